"""Learning curves for the HTML report: one SVG per panel, the legend left to the page.

matplotlib is the optional ``plots`` extra (``pip install 'clusterjob[plots]'``):
it is imported here, lazily, and only the object-oriented ``Figure`` API is used
(settings through a restored ``rc_context``), so no pyplot backend or global state
of the caller is touched. Panels (``panels``): the primary metric, the other
metrics of the grouped table logged per epoch (val_loss), then the train curve
(train_loss, else another loss, else the next metric logged), over "epoch" when the
runs logged one, else over "step".

What is drawn per group is what its table row counts (``stats.counted_runs``): the
mean of its counted runs, a band of one std clipped to the metric's range. A group
none of whose runs counts (all failed or cancelled) is drawn from those runs, dashed,
so that a failure stays in sight. A group of trials its search pruned is dashed in its
own colour, without a band, ending at the rung that stopped it (its last point hollow);
no series takes the red the tables mark failures with.

The y-axis of a panel is scaled to the groups with completed runs that did not diverge
(``scaling_groups``), as TensorBoard leaves outliers out of its scale: one collapsed
run must not flatten every healthy curve. Any other group's points beyond the axis sit
on its edge as triangles, the last one labelled with its value. Without a completed
group, accuracies are drawn 0-100 % and the other metrics fit the unfinished groups.
Metrics that never go below 0 (losses) are drawn from 0. Every point is marked on
short curves, so a group with one epoch is a dot, not nothing.
"""

from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pandas as pd

from clusterjob.core import units
from clusterjob.core.metrics import BOOKKEEPING
from clusterjob.report.stats import COMPLETE, FAILED, PARTIAL, UNFINISHED, counted_runs, group_has, group_ids

if TYPE_CHECKING:
    from clusterjob.report.reading import Results
    from clusterjob.report.stats import Experiment

MAX_GROUPS = 8  # more lines than this make a plot nobody can read
MARKED = 12  # curves with at most this many points show each point
# matplotlib's default colour cycle (tab10) without its red, the colour the tables mark
# failures with, and a navy for the tenth: the page's legend uses the same colours.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#393b79")
# Drawn size (inches) and font: at 420 px of screen a panel is ~0.75 of its size, and
# 11 pt text stays about 11 px tall.
_SIZE, _FONT = (5.4, 3.5), 11
WIDTH_PX, HEIGHT_PX = round(_SIZE[0] * 96), round(_SIZE[1] * 96)  # its size on a page (CSS px)
# A completed group whose last point lies further outside the range of the groups already
# on the axis than that range is tall (at least this share of its values' size) diverged.
DIVERGED_FLOOR = 0.25


@dataclass(frozen=True)
class Look:
    """How one group is drawn, and named in the page's legend."""

    label: str
    color: str
    best: bool
    failed: bool  # none of its runs counts: dashed, never sets the axes
    note: str = ""  # for the legend: "best", "failed: no run completed", "2 of 3 completed"
    completed: bool = False  # some of its runs completed: it may set the axes
    diverged: bool = False  # completed, but far off the others in some panel: it sets no axis
    pruned: bool = False  # its runs are trials their search pruned: dashed, ending at the rung that stopped them


@dataclass(frozen=True)
class Curves:
    """The panels as (metric, title, SVG bytes), the groups drawn, and a note (the best
    of how many groups) for the page."""

    panels: list
    looks: list
    note: str = ""


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


def plain(text: str) -> str:
    """Text matplotlib draws as written: a "$" would start math mode (and may not parse)."""
    return text.replace("$", r"\$")


def x_axis(results: "Results") -> Optional[str]:
    """"epoch" when some run logged epochs, else "step", else None (nothing to draw over)."""
    for name in ("epoch", "step"):
        col = results.columns.get(name)
        if col is not None and not np.isnan(col).all():
            return name
    return None


def _curve_name(name: str) -> str:
    """The logged metric a table column follows: best_val_acc is val_acc's best."""
    return "val_acc" if name == "best_val_acc" else name


def panels(results: "Results", primary_name: str = "val_acc", table: tuple = ()) -> list:
    """[(metric, title, scale)]: the primary metric, the other ``table`` metrics logged
    per line, then the train curve: train_loss, else another loss, else the next
    metric logged."""
    logged = [n for n in results.columns if n not in BOOKKEEPING and not n.startswith("lr_")]
    names = list(dict.fromkeys(n for n in map(_curve_name, (primary_name, *table)) if n in logged))
    rest = [n for n in logged if n not in names]
    train = next((n for n in ["train_loss", *rest] if n in rest and "loss" in n), next(iter(rest), None))
    names += [train] if train is not None else []
    return [(n, f"{n} (%)" if units.unit(n) == "%" else n, 100.0 if units.unit(n) == "%" else 1.0) for n in names]


