"""How well each run used its GPUs, from its ``telemetry.jsonl`` alone (so a run folder
copied off the cluster still tells): the report's efficiency columns beside ``compute``,
the low-utilisation warning and the utilisation curves of the HTML page.

Per run: ``gpu_util_pct`` (the time-weighted mean utilisation over all its GPUs),
``gpu_mem_peak_gib`` (the highest memory any of its GPUs used) and ``idle_gpu_hours``
(the GPU-hours sampled times (1 - utilisation)); ``gpu_hours_sampled`` weighs a group's
mean. Per group: the mean over its runs' GPU-hours, the highest peak, the sum of the idle
GPU-hours (over the runs that have samples). NaN where a run has no sample. A run whose
GPUs stayed under its spec's ``health.low_util_pct`` for 10 minutes gets ``gpu_warning``
(clusterjob.health.telemetry.low_util_warning). Nothing here writes. ``PROVIDER`` gives the
columns, the warnings and the curves to the report (``provider.Provider``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.core import units
from clusterjob.core.errors import escape
from clusterjob.core.rundir import TELEMETRY_FILE, RunDir
from clusterjob.health import telemetry
from clusterjob.report import plots
from clusterjob.report.provider import PROBLEMS, Provider, RunCurves, Runs
from clusterjob.report.termtable import Column

COLUMNS = ("gpu_util_pct", "gpu_mem_peak_gib", "idle_gpu_hours")
WEIGHT = "gpu_hours_sampled"  # a run's GPU-hours in its samples: what its utilisation weighs in its group
WARNING = "gpu_warning"
BUSY = "gpu_busy_hours"  # a run's GPU-hours at work: what its group's mean utilisation adds up
SERIES = "gpu_series"  # a run's GPUs' utilisation over time (``curves``), None without samples
DEFAULT_LOW_UTIL_PCT = 30.0  # health.low_util_pct's default, for a spec that does not say


@dataclass
class Efficiency:
    """The columns of every run (in the order of ``infos``), its GPUs' utilisation over
    time for the HTML page ({run path: {GPU label: (seconds, util)}}), and per run the
    problems of its file (lines skipped)."""

    columns: dict
    series: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


def read(infos: Sequence[dict]) -> Efficiency:
    """The efficiency of every run; no columns ({}) when no run has a sample."""
    rows, series, problems = [], {}, []
    for info in infos:
        path = info.get("path")
        found = telemetry.read(RunDir(Path(path)).telemetry_file) if path else telemetry.Read([])
        problems.append([f"{TELEMETRY_FILE}: {found.skipped} line(s) that are no sample (cut off or damaged) "
                         "were skipped"] if found.skipped else [])
        rows.append(_row(info, found.samples))
        if found.samples:
            series[path] = curves(found.samples)
    if all(math.isnan(row[0]) for row in rows):
        return Efficiency({}, {}, problems)
    names = (*COLUMNS, WEIGHT)
    columns: dict = {name: np.array([row[i] for row in rows], dtype=float) for i, name in enumerate(names)}
    columns[WARNING] = pd.array([row[-1] for row in rows], dtype=object)
    return Efficiency(columns, series, problems)


def _row(info: dict, samples: list) -> tuple:
    """(util %, peak GiB, idle GPU-h, GPU-h sampled, warning) of one run; NaN without samples."""
    found = telemetry.usage(samples)
    if found is None:
        return (math.nan,) * 4 + (None,)
    run = RunDir(Path(info["path"]))
    wait = telemetry.input_wait_pct(run, int(info.get("world_size") or 1))
    warning = telemetry.low_util_warning(samples, low_util_pct(info.get("spec")), wait)
    return found.util_pct, found.mem_peak_gib, found.idle_gpu_hours, found.gpu_hours, warning


def low_util_pct(spec: Optional[dict]) -> float:
    """The run's ``health.low_util_pct`` from its spec's flat keys, else the default."""
    value = (spec or {}).get("health.low_util_pct")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= 100:
        return float(value)
    return DEFAULT_LOW_UTIL_PCT


def curves(samples: list) -> dict:
    """{"GPU-… on host (rank R)": (seconds since the run's first sample, util %)}, one per GPU."""
    first = min(s.time for s in samples)
    return {f"{listed[0].gpu} on {listed[0].host} (rank {listed[0].rank})":
            (np.array([s.time - first for s in listed]), np.array([s.util_pct for s in listed]))
            for listed in telemetry.per_gpu(samples).values()}


def busy_hours(runs: pd.DataFrame) -> pd.Series:
    """Each run's GPU-hours at work: what its group's mean utilisation adds up."""
    return runs[WEIGHT] * runs["gpu_util_pct"] / 100


def series(runs: pd.DataFrame) -> dict:
    """{run path: its GPUs' curves} of the runs that sampled them, in the table's order."""
    if SERIES not in runs.columns:
        return {}
    return {path: curves for path, curves in zip(runs["path"], runs[SERIES]) if isinstance(curves, dict)}


# ---------------------------------------------------------------- the report's columns


TEXT = ("gpu_util: the GPUs' utilisation over the run, weighted by time, over all its GPUs; gpu_mem_peak: the most "
        "memory any of its GPUs used; idle GPU-h: the GPU-hours sampled times (1 - utilisation); -: no sample. "
        "From the run's telemetry.jsonl.")


class EfficiencyColumns(Provider):
    """gpu_util, gpu_mem_peak and idle GPU-h of each run (and of each group), when some run
    of the experiment sampled its GPUs; the low-utilisation warning of each run."""

    fields = ("world_size",)  # the ranks the input wait is averaged over
    run_columns = (*COLUMNS, WARNING)
    group_columns = COLUMNS
    legend = TEXT
    group_legend = "Groups: the mean over their runs' GPU-hours, the highest peak, the idle GPU-hours summed."
    notes_heading = "GPU warnings:"

    def curves(self, runs: pd.DataFrame) -> Optional[RunCurves]:
        """Each run's GPU utilisation over time, one line per GPU."""
        found = series(runs)
        return RunCurves("GPU utilisation", "gpu_util", found, plots.gpu_panel, having="sampled their GPUs") \
            if found else None

    def columns(self, runs: Runs) -> pd.DataFrame:
        """COLUMNS, WEIGHT, WARNING, BUSY and SERIES of every run, from its telemetry.jsonl
        (none when no run has a sample); the lines skipped as its problems."""
        infos = runs.results.infos
        found = read(infos)
        frame = pd.DataFrame(found.columns, index=pd.RangeIndex(len(infos)))
        if found.columns:
            frame[BUSY] = busy_hours(frame)
            frame[SERIES] = pd.Series([found.series.get(info.get("path")) for info in infos], dtype=object)
        frame.attrs[PROBLEMS] = found.problems
        return frame

    def shown(self, runs: pd.DataFrame) -> bool:
        """Whether some run of the experiment sampled its GPUs."""
        return COLUMNS[0] in runs.columns and bool(runs[COLUMNS[0]].notna().any())

    def group(self, runs: pd.DataFrame, grouped) -> dict:
        """Every run's GPUs, counted or not: utilisation weighted by the runs' GPU-hours, the
        highest peak, the idle GPU-hours summed over the runs with samples; NaN for a group
        without any."""
        if WEIGHT not in runs.columns:
            return {}
        weight = grouped[WEIGHT].sum(min_count=1)
        busy = grouped[BUSY].sum(min_count=1)
        util = (100 * busy / weight).where(weight > 0, grouped["gpu_util_pct"].mean())
        return {"gpu_util_pct": util, "gpu_mem_peak_gib": grouped["gpu_mem_peak_gib"].max(),
                "idle_gpu_hours": grouped["idle_gpu_hours"].sum(min_count=1)}

    def cells(self, frame: pd.DataFrame, grouped: bool) -> list:
        """The mean utilisation, the peak memory, the idle GPU-hours."""
        cells = [[units.gpu_cell(name, value) for value in frame[name]] for name in COLUMNS]
        return [Column(header, header, column, column) for header, column in
                zip(("gpu_util", "gpu_mem_peak", "idle GPU-h"), cells)]

    def notes(self, runs: pd.DataFrame) -> list:
        """Each run's low-utilisation warning ("" when none)."""
        return ["" if not isinstance(w, str) else escape(w) for w in runs[WARNING]]


PROVIDER = EfficiencyColumns()
