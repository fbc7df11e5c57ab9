"""Figures of sweeps and comparisons (matplotlib, Agg canvas: no display, no pyplot state).

    fig = sweep_figure(pm.sweep(model, over="nodes", values=[1, 2, 4], cluster=c, strategy=s))
    save_figure(fig, "scaling.png")

A sweep over GPU or node counts draws throughput against GPU count with the
ideal (linear) line, the scaling efficiency, a stacked bar of each
configuration's step-time breakdown and memory per GPU against capacity.
Other sweeps and comparisons draw the same panels against the swept value or
the strategy label.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.costs.memory import ALLOCATOR_RESERVE, CUDA_CONTEXT_BYTES
from perfmodel.core.errors import InvalidInputError
from perfmodel.core.extras import optional_import

BREAKDOWN = (("forward", "forward"), ("backward", "backward"), ("host_overhead", "host (launch)"),
             ("tp_comm", "tensor-parallel comm."), ("pipeline_bubble", "pipeline bubble"),
             ("p2p", "pipeline send/recv"), ("dp_comm", "data-parallel comm."), ("optimizer", "optimizer"))
MEMORY = (("mem_weights", "weights (fp32)"), ("mem_weight_copies", "weight copies (bf16)"),
          ("mem_optimizer", "optimizer states"), ("mem_gradients", "gradients"),
          ("mem_comm_buffers", "communication buffers"), ("mem_activations", "activations"),
          ("mem_loss", "loss (fp32 logits)"))
SUFFIXES = (".png", ".svg", ".pdf")
GIB = 2.0**30


def _figure(rows: int, cols: int, size):
    optional_import("matplotlib", extra="plot", feature="plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def save_figure(fig, path) -> Path:
    """Write ``fig`` as PNG, SVG or PDF (by suffix)."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise InvalidInputError(f"'--plot' must end in one of {', '.join(SUFFIXES)}: got {str(path)!r}")
    fig.savefig(path, dpi=130)
    return path


def _scale(values) -> tuple[float, str]:
    top = float(np.nanmax(values)) if len(values) else 0.0
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if top >= factor:
            return factor, unit
    return 1e-6, "µs"


def _wrap(label: str, width: int = 10) -> str:
    """Break a long label after commas, spaces or '+' into lines of about ``width`` characters."""
    import re

    lines, line = [], ""
    for part in re.findall(r"[^,+ ]+[,+ ]?|[,+ ]", label):
        if line and len(line) + len(part.rstrip()) > width:
            lines.append(line.rstrip())
            line = part
        else:
            line += part
    return "\n".join([*lines, line.rstrip()])


ROTATE_ABOVE = 4  # more tick labels than this are drawn upright (rotated 90°) so neighbours do not overlap


def _xticks(ax, x, labels) -> None:
    if len(labels) > ROTATE_ABOVE:
        ax.set_xticks(x, [_wrap(label, 24) for label in labels], fontsize="x-small", rotation=90)
    else:
        ax.set_xticks(x, [_wrap(label) for label in labels], fontsize="small")


def _log_if_wide(ax, values, span: float = 10.0) -> bool:
    """Log y axis where positive values span more than ``span`` (strong scaling: seconds to milliseconds)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > span:
        ax.set_yscale("log")
        return True
    return False


def _thousands(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _legend_room(ax, top: float) -> None:
    """Leave the upper part of the axes to the legend so it covers no bar."""
    ax.set_ylim(0, top * 1.5 if top > 0 else 1.0)
    ax.legend(fontsize="x-small", ncols=2, loc="upper left")


def breakdown_bars(ax, df, labels) -> None:
    """Stacked bars of each row's step-time breakdown, with the predicted step time marked.

    Where the step exceeds the sum of the parts (a pipeline whose slowest stage is
    not the one the breakdown describes), the excess is drawn hatched.
    """
    factor, unit = _scale(df["step_time"].to_numpy())
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for i, (key, name) in enumerate(BREAKDOWN):
        if key in df and float(df[key].max()) > 0:
            values = df[key].to_numpy(float) / factor
            ax.bar(x, values, 0.7, bottom=bottom, label=name, color=f"C{i}")
            bottom += values
    step = df["step_time"].to_numpy(float) / factor
    excess = np.where(step - bottom > 0.005 * step, step - bottom, 0.0)
    if excess.any():
        ax.bar(x, excess, 0.7, bottom=bottom, label="slowest-stage excess", color="white", edgecolor="gray",
               hatch="//")
    ax.scatter(x, step, marker="_", s=400, color="black", zorder=3, label="step time")
    _xticks(ax, x, labels)
    ax.set_ylabel(f"time per step ({unit})")
    ax.set_title("Where a step's time goes")
    top = float(np.max(np.maximum(step, bottom + excess)))
    if _log_if_wide(ax, step):
        ax.set_ylim(float(np.min(step[step > 0])) / 3, top * 10)
        ax.legend(fontsize="x-small", ncols=2, loc="upper right")
    else:
        _legend_room(ax, top)


def _memory_columns(df) -> list[str]:
    known = [key for key, _ in MEMORY if key in df]
    return known + sorted(c for c in df.columns if c.startswith("mem_") and c not in known)


def alive_at_peak(df) -> dict:
    """Memory terms alive at each row's peak moment (bytes); compose reports exactly those, so they sum to it."""
    return {key: df[key].to_numpy(float) for key in _memory_columns(df)}


