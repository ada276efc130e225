"""The numbers of ``clusterjob report``: which metric ranks the runs, how they group,
and mean and std per group.

The primary metric is ``--metric`` (with ``--mode max|min``), else val_acc (max)
when the runs logged it, else the first metric they logged (min when its name
says loss or err, else max). Groups are formed by the swept keys but the seeds;
they are ranked by the primary metric's mean, the best first. The std is pandas'
sample std (ddof=1), so a group of one run has none.

Which runs count (``counted_runs``): a group's numbers are those of its completed
runs; a group with none completed counts its unfinished runs (running, pending,
preempted, timeout, unknown) at their latest values; failed and cancelled runs never
count, so a diverged run cannot drag a healthy group's mean. Groups with completed
runs rank first, then the unfinished ones, then those with nothing to count; only a
group with completed runs can be best.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.core.errors import BadInput, escape
from clusterjob.core.rundir import STATUSES, UNKNOWN, no_runs
from clusterjob.report import cost
from clusterjob.report.reading import Results, RunStates, collect, with_states
from clusterjob.report.tables import RUN_FIELDS, planned_epochs, runs_frame

# The standard columns of the grouped table (the built-in trainer logs all of them).
GROUP_METRICS = ("val_acc", "best_val_acc", "val_loss", "wall_time_s")
RUN_METRICS = ("epochs", "val_acc", "best_val_acc", "val_loss", "wall_time_s", "samples_per_s")
SEED_KEYS = ("train.seed", "params.seed")  # what a sweep repeats, never a group key
MODES = ("max", "min")
# Logged columns that say where or how fast a run is, not how good it is.
_BOOKKEEPING = ("epoch", "step", "lr", "epoch_time_s", "samples_per_s")
# Runs-table columns that make sense as group keys besides the swept keys.
_EXTRA_KEYS = ("name", "status", "world_size", "backend", "amp", "git_sha")


@dataclass(frozen=True)
class Primary:
    """The metric that ranks the groups, and which way is better."""

    name: str
    mode: str  # "max" or "min"
    why: str  # how the mode was chosen, for the legend

    @property
    def ascending(self) -> bool:
        return self.mode == "min"


@dataclass
class Report:
    """The tables of one report, before formatting."""

    root: Path
    results: Results
    runs: pd.DataFrame  # load_runs' table, planned_epochs (and the primary metric when it is a user's own)
    swept: list  # the swept keys ("name" first when the root holds several names)
    keys: list  # the group keys
    groups: pd.DataFrame  # group_table(runs, keys, primary, metrics)
    primary: Primary
    metrics: list  # the metrics of the grouped table, the primary one first

    @property
    def shows_cost(self) -> bool:
        """Whether the tables have the cost columns: some run ran in a Slurm job."""
        return cost.COLUMNS[0] in self.runs.columns

    @property
    def warnings(self) -> list:
        """Problems found in the run folders, one line each."""
        return self.results.warnings

    @property
    def best(self) -> Optional[dict]:
        """Group keys and values of the best group: the first, when it has completed runs
        with the metric (None when no group has)."""
        if self.groups.empty or self.groups["completed"].iloc[0] == 0 \
                or pd.isna(self.groups[f"{self.primary.name}_mean"].iloc[0]):
            return None
        return {key: plain(self.groups[key].iloc[0]) for key in self.keys}

    @property
    def title(self) -> str:
        """The experiment name, or the folder when it holds several."""
        names = self.runs["name"].dropna().unique()
        return str(names[0]) if len(names) == 1 else str(self.root)

    def save_cache(self) -> None:
        """Write the results cache (after the report succeeded)."""
        self.results.save_cache()


def plain(value: Any) -> Any:
    """A numpy/pandas scalar as a JSON-ready Python value (NaN/NA, and the infinities
    JSON has no word for, as None)."""
    if value is None or (not isinstance(value, (str, list, dict)) and pd.isna(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


# ---------------------------------------------------------------- the primary metric


def default_mode(name: str) -> str:
    """min for a loss or an error rate, max for anything else."""
    return "min" if "loss" in name or "err" in name else "max"


def rankable(results: Results) -> list:
    """Metrics the runs logged (lines, or run.json's final) that can rank them, in the
    order of the metrics table; best_val_acc when they logged val_acc."""
    logged = dict.fromkeys(results.columns)
    for info in results.infos:
        logged.update(dict.fromkeys(info["final"] or {}))
    taken = set(RUN_FIELDS) | set(results.param_keys)
    names = [n for n in logged if n not in taken or n == "samples_per_s"]
    return names + (["best_val_acc"] if "val_acc" in names else [])


def check_mode(mode: Optional[str]) -> None:
    """BadInput unless ``mode`` is None, max or min."""
    if mode is not None and mode not in MODES:
        raise BadInput(f"--mode: {mode!r} is not max or min; give --mode max (higher is better) or --mode min")


def choose_primary(results: Results, metric: Optional[str] = None, mode: Optional[str] = None) -> Primary:
    """The primary metric (see the module docstring); BadInput for a --metric no run
    logged or a --mode other than max/min."""
    check_mode(mode)
    names = rankable(results)
    if metric is None:
        useful = [n for n in names if n not in _BOOKKEEPING and not n.startswith("lr_")]
        metric = "val_acc" if "val_acc" in names or not useful else useful[0]
    elif metric not in names:
        close = [n for n in names if n.startswith(metric)][:1] or difflib.get_close_matches(metric, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(map(escape, names[:20])) or "none"
        raise BadInput(f"--metric: no run logged {metric!r}{hint}; metrics these runs logged: {known}")
    if mode is not None:
        return Primary(metric, mode, "--mode")
    chosen = default_mode(metric)
    why = "the name says loss or err" if chosen == "min" else "the default for a name without loss or err"
    return Primary(metric, chosen, why)


def group_metrics(runs: pd.DataFrame, primary: Primary) -> list:
    """The grouped table's metrics: the primary one, then the standard ones (all of them
    for val_acc, the built-in trainer's; else those some run has a value for)."""
    rest = [m for m in GROUP_METRICS if m != primary.name]
    if primary.name != "val_acc":
        rest = [m for m in rest if runs[m].notna().any()]
    return [primary.name, *rest]


def run_metrics(report: Report) -> list:
    """The metric columns of the per-run table; runs that logged steps but no epochs
    (a user's own code) show their last step instead of the epochs."""
    if report.primary.name == "val_acc":
        return list(RUN_METRICS)
    where = "step" if "step" in report.runs.columns else "epochs"
    rest = [m for m in RUN_METRICS[1:] if m != report.primary.name and report.runs[m].notna().any()]
    return [where, report.primary.name, *rest]


def _extra_columns(results: Results, primary: Primary) -> list:
    """Runs-table columns beyond the standard ones: the primary metric when it is a
    user's own, and the last step when the runs logged steps but no epochs."""
    extra = [primary.name] if primary.name not in RUN_METRICS else []
    if "epoch" not in results.columns and "step" in results.columns and primary.name != "val_acc":
        extra.append("step")
    return extra


# ---------------------------------------------------------------- groups


def _swept_keys(results: Results, runs: pd.DataFrame) -> list:
    """Swept keys; "name" leads when the root holds runs of several names."""
    keys = results.param_keys
    return (["name"] if runs["name"].nunique() > 1 else []) + keys


def _resolve_key(key: str, swept: list, runs: pd.DataFrame) -> str:
    """A --group-by key as a runs-table column; a unique suffix such as "lr" works."""
    allowed = list(dict.fromkeys(swept + [k for k in _EXTRA_KEYS if k in runs.columns]))
    if key in allowed:
        return key
    by_suffix = [k for k in swept if k.endswith("." + key)]
    if len(by_suffix) == 1:
        return by_suffix[0]
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise BadInput(f"--group-by: unknown key {key!r}{hint}; keys of these runs: {', '.join(allowed)}")


def group_keys(runs: pd.DataFrame, swept: list, group_by: Optional[list] = None) -> list:
    """The group keys: ``group_by`` (comma lists allowed), else every swept key but the seeds."""
    if group_by is None:
        return [key for key in swept if key not in SEED_KEYS]
    wanted = [part.strip() for item in group_by for part in item.split(",") if part.strip()]
    return list(dict.fromkeys(_resolve_key(key, swept, runs) for key in wanted))


# Statuses whose runs never count in their group's numbers: they ended without a result.
NEVER_COUNTED = ("failed", "cancelled")


def group_ids(runs: pd.DataFrame, keys: list) -> np.ndarray:
    """Each run's group as a number (all runs one group without keys)."""
    if not keys:
        return np.zeros(len(runs), dtype=np.int64)
    return runs.groupby(keys, dropna=False, sort=False, observed=True).ngroup().to_numpy()


def group_has(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per run: whether some run of its group (``ids``) is in ``mask``."""
    return np.bincount(ids, weights=mask, minlength=ids.max(initial=-1) + 1)[ids] > 0


def counted_runs(runs: pd.DataFrame, keys: list) -> pd.Series:
    """Whether each run counts in its group's numbers (see the module docstring)."""
    status = runs["status"].astype(object)
    completed = (status == "completed").to_numpy()
    unfinished = ~status.isin(NEVER_COUNTED).to_numpy()
    counted = completed | (~group_has(completed, group_ids(runs, keys)) & unfinished)
    return pd.Series(counted, index=runs.index)


def _not_completed(status: pd.Series, ids: np.ndarray) -> list:
    """Per group (``ids`` numbers each run's): "2 failed, 1 running", the runs that are
    not completed ("" when none), the documented states first."""
    names = status.astype(object).to_numpy()
    order = [s for s in (*STATUSES, UNKNOWN) if s != "completed"]
    order += sorted(set(names) - {*order, "completed"})
    column = {name: i for i, name in enumerate(order)}
    codes = np.array([column.get(name, -1) for name in names], dtype=np.int64)
    counts = np.zeros((ids.max(initial=-1) + 1, len(order)), dtype=np.int64)
    np.add.at(counts, (ids[codes >= 0], codes[codes >= 0]), 1)
    return [", ".join(f"{n} {name}" for n, name in zip(row, order) if n) for row in counts]


def group_table(runs: pd.DataFrame, keys: list, primary: Primary, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per group: keys, n, <metric>_mean/_std (ddof=1) over the counted runs,
    <cost>_sum over all its runs (when ``runs`` has the cost columns), completed, counted,
    not_completed ("1 failed"); ranked as the module docstring says."""
    counted = counted_runs(runs, keys)
    frame = runs.assign(_completed=runs["status"].astype(object) == "completed", _counted=counted, _all=0)
    for metric in metrics:  # a run that does not count has no value in its group
        frame[metric] = frame[metric].where(counted)
    grouped = frame.groupby(keys or ["_all"], dropna=False, sort=False, observed=True)
    table = grouped.size().rename("n").to_frame()
    for metric in metrics:
        table[f"{metric}_mean"] = grouped[metric].mean()
        table[f"{metric}_std"] = grouped[metric].std(ddof=1)
    for column in cost.COLUMNS:  # every run cost, counted or not; unknown when one run's is
        if column in frame.columns:
            table[f"{column}_sum"] = grouped[column].sum().where(grouped[column].count() == table["n"])
    table["completed"] = grouped["_completed"].sum().astype(np.int64)
    table["counted"] = grouped["_counted"].sum().astype(np.int64)
    table["not_completed"] = _not_completed(frame["status"], grouped.ngroup().to_numpy())
    table = table.reset_index().drop(columns=["_all"], errors="ignore")
    return _ranked(table, primary)


def _ranked(table: pd.DataFrame, primary: Primary) -> pd.DataFrame:
    """Groups with completed runs first, then unfinished ones, then those with nothing
    counted; by the primary metric's mean within each (missing means last)."""
    tier = np.where(table["completed"] > 0, 0, np.where(table["counted"] > 0, 1, 2))
    mean = table[f"{primary.name}_mean"].to_numpy(dtype=float)
    value = mean if primary.ascending else -mean
    order = np.lexsort((np.where(np.isnan(value), np.inf, value), tier))  # stable: ties keep their order
    return table.iloc[order].reset_index(drop=True)


def _sorted_runs(runs: pd.DataFrame, keys: list) -> pd.DataFrame:
    """Runs ordered by their swept keys (seeds of one config together), then folder order."""
    try:
        return runs.sort_values(keys, kind="stable", na_position="last") if keys else runs
    except TypeError:  # a key mixing numbers and text cannot be ordered: keep folder order
        return runs


def build_report(root: "str | Path | Sequence", group_by: Optional[list] = None, cache: bool = True,
                 metric: Optional[str] = None, mode: Optional[str] = None,
                 states: Optional[RunStates] = None) -> Report:
    """Read the runs under ``root`` (or a list of run folders) and group them, each run's
    state as ``states`` derives it (``reading.with_states``); BadInput for a bad DIR,
    key, metric or mode. Writes nothing: ``Report.save_cache`` does."""
    try:
        results = with_states(collect(root, cache=cache), states)
    except FileNotFoundError:
        raise no_runs(root) from None
    if not results.infos:
        raise no_runs(root)
    primary = choose_primary(results, metric, mode)
    runs = runs_frame(results, _extra_columns(results, primary)).assign(**cost.columns(results.infos))
    runs.insert(list(runs.columns).index("epochs") + 1, "planned_epochs", pd.Series(planned_epochs(results, runs)))
    swept = _swept_keys(results, runs)
    keys = group_keys(runs, swept, group_by)
    metrics = group_metrics(runs, primary)
    groups = group_table(runs, keys, primary, metrics)
    return Report(results.root, results, _sorted_runs(runs, swept), swept, keys, groups, primary, metrics)


# ---------------------------------------------------------------- status


def status_counts(runs: pd.DataFrame) -> dict:
    """{status: runs}, nonzero only, completed first, then the other documented states."""
    counts = runs["status"].astype(object).value_counts()
    order = ["completed", *[s for s in STATUSES if s != "completed"], UNKNOWN]
    order += sorted(set(counts.index) - set(order))
    return {status: int(counts[status]) for status in order if status in counts.index}


def status_line(report: Report) -> str:
    """"12 runs: 9 completed, 2 running, 1 unknown; 1 damaged (see warnings)"."""
    counts = status_counts(report.runs)
    parts = ", ".join(f"{n} {escape(status)}" for status, n in counts.items())
    line = f"{len(report.runs)} run{'s' if len(report.runs) != 1 else ''}: {parts}"
    damaged = sum(1 for problems in report.results.problems if problems)
    return line + (f"; {damaged} damaged (see warnings)" if damaged else "")
