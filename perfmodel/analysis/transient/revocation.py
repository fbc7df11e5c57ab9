"""How long a transient (spot / preemptible) server lives before the provider revokes it.

Three lifetime models, each with an optional hard maximum lifetime (GCE
preemptible VMs are always stopped after 24 h):

* :class:`Exponential` — constant hazard 1/M, memoryless (the model behind the
  Young/Daly checkpoint interval and the closed form in :mod:`.checkpoint`);
* :class:`Weibull` — hazard that falls (shape < 1) or rises (shape > 1) with age;
* :class:`PiecewiseHazard` — a constant hazard per age band, e.g. the
  "bathtub" of GCE preemptible VMs (high in the first hour, low, then high
  again before the 24 h limit; Kadupitiya, Jadhao, Sharma, HPDC 2020).

Every model samples a residual lifetime given the server's age by inverting
the cumulative hazard H: residual = H⁻¹(H(age) + E) − age with E ~ Exp(1)
(inverse-transform sampling, e.g. Devroye 1986, ch. 2), capped at the maximum
lifetime. Times are seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from perfmodel.core.lazy import scipy_special as special

from perfmodel.core.errors import InvalidInputError
from perfmodel.analysis.transient._tables import check_rate, load_table
from perfmodel.core.checks import check_choice, check_positive

SECONDS_PER_MONTH = 30 * 86400.0  # the "trailing month" of the AWS Spot Instance Advisor


def _check_max_lifetime(owner: str, value) -> float:
    if value is None or value == math.inf:
        return math.inf
    return check_positive(f"{owner}.max_lifetime_s", value)


class _Lifetime:
    """Shared behaviour: survival, mean lifetime, residual-life sampling."""

    max_lifetime_s: float

    def cumulative_hazard(self, t):  # pragma: no cover - overridden
        raise NotImplementedError

    def inverse_cumulative_hazard(self, h):  # pragma: no cover - overridden
        raise NotImplementedError

    def survival(self, t):
        """P(lifetime > t); zero at and beyond the maximum lifetime."""
        t = np.asarray(t, dtype=float)
        return np.where(t < self.max_lifetime_s, np.exp(-self.cumulative_hazard(t)), 0.0)

    def sample_residual(self, age_s, rng: np.random.Generator):
        """Remaining lifetime of servers that have survived to ``age_s`` (array, seconds)."""
        age = np.asarray(age_s, dtype=float)
        e = rng.exponential(1.0, size=age.shape)
        with np.errstate(over="ignore", invalid="ignore"):
            death = self.inverse_cumulative_hazard(self.cumulative_hazard(age) + e)
        return np.maximum(np.minimum(death, self.max_lifetime_s) - age, 0.0)


@dataclass(frozen=True)
class Exponential(_Lifetime):
    """Constant hazard 1/``mtbf_s`` (mean time between revocations, seconds)."""

    mtbf_s: float
    max_lifetime_s: float = math.inf

    def __post_init__(self):
        object.__setattr__(self, "mtbf_s", check_positive("Exponential.mtbf_s", self.mtbf_s))
        object.__setattr__(self, "max_lifetime_s",
                           _check_max_lifetime("Exponential", self.max_lifetime_s))

    def cumulative_hazard(self, t):
        return np.asarray(t, dtype=float) / self.mtbf_s  # H(t) = t / M

    def inverse_cumulative_hazard(self, h):
        return np.asarray(h, dtype=float) * self.mtbf_s

    @property
    def mean_lifetime_s(self) -> float:
        # ∫₀ᴸ e^{-t/M} dt = M (1 - e^{-L/M})
        return self.mtbf_s * -math.expm1(-self.max_lifetime_s / self.mtbf_s)


@dataclass(frozen=True)
class Weibull(_Lifetime):
    """Weibull lifetime: H(t) = (t / ``scale_s``) ** ``shape``."""

    scale_s: float
    shape: float
    max_lifetime_s: float = math.inf

    def __post_init__(self):
        object.__setattr__(self, "scale_s", check_positive("Weibull.scale_s", self.scale_s))
        object.__setattr__(self, "shape", check_positive("Weibull.shape", self.shape))
        object.__setattr__(self, "max_lifetime_s",
                           _check_max_lifetime("Weibull", self.max_lifetime_s))

    def cumulative_hazard(self, t):
        return (np.asarray(t, dtype=float) / self.scale_s) ** self.shape

    def inverse_cumulative_hazard(self, h):
        return self.scale_s * np.asarray(h, dtype=float) ** (1.0 / self.shape)

    @property
    def mean_lifetime_s(self) -> float:
        # ∫₀ᴸ e^{-(t/η)^k} dt = η Γ(1 + 1/k) P(1/k, (L/η)^k), P the regularised lower gamma
        k, eta = self.shape, self.scale_s
        try:
            full = eta * math.gamma(1.0 + 1.0 / k)
        except OverflowError:
            raise InvalidInputError(f"Weibull.shape={k:g} is too small: the mean lifetime Γ(1 + 1/k)·scale overflows "
                                    "(shapes of real servers lie around 0.5-5)") from None
        if math.isinf(self.max_lifetime_s):
            return full
        return full * float(special.gammainc(1.0 / k, (self.max_lifetime_s / eta) ** k))


@dataclass(frozen=True)
class PiecewiseHazard(_Lifetime):
    """Constant hazard ``rates_per_s[i]`` on ages [``edges_s[i]``, ``edges_s[i+1]``).

    ``edges_s`` starts at 0 and increases; the last rate holds for all later ages.
    """

    edges_s: tuple
    rates_per_s: tuple
    max_lifetime_s: float = math.inf

    def __post_init__(self):
        edges = tuple(float(e) for e in self.edges_s)
        rates = tuple(float(r) for r in self.rates_per_s)
        if not edges or edges[0] != 0.0 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise InvalidInputError(
                f"'edges_s' must start at 0 and increase strictly: got {list(self.edges_s)}")
        if len(rates) != len(edges):
            raise InvalidInputError(
                f"'rates_per_s' must have one rate per edge ({len(edges)}): got {len(rates)}")
        for i, r in enumerate(rates):
            if not math.isfinite(r) or r < 0:
                raise InvalidInputError(
                    f"'rates_per_s' must be finite and >= 0 (revocations per second): "
                    f"got {r!r} at index {i}")
        max_life = _check_max_lifetime("PiecewiseHazard", self.max_lifetime_s)
        if rates[-1] == 0 and math.isinf(max_life):
            raise InvalidInputError("the last of 'rates_per_s' must be > 0 unless "
                                    "'max_lifetime_s' is finite (else servers never end)")
        object.__setattr__(self, "edges_s", edges)
        object.__setattr__(self, "rates_per_s", rates)
        object.__setattr__(self, "max_lifetime_s", max_life)

    def _knots(self):
        edges, rates = np.array(self.edges_s), np.array(self.rates_per_s)
        cum = np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(edges))])  # H at each edge
        return edges, rates, cum

    def cumulative_hazard(self, t):
        edges, rates, cum = self._knots()
        t = np.asarray(t, dtype=float)
        i = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
        return cum[i] + rates[i] * (t - edges[i])

    def inverse_cumulative_hazard(self, h):
        edges, rates, cum = self._knots()
        h = np.asarray(h, dtype=float)
        i = np.clip(np.searchsorted(cum, h, side="right") - 1, 0, len(edges) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = edges[i] + (h - cum[i]) / rates[i]
        return np.where(rates[i] > 0, t, np.inf)

    @property
    def mean_lifetime_s(self) -> float:
        edges, rates, cum = self._knots()
        ends = np.minimum(np.append(edges[1:], np.inf), self.max_lifetime_s)
        total = 0.0
        for a, b, r, c in zip(edges, ends, rates, cum):
            if b <= a:
                break
            width = b - a  # ∫ₐᵇ e^{-c - r(t-a)} dt = e^{-c} (1 - e^{-r w}) / r
            total += math.exp(-c) * (width if r == 0 else -math.expm1(-r * width) / r)
        return total


Lifetime = Exponential | Weibull | PiecewiseHazard


def mtbf_from_monthly_interruption(fraction: float) -> float:
    """Exponential MTBF (s) such that ``fraction`` of servers are revoked within 30 days.

    The AWS Spot Instance Advisor publishes the "frequency of interruption"
    over the trailing month in bands (<5 %, 5-10 %, ... >20 %).
    P(revoked within T) = 1 - e^{-T/M}  =>  M = T / -ln(1 - fraction).
    """
    f = check_positive("fraction", fraction)
    if f >= 1:
        raise InvalidInputError(f"'fraction' must be in (0, 1): got {fraction!r}")
    return SECONDS_PER_MONTH / -math.log1p(-f)


def as_lifetime(value, field: str = "revocation") -> Lifetime:
    """A lifetime model from a model or an MTBF in seconds (exponential)."""
    if isinstance(value, _Lifetime):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidInputError(
            f"{field!r} must be an Exponential, Weibull or PiecewiseHazard model, or an "
            f"MTBF in seconds: got {value!r}")
    return Exponential(check_positive(f"{field} (MTBF, s)", float(value)))


# --- the bundled / user table -------------------------------------------------------------

MODELS = ("exponential", "weibull", "piecewise")
COLUMNS = ["provider", "region", "gpu", "kind", "model", "mtbf_s", "scale_s", "shape",
           "edges_s", "rates_per_s", "max_lifetime_s", "mean_lifetime_s",
           "replacement_wait_s", "restart_s", "storage_bw_bytes_per_s",
           "source", "date", "quality"]


def _model_of(row: dict, origin: str) -> Lifetime:
    kind = check_choice(f"{origin}: model", row.get("model", "exponential"), MODELS)
    max_life = row.get("max_lifetime_s", math.inf)
    try:
        if kind == "exponential":
            return Exponential(row.get("mtbf_s"), max_life)
        if kind == "weibull":
            return Weibull(row.get("scale_s"), row.get("shape"), max_life)
        return PiecewiseHazard(tuple(row.get("edges_s", ())), tuple(row.get("rates_per_s", ())),
                               max_life)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{origin}: {exc}") from None


def _check_row(row: dict, origin: str) -> dict:
    model = _model_of(row, origin)
    out = {c: row.get(c) for c in COLUMNS}
    out["model"] = row.get("model", "exponential")
    out["max_lifetime_s"] = model.max_lifetime_s
    out["mean_lifetime_s"] = model.mean_lifetime_s
    for field in ("replacement_wait_s", "restart_s"):
        out[field] = check_rate(origin, field, row.get(field, 0.0))
    out["storage_bw_bytes_per_s"] = check_rate(
        origin, "storage_bw_bytes_per_s", row.get("storage_bw_bytes_per_s"), allow_zero=False)
    for field in ("edges_s", "rates_per_s"):
        out[field] = tuple(row[field]) if field in row else None
    return out


def load_revocation(path=None) -> pd.DataFrame:
    """Revocation models per provider/region/GPU: bundled ``data/revocation.toml``.

    A user file (same schema) is merged over it: a row with the same
    provider, region and gpu replaces the bundled one, others are added.
    """
    return load_table("revocation.toml", "revocation", path, COLUMNS, _check_row)


def revocation_model(row) -> Lifetime:
    """The lifetime model described by one row of :func:`load_revocation`."""
    row = dict(row)
    clean = {k: v for k, v in row.items()
             if not (isinstance(v, float) and math.isnan(v)) and v is not None}
    return _model_of(clean, f"revocation {row.get('provider')}/{row.get('region')}/{row.get('gpu')}")
