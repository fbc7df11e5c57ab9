"""Which of MPT's linear layers run fp8 under Composer: ``Strategy.fc_type``.

Composer's ``precision: amp_fp8`` enters Transformer Engine's ``te.fp8_autocast`` and nothing else
(mosaicml/composer 6405188 ``composer/core/precision.py`` ``get_precision_context``; no
``torch.autocast`` in that branch), and ``fp8_autocast`` turns only Transformer Engine modules fp8.
llm-foundry's MPT builds its linears from ``fc_type`` (mosaicml/llm-foundry 8c8dd48
``llmfoundry/models/layers/fc.py``: ``"torch"`` is ``nn.Linear``, ``"te"`` is ``te.Linear``), and
its default is ``"torch"`` (``models/utils/config_defaults.py`` ``fc_type_defaults``), so an
``amp_fp8`` run with MPT's defaults has no fp8 layer: every GEMM runs in the bf16 that FSDP's
``mixed_precision: PURE`` casts the parameters to. llm-foundry's ``TUTORIAL.md`` pairs ``amp_fp8``
with ``fc_type: te``.

``fc_type=None`` (the default) under ``precision="fp8-mixed"`` prices the linears as ``"te"``, the
pairing the tutorial gives, and says so in the prediction's caveats; ``fc_type="torch"`` prices the
step its code runs, bf16 GEMMs throughout (``run_strategy``).
"""

from __future__ import annotations

from dataclasses import replace

from perfmodel.core.checks import check_choice
from perfmodel.core.errors import UnsupportedError

FC_TYPES = ("torch", "te")  # MPTConfig fc_type: llmfoundry/models/layers/fc.py FC_CLASS_REGISTRY
TAKES_FC_TYPE = ("composer",)


def check_fc_type(framework: str, fc_type):
    """``fc_type`` checked: one of ``FC_TYPES``, for a stack that builds MPT's layers; None stays None."""
    if fc_type is None:
        return None
    check_choice("fc_type", fc_type, FC_TYPES)
    if framework not in TAKES_FC_TYPE:
        raise UnsupportedError(f"'fc_type'={fc_type!r} picks the linear layers llm-foundry's MPT builds under "
                               f"Composer: it does not apply to framework={framework!r}; the stack that takes "
                               f"it: {', '.join(TAKES_FC_TYPE)}")
    return fc_type


def runs_no_fp8(s) -> bool:
    """True where ``s`` asks for fp8 but its layers have none (Composer's amp_fp8 over torch linears)."""
    return s.framework in TAKES_FC_TYPE and s.fc_type == "torch" and s.precision == "fp8-mixed"


def run_strategy(s):
    """The strategy whose kernels a step of ``s`` runs: ``s`` itself, but bf16-mixed where ``runs_no_fp8``."""
    return replace(s, precision="bf16-mixed", float8_recipe=None) if runs_no_fp8(s) else s


def fc_type_caveats(s) -> tuple:
    """What a Composer fp8 prediction assumed about MPT's layers, in words."""
    if s.framework not in TAKES_FC_TYPE or s.precision != "fp8-mixed":
        return ()
    if s.fc_type == "torch":
        return ("fc_type='torch': Composer's amp_fp8 is te.fp8_autocast alone, which turns no nn.Linear fp8, "
                "so every GEMM is priced bf16 (as precision='bf16-mixed')",)
    if s.fc_type is None:
        return ("fp8 linears priced as Transformer Engine's (fc_type='te', the pairing llm-foundry's TUTORIAL "
                "gives amp_fp8); MPT's default fc_type='torch' has none and runs every GEMM bf16: pass "
                "fc_type='torch' to price that",)
    return ()
