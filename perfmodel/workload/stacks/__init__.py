"""Software stacks as data: what each training framework does, taken from its code at a version.

``Strategy.framework`` names one of ``STACKS``; the record says how that framework keeps
parameters and gradients, which activation-checkpointing policies and options it has, and its
defaults, so ``framework="torchtitan"`` alone prices what torchtitan does. docs/stacks.md cites
the source of every field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.core.checks import check_choice
from perfmodel.core.errors import UnsupportedError


@dataclass(frozen=True)
class Stack:
    """One training framework's behaviour (bytes per element, policies, defaults)."""

    name: str
    source: str                 # repository, version and file the fields come from
    weights16: bool             # GEMMs read 16-bit parameters: no autocast casts, 16-bit residual stream
    sharding: str               # "ddp" | "megatron" | "fsdp1" | "fsdp2": how parameters are kept
    default_fsdp: str | None    # data-parallel ranks shard parameters unless told otherwise
    reduce_bytes: float         # bytes per gradient element the reduction moves (MixedPrecisionPolicy.reduce_dtype)
    default_recompute: str      # checkpointing when the user names none
    recompute: tuple            # policies the framework has ("every-k" stands for every-<k>)
    compiles: bool              # torch.compile of the blocks is an option
    rope_saves: bool            # the rotary embedding saves its rotated q and k for backward
    swiglu_saved: int           # f-wide tensors SwiGLU saves (fc2's input included)
    compiles_loss: bool = False  # compile=True compiles the loss too
    searched: tuple = ("none", "selective", "full")  # the policies pm.search tries by default
    model_code: str = "torch"   # "megatron": Megatron-LM's layers, fp32 main_grad, vocabulary padding
    engine: str | None = None   # "deepspeed": the DeepSpeed engine's host work per step (costs/engine_host.py)
    default_attention: str = "flash"  # the attention kernel its model code calls when the user names none
    tp_regathers: int = 2       # SP all-gathers a block repeats in backward for its weight gradients (parallel/tensor.py)
    # float8 training (precision "fp8-mixed") and whose kernels run it: "te" (Transformer Engine's fp8 linears:
    # workload/stack.py transformer_engine_fp8), "torchao" (Float8Linear: workload/stacks/float8.py); "": none
    float8: str = ""
    # Transformer Engine keeps each weight's fp8 cast between micro-batches (the caller passes is_first_microbatch:
    # Megatron-Core's TELinear); False: every forward casts it again (workload/stack.py transformer_engine_fp8)
    te_weight_cache: bool = True
    grad_buffer: bool = False   # Megatron-Core DDP: one grad buffer per model chunk, reduced asynchronously (parallel/data.py)
    tp_input_gathers: int = 2   # SP all-gathers of a block's sharded input per forward (parallel/tensor.py)
    default_search: bool = True  # pm.search tries it when no framework is named (explore/stack_options.py)
    loss_parallel: bool = True  # TP keeps the logits vocabulary-sharded for the loss (parallel/tensor.py loss_time)
    # fp32 convolutions run as TF32 on tensor cores: PyTorch's torch.backends.cudnn.allow_tf32 defaults to True
    # (torch 2.13 ATen/Context.h allow_tf32_cudnn = true; matmuls stay fp32: allow_tf32_cublas false since 1.12)
    cudnn_tf32: bool = True
    # the loss its model code computes when the user names none: "eager" (F.cross_entropy over the fp32
    # logits), "fused" (a fused cross-entropy kernel); a compiled stack with compiles_loss takes "compiled"
    default_loss: str = "eager"
    # the model code unpads q, k, v and pads the output around each flash-attn 2 call (MPT's flash_attn_fn:
    # workload/stack.py unpad_copies)
    unpads_attention: bool = False

    def loss_default(self, compiled: bool) -> str:
        """The ``Strategy.loss`` this framework runs when the user names none."""
        return "compiled" if compiled and self.compiles_loss else self.default_loss


