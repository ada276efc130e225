"""The numbers of ``clusterjob report``: which metric ranks the runs, how they group,
and mean and std per group.

Each experiment (the runs of one spec name) is a section of its own (``Experiment``):
runs of different names are never averaged together nor compared for best, and each
has its own primary metric: ``--metric`` (with ``--mode max|min``) where its runs
logged it, else ``core.metrics.default_metric`` (val_acc when logged, else the first
metric logged; min when its name says loss or err, else max). Its groups are formed
by its keys but the seeds (``tables.shown_keys``: every key of the runs' params, and
every spec.yaml key whose value differs between its runs), or by ``--group-by``
(any key of the resolved spec); they are ranked by the primary metric's mean, the
best first. The std is pandas' sample std (ddof=1), so a group of one run has none.

Which runs count (``counted_runs``): a group's numbers are those of its completed
runs; a group with none completed counts its unfinished runs (running, pending,
preempted, timeout, unknown) at their latest values; failed and cancelled runs never
count, so a diverged run cannot drag a healthy group's mean. Groups with completed
runs rank first, then the unfinished ones, then those with nothing to count; only a
group with completed runs can be best. A group's ``state`` column says which of these
it is, once (``group_state``): every reader of the table goes by it.

A search's runs are its trials, each with values of its own: its table has one row per
trial (``by_trial``: a ``trial`` key first, no "more seeds would tell" advice, trials
that tie for best said to tie), unless its space has a seed (its trials group by the
other keys, as a sweep's runs do) or --group-by is given. Its cancelled trials count at
their latest values (SEARCH_NEVER_COUNTED), as a cancelled search is read as far as it got.

The columns of the report's families (``provider.Provider``: what runs cost, how they
used their GPUs, ...) are grouped as each family says (``Provider.group``), over every
run of a group, counted or not; nothing here names one of them.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.core import metrics as metricsfile
from clusterjob.core import runstate, units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.runstate import STATUSES, UNKNOWN
from clusterjob.core.units import default_mode
from clusterjob.report.provider import Provider
from clusterjob.report.reading import Results
from clusterjob.report.tables import RUN_FIELDS, own_code

# The standard columns of the grouped table (the built-in trainer logs all of them).
GROUP_METRICS = ("val_acc", "best_val_acc", "val_loss", "wall_time_s")
RUN_METRICS = ("epochs", "val_acc", "best_val_acc", "val_loss", "wall_time_s", "samples_per_s")
SEED_KEYS = ("train.seed", "params.seed")  # what a sweep repeats, never a group key
MODES = ("max", "min")
# Runs-table columns that make sense as group keys besides the key columns.
EXTRA_KEYS = ("name", "status", "world_size", "backend", "amp", "git_sha")
# A group's state (the ``state`` column): every run completed, some did, none did but
# some still may, none did nor will (every run failed or was cancelled).
COMPLETE, PARTIAL, UNFINISHED, FAILED = "complete", "partial", "unfinished", "failed"


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
class Experiment:
    """The tables of one experiment (the runs of one spec name), before formatting."""

    name: str
    results: Results  # its runs only
    runs: pd.DataFrame  # load_runs' table, planned_epochs, the primary metric when it is a user's own, and
    # every provider's columns
    swept: list  # the key columns (tables.shown_keys, and the --group-by keys of the spec)
    keys: list  # the group keys
    groups: pd.DataFrame  # group_table(runs, keys, primary, metrics, never, providers)
    primary: Primary
    metrics: list  # the metrics of the grouped table, the primary one first
    providers: tuple = ()  # the report's column families (provider.Provider), in the order of their columns
    summaries: dict = field(default_factory=dict)  # {a provider's summary_key: its line on these runs, or None}
    search: Optional[str] = None  # the id of the search whose trials these runs are (None: anything else)
    trials: bool = False  # a search reported trial by trial (``by_trial``): a row per trial, a "trial" key first
    took: dict = field(default_factory=dict)  # {group key: the --group-by word that named it, when it differs}

    @property
    def families(self) -> list:
        """The providers whose columns its tables show (``Provider.shown``), in their order."""
        return [provider for provider in self.providers if provider.shown(self.runs)]

    @property
    def best(self) -> Optional[dict]:
        """Group keys and values of the best group: the first, when it has completed runs
        with the metric (None when no group has)."""
        if self.groups.empty or self.groups["state"].iloc[0] not in (COMPLETE, PARTIAL) \
                or pd.isna(self.groups[f"{self.primary.name}_mean"].iloc[0]):
            return None
        return {key: json_value(self.groups[key].iloc[0]) for key in self.keys}

    @property
    def lead(self) -> Optional["Lead"]:
        """How far the best group leads the next one, when that is within the noise (None
        when it is not, or there is no other group with completed runs to compare)."""
        return best_lead(self) if self.best is not None and not self.trials else None

    @property
    def tied(self) -> list:
        """The trials that tie for best (the best first), when more than one does: a
        search's trials with the best one's value as the tables write it; [] otherwise."""
        return tied_trials(self) if self.best is not None and self.trials else []


@dataclass
class Report:
    """The experiments of one report (one section each), before formatting."""

    root: Path
    results: Results  # every run
    experiments: list  # Experiment, in the order their runs were found

    @property
    def runs(self) -> pd.DataFrame:
        """Every run, experiment after experiment (the runs tables, one below the other)."""
        if len(self.experiments) == 1:
            return self.experiments[0].runs
        return pd.concat([e.runs.astype(object) for e in self.experiments], ignore_index=True)

    @property
    def only(self) -> Experiment:
        """The report's experiment, when it has one (the tables below are its)."""
        if len(self.experiments) != 1:
            raise ValueError(f"the report has {len(self.experiments)} experiments; see Report.experiments")
        return self.experiments[0]

    groups = property(lambda self: self.only.groups, doc="The only experiment's grouped table.")
    keys = property(lambda self: self.only.keys, doc="The only experiment's group keys.")
    swept = property(lambda self: self.only.swept, doc="The only experiment's key columns.")
    primary = property(lambda self: self.only.primary, doc="The only experiment's primary metric.")
    metrics = property(lambda self: self.only.metrics, doc="The only experiment's grouped metrics.")
    best = property(lambda self: self.only.best, doc="The only experiment's best group.")

    @property
    def warnings(self) -> list:
        """Problems found in the run folders, one line each."""
        return self.results.warnings

    @property
    def title(self) -> str:
        """The experiment name, or the folder when it holds several."""
        return self.experiments[0].name if len(self.experiments) == 1 else str(self.root)

    def save_cache(self) -> None:
        """Write the results cache (after the report succeeded)."""
        self.results.save_cache()


