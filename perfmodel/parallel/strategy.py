"""Parallel strategy: how a step is split over GPUs, as validated data.

Fields follow the contract in the design notes. ``zero`` is the ZeRO stage (Rajbhandari et al. 2020;
3 is what PyTorch FSDP's FULL_SHARD does); ``fsdp="hybrid"`` shards within a node and replicates
across nodes (HYBRID_SHARD). ``ps_servers`` > 0 trains with parameter servers instead of all-reduce.
``placement`` orders the groups from fastest-varying rank up (tensor groups inside a node first).
``framework`` and the fields after it describe the software stack (docs/stacks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from perfmodel.workload.stack import ATTENTIONS, FRAMEWORKS, NO_RING_ATTENTIONS
from perfmodel.costs.memory import OPTIMIZER_STATES
from perfmodel.costs.stack_memory import check_expandable
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.parallel.deepspeed import check_pipeline_engine
from perfmodel.parallel.placement import ORDERS
from perfmodel.core.checks import (LIMITS, check_choice, check_divides, check_flag, check_int, check_positive, check_size,
                                   divisors)
from perfmodel.workload.kernels import PRECISIONS
from perfmodel.workload.stacks import check_stack_options, stack, takes_main_grad, takes_reduce_dtype
from perfmodel.workload.stacks.checkpointing import check_recompute
from perfmodel.workload.stacks.composer import check_fc_type
from perfmodel.parallel.expert_checks import check_expert_grid, check_experts, check_expert_tp
from perfmodel.workload.stacks.experts import check_grouped_experts
from perfmodel.workload.stacks.float8 import check_fp8_params, float8_recipe
from perfmodel.workload.stacks.context import check_cp_comm, default_attention
from perfmodel.workload.stacks.layout import DEFAULT_MEMORY_FORMAT, check_memory_format
from perfmodel.workload.stacks.norms import check_norm_kernels
from perfmodel.parallel.looped_bfs import LOOPED_BFS, check_looped_bfs
from perfmodel.parallel.zero_bubble import ZERO_BUBBLE, check_zero_bubble, check_zero_bubble_batches
from perfmodel.workload.stacks.offload import check_offload, check_offload_layers
from perfmodel.workload.stacks.tensorflow import PLACEMENTS as PS_PLACEMENTS
from perfmodel.workload.stacks.tensorflow import check_tensorflow, default_placement

OPTIMIZERS = ("adamw", "sgd", "rmsprop")  # costs/memory.py MOMENTS, costs/compute.py OPTIMIZER_BYTES
SCHEDULES = ("1f1b", "gpipe", "interleaved", "interleaved-zb", "zbv", "looped-bfs", "dualpipev")
CHUNKED_SCHEDULES = ("interleaved", *ZERO_BUBBLE)  # v >= 2 model chunks per rank, as search tries them
LOOPED_SCHEDULES = (*CHUNKED_SCHEDULES, LOOPED_BFS)  # all that loop over chunks (looped BFS: never faster, not searched)
TP_COMM_OVERLAPS = {"userbuffers": "megatron", "userbuffers-nemo": "megatron", "async": "torchtitan"}  # -> its stack
PLACEMENTS = ORDERS
FSDP = (None, "full", "hybrid", "shard-grad-op")
LOSSES = ("eager", "compiled", "fused", "chunked")


def parse_stage_layers(text: str) -> tuple[int, ...] | None:
    """Layers per pipeline stage written as text (``"7,8,8,7"``, ``"7 8 8 7"`` or, inside a strategy
    string whose items commas already separate, ``"7/8/8/7"``); blank: None."""
    parts = str(text).replace(",", " ").replace("/", " ").split()
    if not parts:
        return None
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise InvalidInputError(f"'stage_layers' must be whole numbers of layers per stage, e.g. 7,8,8,7: "
                                f"got {text!r}") from None


MIN_BUCKET_MB = 2**-10  # 1 KiB, in MiB


@dataclass(frozen=True)
class Strategy:
    """How one training step is parallelised; all sizes are per step unless named otherwise."""

    dp: int | None = None               # None: filled from the cluster, GPUs / (tp × pp × cp)
    tp: int = 1
    pp: int = 1
    micro_batch: int = 8
    global_batch: int | None = None     # None: dp × micro_batch (no gradient accumulation)
    zero: int = 0
    recompute: str | None = None       # None: the framework's default (workload/stacks: "none"; torchtitan "every-2")
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    fsdp: str | None = None
    # gradient bucket in MiB (bucket_cap_mb * 1024 * 1024 bytes); None: the framework's default (torch DDP's
    # bucket_cap_mb 25 MiB; Megatron-Core max(4e7, 1e6 · dp) fp32 elements: parallel/config.bucket_bytes)
    bucket_mib: float | None = None
    ps_servers: int = 0
    # synchronous ps: each machine sums its GPUs' gradients and pushes once, pulls once for all of them
    # (tf_cnn_benchmarks variable_update=distributed_replicated); False: every GPU pushes its own
    ps_local_reduce: bool = False
    placement: str = "tp-pp-dp"
    stage_layers: tuple | None = None   # uneven pipeline split: layers per stage, first to last
    framework: str = "pytorch"          # the training framework's record: workload/stacks STACKS
    # "flash": SDPA's; "flash1/2/3": FlashAttention-1/-2/-3; "triton": flash-attn's Triton kernel; "cudnn": cuDNN's
    # as published; "unfused": s² scores; None: the framework's default (under cp > 1 its ring's, stacks/context.py)
    attention: str | None = None
    tp_overlap: bool = False            # Megatron-LM async tensor-parallel communication in backward
    # data-parallel gradient reduction overlaps the last backward (PyTorch DDP, FSDP, Megatron-Core
    # --overlap-grad-reduce); False: after the backward pass (Megatron-LM's "local" DDP, DeepSpeed's pipeline
    # engine), and under ZeRO-3 no gather or reduce-scatter overlaps compute (DeepSpeed ZeRO-3 of early 2021)
    dp_overlap: bool = True
    # context parallelism (Megatron-Core --context-parallel-size): the sequence split over cp ranks,
    # attention as a ring over them (Liu et al. 2023); gradients reduced over dp × cp
    cp: int = 1
    # expert parallelism (Megatron-Core --expert-model-parallel-size): a MoE layer's experts split
    # over ep of the data-parallel ranks, tokens exchanged by all-to-all
    ep: int = 1
    # expert tensor parallelism (Megatron-Core --expert-tensor-parallel-size, "parallel folding" since
    # core_r0.10): each expert's linears split over etp ranks instead of tp, the ep x etp expert grid laid
    # over the tp x cp x dp ranks of a stage; None: tp, Megatron-Core's default
    etp: int | None = None
    # torch.compile of each block (Inductor fuses memory-bound chains; docs/stacks.md)
    compile: bool = False
    # cross-entropy: "eager" (fp32 logits whole), "compiled" (Inductor-fused, 16-bit logits saved),
    # "fused" (flash-attn's cross-entropy kernel, llm-foundry's fused_crossentropy; as "compiled"),
    # "chunked" (fused linear + cross-entropy over chunks, logits never whole); None: the stack's default
    loss: str | None = None
    # tensor-parallel collectives overlapped with their GEMMs: "userbuffers" (Megatron-Core
    # --tp-comm-overlap, Transformer Engine's default SMs), "userbuffers-nemo" (the same with NeMo's
    # tuned per-GEMM SMs), "async" (torchtitan async TP); None: off
    tp_comm_overlap: str | None = None
    # asynchronous parameter servers (TensorFlow 1.x's default): each worker pushes and pulls without
    # waiting for the others (perfmodel/parallel/ps_async.py); False: synchronous rounds
    ps_async: bool = False
    # how variables are spread over the servers: "greedy" by bytes (GreedyLoadBalancingStrategy) or
    # "round-robin" in creation order (replica_device_setter's default); None: the framework's
    ps_placement: str | None = None
    # activation CPU offload of the first k blocks (workload/stacks/offload.py: PyTorch save_on_cpu,
    # Megatron-Core --cpu-offloading-num-layers); 0: off
    offload_layers: int = 0
    # gradients reduced in fp32: Megatron-Core's main_grad (grad_reduce_in_fp32; NeMo's recipes set False), an FSDP
    # stack's MixedPrecision reduce_dtype (Composer's mixed_precision DEFAULT: True, PURE: False); None: the
    # framework's default (Megatron fp32 under bf16, FSDP1 bf16, torchtitan fp32: workload/stacks gradient_reduce_bytes)
    grad_reduce_fp32: bool | None = None
    # the context-parallel K/V exchange (workload/stacks/context.py CP_COMMS; None: the stack's first)
    cp_comm: str | None = None
    # how a Megatron-code optimizer keeps its states (costs/memory.py OPTIMIZER_STATES): "fp32" (DistributedOptimizer),
    # "remainders" (Apex DistributedFusedAdam, NeMo 1.x: int16 remainders), "bf16" (NeMo optim.dtype); None: "fp32"
    optimizer_states: str | None = None
    # GEMM weights as fp8 parameters, no bf16 copy (TE fp8_model_init; torchao: its float8 all-gather); fp8-mixed only
    fp8_params: bool = False
    # a CNN's activation layout (workload/stacks/layout.py): "channels_last" (NHWC, as measured) or "contiguous"
    # (NCHW, PyTorch's default: cuDNN transposes around each tensor-core convolution); no effect on a transformer
    memory_format: str = DEFAULT_MEMORY_FORMAT
    # the eager model code's RMSNorm (workload/stacks/norms.py): "fused" or "composite" (HF's, fms's elementwise ops)
    norm_kernels: str = "fused"
    # fp8 scaling (workload/stacks/float8.py RECIPES: torchao's, Transformer Engine's); None: the stack's first
    float8_recipe: str | None = None
    # MPT's linears under Composer (workload/stacks/composer.py): "torch" (bf16 under amp_fp8), "te"; None: "te" if fp8
    fc_type: str | None = None
    # PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: only the allocated bytes must
    # fit (costs/stack_memory.py ALLOCATORS); None: as the stack's launch scripts set it (torchtitan on, others off)
    expandable_segments: bool | None = None
    # a MoE layer's routed experts as one grouped GEMM per linear (torchtitan use_grouped_mm, Megatron-Core
    # --moe-grouped-gemm: workload/stacks/experts.py); None: the stack's default (torchtitan on from SM90)
    grouped_experts: bool | None = None
    bucket_mb: None = field(default=None, repr=False)  # the old name, refused with a message (MB vs MiB)

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batch", "virtual_stages", "cp", "ep"):
            if name != "dp" or self.dp is not None:
                object.__setattr__(self, name, check_size(name, getattr(self, name)))
        if self.global_batch is not None:
            object.__setattr__(self, "global_batch", check_size("global_batch", self.global_batch))
        span = (self.dp or 1) * self.tp * self.pp * self.cp  # dp unset: filled, and bounded, by the cluster
        if span > LIMITS["gpus"]:
            raise InvalidInputError(f"dp × tp × pp × cp = {span:,} GPUs is above the {LIMITS['gpus']:,} a "
                                    f"strategy may span")
        object.__setattr__(self, "zero", check_int("zero", self.zero, minimum=0))
        if self.zero > 3:
            raise InvalidInputError(f"'zero' must be 0, 1, 2 or 3: got {self.zero}")
        object.__setattr__(self, "ps_servers", check_size("ps_servers", self.ps_servers, minimum=0))
        if self.bucket_mb is not None:
            raise InvalidInputError(f"'bucket_mb' is now 'bucket_mib': PyTorch's bucket_cap_mb counts MiB (2**20 "
                                    f"bytes); got bucket_mb={self.bucket_mb!r} (use bucket_mib={self.bucket_mb!r})")
        if self.bucket_mib is not None and check_positive("bucket_mib", self.bucket_mib) < MIN_BUCKET_MB:
            raise InvalidInputError(f"'bucket_mib' must be >= {MIN_BUCKET_MB} (1 KiB; each bucket is one collective "
                                    f"call, so smaller ones only add launches): got {self.bucket_mib!r}")
        check_choice("framework", self.framework, FRAMEWORKS)
        self._stack_defaults()
        check_recompute(self.recompute)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("placement", self.placement, PLACEMENTS)
        check_choice("fsdp", self.fsdp, FSDP)
        check_choice("attention", self.attention, ATTENTIONS)
        if isinstance(self.stage_layers, str):  # "7,8,8,7" as typed
            object.__setattr__(self, "stage_layers", parse_stage_layers(self.stage_layers))
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", self._checked_stage_layers())
        for flag in ("sequence_parallel", "tp_overlap", "dp_overlap", "compile", "ps_async"):  # 1/0 and "true"/"off" as TOML or text give them
            object.__setattr__(self, flag, check_flag(flag, getattr(self, flag)))
        self._check_combinations()
        self._check_ps()
        check_stack_options(self.framework, recompute=self.recompute, compile=self.compile, precision=self.precision)
        object.__setattr__(self, "offload_layers", check_int("offload_layers", self.offload_layers, minimum=0))
        check_offload(self.framework, self.offload_layers, pp=self.pp, recompute=self.recompute)
        check_pipeline_engine(self.framework, pp=self.pp, zero=self.zero, schedule=self.schedule)
        self._check_tp_comm_overlap()
        self._check_memory_settings()
        self._check_optimizer_layout()
        check_cp_comm(self.framework, self.cp_comm, self.cp)
        object.__setattr__(self, "memory_format", check_memory_format(self.memory_format))
        check_norm_kernels(self.norm_kernels, self.framework)
        float8_recipe(stack(self.framework).float8, self.float8_recipe, self.framework, self.precision, self.fp8_params)
        check_fc_type(self.framework, self.fc_type)
        object.__setattr__(self, "grouped_experts", check_grouped_experts(self.grouped_experts, self.framework))
        object.__setattr__(self, "etp", check_expert_tp(self.etp, self.tp, self.framework))

    @property
    def expert_tp(self) -> int:
        """Ranks each expert's linears split over: ``etp``, or tp where unset (Megatron-Core's default)."""
        return self.tp if self.etp is None else self.etp

    def _check_optimizer_layout(self):
        """``optimizer_states`` (Megatron-Core's optimizer) and ``fp8_params`` (its model code; torchtitan's float8)."""
        object.__setattr__(self, "fp8_params", check_flag("fp8_params", self.fp8_params))
        if self.optimizer_states is None and not self.fp8_params:
            return
        takes = ", ".join(takes_main_grad())
        if self.optimizer_states is not None:
            check_choice("optimizer_states", self.optimizer_states, tuple(OPTIMIZER_STATES))
            if self.framework not in takes_main_grad():
                raise UnsupportedError(f"'optimizer_states'={self.optimizer_states!r} sets how Megatron-Core's "
                                       f"distributed optimizer keeps its states: it does not apply to "
                                       f"framework={self.framework!r}; stacks that take it: {takes}")
        if self.fp8_params:
            check_fp8_params(self.framework, self.precision, self.zero, self.optimizer_states)

    def _check_memory_settings(self):  # PyTorch's allocator (TensorFlow's BFC has none); the gradients' reduce dtype
        if self.expandable_segments is not None:
            object.__setattr__(self, "expandable_segments", check_flag("expandable_segments", self.expandable_segments))
            check_expandable(self.framework)
        if self.grad_reduce_fp32 is None:
            return
        object.__setattr__(self, "grad_reduce_fp32", check_flag("grad_reduce_fp32", self.grad_reduce_fp32))
        if self.framework not in takes_reduce_dtype():  # Megatron-Core's main_grad, FSDP's reduce_dtype
            raise UnsupportedError(f"'grad_reduce_fp32' sets the gradients' reduction dtype: it does not apply to "
                                   f"framework={self.framework!r}; stacks that take it: {', '.join(takes_reduce_dtype())}")

    def _check_ps(self):
        """Asynchronous servers and variable placement: only with parameter servers, data parallel only."""
        if self.ps_placement is not None:
            check_choice("ps_placement", self.ps_placement, PS_PLACEMENTS)
            if not (self.ps_servers or self.ps_async):
                raise InvalidInputError(f"'ps_placement'={self.ps_placement!r} places variables on parameter "
                                        f"servers: give ps_servers (or ps_async=True)")
        if self.ps_async and (self.zero or self.fsdp or self.tp > 1 or self.pp > 1 or self.cp > 1 or self.ep > 1):
            raise InvalidInputError(f"'ps_async'=True is data parallel over parameter servers: use zero=0, fsdp=None, "
                                    f"tp=pp=cp=ep=1 (got zero={self.zero}, fsdp={self.fsdp!r}, tp={self.tp}, "
                                    f"pp={self.pp}, cp={self.cp}, ep={self.ep})")
        if self.ps_async and self.global_batch is not None and self.global_batch != (self.dp or 1) * self.micro_batch:
            raise InvalidInputError("'ps_async'=True: each worker applies its own micro-batch's gradient, so "
                                    "'global_batch' must be left unset (no gradient accumulation)")

    @property
    def variable_placement(self) -> str:
        """The placement of variables on parameter servers in force (the framework's default when unset)."""
        return self.ps_placement or default_placement(self.framework)

    def _check_tp_comm_overlap(self):
        method = self.tp_comm_overlap
        if method is None:
            return
        check_choice("tp_comm_overlap", method, tuple(TP_COMM_OVERLAPS))
        if self.framework != TP_COMM_OVERLAPS[method]:
            raise UnsupportedError(f"tp_comm_overlap={method!r} does not apply to framework={self.framework!r}: "
                                   f"'userbuffers' and 'userbuffers-nemo' are Megatron-Core's (framework='megatron'), "
                                   f"'async' torchtitan's")
        if self.tp == 1 or not self.sequence_parallel:
            raise InvalidInputError(f"tp_comm_overlap={method!r} overlaps sequence-parallel collectives: it needs "
                                    f"tp > 1 and sequence_parallel=True (got tp={self.tp}, "
                                    f"sequence_parallel={self.sequence_parallel})")
        if method == "async" and not self.compile:
            raise InvalidInputError("tp_comm_overlap='async' is Inductor's micro-pipelining: torchtitan needs "
                                    "compile=True with it (parallelisms.enable_async_tensor_parallel)")

    def _stack_defaults(self):
        """Options left unset take the framework's defaults (``perfmodel.workload.stacks``)."""
        st = stack(self.framework)
        if self.recompute is None:
            object.__setattr__(self, "recompute", st.default_recompute)
        if self.attention is None:
            object.__setattr__(self, "attention", self._default_attention())
        if self.loss is None:  # torchtitan compiles the loss with the blocks (compile.components)
            object.__setattr__(self, "loss", st.loss_default(self.compile))
        check_choice("loss", self.loss, LOSSES)
        if st.default_fsdp and self.fsdp is None and self.zero == 0 and not self.ps_servers:
            object.__setattr__(self, "fsdp", st.default_fsdp)
        if self.fsdp == "shard-grad-op" and st.sharding not in ("fsdp1", "fsdp2"):
            raise UnsupportedError(f"fsdp='shard-grad-op' (FSDP1 SHARD_GRAD_OP, FSDP2 reshard_after_forward=False) "
                                   f"is priced for the FSDP stacks: use framework='fsdp1' or 'torchtitan' "
                                   f"(got {self.framework!r})")
        if st.sharding in ("fsdp1", "fsdp2") and self.zero not in (0, 3):
            raise InvalidInputError(f"framework={self.framework!r} shards with FSDP ('fsdp'='full' or 'hybrid'): "
                                    f"'zero' must be 0 or 3 with it: got {self.zero}")

    def _check_combinations(self):
        if self.ps_local_reduce and (not self.ps_servers or self.ps_async):
            raise InvalidInputError("'ps_local_reduce'=True sums each machine's gradients before a synchronous "
                                    f"push: it needs ps_servers > 0 and ps_async=False (got ps_servers="
                                    f"{self.ps_servers}, ps_async={self.ps_async})")
        if self.ps_servers and (self.zero or self.fsdp):
            raise InvalidInputError("a parameter server ('ps_servers' > 0) cannot be combined with 'zero' "
                                    f"or 'fsdp' sharding: got zero={self.zero}, fsdp={self.fsdp!r} (use zero=0, fsdp=None)")
        if self.ps_servers and (self.tp > 1 or self.pp > 1):
            raise InvalidInputError("parameter-server training here is data parallel only: use tp=1, pp=1 "
                                    f"with 'ps_servers' (got tp={self.tp}, pp={self.pp})")
        if self.fsdp and self.zero not in (0, 3):
            raise InvalidInputError(f"'fsdp' already implies full sharding; 'zero' must be 0 or 3 with it: got {self.zero}")
        if self.virtual_stages > 1 and self.schedule not in LOOPED_SCHEDULES:
            raise InvalidInputError(f"'virtual_stages'={self.virtual_stages} needs a schedule that loops over model "
                                    f"chunks: {', '.join(map(repr, LOOPED_SCHEDULES))} (got {self.schedule!r})")
        check_zero_bubble(self.schedule, self.framework, self.pp, self.virtual_stages)
        check_looped_bfs(self.schedule, self.framework, self.pp, self.virtual_stages)
        if self.sequence_parallel and self.tp == 1:
            raise InvalidInputError("'sequence_parallel' needs tp > 1 (it splits norms across the tensor group)")
        if self.schedule == "interleaved" and self.pp == 1:
            raise InvalidInputError("schedule='interleaved' needs pp > 1 (it interleaves pipeline stages): "
                                    "use schedule='1f1b' or pp >= 2")
        if self.cp > 1 and self.attention in NO_RING_ATTENTIONS:
            raise InvalidInputError(f"context parallelism ('cp'={self.cp}) runs attention as a ring of FlashAttention "
                                    f"blocks: use attention='flash', 'flash2', 'flash3' or 'cudnn' (got {self.attention!r})")
        if self.dp is None:  # the checks below need dp: they run again once fill_dp has set it
            return
        check_expert_grid(self.ep, self.etp, tp=self.tp, cp=self.cp, dp=self.dp)
        if self.ep > 1 and self.tp > 1 and not self.sequence_parallel:
            raise InvalidInputError(f"expert parallelism with tensor parallelism needs sequence_parallel=True "
                                    f"(Megatron-Core requires it for MoE; got tp={self.tp})")
        if (self.cp > 1 or self.ep > 1) and self.ps_servers:
            raise InvalidInputError(f"parameter-server training here is data parallel only: use cp=1 and ep=1 "
                                    f"with 'ps_servers' (got cp={self.cp}, ep={self.ep})")
        if self.global_batch is not None and self.global_batch % (self.dp * self.micro_batch):
            g = self.dp * self.micro_batch
            lo = max(g, self.global_batch // g * g)
            raise InvalidInputError(f"'global_batch'={self.global_batch} must be a multiple of dp × micro_batch = {g} "
                                    f"(nearby: {lo} or {lo + g})")

    def _checked_stage_layers(self) -> tuple:
        try:
            layers = tuple(check_int(f"stage_layers[{i}]", n) for i, n in enumerate(self.stage_layers))
        except TypeError:
            raise InvalidInputError(f"'stage_layers' must be a sequence of layer counts, one per pipeline "
                                    f"stage: got {self.stage_layers!r}") from None
        if len(layers) != self.pp:
            raise InvalidInputError(f"'stage_layers' must list one layer count per pipeline stage (pp={self.pp}): "
                                    f"got {len(layers)} counts {layers}")
        v = self.virtual_stages
        # the first and last stage may give one chunk slot to the embedding / the loss (Megatron-LM
        # transformer_block.get_num_layers_to_build: account_for_{embedding,loss}_in_pipeline_split)
        ends = {0, len(layers) - 1}
        if v > 1 and any(n % v and not (i in ends and (n + 1) % v == 0) for i, n in enumerate(layers)):
            raise InvalidInputError(f"'stage_layers'={layers} must be multiples of virtual_stages="
                                    f"{v} (each stage is cut into that many chunks; the first and the last "
                                    f"stage may be one short, their embedding or loss taking a chunk's slot)")
        return layers

    def _dp(self) -> int:
        if self.dp is None:
            raise InvalidInputError("'dp' is not set yet: it is filled from the cluster's GPU count by "
                                    "pm.predict (or fill_dp(strategy, n_gpus)); give dp to use it before")
        return self.dp

    @property
    def gpus(self) -> int:
        return self._dp() * self.tp * self.pp * self.cp

    @property
    def shard(self) -> int:
        """ZeRO stage in force (fsdp counts as stage 3)."""
        return 3 if self.fsdp else self.zero

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per data-parallel rank (gradient accumulation × pipeline)."""
        if self.global_batch is None:
            return 1
        return self.global_batch // (self._dp() * self.micro_batch)

    @property
    def batch(self) -> int:
        return self.global_batch or self._dp() * self.micro_batch

    def is_default(self, name: str) -> bool:
        """Whether field ``name`` holds what it would hold if left unset (the framework's default)."""
        f = next(f for f in fields(self) if f.name == name)
        value = getattr(self, name)
        if f.default is not None or name not in ("recompute", "loss", "fsdp", "attention"):
            return value == f.default
        st = stack(self.framework)
        unset = {"recompute": st.default_recompute, "fsdp": st.default_fsdp if self.zero == 0 else None,
                 "loss": st.loss_default(self.compile),
                 "attention": self._default_attention()}
        return value == unset[name]

    def _default_attention(self) -> str:
        """The attention kernel the framework calls: under context parallelism, the one its ring runs."""
        return default_attention(self.framework, self.cp)

    def replace(self, **changes) -> Strategy:
        return replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if not self.is_default(f.name) or f.name in ("dp", "tp", "pp", "micro_batch"):
                parts.append(f"{f.name}={value!r}")
        return "Strategy(" + ", ".join(parts) + ")"


def _check_schedule(s: Strategy, layers: int) -> None:
    """The model chunks and micro-batches a chunked or zero-bubble pipeline schedule needs."""
    check_zero_bubble_batches(s.schedule, s.micro_batches, s.pp)
    if s.schedule not in LOOPED_SCHEDULES:
        return
    if s.stage_layers is None and not interleaves(layers, s.pp * s.virtual_stages):
        valid = [v for v in divisors(layers // s.pp) if layers % (s.pp * v) == 0] if layers % s.pp == 0 else []
        hint = f"virtual_stages in {valid}" if valid else f"pp dividing {layers}"
        what = "interleaved schedule" if s.schedule == "interleaved" else f"schedule={s.schedule!r}"
        raise InvalidInputError(f"{what} needs layers={layers} divisible by pp × virtual_stages"
                                f" = {s.pp} × {s.virtual_stages} (try {hint})")
    if s.schedule == "interleaved" and s.micro_batches % s.pp:
        raise InvalidInputError(f"interleaved schedule needs the micro-batches per step ({s.micro_batches}) "
                                f"to be a multiple of pp={s.pp} (Megatron-LM schedules.py); "
                                f"e.g. global_batch={s.pp * s.dp * s.micro_batch * max(1, -(-s.micro_batches // s.pp))}")


def interleaves(layers: int, chunks: int) -> bool:
    """Whether ``layers`` split into ``chunks`` = pp × v equal model chunks: as they are, or with the
    embedding and the loss counted as a layer each (layers + 2; Megatron-Core
    ``transformer_block.get_num_layers_to_build``, account_for_embedding/loss_in_pipeline_split)."""
    return (layers % chunks == 0) | ((layers + 2) % chunks == 0)  # numbers or arrays


def fill_dp(s: Strategy, n_gpus: int) -> Strategy:
    """``s`` with dp filled from the GPU count where it was left unset: GPUs / (tp × pp × cp), as the CLI does."""
    if s.dp is not None:
        return s
    group = s.tp * s.pp * s.cp
    if n_gpus % group:
        raise InvalidInputError(f"tp × pp × cp = {s.tp} × {s.pp} × {s.cp} = {group} must divide the cluster's "
                                f"GPU count {n_gpus} to fill dp (or give dp explicitly)")
    return replace(s, dp=n_gpus // group)


def _nearest(value: int, valid: list[int]) -> int:
    return min(valid, key=lambda d: (abs(d - value), d))


def check_against(model, n_gpus: int, s: Strategy) -> None:
    """Raise a clear error when ``s`` cannot run ``model`` on ``n_gpus`` GPUs.

    Each message names the fields, the values and a valid nearby choice. An unset dp is filled
    from ``n_gpus`` first (where tp × pp × cp divides it; else the message says so).
    """
    if s.dp is None:
        s = fill_dp(s, n_gpus) if n_gpus % (s.tp * s.pp * s.cp) == 0 else replace(s, dp=1, global_batch=None)
    if s.gpus != n_gpus:
        rest = s.tp * s.pp * s.cp
        heads = getattr(model, "heads", n_gpus)
        tps = [d for d in divisors(n_gpus) if heads % d == 0] or [1]
        tp = _nearest(s.tp, tps)
        with_cp = f", cp={s.cp}" if s.cp > 1 else ""
        if n_gpus % rest == 0:
            hint = f"dp={n_gpus // rest} with tp={s.tp}, pp={s.pp}{with_cp}"
        elif s.cp > 1:
            hint = f"tp={tp}, pp=1, cp=1, dp={n_gpus // tp}: tp × pp × cp must divide {n_gpus}"
        else:
            hint = f"tp={tp}, pp=1, dp={n_gpus // tp}: tp × pp must divide {n_gpus}"
        shape = f"dp × tp × pp{' × cp' if s.cp > 1 else ''}"
        sizes = " × ".join(str(x) for x in (s.dp, s.tp, s.pp) + ((s.cp,) if s.cp > 1 else ()))
        raise InvalidInputError(f"{shape} = {sizes} = {s.gpus} must equal the cluster's "
                                f"GPU count {n_gpus} (e.g. {hint})")
    if s.framework == "tensorflow":
        check_tensorflow(model, s)
    check_offload_layers(s.framework, s.offload_layers, getattr(model, "layers", 0))
    check_experts(model, s.ep, s.etp, s.tp)
    if s.cp > 1:
        seq = getattr(model, "seq", None)
        if seq is None or not hasattr(model, "heads"):
            raise UnsupportedError(f"context parallelism ('cp'={s.cp}) needs a transformer with a sequence "
                                   f"(got {type(model).__name__})")
        if seq % (2 * s.cp):
            ok = [c for c in divisors(seq // 2) if c <= 2 * s.cp and (seq // 2) % c == 0]
            raise InvalidInputError(f"context parallelism splits the sequence into 2 × cp chunks (load-balanced "
                                    f"causal attention): seq={seq} must be divisible by 2 × cp = {2 * s.cp} "
                                    f"(e.g. cp={_nearest(s.cp, ok or [1])})")
    heads = getattr(model, "heads", None)
    if heads is not None:
        check_divides("tp", s.tp, "heads", heads)
        check_divides("tp", s.tp, "kv_heads", model.kv_heads)
    layers = model.layers
    if s.pp > layers:
        raise InvalidInputError(f"'pp'={s.pp} must be <= layers={layers} (each stage needs a layer; "
                                f"e.g. pp={_nearest(s.pp, [d for d in divisors(layers) if d <= s.pp] or [1])})")
    if s.stage_layers is not None and sum(s.stage_layers) != layers:
        raise InvalidInputError(f"'stage_layers'={s.stage_layers} must add up to layers={layers}: "
                                f"got {sum(s.stage_layers)}")
    _check_schedule(s, layers)