STACKS = {
    "pytorch": Stack("pytorch", "PyTorch eager, torch.autocast over fp32 parameters (torch/amp/autocast_mode.py)",
                     weights16=False, sharding="ddp", default_fsdp=None, reduce_bytes=4.0,
                     default_recompute="none", recompute=("none", "selective", "full", "every-k"),
                     compiles=True, rope_saves=True, swiglu_saved=4),
    "megatron": Stack("megatron", "Megatron-LM core_r0.9 (megatron/core/optimizer, transformer/mlp.py)",
                      weights16=True, sharding="megatron", default_fsdp=None, reduce_bytes=4.0,
                      default_recompute="none", recompute=("none", "selective", "full"),
                      compiles=False, rope_saves=False, swiglu_saved=3, model_code="megatron",
                      float8="te", grad_buffer=True),
    # Megatron-DeepSpeed: Megatron-LM's model code trained by deepspeed.initialize (DeepSpeed 0.16.4
    # deepspeed/runtime/engine.py, zero/stage_1_and_2.py): the engine's host work is priced on top
    # Megatron-DeepSpeed f4157be megatron/arguments.py: --transformer-impl defaults to 'local' and every
    # --use-flash-attn* flag is off, so ParallelAttention runs CoreAttention (baddbmm, FusedScaleMaskSoftmax, bmm)
    "deepspeed": Stack("deepspeed", "microsoft/Megatron-DeepSpeed f4157be (Megatron-LM layers) on DeepSpeed 0.16.4 "
                       "deepspeed/runtime/engine.py, zero/stage_1_and_2.py",
                       weights16=True, sharding="megatron", default_fsdp=None, reduce_bytes=4.0,
                       default_recompute="none", recompute=("none", "selective", "full"),
                       compiles=False, rope_saves=False, swiglu_saved=3, model_code="megatron", engine="deepspeed",
                       default_attention="unfused"),
    # torchtitan v0.2.2: torchtitan/models/llama3/infra/parallelize.py (apply_fsdp, _op_sac_save_list),
    # torchtitan/config/job_config.py (mixed_precision_param "bfloat16", mixed_precision_reduce
    # "float32", activation_checkpoint mode "selective" with selective_ac_option "2")
    "torchtitan": Stack("torchtitan", "pytorch/torchtitan v0.2.2 (73a0e69): models/llama3/infra/parallelize.py, "
                        "config/job_config.py; FSDP2 torch/distributed/fsdp/_fully_shard",
                        weights16=True, sharding="fsdp2", default_fsdp="full", reduce_bytes=4.0,
                        default_recompute="every-2", recompute=("none", "full", "selective-op", "every-k"),
                        compiles=True, rope_saves=False, swiglu_saved=4, compiles_loss=True,
                        searched=("none", "full", "selective-op", "every-2"), tp_regathers=0,
                        float8="torchao"),  # the training.float8 converter
    # KempnerForge (KempnerInstitute/KempnerForge 01b461a kempnerforge/distributed/parallel.py apply_fsdp2:
    # FSDP2 per block, MixedPrecisionPolicy(bf16, reduce fp32), torch.compile of the model; 0c4eba1
    # distributed/tensor_parallel.py _build_block_tp_plan: ColwiseParallel(input_layouts=Shard(1)) on each of
    # q/k/v_proj and gate/up_proj, so each redistributes the block's sequence-sharded input by its own
    # all-gather: 5 per block forward where torchtitan's PrepareModuleInput gathers 2)
    "kempnerforge": Stack("kempnerforge", "KempnerInstitute/KempnerForge 01b461a kempnerforge/distributed/parallel.py, "
                          "0c4eba1 kempnerforge/distributed/tensor_parallel.py; FSDP2 torch/distributed/fsdp/_fully_shard",
                          weights16=True, sharding="fsdp2", default_fsdp="full", reduce_bytes=4.0,
                          default_recompute="none", recompute=("none", "full"), compiles=True, rope_saves=False,
                          swiglu_saved=4, searched=("none", "full"), tp_regathers=0, tp_input_gathers=5,
                          default_search=False, loss_parallel=False),
    # FSDP1 FullyShardedDataParallel as Hugging Face accelerate and Composer/llm-foundry wrap it:
    # one FlatParameter per decoder block, MixedPrecision(param_dtype=bf16, reduce_dtype=bf16: accelerate's
    # "bf16" mixed precision, llm-foundry's mixed_precision PURE), limit_all_gathers
    "fsdp1": Stack("fsdp1", "PyTorch FSDP1 torch/distributed/fsdp/fully_sharded_data_parallel.py, _runtime_utils.py "
                   "(torch 2.4), as accelerate FullyShardedDataParallelPlugin and Composer configure it",
                   weights16=True, sharding="fsdp1", default_fsdp="full", reduce_bytes=2.0,
                   default_recompute="none", recompute=("none", "full", "every-k"),
                   compiles=True, rope_saves=False, swiglu_saved=4, searched=("none", "full"),
                   # llm-foundry llmfoundry/models/layers/attention.py: attn_impl='flash' calls flash-attn 2's
                   # flash_attn_varlen_func (flash_attn_fn) when flash-attn 2 is installed
                   default_attention="flash2",
                   # Composer's precision amp_fp8 (composer/core/precision.py get_precision_context): te.fp8_autocast
                   # alone, so only the Transformer Engine linears llm-foundry builds for fp8 run it
                   # (llmfoundry/models/layers/fc.py fc_type "te": Strategy.fc_type, stacks/composer.py); neither
                   # passes is_first_microbatch (FSDP frees the gathered weight after each forward anyway), so TE
                   # casts every weight again in every forward
                   float8="te", te_weight_cache=False),
    # TensorFlow 1.x graph mode with parameter servers (perfmodel/workload/stacks/tensorflow.py):
    # fp32 variables on the servers, the update there, no activation checkpointing or compilation
    "tensorflow": Stack("tensorflow", "tensorflow v1.10 python/training/device_setter.py, core/kernels/"
                        "training_ops.cc; tensor2tensor v1.9.0 utils/devices.py (workload/stacks/tensorflow.py)",
                        weights16=False, sharding="ps", default_fsdp=None, reduce_bytes=4.0,
                        default_recompute="none", recompute=("none",), compiles=False, rope_saves=False,
                        swiglu_saved=4, searched=("none",), cudnn_tf32=False),  # TF32 came with TF 2.4
}
# composer: Composer's FSDP1 over MPT's model code (mosaicml/llm-foundry 8c8dd48): FSDP1 as the
# fsdp1 record has it (scripts/train/yamls/pretrain/mpt-*.yaml: FULL_SHARD, mixed_precision PURE,
# limit_all_gathers); MPT's loss is flash-attn's fused cross-entropy (models/mpt/modeling_mpt.py
# ComposerMPTCausalLM: loss_fn='fused_crossentropy' by default), its norm LPLayerNorm in bf16
# (models/layers/norm.py, MPTConfig norm_type='low_precision_layernorm': one fused kernel, as priced); its
# attn_impl='flash' unpads q, k, v for flash_attn_varlen_func and pads the output (models/layers/attention.py)
STACKS["composer"] = replace(
    STACKS["fsdp1"], name="composer", default_loss="fused", default_search=False, unpads_attention=True,
    source="mosaicml/llm-foundry 8c8dd48 llmfoundry/models/mpt/modeling_mpt.py, models/layers/norm.py, "
           "models/layers/attention.py, scripts/train/yamls/pretrain; Composer FSDP1 (torch/distributed/fsdp, torch 2.4)")