def json_value(value: Any) -> Any:
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


def rankable(results: Results, reserved: Sequence[str] = ()) -> list:
    """Metrics the runs logged (lines, or run.json's final) that can rank them, in the
    order of the metrics table; best_val_acc when they logged val_acc. ``reserved``: the
    providers' run columns (``Provider.reserved``), which no metric may take."""
    logged = dict.fromkeys(results.columns)
    for info in results.infos:
        logged.update(dict.fromkeys(info["final"] or {}))
    taken = set(RUN_FIELDS) | set(reserved) | set(results.param_keys)
    names = [n for n in logged if n not in taken or n == "samples_per_s"]
    return names + (["best_val_acc"] if "val_acc" in names else [])


def check_mode(mode: Optional[str]) -> None:
    """BadInput unless ``mode`` is None, max or min."""
    if mode is not None and mode not in MODES:
        raise BadInput(f"--mode: {mode!r} is not max or min; give --mode max (higher is better) or --mode min")


def choose_primary(results: Results, metric: Optional[str] = None, mode: Optional[str] = None,
                   reserved: Sequence[str] = ()) -> Primary:
    """The primary metric (see the module docstring); BadInput for a --metric no run
    logged or a --mode other than max/min (``reserved``: ``rankable``'s)."""
    check_mode(mode)
    names = rankable(results, reserved)
    named = spec_metric(results, names) if metric is None else None
    if named is not None:
        return named if mode is None else Primary(named.name, mode, "--mode")
    if metric is None:
        metric = metricsfile.default_metric(names)
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