def _drawn_runs(runs: pd.DataFrame, keys: list) -> np.ndarray:
    """Which runs a curve averages: the counted ones; all of a group that counts none."""
    counted = counted_runs(runs, keys).to_numpy()
    return counted | ~group_has(counted, group_ids(runs, keys))


def curve_table(results: "Results", runs: pd.DataFrame, groups: pd.DataFrame, keys: list,
                primary_name: str = "val_acc", table: tuple = ()) -> pd.DataFrame:
    """Mean and std (ddof=1) per shown group and epoch (or step) of the panels' metrics,
    over the runs ``_drawn_runs`` picks; a metric missing at some lines is left out there.

    ``groups`` is sorted best first; a run's group is its rank there, and only the
    first MAX_GROUPS ranks are kept. ``runs`` may be re-sorted: its index is the
    run's position in ``results``.
    """
    rank = {label: i for i, label in enumerate(group_labels(groups, keys)[:MAX_GROUPS])}
    in_order = runs.sort_index()
    run_rank = np.array([rank.get(label, -1) for label in group_labels(in_order, keys)])
    run_rank = np.where(_drawn_runs(in_order, keys), run_rank, -1)
    metrics = [name for name, _, _ in panels(results, primary_name, table)]
    x = x_axis(results)
    if x is None or not metrics:
        return pd.DataFrame()
    frame = pd.DataFrame({"group": np.repeat(run_rank, results.lengths), x: results.columns[x]})
    for name in metrics:
        frame[name] = results.columns[name]
    frame = frame[(frame["group"] >= 0) & frame[x].notna()]
    return frame.groupby(["group", x])[metrics].agg(["mean", "std"])


def value_range(metric: str, values: np.ndarray) -> tuple:
    """(low, high) a metric's values can take, drawn scale: 0-100 for accuracies in %,
    from 0 for a metric never logged below 0 (losses), else unbounded."""
    if units.unit(metric) == "%":
        return 0.0, 100.0
    finite = values[np.isfinite(values)]
    return (0.0 if finite.size and finite.min() >= 0 else -math.inf), math.inf


def band(mean: np.ndarray, std: np.ndarray, bounds: tuple) -> tuple:
    """mean -/+ std clipped to ``bounds`` (no std: the mean itself)."""
    std = np.nan_to_num(std, nan=0.0)
    return np.clip(mean - std, *bounds), np.clip(mean + std, *bounds)


def _series(table: pd.DataFrame, group: int, metric: str, scale: float) -> tuple:
    """(x, mean, std) of one group's logged points, drawn scale."""
    part = pd.DataFrame(table.loc[group])
    part = part[part[(metric, "mean")].notna()]
    return (part.index.to_numpy(dtype=float), part[(metric, "mean")].to_numpy() * scale,
            part[(metric, "std")].to_numpy() * scale)


def scaling_groups(data: dict, looks: list, bounds: tuple) -> list:
    """The groups that set a panel's y-axis (``data``: {group: (x, mean, std)}, best
    first): those with completed runs that did not diverge, the best of them first, then
    each next one whose last point lies within the range of those before it, widened on
    both sides by its height (at least DIVERGED_FLOOR of its values' size); a group
    beyond that diverged (``diverged_groups``)."""
    completed = [g for g in data if looks[g].completed and not looks[g].diverged and len(data[g][1])]
    chosen = completed[:1]
    for group in completed[1:]:
        low, high = _extent(data, chosen, bounds)
        margin = max(high - low, DIVERGED_FLOOR * max(abs(low), abs(high)))
        if low - margin <= data[group][1][-1] <= high + margin:
            chosen.append(group)
    return chosen


def diverged_groups(panels: list, looks: list) -> set:
    """The groups with completed runs that some panel's scale leaves out (``panels``:
    [(data, bounds)]): far off the others in one metric, they set the axes of none."""
    diverged = set()
    for data, bounds in panels:
        completed = {g for g in data if looks[g].completed and len(data[g][1])}
        diverged |= completed - set(scaling_groups(data, looks, bounds))
    return diverged


def _extent(data: dict, groups: list, bounds: tuple) -> tuple:
    """(lowest, highest) of the groups' bands."""
    spans = [band(data[g][1], data[g][2], bounds) for g in groups]
    low = min((float(np.min(lo)) for lo, _ in spans if len(lo)), default=0.0)
    high = max((float(np.max(hi)) for _, hi in spans if len(hi)), default=1.0)
    return low, high


