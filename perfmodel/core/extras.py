"""Optional dependencies: import one, or say which extra of perfmodel installs it.

    plt = optional_import("matplotlib", extra="plot", feature="plots")
"""

from __future__ import annotations

import importlib

from perfmodel.core.errors import UnsupportedError

# extra of pyproject.toml -> the distributions it adds (kept in step with [project.optional-dependencies])
EXTRAS = {"plot": ("matplotlib",), "torch": ("torch", "tqdm"), "hf": ("huggingface_hub",)}


def optional_import(module: str, *, extra: str, feature: str):
    """``module`` imported, or an UnsupportedError naming the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and not module.startswith(exc.name):  # the module is there but one of its own imports fails
            raise
        raise UnsupportedError(f"{feature} need {module.split('.')[0]}, which is not installed: "
                               f"pip install 'perfmodel[{extra}]'") from None


def require_installed(module: str, *, extra: str, feature: str) -> None:
    """Raise :func:`optional_import`'s error when ``module`` is not installed, without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):  # a module entry set to None (blocked) or a broken parent package
        found = False
    if not found:
        raise UnsupportedError(f"{feature} need {module.split('.')[0]}, which is not installed: "
                               f"pip install 'perfmodel[{extra}]'")