FRAMEWORKS = tuple(STACKS)
# the stacks that train any traced module (a CNN, a ViT, pm.from_torch): eager DDP, FSDP1 as accelerate wraps
# a module, TensorFlow 1.x's parameter servers; the others run their own transformer code (Megatron-LM's GPT,
# torchtitan's and KempnerForge's Llama, llm-foundry's MPT)
GRAPH_FRAMEWORKS = ("pytorch", "fsdp1", "tensorflow")


def stack(name: str) -> Stack:
    """The record of framework ``name``; unknown names list the known ones."""
    if type(name) is str and name in STACKS:  # a known name: no choice list to build
        return STACKS[name]
    return STACKS[check_choice("framework", name, FRAMEWORKS)]


def megatron_code(framework: str) -> bool:
    """Whether the framework runs Megatron-LM's layers (16-bit weights, fp32 main_grad, padded vocabulary)."""
    return stack(framework).model_code == "megatron"


def takes_main_grad() -> list[str]:
    """Frameworks whose gradient buffer dtype ``Strategy.grad_reduce_fp32`` sets: Megatron-Core's own
    DDP (not DeepSpeed's engine, which keeps its own gradient buffers)."""
    return [s.name for s in STACKS.values() if s.model_code == "megatron" and s.engine is None]