_OWN_METRICS = "entrypoint.metrics."  # your code's metrics in a flat spec: entrypoint.metrics.<name>: regex


def spec_metric(results: Results, logged: list) -> Optional[Primary]:
    """The metric the runs' spec names, when some run logged it: its search.metric (with
    search.mode), else for your own code the one ``default_metric`` takes of its
    entrypoint.metrics; None when the spec names none (the built-in trainer's runs). The
    first spec tells: the runs of one name share it but for a value or two."""
    spec = next((info["spec"] for info in results.infos if info["spec"]), None)
    if spec is None:
        return None
    searched = spec.get("search.metric")
    if isinstance(searched, str) and searched in logged:
        mode = spec.get("search.mode")
        if mode in MODES:
            return Primary(searched, mode, "the spec's search.mode; the metric its search.metric names")
        return _named(searched, "search.metric")
    own = metricsfile.named_metric([key[len(_OWN_METRICS):] for key in spec if key.startswith(_OWN_METRICS)], logged)
    return _named(own, "entrypoint.metrics") if own is not None else None


def _named(metric: str, key: str) -> Primary:
    """``metric`` as the spec's ``key`` names it, its mode the default for its name."""
    chosen = default_mode(metric)
    why = "the name says loss or err" if chosen == "min" else "the default for a name without loss or err"
    return Primary(metric, chosen, f"{why}; the metric the spec's {key} names")


def primaries(parts: list, metric: Optional[str], mode: Optional[str], reserved: Sequence[str] = ()) -> list:
    """Each experiment's primary metric: ``--metric`` where its runs logged it, else its
    own default (the legend says so); BadInput when no experiment's runs logged it."""
    chosen: list[Optional[Primary]] = []
    errors = []
    for part in parts:
        try:
            chosen.append(choose_primary(part, metric, mode, reserved))
        except BadInput as err:
            errors.append(err)
            chosen.append(None)
    if len(errors) == len(parts):
        raise errors[0]
    return [c or _unasked(part, metric, reserved) for c, part in zip(chosen, parts)]


def _unasked(results: Results, metric: Optional[str], reserved: Sequence[str]) -> Primary:
    """The default primary metric of runs that did not log the --metric asked for."""
    own = choose_primary(results, reserved=reserved)
    return Primary(own.name, own.mode, f"these runs did not log --metric {metric}")


def _trainer_columns(results: Results, primary: Primary) -> bool:
    """Whether the tables have every column of the built-in trainer: its runs ranked by
    val_acc; your own code's runs show only what they logged."""
    return primary.name == "val_acc" and not any(map(own_code, results.infos))


def group_metrics(runs: pd.DataFrame, primary: Primary, results: Results) -> list:
    """The grouped table's metrics: the primary one, then the standard ones (all of them
    for the built-in trainer ranked by val_acc; else those some run has a value for)."""
    rest = [m for m in GROUP_METRICS if m != primary.name]
    if not _trainer_columns(results, primary):
        rest = [m for m in rest if runs[m].notna().any()]
    return [primary.name, *rest]


def run_metrics(experiment: Experiment) -> list:
    """The metric columns of the per-run table; runs that logged steps but no epochs
    (a user's own code) show their last step instead of the epochs."""
    if _trainer_columns(experiment.results, experiment.primary):
        return list(RUN_METRICS)
    runs = experiment.runs
    where = "step" if "step" in runs.columns else "epochs"
    rest = [m for m in RUN_METRICS[1:] if m != experiment.primary.name and runs[m].notna().any()]
    return [where, experiment.primary.name, *rest]


