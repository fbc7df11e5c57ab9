"""Heavy optional imports deferred to first use, so ``import perfmodel`` stays light.

``sympy`` below is a stand-in for the module: the first attribute looked up on it
imports sympy (about a second on a busy machine) and delegates every later lookup.
Predictions never touch it; symbolic formulas (``Profile.formula``,
``perfmodel.analysis.symbolic``) do. ``pandas`` likewise: the package root reaches
the datasheet derivation (``profiles/reference.py`` reads its table with pandas),
which runs only for a GPU without a bundled profile. ``scipy_optimize`` and
``scipy_special``: the fits, root finders and revocation laws (about 0.6 s of import
that ``perfmodel --help`` and ``perfmodel predict`` need not pay).
"""

from __future__ import annotations

import importlib
import sys


class LazyModule:
    """A module imported when one of its attributes is first read."""

    def __init__(self, name: str):
        self._name = name

    def _module(self):
        return sys.modules.get(self._name) or importlib.import_module(self._name)

    def __getattr__(self, attr):
        return getattr(self._module(), attr)

    def loaded(self) -> bool:
        """Whether the real module is imported already (no import is triggered)."""
        return self._name in sys.modules

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{' (loaded)' if self.loaded() else ''}>"


sympy = LazyModule("sympy")
pandas = LazyModule("pandas")
scipy_optimize = LazyModule("scipy.optimize")
scipy_special = LazyModule("scipy.special")
