"""Which expert-parallel layouts a strategy may name, for a model: ``ep`` and Megatron-Core's ``etp``."""

from __future__ import annotations

from perfmodel.core.checks import check_divides, check_size
from perfmodel.core.errors import InvalidInputError, UnsupportedError


def check_expert_tp(etp, tp: int, framework: str):
    """``etp`` as given (None: tp), checked. Megatron-Core's --expert-tensor-parallel-size (core_r0.10
    ``parallel_state.initialize_model_parallel``: expert_tensor_parallel_size defaults to tensor_model_parallel_size)
    splits each expert's linears over other ranks than tp; the other stacks split them by tp."""
    if etp is None:
        return None
    etp = check_size("etp", etp, limit="tp")
    if etp != tp and framework != "megatron":
        raise UnsupportedError(f"'etp'={etp} (experts split over other ranks than tp={tp}) is Megatron-Core's "
                               f"--expert-tensor-parallel-size: use framework='megatron' (got {framework!r}), "
                               f"or leave etp unset")
    return etp


def check_experts(model, ep: int, etp, tp: int) -> None:
    """``ep`` > 1 needs a MoE model whose experts it divides; an ``etp`` other than tp a MoE model whose expert
    width it divides."""
    experts = getattr(model, "experts", 1)
    if ep > 1:
        if experts <= 1:
            raise InvalidInputError(f"expert parallelism ('ep'={ep}) needs a mixture-of-experts model "
                                    f"(got experts={experts})")
        check_divides("ep", ep, "experts", experts)
    if etp is not None and etp != tp:
        if experts <= 1:
            raise InvalidInputError(f"'etp'={etp} splits a mixture-of-experts model's experts (got experts="
                                    f"{experts}): leave etp unset for a dense model")
        check_divides("etp", etp, "ffn_hidden", model.ffn_hidden)


def check_expert_grid(ep: int, etp, *, tp: int, cp: int, dp: int) -> None:
    """Where the ep (× etp) expert ranks lie: among the dp × cp data-parallel ranks when etp is unset (experts split
    by tp), over a stage's tp × cp × dp ranks when it is set (Megatron-Core ``parallel_state``: expert data parallel
    = world / (etp × ep × pp), which must be whole)."""
    if etp is None and ep > 1 and (dp * cp) % ep:
        raise InvalidInputError(f"expert-parallel ranks are data-parallel ranks: 'ep'={ep} must divide "
                                f"dp × cp = {dp * cp} (or set 'etp' to fold experts over tp ranks too)")
    if etp is not None and (tp * cp * dp) % (ep * etp):
        raise InvalidInputError(f"the expert grid ep × etp = {ep} × {etp} must divide a stage's tp × cp × dp = "
                                f"{tp * cp * dp} ranks (Megatron-Core: expert data parallel = world / (etp × ep × pp))")