def extra_columns(results: Results, primary: Primary) -> list:
    """Runs-table columns beyond the standard ones: the primary metric when it is a
    user's own, and the last step when the runs logged steps but no epochs."""
    extra = [primary.name] if primary.name not in RUN_METRICS else []
    if "epoch" not in results.columns and "step" in results.columns and primary.name != "val_acc":
        extra.append("step")
    return extra


# ---------------------------------------------------------------- groups


def _resolve_key(key: str, shown: list, spec: list) -> str:
    """A --group-by key as a runs-table column: a key column, any key of the runs'
    spec.yaml or one of EXTRA_KEYS; a unique suffix such as "lr" works. The spec's key
    comes before a run.json field of the same last word ("amp" is train.amp, whose column
    shows what each run resolved it to: ``tables.RESOLVED``)."""
    allowed = list(dict.fromkeys(shown + list(EXTRA_KEYS) + spec))
    if key in shown or key in spec:
        return key
    of_spec = [k for k in dict.fromkeys(shown + spec) if k.endswith("." + key)]
    if key in EXTRA_KEYS:
        return of_spec[0] if len(of_spec) == 1 else key
    for among in (shown, allowed):
        by_suffix = [k for k in among if k.endswith("." + key)]
        if len(by_suffix) == 1:
            return by_suffix[0]
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(map(escape, shown + list(EXTRA_KEYS)))
    raise BadInput(f"--group-by: unknown key {key!r}{hint}; keys of these runs: {listed}, "
                   "or any key of their spec.yaml (e.g. train.lr)")


def wanted_keys(group_by: Optional[list]) -> Optional[list]:
    """--group-by's keys, comma lists split; None without --group-by."""
    if group_by is None:
        return None
    return [part.strip() for item in group_by for part in item.split(",") if part.strip()]


def group_keys(shown: list, spec: list, wanted: Optional[list] = None) -> list:
    """The group keys: ``wanted`` (--group-by), else every key column but the seeds."""
    if wanted is None:
        return [key for key in shown if key not in SEED_KEYS]
    return list(dict.fromkeys(_resolve_key(key, shown, spec) for key in wanted))


# Statuses whose runs never count in their group's numbers: they ended without a result.
NEVER_COUNTED = (runstate.FAILED, runstate.CANCELLED)


def group_ids(runs: pd.DataFrame, keys: list) -> np.ndarray:
    """Each run's group as a number (all runs one group without keys)."""
    if not keys:
        return np.zeros(len(runs), dtype=np.int64)
    return runs.groupby(keys, dropna=False, sort=False, observed=True).ngroup().to_numpy()


