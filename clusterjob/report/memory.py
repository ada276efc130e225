"""The most host memory each run used: the report's ``mem_peak_gib``
(docs/design.md, "Resubmit with more memory or time").

A run's peak is the highest its ranks' watchers sampled (clusterjob.health.hostmem: the
PSS of a rank and the processes under it, over every session of the run), in GiB, in the
per-run table; a group's is the highest of its runs', in the grouped data. A run whose
ranks recorded none (``health: null``, no /proc, a run that never started) has none
("-"). Each run's few small files are read for every report; nothing here writes, and
no cluster is asked.
"""

from __future__ import annotations

import math

import pandas as pd

from clusterjob.health import hostmem
from clusterjob.report.provider import Provider, Runs
from clusterjob.report.termtable import Column

COLUMN = "mem_peak_gib"
TEXT = ("mem_peak: the most host memory one rank of the run held with the processes it started (its DataLoader "
        "workers), shared pages split between them (PSS), sampled every 5 s; -: not sampled (health: null).")


def cell(value: float) -> str:
    """"1.6 GiB"; "-" when not known."""
    return f"{value:.1f} GiB" if math.isfinite(value) else "-"


class MemoryColumns(Provider):
    """mem_peak of each run, when some run of the experiment has one: a column of the
    per-run table (``--runs``), where a request is sized; the grouped data (json, csv)
    has each group's highest, its table does not show it (it stays as narrow as it was)."""

    in_groups = False
    run_columns = (COLUMN,)
    group_columns = (COLUMN,)
    reserved = (COLUMN,)  # a metric named mem_peak_gib is not this one
    legend = TEXT
    group_legend = "Groups: the highest of their runs'."

    def columns(self, runs: Runs) -> pd.DataFrame:
        """COLUMN of every run from its ranks' files; none when no run has one."""
        infos = runs.results.infos
        peaks = [hostmem.run_peak(info["path"]) / 2**30 if info.get("path") else math.nan for info in infos]
        frame = pd.DataFrame(index=pd.RangeIndex(len(infos)))
        if any(math.isfinite(peak) for peak in peaks):
            frame[COLUMN] = pd.Series(peaks, dtype=float)
        return frame

    def shown(self, runs: pd.DataFrame) -> bool:
        """Whether some run of the experiment has a peak."""
        return COLUMN in runs.columns and bool(runs[COLUMN].notna().any())

    def group(self, runs: pd.DataFrame, grouped) -> dict:
        """The highest peak of each group's runs."""
        return {COLUMN: grouped[COLUMN].max()} if COLUMN in runs.columns else {}

    def cells(self, frame: pd.DataFrame, grouped: bool) -> list:
        if grouped:
            return []
        shown = [cell(value) for value in frame[COLUMN]]
        return [Column("mem_peak", "mem_peak", shown, shown)]


PROVIDER = MemoryColumns()