def memory_bars(ax, df, labels) -> None:
    """Stacked bars of the memory alive at each row's peak, against capacity and what is usable of it."""
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for i, (key, values) in enumerate(alive_at_peak(df).items()):
        if values.max() > 0:
            name = dict(MEMORY).get(key, key[4:].replace("_", " "))
            ax.bar(x, values / GIB, 0.7, bottom=bottom, label=name, color=f"C{i}")
            bottom += values / GIB
    capacity = df["memory_capacity"].to_numpy(float)
    usable = (capacity - CUDA_CONTEXT_BYTES) / (1 + ALLOCATOR_RESERVE) / GIB
    edges = np.r_[x - 0.5, x[-1] + 0.5]
    ax.step(edges, np.r_[capacity, capacity[-1]] / GIB, where="post", color="red", label="GPU memory")
    ax.step(edges, np.r_[usable, usable[-1]], where="post", color="red", linestyle=":",
            label="usable (less reserve, CUDA context)")
    for xi, fits, top in zip(x, df["fits"], bottom):
        if not bool(fits):
            ax.bar(xi, top, 0.7, fill=False, edgecolor="red", linewidth=2)
            ax.annotate("does not fit", (xi, top), xytext=(0, -4), textcoords="offset points", ha="center",
                        va="top", fontsize="small", color="white", fontweight="bold", rotation=90)
    _xticks(ax, x, labels)
    ax.set_ylabel("memory per GPU at its peak (GiB)")
    ax.set_title("Peak memory per GPU")
    _legend_room(ax, float(max(bottom.max(), capacity.max() / GIB)))


