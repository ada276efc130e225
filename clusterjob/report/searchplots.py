"""The metric against each searched key, for a search's HTML page: one small SVG per key
(docs/design.md, "Search").

Each trial is a point: x its value of the key, y its latest value of the experiment's
primary metric (a pruned trial's is the value at the rung that stopped it). Completed
trials are filled dots, the best one a star; pruned trials hollow grey circles; failed,
cancelled and unfinished trials grey crosses; a trial that logged no value is left out.
The x-axis is logarithmic for a ``log_uniform`` key (the space in the search's
search.json, read tolerantly: without it every axis is linear), one tick per value for a
key whose values are not all numbers (a ``choice`` of words).

matplotlib is the optional ``plots`` extra, imported lazily and used as ``plots`` uses it
(the ``Figure`` API, settings in a restored ``rc_context``). Nothing here writes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pandas as pd

from clusterjob.core import search as searchmod
from clusterjob.core import units
from clusterjob.core.files import is_number
from clusterjob.report import plots
from clusterjob.report.searchcost import search_of

if TYPE_CHECKING:
    from clusterjob.report.stats import Experiment

_SIZE, _FONT = (4.2, 3.0), 10  # a small panel each: a search may have many keys
WIDTH_PX, HEIGHT_PX = round(_SIZE[0] * 96), round(_SIZE[1] * 96)
# (status test, label, how it is drawn); the best completed trial is drawn on top as a star
_KINDS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("completed", "completed", {"marker": "o", "s": 30, "color": plots.COLORS[0], "zorder": 3}),
    ("pruned", "pruned (at its rung)", {"marker": "o", "s": 30, "facecolors": "none", "edgecolors": "#7f7f7f",
                                        "zorder": 2}),
    ("other", "failed, cancelled or unfinished", {"marker": "x", "s": 30, "color": "#b0b0b0", "zorder": 1}),
)


@dataclass(frozen=True)
class KeyPlot:
    """One searched key's panel: its distribution ("" when not known) and the SVG."""

    key: str
    kind: str
    svg: bytes


def space_kinds(experiment: "Experiment") -> dict:
    """{searched key: its distribution, "" when search.json does not say}, in the order of
    the trials' params."""
    kinds: dict = {}
    for info in experiment.results.infos:
        folder = Path(info["path"]).parent
        if searchmod.is_search(folder):
            kinds = {dim.key: dim.kind for dim in searchmod.read(folder)[0].dimensions}
            break
    return {key: kinds.get(key, "") for key in experiment.results.param_keys}


def draw(experiment: "Experiment") -> Optional[list]:
    """The KeyPlots of a search's experiment; [] for anything else (a grid sweep) or when no
    trial logged the metric; None when matplotlib is not installed."""
    if search_of(experiment.results) is None:
        return []
    if not plots.available():
        return None
    runs = experiment.runs
    name = experiment.primary.name
    scale = 100.0 if units.unit(name) == "%" else 1.0
    y = pd.to_numeric(runs[name], errors="coerce").to_numpy(dtype=float) * scale
    if not np.isfinite(y).any():
        return []
    status = runs["status"].astype(object).to_numpy()
    best = _best(status, y, experiment.primary.ascending)
    title = f"{name} (%)" if scale != 1.0 else name
    return [KeyPlot(key, kind, _panel(key, kind, runs[key].tolist(), y, status, best, title))
            for key, kind in space_kinds(experiment).items() if key in runs.columns]


def _best(status: np.ndarray, y: np.ndarray, ascending: bool) -> Optional[int]:
    """The position of the best completed trial (None without one)."""
    scored = np.where((status == "completed") & np.isfinite(y), y if ascending else -y, np.inf)
    return int(np.argmin(scored)) if np.isfinite(scored).any() else None


def _positions(values: list, kind: str) -> tuple:
    """(x per trial, tick labels or None, whether the axis is logarithmic): numbers as
    themselves, anything else one position per distinct value."""
    if all(is_number(v) or v is None for v in values):  # None: a trial without the key
        x = np.array([math.nan if v is None else v for v in values], dtype=float)
        return x, None, kind == "log_uniform" and bool(np.all(x > 0))
    labels = list(dict.fromkeys(plots.group_labels(pd.DataFrame({"v": values}), ["v"])))
    shown = [label.partition("=")[2] for label in labels]
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[label] for label in plots.group_labels(pd.DataFrame({"v": values}), ["v"])],
                    dtype=float), shown, False


def _panel(key: str, kind: str, values: list, y: np.ndarray, status: np.ndarray, best: Optional[int],
           title: str) -> bytes:
    """One key's SVG (text kept as text, as the curves keep it)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    x, ticks, log = _positions(values, kind)
    shown = np.isfinite(y) & np.isfinite(x)
    groups = {"completed": status == "completed", "pruned": status == "pruned"}
    groups["other"] = ~(groups["completed"] | groups["pruned"])
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "clusterjob", "font.size": _FONT}):
        fig = Figure(figsize=_SIZE, dpi=100, layout="constrained")
        ax = fig.subplots()
        for group, label, look in _KINDS:
            mask = shown & groups[group]
            if mask.any():
                ax.scatter(x[mask], y[mask], label=label, **look)
        if best is not None and shown[best]:
            ax.scatter(x[best:best + 1], y[best:best + 1], marker="*", s=160, color=plots.COLORS[1], zorder=4,
                       label="best")
        if log:
            ax.set_xscale("log")
        if ticks is not None:
            ax.set_xticks(range(len(ticks)), [plots.plain(t) for t in ticks])
            ax.set_xlim(-0.5, len(ticks) - 0.5)
        ax.set_xlabel(plots.plain(key + (" (log)" if log else "")))
        ax.set_ylabel(plots.plain(title))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=_FONT - 2, loc="best")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def alt_text(plot: KeyPlot, metric: str) -> str:
    """The panel's text alternative."""
    return f"{metric} of each trial against {plot.key} ({plot.kind or 'its values'}); pruned trials hollow"