def takes_reduce_dtype() -> list[str]:
    """Frameworks whose gradient-reduction dtype ``Strategy.grad_reduce_fp32`` sets: Megatron-Core's main_grad
    (``takes_main_grad``) and the FSDP stacks' ``MixedPrecision(reduce_dtype=...)`` (``gradient_reduce_bytes``)."""
    return takes_main_grad() + [s.name for s in STACKS.values() if s.sharding in ("fsdp1", "fsdp2")]


def gradient_reduce_bytes(framework: str, grad_reduce_fp32=None) -> float:
    """Bytes per gradient element an FSDP stack reduce-scatters: its record's reduce dtype (torchtitan
    ``mixed_precision_reduce = "float32"``; FSDP1 as accelerate and llm-foundry's ``mixed_precision: PURE`` set
    it, bf16), or fp32 / bf16 where ``grad_reduce_fp32`` names it (Composer's ``mixed_precision: DEFAULT``,
    its FSDP default: ``reduce_dtype=torch.float32``, composer/distributed/mosaic_parallelism.py
    ``get_mixed_precision``; torchtitan ``mixed_precision_reduce = "bfloat16"``)."""
    if grad_reduce_fp32 is None:
        return stack(framework).reduce_bytes
    return 4.0 if grad_reduce_fp32 else 2.0


def takes(option: str) -> list[str]:
    """Frameworks that take a stack option (a recompute policy or "compile")."""
    if option == "compile":
        return [s.name for s in STACKS.values() if s.compiles]
    policy = "every-k" if option.startswith("every-") else option
    return [s.name for s in STACKS.values() if policy in s.recompute]


def check_stack_options(framework: str, *, recompute: str, compile: bool = False, precision: str = "") -> None:
    """Raise when an option does not apply to the framework, naming the stacks that take it."""
    st = stack(framework)
    if precision == "fp8-mixed" and not st.float8:
        raise UnsupportedError(f"precision='fp8-mixed' (float8 training) does not apply to framework={framework!r}: "
                               f"its code has no fp8 linears; stacks that take it: "
                               f"{', '.join(s.name for s in STACKS.values() if s.float8)}")
    if compile and not st.compiles:
        raise UnsupportedError(f"'compile'=True does not apply to framework={framework!r} (its kernels are "
                               f"its own fused CUDA ones); stacks that take it: {', '.join(takes('compile'))}")
    policy = "every-k" if recompute.startswith("every-") else recompute
    if policy not in st.recompute:
        raise UnsupportedError(f"recompute={recompute!r} is not a checkpointing policy of framework={framework!r} "
                               f"(it has {', '.join(st.recompute)}); stacks that take it: "
                               f"{', '.join(takes(recompute)) or 'none'}")
