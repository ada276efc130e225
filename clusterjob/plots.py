"""Learning curves for the HTML report.

matplotlib is the optional ``plots`` extra (``pip install 'clusterjob[plots]'``):
it is imported here, lazily, and only the object-oriented ``Figure`` API is used,
so no pyplot backend or global state of the caller is touched.
"""

from __future__ import annotations

import io
from typing import Optional

import numpy as np
import pandas as pd

from clusterjob.results import Results

MAX_GROUPS = 8  # more lines than this make a plot nobody can read
PANELS = (("val_acc", "val_acc (%)", 100.0), ("train_loss", "train_loss", 1.0))


def group_labels(frame: pd.DataFrame, keys: list) -> list:
    """"train.lr=0.1, train.optimizer=sgd" per row ("all runs" without keys)."""
    if not keys:
        return ["all runs"] * len(frame)
    parts = [[f"{key}={_text(v)}" for v in frame[key]] for key in keys]
    return [", ".join(row) for row in zip(*parts)]


def _text(value: object) -> str:
    """A key value as the tables show it."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def curve_table(results: Results, runs: pd.DataFrame, groups: pd.DataFrame, keys: list) -> pd.DataFrame:
    """Mean and std (ddof=1) per shown group and epoch of the PANELS metrics.

    ``groups`` is sorted best first; a run's group is its rank there, and only the
    first MAX_GROUPS ranks are kept. ``runs`` may be re-sorted: its index is the
    run's position in ``results``.
    """
    rank = {label: i for i, label in enumerate(group_labels(groups, keys)[:MAX_GROUPS])}
    in_order = runs.sort_index()
    run_rank = np.array([rank.get(label, -1) for label in group_labels(in_order, keys)])
    metrics = [name for name, _, _ in PANELS if name in results.columns]
    if "epoch" not in results.columns or not metrics:
        return pd.DataFrame()
    frame = pd.DataFrame({"group": np.repeat(run_rank, results.lengths), "epoch": results.columns["epoch"]})
    for name in metrics:
        frame[name] = results.columns[name]
    frame = frame[frame["group"] >= 0]
    return frame.groupby(["group", "epoch"])[metrics].agg(["mean", "std"])


def _draw(ax, table: pd.DataFrame, labels: list, metric: str, scale: float) -> None:
    """One panel: a mean line and a +-1 std band per group, the best one bold."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is there: curves_png checked

    for group in table.index.get_level_values("group").unique():
        part = table.loc[group]
        x = part.index.to_numpy(dtype=float)
        mean, std = part[(metric, "mean")].to_numpy() * scale, part[(metric, "std")].to_numpy() * scale
        color = f"C{group % 10}"
        best = group == 0  # drawn bold and on top of the others
        ax.plot(x, mean, color=color, lw=2.6 if best else 1.4, zorder=3 if best else 2, label=labels[group])
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.18, lw=0, zorder=1)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no "epoch 1.5" ticks on short runs
    ax.grid(alpha=0.3)


def _legend(fig, ax, count: int) -> None:
    """The legend below both panels (inside the first on matplotlib < 3.7)."""
    handles, labels = ax.get_legend_handles_labels()
    try:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(count, 3), frameon=False)
    except (ValueError, TypeError):
        ax.legend(fontsize=8)


def curves_png(results: Results, runs: pd.DataFrame, groups: pd.DataFrame, keys: list) -> Optional[bytes]:
    """The learning curves as PNG bytes; b"" when no epoch was logged; None
    when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    table = curve_table(results, runs, groups, keys)
    if table.empty:
        return b""
    labels = group_labels(groups, keys)
    panels = [p for p in PANELS if (p[0], "mean") in table.columns]
    fig = Figure(figsize=(11, 4.6), dpi=100, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (metric, title, scale) in zip(axes, panels):
        _draw(ax, table, labels, metric, scale)
        ax.set_title(title)
    shown = table.index.get_level_values("group").nunique()
    _legend(fig, axes[0], shown)
    if len(groups) > shown:
        fig.suptitle(f"the {shown} best of {len(groups)} groups by mean val_acc")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
