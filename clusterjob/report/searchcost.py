"""What a search spent against what its trials would have cost run to the end: the
report's one line on a search (docs/design.md, "Search").

Only the runs of one experiment that are all trials of one search get it (run.json's
``search``); a grid sweep's report has none. The unit is GPU-hours when a trial held a
GPU, else CPU-hours.

- **Spent.** Where Slurm accounting answers for every job the trials ran in, the
  compute of those jobs (``cost.shared_compute``: each slot's array task once, every
  requeue and every array of a resume included, the slot's time between trials too).
  Else each trial's running time (``tables.running_time``) times the GPUs (CPUs) its
  spec asks: nodes x gpus_per_node (nodes x tasks_per_node x cpus_per_task).
- **Run to the end.** Spent, plus for each pruned trial the epochs (your code: the
  metric's steps) it did not run times its time per epoch (the mean of its
  epoch_time_s, else its running time over the epochs or steps it logged) times what it
  held (accounting's AllocTRES of its last job, else its spec's). The full length is
  the spec's train.epochs for the trainer; for your code, the most steps a completed
  trial of the search logged. A pruned trial whose full length or pace is not known
  counts as it is, and the line says how many those are.
- **Not ended by the search.** A cancelled (or still running) trial counts as far as it
  ran, never as a saving; the line says how many. A search that pruned nothing says so
  ("no trial pruned") instead of a share saved.

Nothing here writes; a trial that cannot be read is left out, never an error. ``PROVIDER``
gives the line to the report (``provider.Provider``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from clusterjob.core import runstate, slurmctl, units
from clusterjob.report import cost
from clusterjob.report.provider import Provider, Runs
from clusterjob.report.reading import Results
from clusterjob.report.tables import last_logged, search_of, segment_mean

NAN = math.nan


@dataclass(frozen=True)
class SearchHours:
    """A search's hours: ``spent``, ``full`` (had every pruned trial run to its end) in
    ``unit`` (GPU or CPU) hours, from ``source`` (sacct or run time); ``pruned`` trials
    scaled up, ``unscaled`` pruned ones counted as they are, ``unknown`` trials whose
    running time is not known (left out)."""

    search: str
    unit: str
    spent: float
    full: float
    source: str
    trials: int
    pruned: int
    unscaled: int = 0
    unknown: int = 0
    cancelled: int = 0  # trials cancelled (or still running): counted as far as they ran, never as savings

    @property
    def saved(self) -> float:
        """The share of ``full`` that pruning saved (NaN when not known)."""
        return 1 - self.spent / self.full if self.full > 0 else NAN

    def line(self) -> str:
        """"search 2026...: 0.042 CPU-h spent; 0.083 CPU-h had its 12 trials run to the end: 50% saved ..."."""
        if math.isnan(self.spent):
            return f"search {self.search}: hours not known (no trial recorded its running time)"
        spent, full = (units.unit_hours(h, self.unit) for h in (self.spent, self.full))
        source = "from sacct" if self.source == SACCT else f"run time x the {self.unit}s each trial asks"
        notes = [f"{self.cancelled} trial(s) not ended by the search (cancelled, running) counted as far as they "
                 "ran"] if self.cancelled else []
        notes += [f"{self.unknown} trial(s) without a known running time left out"] if self.unknown else []
        if not self.pruned and not self.unscaled:  # nothing pruned: nothing saved, nothing to claim
            return f"search {self.search}: {spent} spent; no trial pruned ({'; '.join([source, *notes])})"
        saved = f"{self.saved:.0%} saved by pruning" if math.isfinite(self.saved) else "nothing to save"
        notes = [f"{self.pruned} pruned trial(s) scaled up to their full length", source, *notes]
        notes += [f"{self.unscaled} pruned trial(s) of unknown full length counted as run"] if self.unscaled else []
        return (f"search {self.search}: {spent} spent; {full} had its {self.trials} trial(s) run to the end: "
                f"{saved} ({'; '.join(notes)})")

    def as_json(self) -> dict:
        """The json report's ``search_hours``."""
        finite = [h if math.isfinite(h) else None for h in (self.spent, self.full, self.saved)]
        return {"search": self.search, "unit": f"{self.unit}-hours", "hours_spent": finite[0],
                "hours_if_run_to_end": finite[1], "saved_share": finite[2], "source": self.source,
                "trials": self.trials, "pruned": self.pruned, "pruned_unscaled": self.unscaled,
                "time_unknown": self.unknown, "not_ended": self.cancelled}


