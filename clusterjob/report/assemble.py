"""The report of a results folder, assembled: its runs read, every registered column
family's columns added to them (``PROVIDERS``), and one ``stats.Experiment`` per spec name
with its tables grouped (stats.py says how).

A family of columns is one module with a ``provider.Provider``, registered by its line in
``PROVIDERS`` (whose order is the order of the families' columns in every table): the
grouping (stats) and the writers (cells, build, htmlpage) take whatever families a report
has and name none of them.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Callable, Optional, Sequence

import pandas as pd

from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import no_runs
from clusterjob.report import cost, efficiency, memory, searchcost
from clusterjob.report.provider import PROBLEMS, Answers, Provider, Runs
from clusterjob.report.reading import Results, RunStates, collect, with_states
from clusterjob.report.stats import (
    EXTRA_KEYS,
    NEVER_COUNTED,
    SEARCH_NEVER_COUNTED,
    TRIAL,
    Experiment,
    Primary,
    Report,
    by_trial,
    extra_columns,
    group_keys,
    group_metrics,
    group_table,
    own_columns,
    primaries,
    trial_numbers,
    wanted_keys,
)
from clusterjob.report.tables import planned_epochs, runs_frame, search_of, shown_keys, spec_keys

# The report's column families, in the order of their columns in every table.
PROVIDERS: tuple = (cost.PROVIDER, efficiency.PROVIDER, memory.PROVIDER, searchcost.PROVIDER)


def _sorted_runs(runs: pd.DataFrame, keys: list) -> pd.DataFrame:
    """Runs ordered by their key columns (seeds of one config together), then folder order."""
    try:
        return runs.sort_values(keys, kind="stable", na_position="last") if keys else runs
    except TypeError:  # a key mixing numbers and text cannot be ordered: keep folder order
        return runs


def _by_name(results: Results) -> list:
    """[(name, run indices)] of each experiment, in the order its first run was found."""
    parts: dict = {}
    for i, info in enumerate(results.infos):
        parts.setdefault(info["name"], []).append(i)
    return list(parts.items())


def _experiment_keys(parts: list, group_by: Optional[list]) -> list:
    """Per experiment: (key columns, group keys); a --group-by key that no experiment
    knows is BadInput, one that only some know groups those."""
    wanted = wanted_keys(group_by)
    found = []
    for part in parts:
        shown, spec = shown_keys(part), spec_keys(part)
        keys, errors = [], []
        for key in wanted if wanted is not None else [None]:
            try:
                keys += group_keys(shown, spec, None if key is None else [key])
            except BadInput as err:
                errors.append((key, err))
        found.append((shown, list(dict.fromkeys(keys)), errors))
    for key in wanted or []:
        failed = [err for _, _, errors in found for k, err in errors if k == key]
        if len(failed) == len(parts):
            raise failed[0]
    return [(shown, keys, _took(keys, wanted or [])) for shown, keys, _ in found]


def _took(keys: list, wanted: list) -> dict:
    """{group key: the --group-by word that named it}, for a spec key named by the word of
    a run.json field ("amp": train.amp, not run.json's amp): the legend says which it took."""
    took = {}
    for word in (w for w in wanted if w in EXTRA_KEYS):
        for key in keys:
            if key != word and key.endswith("." + word) and key not in took:
                took[key] = word
    return took


def _experiment(name: str, results: Results, columns: dict, shown: list, keys: list, primary: Primary,
                providers: Sequence[Provider], ask: Callable) -> Experiment:
    """The tables of one experiment's runs (``columns``: the providers' columns of its runs;
    their lines on it, sacct asked through ``ask``)."""
    key_columns = shown + [key for key in keys if key not in shown and key not in EXTRA_KEYS]
    runs = runs_frame(results, extra_columns(results, primary), key_columns).assign(**columns)
    runs.insert(list(runs.columns).index("epochs") + 1, "planned_epochs", pd.Series(planned_epochs(results, runs)))
    metrics = group_metrics(runs, primary, results)
    summaries = {p.summary_key: p.summary(Runs(results, ask, runs)) for p in providers if p.summary_key}
    search = search_of(results)
    trials = search is not None and by_trial(shown, keys)
    if trials:
        runs, keys = runs.assign(**{TRIAL: trial_numbers(results)}), [TRIAL, *keys]
    never = SEARCH_NEVER_COUNTED if search is not None else NEVER_COUNTED
    groups = group_table(runs, keys, primary, metrics, never, providers)
    return Experiment(name, results, _sorted_runs(runs, key_columns), key_columns, keys, groups, primary, metrics,
                      tuple(providers), summaries, search, trials)


def _with_problems(results: Results, frames: list) -> Results:
    """``results`` with the problems the providers found in each run's files added to its
    own (a copy: the cache keeps what the run folders' own files hold)."""
    found = [problems for problems in (frame.attrs.get(PROBLEMS) for frame in frames) if problems and any(problems)]
    if not found:
        return results
    return replace(results, problems=[[*old, *chain(*new)] for old, *new in zip(results.problems, *found)])


def _without_own_names(results: Results, taken: frozenset) -> Results:
    """``results`` whose params and specs hold no key named as a column of the tables'
    own (``stats.own_columns``), each such key a problem of its run (a copy, as
    ``_with_problems``)."""
    infos, problems, changed = [], [], False
    for info, found in zip(results.infos, results.problems):
        params, spec = info["params"] or {}, info["spec"] or {}
        names = sorted({*params, *spec} & taken - {"name"})  # spec.yaml's name is the experiment's
        if names:
            changed = True
            info = {**info, "params": _dropped(info["params"], names), "spec": _dropped(info["spec"], names)}
            found = [*found, f"params or spec.yaml key {', '.join(map(repr, names))} is named as a column of the "
                             "report's own; not a key"]
        infos.append(info)
        problems.append(found)
    return replace(results, infos=infos, problems=problems) if changed else results


def _dropped(mapping: Optional[dict], names: list) -> Optional[dict]:
    return {k: v for k, v in mapping.items() if k not in names} if mapping else mapping


def build_report(root: "str | Path | Sequence", group_by: Optional[list] = None, cache: bool = True,
                 metric: Optional[str] = None, mode: Optional[str] = None, states: Optional[RunStates] = None,
                 providers: Sequence[Provider] = PROVIDERS) -> Report:
    """Read the runs under ``root`` (or a list of run folders), add the columns of every
    one of ``providers`` and group each experiment's, each run's state as ``states``
    derives it (``reading.with_states``); BadInput for a bad DIR, key, metric or mode.
    Writes nothing: ``Report.save_cache`` does."""
    try:
        fields = [name for provider in providers for name in provider.fields]
        results = with_states(collect(root, cache=cache, fields=fields), states)
    except FileNotFoundError:
        raise no_runs(root) from None
    if not results.infos:
        raise no_runs(root)
    asked = Answers()  # one sacct call for every run, the cost columns and a search's hours
    frames = [provider.columns(Runs(results, asked)) for provider in providers]
    results = _with_problems(results, frames)
    columns = {name: frame[name].to_numpy() for frame in frames for name in frame.columns}
    reserved = [name for provider in providers for name in provider.reserved]
    results = _without_own_names(results, own_columns(results, [*columns, *reserved]))
    named = _by_name(results)
    parts = [results.subset(indices) for _, indices in named]
    chosen = primaries(parts, metric, mode, reserved)
    keys = _experiment_keys(parts, group_by)
    experiments = [replace(_experiment(name, part, {c: v[indices] for c, v in columns.items()}, shown, group, primary,
                                       providers, asked), took=took)
                   for (name, indices), part, (shown, group, took), primary in zip(named, parts, keys, chosen)]
    return Report(results.root, results, experiments)
