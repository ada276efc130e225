"""A search's plots for its HTML page (docs/design.md, "Search"): its optimization
history, and the metric against each searched key, one small SVG each.

Each trial is a point with y its latest value of the experiment's primary metric (a
pruned trial's is the value at the rung that stopped it). Completed trials are filled
dots, the best one a star; pruned trials hollow grey circles; failed, cancelled and
unfinished trials grey crosses; a trial that logged no value is left out. Points are
half transparent, so that trials on one spot show as a darker one.

- **History**: x the trial's number; the best completed value so far as a step line.
- **Per key**: x the trial's value of the key, logarithmic for a ``log_uniform`` key
  (the space in the search's search.json, read tolerantly: without it every axis is
  linear); a key whose values are not all numbers (a ``choice`` of words) has one tick
  per value, its points spread sideways around it (by trial number, the same on every
  drawing), so that trials with the same value do not hide each other.

The y-axis fits the completed trials, as the learning curves' does: a trial pruned far
below them must not flatten them. A point beyond it sits on the edge as a triangle.
Without a completed trial, it fits every trial.

matplotlib is the optional ``plots`` extra, imported lazily and used as ``plots`` uses it
(the ``Figure`` API, settings in a restored ``rc_context``). Nothing here writes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pandas as pd

from clusterjob.core import runstate, units
from clusterjob.core.files import is_number
from clusterjob.report import plots
from clusterjob.report.stats import trial_numbers
from clusterjob.report.tables import search_of, search_record

if TYPE_CHECKING:
    from clusterjob.report.stats import Experiment

_SIZE, _FONT = (4.2, 3.0), 10  # a small panel each: a search may have many keys
WIDTH_PX, HEIGHT_PX = round(_SIZE[0] * 96), round(_SIZE[1] * 96)
_ALPHA = 0.6  # points on one spot add up to a darker one
_SPREAD = 0.3  # how far sideways (in ticks) the points of one categorical value spread
# (status test, label, how it is drawn); the best completed trial is drawn on top as a star
_KINDS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("completed", "completed", {"marker": "o", "s": 30, "color": plots.COLORS[0], "zorder": 3}),
    ("pruned", "pruned (at its rung)", {"marker": "o", "s": 30, "facecolors": "none", "edgecolors": "#7f7f7f",
                                        "zorder": 2}),
    ("other", "failed, cancelled or unfinished", {"marker": "x", "s": 30, "color": "#b0b0b0", "zorder": 1}),
)
HISTORY = "history"  # the history plot's data-plot name on the page


@dataclass(frozen=True)
class KeyPlot:
    """One searched key's panel: its distribution ("" when not known) and the SVG."""

    key: str
    kind: str
    svg: bytes


@dataclass(frozen=True)
class _Scored:
    """What every plot of a search draws: per trial (the runs table's order) its value
    (drawn scale), status, number and whether it is the best; the axis' title."""

    y: np.ndarray
    status: np.ndarray
    number: np.ndarray
    best: Optional[int]
    title: str
    limits: Optional[tuple]  # the y-axis (None: matplotlib's)


def space_kinds(experiment: "Experiment") -> dict:
    """{searched key: its distribution, "" when search.json does not say}, in the order of
    the trials' params."""
    record = search_record(experiment.results)
    kinds = {dim.key: dim.kind for dim in record.dimensions} if record is not None else {}
    return {key: kinds.get(key, "") for key in experiment.results.param_keys}


def _scored(experiment: "Experiment") -> Optional[_Scored]:
    """The trials' values, or None when no trial logged the metric."""
    runs, name = experiment.runs, experiment.primary.name
    scale = 100.0 if units.unit(name) == "%" else 1.0
    y = pd.to_numeric(runs[name], errors="coerce").to_numpy(dtype=float) * scale
    if not np.isfinite(y).any():
        return None
    status = runs["status"].astype(object).to_numpy()
    numbers = trial_numbers(experiment.results).to_numpy(dtype=float, na_value=math.nan)[runs.index.to_numpy()]
    number = np.where(np.isfinite(numbers), numbers, np.arange(len(runs), dtype=float))
    return _Scored(y, status, number, _best(status, y, experiment.primary.ascending),
                   f"{name} (%)" if scale != 1.0 else name, _y_limits(y, status, name))


def draw(experiment: "Experiment") -> Optional[list]:
    """The KeyPlots of a search's experiment; [] for anything else (a grid sweep) or when no
    trial logged the metric; None when matplotlib is not installed."""
    if search_of(experiment.results) is None:
        return []
    if not plots.available():
        return None
    scored = _scored(experiment)
    if scored is None:
        return []
    return [KeyPlot(key, kind, _key_panel(key, kind, experiment.runs[key].tolist(), scored))
            for key, kind in space_kinds(experiment).items() if key in experiment.runs.columns]


def history(experiment: "Experiment") -> Optional[bytes]:
    """The optimization history's SVG of a search's experiment (each trial's value in the
    order of the trials, the best so far as a line); None for anything else, without
    matplotlib or when no trial logged the metric."""
    if search_of(experiment.results) is None or not plots.available():
        return None
    scored = _scored(experiment)
    if scored is None:
        return None
    return _figure(lambda ax: _history_axes(ax, scored, experiment.primary.ascending))