def y_limits(data: dict, looks: list, metric: str, bounds: tuple) -> tuple:
    """(the y-axis of a panel, the groups whose bands set it) (``data``: {group: (x, mean,
    std)}): the ``scaling_groups``, from ``bounds``' low end for a metric never below 0;
    without a completed group, 0-100 for accuracies, else the groups that are not failed
    (all of them when every one failed)."""
    setters = scaling_groups(data, looks, bounds)
    if not setters:
        setters = [g for g in data if not looks[g].failed] or list(data)
        if units.unit(metric) == "%":
            return (-2.0, 102.0), setters  # a margin, so that a line at 0 or 100 % shows whole
    low, high = _extent(data, setters, bounds)
    floor = math.isfinite(bounds[0])
    low = bounds[0] if floor and units.unit(metric) != "%" else low
    pad = 0.06 * (high - low) or 0.5 * abs(high) or 1.0
    limits = low - (0.02 * pad if floor and low == bounds[0] else pad), high + pad
    if units.unit(metric) == "%":
        limits = max(limits[0], -2.0), min(limits[1], 102.0)
    return limits, setters


def _off_scale(ax, x: np.ndarray, y: np.ndarray, limits: tuple, color: str, row: int) -> np.ndarray:
    """Points beyond ``limits`` drawn on the edge as triangles (on a long curve only the
    last one), the last one of each edge labelled with its value (the ``row``-th group
    with such points one line lower, so that two do not overlap); the values clipped to
    the limits, for the line."""
    low, high = limits
    for above in (True, False):
        beyond = np.flatnonzero(y > high if above else y < low)
        if not len(beyond):
            continue
        edge = high if above else low
        shown = beyond if len(x) <= MARKED else beyond[-1:]
        ax.plot(x[shown], np.full(len(shown), edge), ls="none", marker="^" if above else "v", ms=9, color=color,
                zorder=4, clip_on=False)
        last = beyond[-1]
        ax.annotate(f"{y[last]:.5g}", (x[last], edge), xytext=(7, -13 - 12 * row if above else 4 + 12 * row),
                    textcoords="offset points", fontsize=_FONT - 2, color=color)
    return np.clip(y, low, high)


def _draw_group(ax, x: np.ndarray, mean: np.ndarray, std: np.ndarray, look: Look, limits: tuple,
                bounds: tuple, row: int = 0, banded: bool = True) -> None:
    """One group's line (dots on short curves) and, when ``banded``, its band, or the
    dashed failed line; points beyond ``limits`` on the edge (``_off_scale``, the
    ``row``-th such group)."""
    marker = "o" if len(x) <= MARKED else None
    shown = _off_scale(ax, x, mean, limits, look.color, row)
    if look.pruned:  # a result cut short, not a failure: dashed in its own colour, no band, its last point hollow
        ax.plot(x, shown, color=look.color, lw=1.4, ls="--", zorder=2)
        ax.plot(x[-1:], shown[-1:], ls="none", marker="o", ms=6, mfc="white", color=look.color, zorder=3)
        return
    if look.failed:
        ax.plot(x, shown, color=look.color, lw=1.4, ls="--", marker="x", ms=7, zorder=2)
        return
    ax.plot(x, shown, color=look.color, lw=2.6 if look.best else 1.4, zorder=3 if look.best else 2,
            marker=marker, ms=5 if look.best else 4)
    if not banded:  # a group off the scale: its band would cover the ones on it
        return
    low, high = band(mean, std, bounds)
    ax.fill_between(x, np.clip(low, *limits), np.clip(high, *limits), color=look.color, alpha=0.18, lw=0, zorder=1)