def _gpu_axis(ax, x) -> None:
    """Log-2 GPU axis with the swept counts written out (8, 16, ..., 1,024)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(x))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _unfit(ax, x, y, fits) -> None:
    if (~fits).any():
        ax.scatter(x[~fits], y[~fits], marker="x", s=80, color="red", zorder=3, label="does not fit")


def _throughput(ax, df, x, xlabel, log2: bool) -> None:
    tps = df["tokens_per_second"].to_numpy(float)
    fits = df["fits"].to_numpy(bool)
    ax.plot(x, tps, marker="o", label="predicted")
    _unfit(ax, x, tps, fits)
    if log2:
        base = int(np.argmax(fits)) if fits.any() else 0
        ax.plot(x, tps[base] * x / x[base], linestyle="--", color="gray", label="linear scaling")
        _gpu_axis(ax, x)
        ax.set_yscale("log")
    else:
        _thousands(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Training throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def _efficiency(ax, df, x, xlabel, log2: bool, label=None, color="C2") -> None:
    if "scaling_efficiency" in df:
        y, name = df["scaling_efficiency"].to_numpy(float) * 100, "scaling efficiency (%)"
        title = "Scaling efficiency (tokens/s per GPU vs. the first point that fits)"
    else:
        y, name, title = df["mfu"].to_numpy(float) * 100, "model FLOPs utilisation (%)", "MFU"
    fits = df["fits"].to_numpy(bool)
    if not np.isfinite(y).any():  # no point fits: nothing to be efficient about
        ax.text(0.5, 0.5, "no point fits in memory", transform=ax.transAxes, ha="center", color="red")
    else:
        if "scaling_efficiency" in df:
            ax.axhline(100, color="gray", linestyle="--", linewidth=1)
        ax.plot(x, y, marker="o", color=color, label=label)
        _unfit(ax, x, np.where(np.isfinite(y), y, 0.0), fits)
    if log2:
        _gpu_axis(ax, x)
    top = float(np.nanmax(y)) if np.isfinite(y).any() else 0.0
    ax.set_ylim(0, max(105.0, top * 1.05))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(name)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)


def _default_title(df) -> str:
    a = df.attrs
    batches = sorted(set(int(b) for b in df["global_batch"])) if "global_batch" in df else []
    batch = (f", global batch {batches[0]:,}" if len(batches) == 1 else
             f", global batch {batches[0]:,}–{batches[-1]:,}" if batches else "")
    gpu = f" on {df['gpu'].iloc[0]}" if "gpu" in df and df["gpu"].nunique() == 1 else ""
    scaling = f" ({a['scaling']} scaling)" if a.get("over") in ("nodes", "gpus") and a.get("scaling") else ""
    return f"{a.get('model', '')}{gpu}: {a.get('strategy', '')}{batch}, sweep over {a.get('over', '')}{scaling}"


def overlay_figure(sweeps, *, title: str | None = None):
    """Throughput and efficiency of several sweeps over the same axis in one figure, e.g.
    ``{"FSDP": pm.sweep(...), "3D": pm.sweep(...)}``; one line per sweep."""
    items = list(sweeps.items())
    if not items:
        raise InvalidInputError("'sweeps' must map labels to at least one pm.sweep result: got none")
    over = items[0][1].attrs.get("over") or items[0][1].columns[0]
    log2 = over in ("nodes", "gpus")
    fig, axes = _figure(1, 2, (13, 5))
    for i, (label, df) in enumerate(items):
        x = df["gpus"].to_numpy(float) if log2 else np.arange(len(df), dtype=float)
        tps = df["tokens_per_second"].to_numpy(float)
        axes[0, 0].plot(x, tps, marker="o", color=f"C{i}", label=f"{label} ({df.attrs.get('strategy', '')})")
        _unfit(axes[0, 0], x, tps, df["fits"].to_numpy(bool))
        _efficiency(axes[0, 1], df, x, "GPUs" if log2 else over, log2, label=label, color=f"C{i}")
    for ax in axes[0]:
        if log2:
            _gpu_axis(ax, np.unique(np.concatenate([d["gpus"].to_numpy(float) for _, d in items])))
        ax.set_xlabel("GPUs" if log2 else over.replace("_", " "))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    if log2:
        axes[0, 0].set_yscale("log")
    axes[0, 0].set_ylabel("throughput (tokens/s)")
    axes[0, 0].set_title("Training throughput")
    fig.suptitle(title or f"{items[0][1].attrs.get('model', '')}: " + " vs ".join(label for label, _ in items))
    return fig


def sweep_figure(df, *, title: str | None = None):
    """Four panels of a ``pm.sweep`` result: throughput, efficiency, time breakdown, memory.
    A mapping of label -> sweep draws them overlaid (``overlay_figure``)."""
    if isinstance(df, dict):
        return overlay_figure(df, title=title)
    over = df.attrs.get("over") or df.columns[0]
    log2 = over in ("nodes", "gpus")
    if log2:
        x, xlabel = df["gpus"].to_numpy(float), "GPUs"
        labels = [f"{g:,}" for g in df["gpus"]]
    else:
        x, xlabel = np.arange(len(df), dtype=float), over.replace("_", " ")
        labels = [str(v) for v in df[over]]
    fig, axes = _figure(2, 2, (13, 9))
    _throughput(axes[0, 0], df, x, xlabel, log2)
    _efficiency(axes[0, 1], df, x, xlabel, log2)
    if not log2:
        for ax in axes[0]:
            ax.set_xticks(x, labels)
    breakdown_bars(axes[1, 0], df, labels)
    memory_bars(axes[1, 1], df, labels)
    for ax in axes[1]:
        ax.set_xlabel(xlabel)
    fig.suptitle(title or _default_title(df))
    return fig


def compare_figure(df, *, title: str | None = None):
    """Three panels of a ``pm.compare`` result: throughput, time breakdown, memory, per strategy."""
    labels = [str(v) for v in df["label"]]
    fig, axes = _figure(1, 3, (max(15.0, 1.6 * len(df) + 6), 6))
    x = np.arange(len(df))
    colors = ["C2" if bool(b) else ("C7" if not bool(f) else "C0") for b, f in zip(df.get("best", [False] * len(df)), df["fits"])]
    axes[0, 0].bar(x, df["tokens_per_second"].to_numpy(float), 0.7, color=colors)
    _xticks(axes[0, 0], x, labels)
    axes[0, 0].set_ylabel("throughput (tokens/s)")
    _thousands(axes[0, 0])
    axes[0, 0].set_title("Throughput (green: best that fits; grey: does not fit)")
    breakdown_bars(axes[0, 1], df, labels)
    memory_bars(axes[0, 2], df, labels)
    fig.suptitle(title or "Strategy comparison")
    return fig
