"""On-demand and spot GPU prices ($ per GPU-hour), and the cost of GPU time.

Prices live in ``data/prices.toml`` (each with its source and date); a user
file with the same schema is merged over them by :func:`load_prices`.
"""

from __future__ import annotations

import re

import pandas as pd

from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.analysis.transient._tables import check_rate, load_table

COLUMNS = ["provider", "region", "gpu", "on_demand_usd_per_gpu_hour", "spot_usd_per_gpu_hour",
           "spot_kind", "host", "source", "spot_source", "date", "quality", "spot_quality"]
SECONDS_PER_HOUR = 3600.0


def _check_row(row: dict, origin: str) -> dict:
    out = {c: row.get(c) for c in COLUMNS}
    for field in ("on_demand_usd_per_gpu_hour", "spot_usd_per_gpu_hour"):
        out[field] = check_rate(origin, field, row.get(field))
    return out


def load_prices(path=None) -> pd.DataFrame:
    """GPU prices per provider/region/GPU: bundled ``data/prices.toml`` merged with ``path``.

    A row of the user file with the same provider, region and gpu replaces
    the bundled one; other rows are added. Negative prices are rejected.
    """
    return load_table("prices.toml", "price", path, COLUMNS, _check_row)


def gpu_key(name, known) -> str | None:
    """The entry of ``known`` that names this GPU: ``"dgx-a100-80gb"`` -> ``"A100"``.

    Matches whole tokens (split on anything not a letter or digit), case-blind,
    so "A10" never matches "A100".
    """
    table = {str(k).upper(): k for k in known}
    for token in re.split(r"[^0-9A-Za-z]+", str(name).upper()):
        if token in table:
            return table[token]
    return None


# the keyword of plan_training that takes each table, and the TOML array its rows are written in
TABLE_KEYS = {"prices": "price", "revocation": "revocation"}


def select_row(table: pd.DataFrame, gpu: str, provider=None, region=None, *, what: str):
    """The row for ``gpu`` (and ``provider``/``region`` when given); else a listing error.

    Without a provider, GCP is preferred, then the first provider listed;
    without a region, the first region listed for that provider.
    """
    key = gpu_key(gpu, table["gpu"].unique())
    if key is None:
        err = unknown_name(f"GPU in the {what} table", gpu, table["gpu"].unique())
        raise type(err)(f"{err}; give its row in a TOML file of your own ({what}=PATH, one [[{TABLE_KEYS[what]}]] "
                         "table per provider, region and GPU, as docs/transient.md shows)")
    rows = table[table["gpu"] == key]
    if provider is not None:
        rows = rows[rows["provider"].str.lower() == str(provider).lower()]
        if rows.empty:
            have = table.loc[table["gpu"] == key, "provider"].unique()
            raise unknown_name(f"provider with {key} in the {what} table", provider, have)
    elif (rows["provider"] == "gcp").any():
        rows = rows[rows["provider"] == "gcp"]
    else:
        rows = rows[rows["provider"] == rows["provider"].iloc[0]]
    if region is not None:
        picked = rows[rows["region"].str.lower() == str(region).lower()]
        if picked.empty:
            raise unknown_name(f"region for {key} on {rows['provider'].iloc[0]} in the {what} "
                               f"table", region, rows["region"].unique())
        rows = picked
    return rows.iloc[0]


def cost_usd(gpu_seconds, usd_per_gpu_hour):
    """Cost of GPU time: GPU-seconds / 3600 x $ per GPU-hour (broadcasts)."""
    if pd.api.types.is_scalar(usd_per_gpu_hour) and usd_per_gpu_hour < 0:
        raise InvalidInputError(f"'usd_per_gpu_hour' must be >= 0: got {usd_per_gpu_hour!r}")
    return gpu_seconds / SECONDS_PER_HOUR * usd_per_gpu_hour
