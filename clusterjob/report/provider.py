"""A family of the report's columns, as one module provides it: what it is handed, what it
gives, and how its cells are written.

A provider (cost, efficiency, searchcost) gives every run's columns at once
(``columns(runs) -> DataFrame``), how a group's values come from its runs' (``group``),
its names and order in each table's data (``run_columns``, ``group_columns``), its
display columns and legend (``cells``, ``legend``), a note per run (``notes``), a line
per experiment (``summary``) and curves of each run for the html page (``curves``).
The registered ones are ``assemble.PROVIDERS``; the grouping (stats) and the writers
(cells, build, htmlpage) take whichever the report has and name none of them. Every hook
has a default that adds nothing, so a family that only adds a column or two overrides
only what it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import pandas as pd

from clusterjob.core import slurmctl, units
from clusterjob.report.reading import Results

if TYPE_CHECKING:
    from pandas.core.groupby import DataFrameGroupBy

# The attrs key of a columns frame that holds, per run, what was wrong in the files it was
# read from (a list of lines each): they join the run's warnings.
PROBLEMS = "problems"


class Answers:
    """sacct's answers, each list of jobs asked once: the providers of one report share one
    query (the cost columns and a search's hours)."""

    def __init__(self, ask: Callable = slurmctl.segments):
        self._ask = ask
        self._answers: dict = {}

    def __call__(self, jobs: list) -> Optional[dict]:
        key = tuple(jobs)
        if key not in self._answers:
            self._answers[key] = self._ask(jobs)
        return self._answers[key]


@dataclass(frozen=True)
class Runs:
    """What a provider reads: the runs (``results``, in their order), sacct asked through
    ``ask`` (``Answers``: once per list of jobs for the whole report), and for a line on
    one experiment its runs table (``table``: load_runs' columns, planned_epochs and every
    provider's columns, in ``results`` order; None for the whole report's columns)."""

    results: Results
    ask: Callable = slurmctl.segments
    table: Optional[pd.DataFrame] = None


@dataclass(frozen=True)
class RunCurves:
    """A family's curve of each run over time, one panel per run on the html page, under
    ``heading``: ``series`` {run path: what ``draw`` takes}, ``draw`` (a panel's title,
    one run's series) -> SVG, ``metric`` the panels' data-metric, ``x`` their unit of
    time, ``having`` what the runs not drawn did (said under the panels)."""

    heading: str
    metric: str
    series: dict
    draw: Callable[[str, Any], bytes]
    x: str = "second"
    having: str = "have curves"


class Summary(Protocol):
    """A provider's line on an experiment: above its tables, and in json."""

    def line(self) -> str: ...

    def as_json(self) -> dict: ...


class Provider:
    """A family of columns. Its class attributes name it in each table:

    - ``run_columns``, ``group_columns``: its columns of the per-run and the grouped data
      (csv, json), in their order; the first of ``run_columns`` present in an
      experiment's runs means the family has something to say there (``shown``).
    - ``reserved``: run columns a metric of the same name may not rank by.
    - ``legend``: what its cells mean, in both tables' legends; ``group_legend``: how a
      group's come from its runs', after it in the grouped table's.
    - ``notes_heading``: the heading of its per-run notes under the md table.
    - ``summary_key``: the json key of its line on an experiment ("" for none).
    - ``fields``: the run.json fields it reads from each run's row beyond the tables' own
      (``reading.TABLE_FIELDS``); the report reads every provider's.
    - ``in_groups``: whether the grouped table shows its cells and legend (its
      ``group_columns`` stay in the grouped data either way).
    """

    fields: tuple = ()
    in_groups = True
    run_columns: tuple = ()
    group_columns: tuple = ()
    reserved: tuple = ()
    legend = ""
    group_legend = ""
    notes_heading = ""
    summary_key = ""

    def columns(self, runs: Runs) -> pd.DataFrame:
        """Every run's columns, a row per run of ``runs.results`` in their order; none when
        the family has nothing to say about these runs. ``attrs[PROBLEMS]``, when set: per
        run, the problems found in the files it read."""
        return pd.DataFrame(index=pd.RangeIndex(len(runs.results.infos)))

    def shown(self, runs: pd.DataFrame) -> bool:
        """Whether an experiment's tables show the family: its runs have its columns."""
        return bool(self.run_columns) and self.run_columns[0] in runs.columns

    def group(self, runs: pd.DataFrame, grouped: "DataFrameGroupBy") -> dict:
        """{column: values per group} of the grouped table, from ``runs`` (every run, a
        metric of a run that does not count masked) as ``grouped`` groups them."""
        return {}

    def cells(self, frame: pd.DataFrame, grouped: bool) -> list:
        """Its display columns (termtable.Column) of the runs table, or of the grouped one."""
        return []

    def notes(self, runs: pd.DataFrame) -> list:
        """Per run, its note ("" for none), in the runs table's order, escaped."""
        return [""] * len(runs)

    def summary(self, runs: Runs) -> Optional[Summary]:
        """Its line on one experiment (``runs.table`` given); None when it has none."""
        return None

    def curves(self, runs: pd.DataFrame) -> Optional[RunCurves]:
        """Its curves of each run of an experiment's runs table for the html page; None
        when it has none."""
        return None


def number_cell(metric: str, value: Any) -> str:
    """One value in the metric's unit (``units.number``); "-" when missing."""
    return "-" if pd.isna(value) else units.number(metric, value)