def _x_limits(ax, table: pd.DataFrame) -> None:
    """Integer ticks; one epoch (or step) gets room on both sides, not 0.95 ... 1.05."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is there: draw checked

    xs = table.index.get_level_values(1).to_numpy(dtype=float)
    if xs.size and xs.min() == xs.max():
        ax.set_xlim(xs.min() - 1, xs.max() + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _panel_data(table: pd.DataFrame, metric: str, scale: float) -> tuple:
    """({group: (x, mean, std)}, the metric's value range) of one panel."""
    data = {g: _series(table, g, metric, scale) for g in table.index.get_level_values("group").unique()}
    return data, value_range(metric, np.concatenate([mean for _, mean, _ in data.values()]))


def _panel_svg(table: pd.DataFrame, panel: tuple, looks: list, metric: str, title: str) -> tuple:
    """(SVG, whether some point lies beyond the axis) of one panel (``panel``: its
    ``_panel_data``; text kept as text: it scales with the image and can be read)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    data, bounds = panel
    limits, setters = y_limits(data, looks, metric, bounds)
    beyond = [g for g, (_, mean, _) in data.items() if np.any((mean < limits[0]) | (mean > limits[1]))]
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "clusterjob", "font.size": _FONT}):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        ax = fig.subplots()
        for group, (x, mean, std) in data.items():
            row = beyond.index(group) if group in beyond else 0
            _draw_group(ax, x, mean, std, looks[group], limits, bounds, row, group in setters)
        ax.set_ylim(*limits)
        _x_limits(ax, table)
        ax.set_xlabel(str(table.index.names[1]))
        ax.set_title(plain(title))
        ax.grid(alpha=0.3)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue(), bool(beyond)


def _note(best: bool, n: int, completed: int, state: str) -> str:
    """What the legend says of a group beside its name."""
    if best:
        return "best"
    if state == FAILED:
        return "failed: no run completed"
    return f"{completed} of {n} completed" if state != COMPLETE else ""


def _looks(experiment: "Experiment") -> list:
    """How each of the first MAX_GROUPS groups is drawn and named, best first."""
    groups = experiment.groups.head(MAX_GROUPS)
    labels = group_labels(groups, experiment.keys)
    looks = []
    rows = zip(labels, groups["n"], groups["completed"], groups["state"], groups["not_completed"])
    for i, (label, n, completed, state, others) in enumerate(rows):
        best = i == 0 and experiment.best is not None
        pruned = state == UNFINISHED and _all_pruned(str(others))
        note = "pruned" if pruned else _note(best, n, completed, state)
        if experiment.trials and state != COMPLETE and others:  # a trial: how it ended ("pruned at rung 0")
            note = str(others).split(" ", 1)[-1]
        looks.append(Look(label, COLORS[i % len(COLORS)], best, state == FAILED, note, state in (COMPLETE, PARTIAL),
                          pruned=pruned))
    return looks


def _all_pruned(others: str) -> bool:
    """Whether a group's runs that did not complete ("2 pruned at rung 0, 1 pruned at rung 1")
    are all pruned trials."""
    return bool(others) and all(part.split(" ", 1)[-1].startswith("pruned") for part in others.split(", "))


DIVERGED_NOTE = "diverged: left out of the axes' scale"
CLIPPED_NOTE = ("The y-axes fit the groups with completed runs that did not diverge; a triangle on an axis' edge "
                "is a point beyond it, the last one with its value.")


def available() -> bool:
    """Whether matplotlib, which draws the curves, is installed."""
    try:
        import matplotlib.figure  # noqa: F401  (only whether it is there)
    except ImportError:
        return False
    return True


def draw(experiment: "Experiment") -> Optional[Curves]:
    """The experiment's learning curves; None when matplotlib is not installed, no panels
    when nothing was logged over epochs or steps."""
    if not available():
        return None
    table_metrics = tuple(experiment.metrics)
    table = curve_table(experiment.results, experiment.runs, experiment.groups, experiment.keys,
                        experiment.primary.name, table_metrics)
    if table.empty:
        return Curves([], [])
    shown = [p for p in panels(experiment.results, experiment.primary.name, table_metrics)
             if (p[0], "mean") in table.columns]
    data = [_panel_data(table, metric, scale) for metric, _, scale in shown]
    looks = _looks(experiment)
    diverged = diverged_groups(data, looks)
    looks = [dataclasses.replace(look, diverged=True, note=", ".join(filter(None, [look.note, DIVERGED_NOTE])))
             if g in diverged else look for g, look in enumerate(looks)]
    drawn = [(metric, title, *_panel_svg(table, panel, looks, metric, title)) for (metric, title, _), panel
             in zip(shown, data)]
    groups = sorted(table.index.get_level_values("group").unique())
    notes = [f"The {len(looks)} best of {len(experiment.groups)} groups by mean {experiment.primary.name}."
             if len(experiment.groups) > len(looks) else "", CLIPPED_NOTE if any(c for *_, c in drawn) else ""]
    return Curves([(m, t, svg) for m, t, svg, _ in drawn], [looks[g] for g in groups], " ".join(filter(None, notes)))


MAX_GPU_RUNS = 12  # the HTML page draws the GPUs of this many runs at most (the first in the runs table)


def gpu_panel(title: str, series: dict) -> bytes:
    """One run's GPU utilisation over time as an SVG: one line per GPU ({label: (seconds, util %)})."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "clusterjob", "font.size": _FONT}):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        ax = fig.subplots()
        minutes = max((x.max() for x, _ in series.values() if len(x)), default=0.0) > 600
        for index, (label, (x, y)) in enumerate(series.items()):
            ax.plot(x / 60 if minutes else x, y, color=COLORS[index % len(COLORS)], linewidth=1.2,
                    marker="o" if len(x) <= MARKED else None, markersize=3, label=plain(label))
        ax.set_ylim(0, 100)
        ax.set_xlabel("minutes" if minutes else "seconds")
        ax.set_ylabel("GPU utilisation %")
        ax.set_title(plain(title))
        ax.grid(alpha=0.3)
        if len(series) <= MAX_GROUPS:
            ax.legend(fontsize=_FONT - 3, loc="lower right")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()
