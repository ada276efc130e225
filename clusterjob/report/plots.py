"""Learning curves for the HTML report.

matplotlib is the optional ``plots`` extra (``pip install 'clusterjob[plots]'``):
it is imported here, lazily, and only the object-oriented ``Figure`` API is used,
so no pyplot backend or global state of the caller is touched. The curves follow
the report's primary metric (and train_loss, or another loss, beside it) over
"epoch" when the runs logged one, else over "step".
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from clusterjob.report.reading import Results
    from clusterjob.report.stats import Primary

MAX_GROUPS = 8  # more lines than this make a plot nobody can read
_PERCENT = ("val_acc", "val_acc_ema", "val_acc_tta", "train_acc")  # fractions, drawn in %
_NOT_CURVES = ("epoch", "step", "lr", "epoch_time_s", "samples_per_s")


def group_labels(frame: pd.DataFrame, keys: list) -> list:
    """"train.lr=0.1, train.optimizer=sgd" per row ("all runs" without keys)."""
    if not keys:
        return ["all runs"] * len(frame)
    parts = [[f"{key}={_text(v)}" for v in frame[key]] for key in keys]
    return [", ".join(row) for row in zip(*parts)]


def _text(value: Any) -> str:
    """A key value as the tables show it (a frame's cell: any type)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _plain(text: str) -> str:
    """Text matplotlib draws as written: a "$" would start math mode (and may not parse)."""
    return text.replace("$", r"\$")


def x_axis(results: "Results") -> Optional[str]:
    """"epoch" when some run logged epochs, else "step", else None (nothing to draw over)."""
    for name in ("epoch", "step"):
        col = results.columns.get(name)
        if col is not None and not np.isnan(col).all():
            return name
    return None


def panels(results: "Results", primary_name: str = "val_acc") -> list:
    """[(metric, title, scale)]: the primary metric (val_acc for best_val_acc), then
    train_loss, else another loss, else the next metric logged."""
    first = "val_acc" if primary_name == "best_val_acc" else primary_name
    others = [n for n in results.columns if n not in _NOT_CURVES and n != first and not n.startswith("lr_")]
    second = next((n for n in ["train_loss", *others] if n in others and "loss" in n), None)
    second = second or next(iter(others), None)
    names = [n for n in (first, second) if n is not None and n in results.columns]
    return [(n, f"{n} (%)" if n in _PERCENT else n, 100.0 if n in _PERCENT else 1.0) for n in names]


def curve_table(results: "Results", runs: pd.DataFrame, groups: pd.DataFrame, keys: list,
                primary_name: str = "val_acc") -> pd.DataFrame:
    """Mean and std (ddof=1) per shown group and epoch (or step) of the panels' metrics.

    ``groups`` is sorted best first; a run's group is its rank there, and only the
    first MAX_GROUPS ranks are kept. ``runs`` may be re-sorted: its index is the
    run's position in ``results``.
    """
    rank = {label: i for i, label in enumerate(group_labels(groups, keys)[:MAX_GROUPS])}
    in_order = runs.sort_index()
    run_rank = np.array([rank.get(label, -1) for label in group_labels(in_order, keys)])
    metrics = [name for name, _, _ in panels(results, primary_name)]
    x = x_axis(results)
    if x is None or not metrics:
        return pd.DataFrame()
    frame = pd.DataFrame({"group": np.repeat(run_rank, results.lengths), x: results.columns[x]})
    for name in metrics:
        frame[name] = results.columns[name]
    frame = frame[(frame["group"] >= 0) & frame[x].notna()]
    return frame.groupby(["group", x])[metrics].agg(["mean", "std"])


def _draw(ax, table: pd.DataFrame, labels: list, metric: str, scale: float) -> None:
    """One panel: a mean line and a +-1 std band per group, the best one bold."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is there: curves_png checked

    for group in table.index.get_level_values("group").unique():
        part = table.loc[group].dropna(subset=[(metric, "mean")])
        x = part.index.to_numpy(dtype=float)
        mean, std = part[(metric, "mean")].to_numpy() * scale, part[(metric, "std")].to_numpy() * scale
        color = f"C{group % 10}"
        best = group == 0  # drawn bold and on top of the others
        ax.plot(x, mean, color=color, lw=2.6 if best else 1.4, zorder=3 if best else 2, label=_plain(labels[group]))
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.18, lw=0, zorder=1)
    ax.set_xlabel(table.index.names[1])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no "epoch 1.5" ticks on short runs
    ax.grid(alpha=0.3)


def _legend(fig, ax, count: int) -> None:
    """The legend below both panels (inside the first on matplotlib < 3.7)."""
    handles, labels = ax.get_legend_handles_labels()
    try:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(count, 3), frameon=False)
    except (ValueError, TypeError):
        ax.legend(fontsize=8)


def curves_png(results: "Results", runs: pd.DataFrame, groups: pd.DataFrame, keys: list,
               primary: "Optional[Primary]" = None) -> Optional[bytes]:
    """The learning curves as PNG bytes; b"" when nothing was logged over epochs or
    steps; None when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    name = primary.name if primary is not None else "val_acc"
    table = curve_table(results, runs, groups, keys, name)
    if table.empty:
        return b""
    labels = group_labels(groups, keys)
    shown_panels = [p for p in panels(results, name) if (p[0], "mean") in table.columns]
    fig = Figure(figsize=(11, 4.6), dpi=100, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(shown_panels)))
    for ax, (metric, title, scale) in zip(axes, shown_panels):
        _draw(ax, table, labels, metric, scale)
        ax.set_title(_plain(title))
    shown = table.index.get_level_values("group").nunique()
    _legend(fig, axes[0], shown)
    if len(groups) > shown:
        fig.suptitle(_plain(f"the {shown} best of {len(groups)} groups by mean {name}"))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
