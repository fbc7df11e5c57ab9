"""``import perfmodel`` and one prediction load none of the heavy optional libraries.

sympy, scipy, scikit-learn, matplotlib and tqdm are imported where they are used
(symbolic formulas, fitting, plots); a planner who only predicts never pays for them.
"""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("sympy", "scipy", "sklearn", "matplotlib", "tqdm", "torch")


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split()) & set(HEAVY)


def test_import_and_predict_load_no_heavy_library():
    code = ("import perfmodel as pm\n"
            "pm.predict('gpt2-small', 'h200', pm.Strategy(micro_batch=8))")
    assert _loaded_after(code) == set()


def test_symbolic_formula_still_loads_sympy_on_use():
    code = ("import perfmodel as pm\n"
            "e = pm.load_profile('h100-sxm5-80gb').formula('gemm', dtype='bf16')\n"
            "assert e.free_symbols")
    assert "sympy" in _loaded_after(code)



def test_cli_help_loads_no_scipy():
    # why the fit/validate/plan/sites back ends are imported when their command runs (tests/test_imports.py)
    probe = "import sys\nfrom perfmodel.cli import build_parser\nbuild_parser()\nprint('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