SACCT, RUN_TIME = "sacct", "run time"
_GPU_KEYS = ("resources.nodes", "resources.gpus_per_node")
_CPU_KEYS = ("resources.nodes", "resources.tasks_per_node", "resources.cpus_per_task")


def _held(spec: Optional[dict], keys: tuple) -> float:
    """The product of the spec's resources ``keys`` (NaN when one is not a whole number)."""
    values = [(spec or {}).get(key) for key in keys]
    whole = [v for v in values if type(v) is int and v >= 0]
    return float(math.prod(whole)) if len(whole) == len(values) else NAN


def _progress(results: Results, runs: pd.DataFrame) -> tuple:
    """(done, full, seconds per epoch or step) per trial, in ``results`` order."""
    epochs, steps = last_logged(results, "epoch"), last_logged(results, "step")
    done = np.where(np.isnan(epochs), steps, epochs)
    planned = runs["planned_epochs"].astype("Float64").to_numpy(dtype=float, na_value=NAN)
    completed = (runs["status"].astype(object) == runstate.COMPLETED).to_numpy()
    by_steps = np.isnan(epochs) & ~np.isnan(steps)
    longest = np.nanmax(np.where(completed & by_steps, steps, NAN), initial=-np.inf)
    full = np.where(np.isnan(planned) & by_steps & np.isfinite(longest), longest, planned)
    wall = runs["wall_time_s"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        pace = np.where(done > 0, wall / done, NAN)
    per_epoch = segment_mean(results, "epoch_time_s")
    pace = np.where(~np.isnan(epochs) & np.isfinite(per_epoch), per_epoch, pace)
    return done, full, pace


def search_hours(results: Results, runs: pd.DataFrame, ask: Callable = slurmctl.segments) -> Optional[SearchHours]:
    """The search's hours (module docstring) of an experiment's ``results`` and its runs
    table (``runs``: load_runs' columns and planned_epochs, any order); None when its
    runs are not the trials of one search."""
    search = search_of(results)
    if search is None:
        return None
    runs = runs.sort_index()  # results order
    gpus = np.array([_held(info["spec"], _GPU_KEYS) for info in results.infos])
    accounted = cost.shared_compute(results.infos, ask)
    unit = "GPU" if np.nansum(gpus) > 0 or (accounted is not None and accounted[0] > 0) else "CPU"
    rates = gpus if unit == "GPU" else np.array([_held(info["spec"], _CPU_KEYS) for info in results.infos])
    wall = runs["wall_time_s"].to_numpy(dtype=float)
    known = ~np.isnan(wall * rates)
    if accounted is not None:
        spent, source = accounted[0] if unit == "GPU" else accounted[1], SACCT
        rates = _accounted_rates(results, accounted[2], rates, unit)
    else:
        spent, source = (float(np.sum((wall * rates)[known])) / 3600 if known.any() else NAN), RUN_TIME
    done, full, pace = _progress(results, runs)
    pruned = (runs["status"].astype(object) == runstate.PRUNED).to_numpy()
    rest = (full - done) * pace * rates / 3600
    scaled = pruned & np.isfinite(rest)
    extra = float(np.sum(np.maximum(rest[scaled], 0.0)))
    status = runs["status"].astype(object)
    told = (runstate.COMPLETED, runstate.PRUNED, runstate.FAILED)
    cut_short = int((~status.isin(told)).sum())  # cancelled, running, ...
    return SearchHours(search, unit, spent, spent + extra, source, len(results.infos), int(scaled.sum()),
                       int((pruned & ~scaled).sum()), int((~known).sum()) if source == RUN_TIME else 0, cut_short)


def _accounted_rates(results: Results, held: dict, rates: np.ndarray, unit: str) -> np.ndarray:
    """What each trial held in its last Slurm job as accounting says, else ``rates``."""
    out = rates.copy()
    for i, info in enumerate(results.infos):
        jobs = cost.slurm_jobs(info)
        if jobs and jobs[-1] in held:
            out[i] = held[jobs[-1]][0 if unit == "GPU" else 1]
    return out


class SearchHoursLine(Provider):
    """The line of a search's hours above its experiment's tables, and json's ``search_hours``."""

    summary_key = "search_hours"
    fields = cost.CostColumns.fields  # the search's hours are its trials' jobs, as the cost's

    def summary(self, runs: Runs) -> Optional[SearchHours]:
        """The search's hours, when the experiment's runs are the trials of one search."""
        assert runs.table is not None  # a line on one experiment: its runs table is given
        return search_hours(runs.results, runs.table, runs.ask)


PROVIDER = SearchHoursLine()