def _best(status: np.ndarray, y: np.ndarray, ascending: bool) -> Optional[int]:
    """The position of the best completed trial (None without one)."""
    scored = np.where((status == runstate.COMPLETED) & np.isfinite(y), y if ascending else -y, np.inf)
    return int(np.argmin(scored)) if np.isfinite(scored).any() else None


def _y_limits(y: np.ndarray, status: np.ndarray, metric: str) -> Optional[tuple]:
    """The y-axis: the completed trials' values with a margin (0-100 for accuracies at
    most); None (every trial's) without a completed trial."""
    done = y[(status == runstate.COMPLETED) & np.isfinite(y)]
    if not done.size:
        return None
    low, high = float(done.min()), float(done.max())
    pad = 0.08 * (high - low) or 0.05 * abs(high) or 1.0
    low, high = low - pad, high + pad
    if units.unit(metric) == "%":
        low, high = max(low, -2.0), min(high, 102.0)
    return low, high


def _positions(values: list, kind: str, number: np.ndarray) -> tuple:
    """(x per trial, tick labels or None, whether the axis is logarithmic): numbers as
    themselves, anything else one position per distinct value, each trial spread around
    it by its number (the golden ratio's steps: neighbours land apart)."""
    if all(is_number(v) or v is None for v in values):  # None: a trial without the key
        x = np.array([math.nan if v is None else v for v in values], dtype=float)
        return x, None, kind == "log_uniform" and bool(np.all(x[np.isfinite(x)] > 0))
    rows = plots.group_labels(pd.DataFrame({"v": values}), ["v"])
    labels = list(dict.fromkeys(rows))
    shown = [label.partition("=")[2] for label in labels]
    index = {label: i for i, label in enumerate(labels)}
    spread = ((number * 0.6180339887) % 1.0 - 0.5) * 2 * _SPREAD if len(values) > 1 else np.zeros(len(values))
    return np.array([index[label] for label in rows], dtype=float) + spread, shown, False


def _points(ax, x: np.ndarray, scored: _Scored) -> None:
    """Each trial's point by its kind (``_KINDS``), the best a star; a point beyond the
    y-axis on its edge as a triangle."""
    y, status = scored.y, scored.status
    low, high = scored.limits if scored.limits is not None else (-math.inf, math.inf)
    shown = np.isfinite(y) & np.isfinite(x)
    completed, pruned = status == runstate.COMPLETED, status == runstate.PRUNED
    groups = {"completed": completed, "pruned": pruned, "other": ~(completed | pruned)}
    for group, label, look in _KINDS:
        mask = shown & groups[group]
        inside = mask & (y >= low) & (y <= high)
        if mask.any():
            ax.scatter(x[inside], y[inside], label=label, alpha=_ALPHA, **look)
        for beyond, edge, marker in ((mask & (y < low), low, "v"), (mask & (y > high), high, "^")):
            if beyond.any():
                ax.scatter(x[beyond], np.full(int(beyond.sum()), edge), alpha=_ALPHA, clip_on=False,
                           **{**look, "marker": marker})
    best = scored.best
    if best is not None and shown[best]:
        ax.scatter(x[best:best + 1], y[best:best + 1], marker="*", s=160, color=plots.COLORS[1], zorder=4,
                   label="best")
    if scored.limits is not None:
        ax.set_ylim(*scored.limits)


def _key_panel(key: str, kind: str, values: list, scored: _Scored) -> bytes:
    """One key's SVG (text kept as text, as the curves keep it)."""
    x, ticks, log = _positions(values, kind, scored.number)

    def axes(ax) -> None:
        _points(ax, x, scored)
        if log:
            ax.set_xscale("log")
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), [plots.plain(t) for t in ticks])
            ax.set_xlim(-0.5, len(ticks) - 0.5)
        ax.set_xlabel(plots.plain(key + (" (log)" if log else "")))
        ax.set_ylabel(plots.plain(scored.title))

    return _figure(axes)


def _history_axes(ax, scored: _Scored, ascending: bool) -> None:
    """The history: every trial at its number, the best completed value so far as a step
    line from the first completed trial to the last trial."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is there: history checked

    _points(ax, scored.number, scored)
    done = (scored.status == runstate.COMPLETED) & np.isfinite(scored.y)
    if done.any():
        order = np.argsort(scored.number[done], kind="stable")
        xs, ys = scored.number[done][order], scored.y[done][order]
        best = np.minimum.accumulate(ys) if ascending else np.maximum.accumulate(ys)
        last = float(np.nanmax(scored.number))
        ax.step(np.append(xs, last), np.append(best, best[-1]), where="post", color=plots.COLORS[2], lw=1.6,
                zorder=2, label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial (in the order taken)")
    ax.set_ylabel(plots.plain(scored.title))


def _figure(axes) -> bytes:
    """A small panel's SVG, drawn by ``axes(ax)``, with a grid and a legend."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "clusterjob", "font.size": _FONT}):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        ax = fig.subplots()
        axes(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=_FONT - 2, loc="best")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def alt_text(plot: KeyPlot, metric: str) -> str:
    """The panel's text alternative."""
    return f"{metric} of each trial against {plot.key} ({plot.kind or 'its values'}); pruned trials hollow"


def history_alt(metric: str) -> str:
    """The history's text alternative."""
    return f"{metric} of each trial in the order of the trials, the best completed one so far as a line"
