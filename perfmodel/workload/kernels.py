"""The kernels one training micro-batch launches on one GPU, forward and backward.

Mirrors eager PyTorch under ``torch.autocast`` with fp32 master weights (the
``bf16-mixed`` / ``fp16-mixed`` precisions): norms, residual adds and the loss
run in fp32; every linear casts its fp32 weight (and bias) to bf16 once per
forward and its input when that input is fp32; backward casts weight
gradients back to fp32. Sizes are arrays: ``micro_batch``, ``tp`` and ``sp``
broadcast, so a sweep is priced in one pass. Tensor parallelism splits as in
Megatron-LM (Shoeybi et al. 2019): QKV and the MLP's first projection by
columns, the output projections by rows, the vocabulary across ranks;
sequence parallelism (Korthikanti et al. 2022) splits norms and residual adds
across the tensor group too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.core.units import DTYPE_BYTES
from perfmodel.core.checks import check_choice
from perfmodel.workload.ops import Kernel, linear, mem
from perfmodel.workload.stacks.checkpointing import check_recompute, recomputed_kernels

PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp8-mixed", "fp32", "tf32")
# Megatron-LM pads the vocabulary to a multiple of 128 x tp (``_vocab_size_with_padding``,
# --make-vocab-size-divisible-by 128), so its LM head and embedding never run misaligned GEMMs
MEGATRON_VOCAB_MULTIPLE = 128
RECOMPUTE = ("none", "selective", "full", "selective-op")  # and every-<k> (workload/stacks/checkpointing.py)


def gemm_dtype(precision: str) -> str:
    return {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp8-mixed": "fp8", "fp32": "fp32", "tf32": "tf32"}[precision]


def activation_dtype(precision: str) -> str:
    """The dtype of activations outside the GEMMs: 16-bit under autocast, bf16 under fp8 training (Transformer
    Engine and torchao quantize only a GEMM's operands), fp32 otherwise."""
    return "fp32" if not is_mixed(precision) else ("fp16" if precision == "fp16-mixed" else "bf16")


def is_mixed(precision: str) -> bool:
    return precision.endswith("-mixed")


def _is_symbolic(x) -> bool:
    return hasattr(x, "free_symbols")


def _numeric(x):
    """Arrays of floats, except sympy expressions (symbolic step times) pass through."""
    return x if _is_symbolic(x) else np.asarray(x, dtype=float)


class _Builder:
    """Collects forward and backward kernels of one layer stack for one precision."""

    def __init__(self, model, micro_batch, tp, sp, precision, ep=1, etp=None):
        self.m, self.precision, self.ep = model, precision, ep
        self.mixed = is_mixed(precision)
        self.low = activation_dtype(precision)
        self.b = _numeric(micro_batch)
        self.tp = _numeric(tp)
        self.etp = self.tp if etp is None else float(etp)        # ranks an expert's linears split over
        self.T = self.b * model.seq                              # tokens per micro-batch
        if np.ndim(sp) == 0 and not _is_symbolic(self.T):      # tokens seen by norms
            self.Tn = self.T / self.tp if bool(sp) else self.T
        else:
            self.Tn = np.where(np.asarray(sp, bool), self.T / self.tp, self.T)
        self.fwd: list[Kernel] = []
        self.bwd: list[Kernel] = []

    # -- pieces ------------------------------------------------------------
    def linear(self, name, tokens, d_in, d_out, *, count=1, cast_input=False, bias=None):
        bias = self.m.bias if bias is None else bias
        dt = gemm_dtype(self.precision)
        f, b = linear(name, tokens, d_in, d_out, count=count, dtype=dt)
        fwd, bwd = [], []
        if self.mixed:  # autocast casts the fp32 weight (and bias) once per forward
            fwd.append(mem(name + ".w_cast", "cast_fp32_to_bf16", "fwd", np.multiply(d_in, d_out), count=count, variant="fwd", autocast=True))
            bwd.append(mem(name + ".w_grad_cast", "cast_bf16_to_fp32", "bwd", np.multiply(d_in, d_out), count=count, variant="fwd", autocast=True))
            if bias:
                fwd.append(mem(name + ".b_cast", "cast_fp32_to_bf16", "fwd", d_out, count=count, variant="fwd", autocast=True))
                bwd.append(mem(name + ".b_grad_cast", "cast_bf16_to_fp32", "bwd", d_out, count=count, variant="fwd", autocast=True))
            if cast_input:
                fwd.append(mem(name + ".x_cast", "cast_fp32_to_bf16", "fwd", np.multiply(tokens, d_in), count=count, variant="fwd", autocast=True))
                bwd.append(mem(name + ".x_grad_cast", "cast_bf16_to_fp32", "bwd", np.multiply(tokens, d_in), count=count, variant="fwd", autocast=True))
        if bias:  # bias gradient: a column sum of dy
            bwd.append(mem(name + ".b_grad", "sum", "bwd", np.multiply(tokens, d_out) * DTYPE_BYTES[self.low] / 4,
                           count=count, variant="fwd"))
        return fwd + f, b[::-1] + bwd[::-1]

    def norm(self, name):
        cls = self.m.norm
        return ([mem(name, cls, "fwd", self.Tn * self.m.hidden, rows=self.Tn)],
                [mem(name + ".bwd", cls, "bwd", self.Tn * self.m.hidden, rows=self.Tn)])

    def residual(self, name):
        k = mem(name, "residual_add", "fwd", self.Tn * self.m.hidden, rows=self.Tn)
        bwd = [replace(k, name=name + ".grad_add", phase="bwd")]
        if self.mixed:  # fp32 stream + 16-bit branch output: the stream's gradient is cast down for the
            # branch (two fp32 -> bf16 copies per layer in a profile of the autocast step)
            bwd.append(mem(name + ".grad_cast", "cast_fp32_to_bf16", "bwd", self.Tn * self.m.hidden,
                           variant="fwd", autocast=True))
        return [k], bwd

    def attention(self):
        if self.m.kv_lora_rank:
            return self.latent_attention()
        m, h = self.m, self.m.hidden
        heads, kv, d = m.heads / self.tp, m.kv_heads / self.tp, m.head_dim
        f_qkv, b_qkv = self.linear("attn.qkv", self.T, h, m.qkv_out / self.tp, cast_input=self.mixed)
        fwd, bwd = list(f_qkv), []
        if m.qk_norm != "none":  # norms of q and of k, 16-bit: over each head's head_dim (Qwen3) or each token's
            for part, nh in (("q", heads), ("k", kv)):  # whole q or k (OLMo 2)
                rows = self.T * nh if m.qk_norm == "head" else self.T
                fwd.append(mem(f"attn.{part}_norm", m.norm, "fwd", self.T * nh * d, rows=rows, dtype=self.low))
                bwd.append(mem(f"attn.{part}_norm.bwd", m.norm, "bwd", self.T * nh * d, rows=rows, dtype=self.low))
        if m.position == "rotary":  # plain-PyTorch rotary on q and k (cat/mul), bf16
            for part, nh in (("q", heads), ("k", kv)):
                fwd.append(mem(f"attn.rope_{part}", "rope", "fwd", self.T * nh * d, dtype=self.low))
                bwd.append(mem(f"attn.rope_{part}.bwd", "rope", "bwd", self.T * nh * d, dtype=self.low))
        # q, k, v are views of the fused QKV output: backward of the split concatenates
        # their gradients into one (tokens × qkv_out) tensor, a copy kernel
        bwd.append(mem("attn.split.bwd", "copy", "bwd", self.T * m.qkv_out / self.tp, variant="fwd", dtype=self.low))
        f_a, b_a = self.core(heads, kv)
        f_o, b_o = self.linear("attn.proj", self.T, m.attn_width / self.tp, h)
        return fwd + f_a + f_o, b_o + b_a + bwd[::-1] + b_qkv

    def core(self, heads, kv):
        """The attention kernel (FlashAttention-style: no s² tensor) at ``Transformer.attention_head_dim``; with a
        sliding window on some blocks only, the average block's: the windowed kernel in ``window_share`` of the
        blocks, the whole causal one in the rest."""
        m, d = self.m, self.m.attention_head_dim
        size = {"batch": self.b, "heads": heads, "kv_heads": kv, "seq": float(m.seq), "head_dim": float(d),
                "causal": float(m.causal)}
        flops = 4.0 * self.b * heads * m.seq ** 2 * d     # FlopCounterMode convention: full s²
        fwd = [Kernel("attn.sdpa", "sdpa", "fwd", size, 1, flops, "fwd", self.low)]
        bwd = [Kernel("attn.sdpa.bwd", "sdpa", "bwd", size, 1, 2.5 * flops, "bwd", self.low)]
        if not (m.causal and 0 < m.window < m.seq):
            return fwd, bwd
        # a kernel that skips the blocks outside the window runs less (stack.windowed)
        near = [replace(k, size={**size, "window": float(m.window)}) for k in fwd + bwd]
        share = m.window_share
        if share == 1.0:
            return near[:1], near[1:]
        return _weighted(near[:1], share) + _weighted(fwd, 1 - share), _weighted(near[1:], share) + _weighted(bwd, 1 - share)

    def latent_attention(self):
        """Multi-head latent attention as transformers ``DeepseekV3Attention`` runs it: q down (``q_a_proj``),
        RMSNorm, up (``q_b_proj``) or one ``q_proj``; ``kv_a_proj_with_mqa`` to the K/V latent and k's rotary part,
        RMSNorm of the latent, ``kv_b_proj`` up to each head's k (no position) and v; rotary on q's and k's rotary
        parts; q and k concatenated (k's rotary part expanded over the heads); attention; ``o_proj``. The down
        projections are whole on every tensor-parallel rank (Megatron-Core ``MLASelfAttention``: duplicated), the
        up and output ones split by heads."""
        m, h = self.m, self.m.hidden
        heads, dn, dr, dv = m.heads / self.tp, m.head_dim, m.rope_head_dim, m.v_dim
        qk = heads * (dn + dr)
        fwd, bwd = [], []
        if m.q_lora_rank:
            for k_f, k_b in (self.linear("attn.q_a", self.T, h, m.q_lora_rank, cast_input=self.mixed),
                             self._latent_norm("attn.q_a_norm", m.q_lora_rank),
                             self.linear("attn.q_b", self.T, m.q_lora_rank, qk)):
                fwd, bwd = fwd + k_f, k_b + bwd
        else:
            f_q, b_q = self.linear("attn.q", self.T, h, qk, cast_input=self.mixed)
            fwd, bwd = fwd + f_q, b_q + bwd
        for k_f, k_b in (self.linear("attn.kv_a", self.T, h, m.kv_lora_rank + dr, cast_input=self.mixed),
                         self._latent_norm("attn.kv_a_norm", m.kv_lora_rank),
                         self.linear("attn.kv_b", self.T, m.kv_lora_rank, heads * (dn + dv))):
            fwd, bwd = fwd + k_f, k_b + bwd
        for part, width in (("q", heads * dr), ("k", dr)):
            fwd.append(mem(f"attn.rope_{part}", "rope", "fwd", self.T * width, dtype=self.low))
            bwd.insert(0, mem(f"attn.rope_{part}.bwd", "rope", "bwd", self.T * width, dtype=self.low))
        # q = cat(q_nope, q_pe), k = cat(k_nope, k_pe.expand(heads)): two copies forward, their splits backward
        fwd.append(mem("attn.qk_cat", "copy", "fwd", 2 * self.T * qk, variant="fwd", dtype=self.low))
        bwd.insert(0, mem("attn.qk_cat.bwd", "copy", "bwd", 2 * self.T * qk, variant="fwd", dtype=self.low))
        f_a, b_a = self.core(heads, heads)
        f_o, b_o = self.linear("attn.proj", self.T, m.attn_width / self.tp, h)
        return fwd + f_a + f_o, b_o + b_a + bwd

    def _latent_norm(self, name, width):
        """An RMSNorm of a latent (16-bit, one row per token)."""
        return ([mem(name, "rmsnorm", "fwd", self.T * width, rows=self.T, dtype=self.low)],
                [mem(name + ".bwd", "rmsnorm", "bwd", self.T * width, rows=self.T, dtype=self.low)])

    def mlp(self, tokens, count=1, prefix="mlp", width=None, cast_input=True, split=None):
        """An MLP of ``width`` (the model's ``ffn_hidden``) over ``tokens``, split over ``split`` ranks (tp);
        ``cast_input``: its input is the fp32 normed stream autocast casts (False for routed experts, whose permuted
        inputs are 16-bit already)."""
        m, h = self.m, self.m.hidden
        f = (width or m.ffn_hidden) / (self.tp if split is None else split)
        act = "swiglu" if m.activation == "swiglu" else "gelu"
        f_in, b_in = self.linear(f"{prefix}.fc1", tokens, h, (2 if act == "swiglu" else 1) * f,
                                 count=count, cast_input=self.mixed and cast_input)
        a_f = mem(f"{prefix}.{act}", act, "fwd", np.multiply(tokens, f), rows=tokens, count=count, dtype=self.low)
        a_b = mem(f"{prefix}.{act}.bwd", act, "bwd", np.multiply(tokens, f), rows=tokens, count=count, dtype=self.low)
        f_out, b_out = self.linear(f"{prefix}.fc2", tokens, f, h, count=count)
        return f_in + [a_f] + f_out, b_out + [a_b] + b_in

    def moe(self):
        """Router + ``experts`` MLPs each seeing tokens·top_k/experts tokens (balanced routing).

        With expert parallelism over ``ep`` ranks a rank holds experts/ep of them, each
        receiving the routed tokens of all ep ranks: tokens·top_k·ep/experts. Split over etp ranks
        (Megatron-Core ``MoEAlltoAllTokenDispatcher``, core_v0.12.0: all-to-all over ep of the rank's
        1/tp sequence shard, then gathered over the etp ranks), an expert sees etp/tp of that, whole
        widths / etp; etp = tp (the default) gives the line above.
        """
        m = self.m
        f_r, b_r = self.linear("moe.router", self.T, m.hidden, m.experts, cast_input=self.mixed)
        per_expert = self.T * m.experts_per_token * self.ep / m.experts * self.etp / self.tp
        f_e, b_e = self.mlp(per_expert, count=m.experts // self.ep, prefix="moe.expert", cast_input=False,
                            split=self.etp)
        perm = self.T * m.experts_per_token * m.hidden * DTYPE_BYTES[self.low] / 4 * self.etp / self.tp
        f_p = [mem("moe.permute", "copy", "fwd", perm, count=2, variant="fwd")]
        b_p = [mem("moe.permute.bwd", "copy", "bwd", perm, count=2, variant="fwd")]
        f_s, b_s = self.shared_expert() if m.shared_ffn else ([], [])
        return f_r + f_p + f_e + f_s, b_s + b_e + b_p + b_r

    def shared_expert(self):
        """The shared expert on every local token (tensor-parallel like the dense MLP; Megatron-Core
        ``SharedExpertMLP``), its optional sigmoid gate, and the add of its output to the routed experts'
        (transformers ``modeling_qwen2_moe.py`` ``Qwen2MoeSparseMoeBlock.forward``)."""
        m, h = self.m, self.m.hidden
        fwd, bwd = self.mlp(self.T, prefix="moe.shared", width=m.shared_ffn)
        out = self.T * h  # 16-bit under autocast: the outputs of GEMMs
        if m.shared_gate:  # sigmoid(x · w) over one column, then the (tokens × hidden) product; backward: the
            f_g, b_g = self.linear("moe.shared_gate", self.T, h, 1, bias=False,  # product's two gradients
                                   cast_input=self.mixed)
            fwd = fwd + f_g + [mem("moe.shared_gate.mul", "residual_add", "fwd", out, rows=self.T, dtype=self.low)]
            bwd = [mem("moe.shared_gate.mul.bwd", "residual_add", "bwd", out, rows=self.T, count=2, variant="fwd",
                       dtype=self.low)] + bwd + b_g
        fwd = fwd + [mem("moe.shared_add", "residual_add", "fwd", out, rows=self.T, dtype=self.low)]
        return fwd, bwd

    def layer(self):
        n1f, n1b = self.norm("ln1")
        af, ab = self.attention()
        r1f, r1b = self.residual("res1")
        n2f, n2b = self.norm("ln2")
        mf, mb = self.moe() if self.m.experts > 1 else self.mlp(self.T)
        if self.m.dense_layers:  # the average block: the experts in moe_share of the blocks, a dense MLP in the rest
            share, (df, db) = self.m.moe_share, self.mlp(self.T, width=self.m.dense_ffn)
            mf, mb = _weighted(mf, share) + _weighted(df, 1 - share), _weighted(mb, share) + _weighted(db, 1 - share)
        if self.m.post_norms:  # Gemma 2/3: each branch's output normed before its residual add
            (p1f, p1b), (p2f, p2b) = self.norm("ln1_post"), self.norm("ln2_post")
            af, ab, mf, mb = af + p1f, p1b + ab, mf + p2f, p2b + mb
        r2f, r2b = self.residual("res2")
        fwd = n1f + af + r1f + n2f + mf + r2f
        bwd = mb + n2b + r2b + ab + n1b + r1b
        return fwd, bwd


def _weighted(kernels, share):
    """``kernels`` run in ``share`` of the blocks: their counts per average block."""
    return [replace(k, count=np.multiply(k.count, share)) for k in kernels]


def layer_kernels(model, micro_batch, *, tp=1, sp=False, precision="bf16-mixed",
                  recompute="none", ep=1, etp=None) -> tuple[list[Kernel], list[Kernel]]:
    """Kernels of one layer of any workload (a traced graph: the whole model): (forward, backward)."""
    check_choice("precision", precision, PRECISIONS)
    check_recompute(recompute)
    return model.layer_kernels(micro_batch, tp=tp, sp=sp, precision=precision, recompute=recompute, ep=ep, etp=etp)


def transformer_layer_kernels(model, micro_batch, *, tp=1, sp=False, precision="bf16-mixed",
                              recompute="none", ep=1, etp=None) -> tuple[list[Kernel], list[Kernel]]:
    """Kernels of one transformer block: (forward, backward incl. recomputation)."""
    fwd, bwd = _Builder(model, micro_batch, tp, sp, precision, ep, etp).layer()
    return fwd, recomputed_kernels(fwd, recompute, model) + bwd


def vocab_shard(vocab, tp, multiple=1):
    """Vocabulary rows per tensor-parallel rank, the vocabulary padded to a multiple of ``multiple`` x tp."""
    tp = np.asarray(tp, float)
    return np.ceil(vocab / (multiple * tp)) * multiple if multiple > 1 else vocab / tp


def embedding_kernels(model, micro_batch, *, tp=1, precision="bf16-mixed", vocab_multiple=1):
    """Kernels of the workload's embedding stage (none for a traced graph)."""
    return model.embedding_kernels(micro_batch, tp=tp, precision=precision, vocab_multiple=vocab_multiple)


def transformer_embedding_kernels(model, micro_batch, *, tp=1, precision="bf16-mixed",
                                  vocab_multiple=1):
    """Token (+ learned position) embedding: gather forward, scatter-add backward."""
    bld = _Builder(model, micro_batch, tp, False, precision)
    h, T = model.hidden, bld.T
    vocab_rows = vocab_shard(model.vocab, bld.tp, vocab_multiple)
    fwd = [Kernel("embed.tok", "embedding", "fwd", {"x": T * h, "rows": T}, 1, 0.0, "fwd", "fp32")]
    bwd = [Kernel("embed.tok.bwd", "embedding", "bwd", {"x": T * h, "y": vocab_rows * h}, 1, 0.0, "bwd", "fp32")]
    if model.position == "learned":
        fwd += [mem("embed.pos", "embedding", "fwd", model.seq * h, rows=model.seq),
                mem("embed.add", "residual_add", "fwd", T * h, rows=T)]
        bwd += [mem("embed.pos.grad", "sum", "bwd", T * h, variant="fwd")]
    if model.arch == "encoder":
        nf, nb = bld.norm("embed.ln")
        fwd += nf
        bwd += nb
    return fwd, bwd[::-1]


def head_kernels(model, micro_batch, *, tp=1, sp=False, precision="bf16-mixed", vocab_multiple=1):
    """Kernels of the workload's head and loss."""
    return model.head_kernels(micro_batch, tp=tp, sp=sp, precision=precision, vocab_multiple=vocab_multiple)


def transformer_head_kernels(model, micro_batch, *, tp=1, sp=False, precision="bf16-mixed",
                             vocab_multiple=1):
    """Final norm, LM head and cross-entropy on fp32 logits (vocabulary split over tp)."""
    bld = _Builder(model, micro_batch, tp, sp, precision)
    T, V = bld.T, vocab_shard(model.vocab, bld.tp, vocab_multiple)
    nf, nb = bld.norm("final_norm")
    lf, lb = bld.linear("lm_head", T, model.hidden, V, bias=False, cast_input=bld.mixed)
    fwd, bwd = nf + lf, []
    if model.logit_softcap:  # cap · tanh(logits / cap): three elementwise kernels each way on the 16-bit logits
        fwd += [mem("softcap.div", "copy", "fwd", T * V, variant="fwd", dtype=bld.low),
                mem("softcap.tanh", "gelu", "fwd", T * V, dtype=bld.low),
                mem("softcap.mul", "copy", "fwd", T * V, variant="fwd", dtype=bld.low)]
        bwd += [mem("softcap.div.bwd", "copy", "bwd", T * V, variant="fwd", dtype=bld.low),
                mem("softcap.tanh.bwd", "gelu", "bwd", T * V, dtype=bld.low),
                mem("softcap.mul.bwd", "copy", "bwd", T * V, variant="fwd", dtype=bld.low)]
    if bld.mixed:  # logits.float(): the loss runs on fp32 logits
        fwd.append(mem("logits.float", "cast_bf16_to_fp32", "fwd", T * V, variant="fwd"))
        bwd.append(mem("logits.grad_cast", "cast_fp32_to_bf16", "bwd", T * V, variant="fwd"))
    fwd.append(mem("loss", "cross_entropy", "fwd", T * V, rows=T))
    bwd.append(mem("loss.bwd", "cross_entropy", "bwd", T * V, rows=T))  # listed last, runs first
    if model.tied_embeddings:  # the head's weight gradient is added into the embedding's
        bwd.append(mem("tied.grad_add", "add", "bwd", V * model.hidden, variant="fwd"))
    return fwd, bwd[::-1] + lb + nb


def step_kernels(model, micro_batch, *, tp=1, sp=False, precision="bf16-mixed",
                 recompute="none", layers=None, first_stage=True, last_stage=True):
    """Forward and backward kernels of one micro-batch on one GPU (a pipeline stage)."""
    layers = model.layers if layers is None else layers
    lf, lb = layer_kernels(model, micro_batch, tp=tp, sp=sp, precision=precision, recompute=recompute)
    fwd = [k.scaled(layers) for k in lf]
    bwd = [k.scaled(layers) for k in lb]
    if first_stage:
        ef, eb = embedding_kernels(model, micro_batch, tp=tp, precision=precision)
        fwd, bwd = ef + fwd, bwd + eb
    if last_stage:
        hf, hb = head_kernels(model, micro_batch, tp=tp, sp=sp, precision=precision)
        fwd, bwd = fwd + hf, hb + bwd
    return fwd, bwd
