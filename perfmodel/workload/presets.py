"""Named model presets, read from ``data/presets.toml`` (published sizes with sources)."""

from __future__ import annotations

import inspect
from functools import lru_cache
from importlib import resources

from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.workload.model import Transformer, transformer
from perfmodel.core.readers import read_toml_file
from perfmodel.workload.cnn_presets import graph_preset, is_graph_preset, list_graph_presets

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

META_KEYS = ("published_params", "source")


@lru_cache(maxsize=1)
def _table() -> dict:
    text = (resources.files("perfmodel.workload") / "data" / "presets.toml").read_text()
    return tomllib.loads(text)


def list_presets() -> list[str]:
    """Transformer presets and the traced CNN/ViT graphs."""
    return sorted([*_table(), *list_graph_presets()])


def preset_info(name: str) -> dict:
    """The preset's published parameter count and source."""
    return {k: _table()[_key(name)][k] for k in META_KEYS}


def _key(name: str) -> str:
    key = str(name).lower()
    if key not in _table():
        raise unknown_name("model preset", name, list_presets())
    return key


def _check_fields(fields) -> None:
    """Every key an argument of ``transformer()`` (it would raise a bare TypeError otherwise)."""
    known = list(inspect.signature(transformer).parameters)
    for field in fields:
        if field not in known:
            raise unknown_name("model field", field, known)


def preset(name: str, **overrides) -> Transformer:
    """A bundled model by name; keyword overrides change fields (e.g. ``seq=4096``)."""
    if is_graph_preset(name):  # traced CNN/ViT workloads shipped as data (data/graphs/*.json)
        return graph_preset(name, **overrides)
    key = _key(name)
    fields = {k: v for k, v in _table()[key].items() if k not in META_KEYS}
    _check_fields(overrides)
    return transformer(**{"name": key, **fields, **overrides})


# The fields that give a transformer its shape; the others (seq, vocab, ...) have documented defaults
MODEL_TOML_SHAPE = ("layers", "hidden", "heads")


def model_from_toml(path) -> Transformer:
    """A transformer from a TOML file of its fields (``layers = 24``, ``hidden = 2048``, ...), optionally
    starting from a bundled one (``preset = "llama-3-8b"``) whose fields the others change."""
    from pathlib import Path

    data = read_toml_file(path, field="model", expect="a TOML file of model fields")
    data = data.get("model", data)  # the fields, at the top level or under [model]
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path}: [model] must be a table of model fields: got {data!r}")
    base = data.pop("preset", None)
    shape = [k for k in MODEL_TOML_SHAPE if k not in data]
    if base is None and shape:  # an empty or partial file would silently be GPT-2 small's shape
        raise InvalidInputError(f"{path}: a model TOML needs preset = \"<name>\" or the fields "
                                f"{', '.join(MODEL_TOML_SHAPE)} (missing: {', '.join(shape)})")
    data.setdefault("name", Path(path).stem)
    if base is not None:
        return preset(str(base), **{k: v for k, v in data.items() if k != "name"}).with_(name=data["name"])
    _check_fields(data)
    return transformer(**data)


def as_model(model):
    """``model`` itself, or the bundled preset when given its name (as clusters are taken by name)."""
    if isinstance(model, str):
        return preset(model)
    if not (hasattr(type(model), "params") or hasattr(model, "params")):  # the class first: no property evaluated
        raise InvalidInputError(f"'model' must be a preset name or a model (pm.transformer, pm.preset, "
                                f"pm.from_hf_config, pm.from_torch): got {type(model).__name__}")
    return model