def group_has(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per run: whether some run of its group (``ids``) is in ``mask``."""
    return np.bincount(ids, weights=mask, minlength=ids.max(initial=-1) + 1)[ids] > 0


def counted_runs(runs: pd.DataFrame, keys: list, never: Sequence[str] = NEVER_COUNTED) -> pd.Series:
    """Whether each run counts in its group's numbers (see the module docstring; ``never``:
    the statuses that never count, a search's SEARCH_NEVER_COUNTED)."""
    status = runs["status"].astype(object)
    completed = (status == runstate.COMPLETED).to_numpy()
    unfinished = ~status.isin(never).to_numpy()
    counted = completed | (~group_has(completed, group_ids(runs, keys)) & unfinished)
    return pd.Series(counted, index=runs.index)


def group_state(n: np.ndarray, completed: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Each group's state from its run counts: COMPLETE, PARTIAL, UNFINISHED or FAILED."""
    return np.where(completed == n, COMPLETE, np.where(completed > 0, PARTIAL,
                                                       np.where(counted > 0, UNFINISHED, FAILED)))


def _not_completed(status: pd.Series, ids: np.ndarray) -> list:
    """Per group (``ids`` numbers each run's): "2 failed, 1 running", the runs that are
    not completed ("" when none), the documented states first."""
    names = status.astype(object).to_numpy()
    order = [s for s in (*STATUSES, UNKNOWN) if s != runstate.COMPLETED]
    order += sorted(set(names) - {*order, runstate.COMPLETED})
    column = {name: i for i, name in enumerate(order)}
    codes = np.array([column.get(name, -1) for name in names], dtype=np.int64)
    counts = np.zeros((ids.max(initial=-1) + 1, len(order)), dtype=np.int64)
    np.add.at(counts, (ids[codes >= 0], codes[codes >= 0]), 1)
    return [", ".join(f"{n} {name}" for n, name in zip(row, order) if n) for row in counts]


def _with_rungs(runs: pd.DataFrame) -> pd.Series:
    """Each run's state, a pruned trial's with the rung its search stopped it at
    ("pruned at rung 1")."""
    status = runs["status"].astype(object)
    if "pruned_rung" not in runs.columns:
        return status
    rung = runs["pruned_rung"]
    marked = (status == runstate.PRUNED) & rung.notna()
    return status.where(~marked, "pruned at rung " + rung.astype("string"))


# The grouped table's own columns besides the keys and the metrics' statistics, with the
# working columns group_table adds to the runs.
STATS = ("_mean", "_std")  # what the grouped table gives of a metric: val_acc_mean, val_acc_std
GROUP_FIELDS = ("n", "completed", "counted", "not_completed", "state", "_completed", "_counted", "_all")


def own_columns(results: Results, provider_columns: Sequence[str]) -> frozenset:
    """The names the tables give their own columns, which no key column may take: a
    hand-edited run.json or spec.yaml with a key named n, status or val_loss would put a
    name twice in a table (clusterjob's keys are dotted: train.lr, params.lr)."""
    stems = {*RUN_FIELDS, *RUN_METRICS, *GROUP_METRICS, *provider_columns, *results.columns}
    return frozenset({*RUN_FIELDS, *RUN_METRICS, *GROUP_METRICS, *GROUP_FIELDS, *provider_columns,
                      "planned_epochs", "step", TRIAL, *(f"{stem}{stat}" for stem in stems for stat in STATS)})


def group_table(runs: pd.DataFrame, keys: list, primary: Primary, metrics: Sequence[str],
                never: Sequence[str] = NEVER_COUNTED, providers: Sequence[Provider] = ()) -> pd.DataFrame:
    """One row per group: keys, n, <metric>_mean/_std (ddof=1) over the counted runs, each
    provider's columns (``Provider.group``: over all its runs, counted or not), completed,
    counted, not_completed ("1 failed") and state; ranked as the module docstring says
    (``never``: ``counted_runs``')."""
    counted = counted_runs(runs, keys, never)
    frame = runs.assign(_completed=runs["status"].astype(object) == runstate.COMPLETED, _counted=counted, _all=0)
    for metric in metrics:  # a run that does not count has no value in its group
        frame[metric] = frame[metric].where(counted)
    grouped = frame.groupby(keys or ["_all"], dropna=False, sort=False, observed=True)
    table = grouped.size().rename("n").to_frame()
    for metric in metrics:
        table[f"{metric}_mean"] = grouped[metric].mean()
        table[f"{metric}_std"] = grouped[metric].std(ddof=1)
    for provider in providers:
        for column, values in provider.group(frame, grouped).items():
            table[column] = values
    table["completed"] = grouped["_completed"].sum().astype(np.int64)
    table["counted"] = grouped["_counted"].sum().astype(np.int64)
    table["not_completed"] = _not_completed(_with_rungs(frame), grouped.ngroup().to_numpy())
    table["state"] = group_state(*(table[c].to_numpy() for c in ("n", "completed", "counted")))
    table = table.reset_index().drop(columns=["_all"], errors="ignore")
    return _ranked(table, primary)


_TIERS = {COMPLETE: 0, PARTIAL: 0, UNFINISHED: 1, FAILED: 2}


def _ranked(table: pd.DataFrame, primary: Primary) -> pd.DataFrame:
    """Groups with completed runs first, then unfinished ones, then those with nothing
    counted; by the primary metric's mean within each (missing means last)."""
    tier = table["state"].map(_TIERS).to_numpy()
    mean = table[f"{primary.name}_mean"].to_numpy(dtype=float)
    value = mean if primary.ascending else -mean
    order = np.lexsort((np.where(np.isnan(value), np.inf, value), tier))  # stable: ties keep their order
    return table.iloc[order].reset_index(drop=True)


# ---------------------------------------------------------------- how sure the best is


@dataclass(frozen=True)
class Lead:
    """The best group's lead over the next one, when it says little: ``runs`` (the best
    group's counted runs), ``by`` (the lead) and ``spread`` (the larger std of the two;
    NaN: neither has one)."""

    runs: int
    by: float
    spread: float


def best_lead(experiment: Experiment) -> Optional[Lead]:
    """The Lead of the best group over the next group with completed runs, when the best
    rests on one run or leads by no more than one std of either; None otherwise."""
    groups, name = experiment.groups, experiment.primary.name
    rivals = groups[groups["state"].isin((COMPLETE, PARTIAL)) & groups[f"{name}_mean"].notna()]
    if len(rivals) < 2:
        return None
    best, next_ = rivals.iloc[0], rivals.iloc[1]
    by = abs(float(best[f"{name}_mean"]) - float(next_[f"{name}_mean"]))
    stds = [float(g[f"{name}_std"]) for g in (best, next_) if pd.notna(g[f"{name}_std"])]
    spread = max(stds, default=math.nan)
    counted = int(best["counted"])
    return Lead(counted, by, spread) if counted < 2 or not by > spread else None


# ---------------------------------------------------------------- a search's trials


TRIAL = "trial"  # the key of a search's table by trial: each trial's number
# A search's cancelled trials count at their latest values (a cancelled search is read as
# far as it got); only a failed trial has nothing to show.
SEARCH_NEVER_COUNTED = (runstate.FAILED,)


def by_trial(shown: list, keys: list) -> bool:
    """Whether a search's runs are reported trial by trial: each trial drew its own
    values, so a group of one is no sample of noise. Not when its space has a seed (its
    trials group by the other keys, as a sweep's runs do) nor with --group-by."""
    return not set(shown) & set(SEED_KEYS) and keys == shown


def trial_numbers(results: Results) -> pd.Series:
    """Each run's trial number in its search (run.json's ``search.trial``; NA when not
    known), in ``results`` order."""
    numbers = [(info["search"] or {}).get("trial") if isinstance(info["search"], dict) else None
               for info in results.infos]
    return pd.Series([n if type(n) is int else None for n in numbers], dtype="Int64")


def tied_trials(experiment: Experiment) -> list:
    """The rows of the completed trials whose value of the primary metric is written as the
    best one's (``units.number``), when more than one is; [] otherwise."""
    groups, name = experiment.groups, experiment.primary.name
    done = groups[(groups["state"] == COMPLETE) & groups[f"{name}_mean"].notna()]
    if done.empty:
        return []
    shown = [units.number(name, float(v)) for v in done[f"{name}_mean"]]
    tied = [i for i, text in zip(done.index, shown) if text == shown[0]]
    return tied if len(tied) > 1 else []


# ---------------------------------------------------------------- status


def status_counts(runs: pd.DataFrame) -> dict:
    """{status: runs}, nonzero only, completed first, then the other documented states."""
    counts = runs["status"].astype(object).value_counts()
    order = [runstate.COMPLETED, *[s for s in STATUSES if s != runstate.COMPLETED], UNKNOWN]
    order += sorted(set(counts.index) - set(order))
    return {status: int(counts[status]) for status in order if status in counts.index}


def status_line(report: "Report | Experiment") -> str:
    """"12 runs: 9 completed, 2 running, 1 unknown; 1 damaged (see warnings)"."""
    counts = status_counts(report.runs)
    parts = ", ".join(f"{n} {escape(status)}" for status, n in counts.items())
    line = f"{len(report.runs)} run{'s' if len(report.runs) != 1 else ''}: {parts}"
    damaged = sum(1 for problems in report.results.problems if problems)
    return line + (f"; {damaged} damaged (see warnings)" if damaged else "")
