"""The pandas tables of ``clusterjob.report.results``: one row per run (``runs_frame``) and
one row per run and logged line (``epochs_frame``), built from a ``Results`` with
array operations over all runs at once (no per-row DataFrame work).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.core import runstate
from clusterjob.core.files import is_number
from clusterjob.core.record import parse_time
from clusterjob.core.runstate import STATUSES, UNKNOWN
from clusterjob.report.reading import Results
from clusterjob.search import record as searchmod

# Metrics whose last value the runs table carries under the same name
# (the first four always, the others when some run logged them).
LAST_VALUE = ("val_acc", "val_loss", "train_loss", "train_acc", "val_acc_ema", "val_acc_tta")


# ---------------------------------------------------------------- per-run values


def last_logged(results: Results, name: str) -> np.ndarray:
    """Each run's last logged (non-NaN) value of ``name`` (NaN when it logged none)."""
    out = np.full(len(results.lengths), np.nan)
    col = results.columns.get(name)
    has = results.lengths > 0
    if col is None or not has.any():
        return out
    ends = results.offsets[1:][has] - 1
    last = col[ends]
    gaps = np.isnan(last)
    if gaps.any():  # some run's last line lacks the metric: look back within the run
        rows = np.maximum.accumulate(np.where(np.isnan(col), -1, np.arange(len(col))))
        found = rows[ends[gaps]]
        inside = found >= results.offsets[:-1][has][gaps]
        last[gaps] = np.where(inside, col[np.maximum(found, 0)], np.nan)
    out[has] = last
    return out


def _segment_reduce(results: Results, name: str, ufunc: np.ufunc) -> np.ndarray:
    """``ufunc.reduceat`` of ``name`` over each run's lines (NaN with no lines)."""
    out = np.full(len(results.lengths), np.nan)
    col = results.columns.get(name)
    has = results.lengths > 0
    if col is not None and has.any():
        out[has] = ufunc.reduceat(col, results.offsets[:-1][has])
    return out


def segment_mean(results: Results, name: str) -> np.ndarray:
    """Each run's mean of ``name`` over the lines that logged it."""
    col = results.columns.get(name)
    if col is None:
        return np.full(len(results.lengths), np.nan)
    logged = ~np.isnan(col)
    sums = _reduce_array(results, np.where(logged, col, 0.0))
    counts = _reduce_array(results, logged.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _reduce_array(results: Results, values: np.ndarray) -> np.ndarray:
    """Per-run sums of an array aligned with the rows (0 with no lines)."""
    out = np.zeros(len(results.lengths))
    has = results.lengths > 0
    if has.any():
        out[has] = np.add.reduceat(values, results.offsets[:-1][has])
    return out


def _best_epoch(results: Results, best: np.ndarray) -> np.ndarray:
    """The first epoch at which each run reached its best val_acc."""
    out = np.full(len(results.lengths), np.nan)
    col, epochs = results.columns.get("val_acc"), results.columns.get("epoch")
    if col is None or epochs is None:
        return out
    hits = np.flatnonzero(col == np.repeat(best, results.lengths))
    run_of_hit = np.searchsorted(results.offsets, hits, side="right") - 1
    runs, first = np.unique(run_of_hit, return_index=True)
    out[runs] = epochs[hits[first]]
    return out


def timestamp(text: Optional[str]) -> Optional[datetime]:
    """A run folder's ISO-8601 time in UTC (``record.parse_time``), or None when absent or
    unreadable: any two compare and subtract."""
    return parse_time(text)


def _wall_time(results: Results) -> np.ndarray:
    """Each run's running time (``running_time``); where that is not known, finished_at -
    started_at for a run that recorded no sessions (older versions), else the sum of
    epoch_time_s (a running run: the epochs so far)."""
    summed = _segment_reduce(results, "epoch_time_s", np.add)
    out = summed.copy()
    for i, info in enumerate(results.infos):
        if info["sessions"]:
            out[i] = running_time(info)
            out[i] = summed[i] if math.isnan(out[i]) else out[i]
            continue
        start, end = timestamp(info["started_at"]), timestamp(info["finished_at"])
        if start is not None and end is not None:
            out[i] = (end - start).total_seconds()
    return out


def running_time(info: dict) -> float:
    """The sum of the run's sessions' running times: each from its start (run.json
    ``sessions``) to the last end recorded before the next start (finished_at, stopped_at,
    an attempt's end, or the newest checkpoint a later session found, written before the
    stop); the time a run spent stopped, queued or waiting for a resume is left out.
    NaN when a session's end is not known (it still runs, or nothing was recorded)."""
    starts = sorted(t for t in (timestamp(s.get("at")) for s in info["sessions"]) if t is not None)
    marks = [info["finished_at"], info["stopped_at"], *(a.get("at") for a in info["attempts"]),
             *(s.get("checkpoint_at") for s in info["sessions"])]
    ends = [t for t in map(timestamp, marks) if t is not None]
    total = 0.0
    for start, after in zip(starts, [*starts[1:], None]):
        inside = [t for t in ends if start <= t and (after is None or t <= after)]
        if not inside:
            return math.nan
        total += (max(inside) - start).total_seconds()
    return total if starts else math.nan


def _fill_from_final(results: Results, values: dict, names: Iterable) -> None:
    """Runs without metrics.jsonl take their last values from run.json's "final"."""
    for i, info in enumerate(results.infos):
        final = info["final"]
        if results.lengths[i] or not final:
            continue
        for name in names:
            if name in values and is_number(final.get(name)):
                values[name][i] = final[name]
        if is_number(final.get("epoch")):
            values["epochs"][i] = final["epoch"]


def _run_values(results: Results, extra: Sequence[str]) -> dict:
    """The per-run numbers of the runs table, as arrays in run order."""
    names = [n for n in LAST_VALUE if n in results.columns or n in LAST_VALUE[:4]]
    names += [n for n in extra if n not in names]
    values = {name: last_logged(results, name) for name in names}
    values["epochs"] = last_logged(results, "epoch")
    values["best_val_acc"] = _segment_reduce(results, "val_acc", np.fmax)
    values["best_epoch"] = _best_epoch(results, values["best_val_acc"])
    values["wall_time_s"] = _wall_time(results)
    values["samples_per_s"] = segment_mean(results, "samples_per_s")
    _fill_from_final(results, values, names)
    epochs = np.trunc(values["epochs"])  # a user's code may log any number as epoch
    whole = np.isfinite(epochs) & (np.abs(epochs) < 2**53)
    values["epochs"] = np.where(whole, epochs, results.lengths).astype(np.int64)
    return values


# ---------------------------------------------------------------- keys


# Spec keys that never group: the experiment itself (each name is a report section of its
# own) and the sweep that made the points (the points' values are keys of their own).
_NOT_KEYS = ("name", "sweep")


def shown_keys(results: Results) -> list:
    """The keys the runs table shows: every key of the runs' params (their sweep points and
    your code's params), then every spec.yaml key whose value differs between runs of one
    name (a ``--set``, an edited spec), in the order first seen."""
    keys = dict.fromkeys(results.param_keys)
    specs: dict = {}
    for info in results.infos:
        if info["spec"] is not None:
            specs.setdefault(info["name"], []).append(info["spec"])
    for same_name in specs.values():
        keys.update(dict.fromkeys(_differing(same_name)))
    return list(keys)


def _differing(specs: list) -> list:
    """The keys with two values or more among the specs that hold them (a key only some
    specs hold, as one written by another version, is no difference), in first-seen order."""
    seen = dict(specs[0])
    differ: dict = {}
    for spec in specs[1:]:
        for key, value in spec.items() - seen.items():  # set work in C: 10,000 specs of 80 keys
            if key in seen:
                differ[key] = None
            else:
                seen[key] = value
    return [key for key in seen if key in differ and key.split(".", 1)[0] not in _NOT_KEYS]


def spec_keys(results: Results) -> list:
    """Every key of any run's spec.yaml, in first-seen order (what --group-by may name)."""
    keys: dict = {}
    for info in results.infos:
        keys.update(dict.fromkeys(info["spec"] or {}))
    return list(keys)


# Spec keys a run resolves as it starts (``auto``), each with the run.json field that
# records what it became: the tables show and group by what the run ran with.
RESOLVED = {"train.amp": "amp", "dist.backend": "backend"}


def key_value(info: dict, key: str) -> Any:
    """A run's value of ``key``: what the run resolved it to (``RESOLVED``), else its
    params' (run.json), else its spec.yaml's; None when none has it."""
    field = RESOLVED.get(key)
    if field is not None and info[field] is not None:
        return info[field]
    return _given(info, key)


def _given(info: dict, key: str) -> Any:
    """A run's value of ``key`` as its sweep point (params) or its spec.yaml gives it."""
    params = info["params"]
    if params is not None and key in params:
        return params[key]
    return (info["spec"] or {}).get(key)


def key_values(results: Results, key: str) -> list:
    """Every run's ``key_value``. A run that has not resolved a ``RESOLVED`` key yet (not
    started: run.json records nothing) takes what the runs given the same value resolved it
    to, when they agree: a pending run joins their group, never one of its own."""
    values = [key_value(info, key) for info in results.infos]
    field = RESOLVED.get(key)
    if field is None:
        return values
    given = [value if isinstance(value, str) else None for value in (_given(info, key) for info in results.infos)]
    became: dict = {}
    for value, info in zip(given, results.infos):
        if value is not None and info[field] is not None:
            became.setdefault(value, set()).add(info[field])
    return [next(iter(became[g])) if info[field] is None and len(became.get(g, ())) == 1 else v
            for v, g, info in zip(values, given, results.infos)]


def _key_column(values: list) -> pd.Series:
    """One key's values; lists and dicts become JSON text so they can group."""
    values = [json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for v in values]
    return pd.Series(values, dtype=None if any(v is not None for v in values) else float)


def _keys_table(results: Results, keys: Optional[Sequence[str]] = None) -> dict:
    """{key: Series over runs} of ``keys`` (default: ``shown_keys``)."""
    keys = shown_keys(results) if keys is None else keys
    return {key: _key_column(key_values(results, key)) for key in keys}


_ENTRYPOINT_KEYS = ("entrypoint.script", "entrypoint.module", "entrypoint.function")


def own_code(info: dict) -> bool:
    """Whether the run ran your own code (its spec.yaml names an entrypoint), not the built-in trainer."""
    spec = info["spec"] or {}
    return any(spec.get(key) is not None for key in _ENTRYPOINT_KEYS)


def search_of(results: Results) -> Optional[str]:
    """The id of the one search every run is a trial of; None otherwise (a grid sweep)."""
    ids = {(info["search"] or {}).get("id") if isinstance(info["search"], dict) else None for info in results.infos}
    (found,) = ids if len(ids) == 1 else (None,)
    return found if isinstance(found, str) and found else None


def search_record(results: Results) -> Optional[searchmod.SearchRecord]:
    """The search.json of the search every run is a trial of (read tolerantly: a damaged
    one gives empty fields); None for anything else."""
    if search_of(results) is None:
        return None
    return searchmod.read(Path(results.infos[0]["path"]).parent)[0]


def _spec_epochs(info: dict) -> Optional[int]:
    """train.epochs of the run's spec.yaml; None for your own code (an entrypoint, which
    has no epochs of ours) or a spec that does not say."""
    epochs = (info["spec"] or {}).get("train.epochs")
    if own_code(info) or type(epochs) is not int or epochs < 1:
        return None
    return epochs


def planned_epochs(results: Results, runs: pd.DataFrame) -> pd.arrays.IntegerArray:
    """The epochs each run's spec asked for (nullable Int64, in ``results`` order). A
    completed run of the built-in trainer (it records its amp) ran them all; any other
    run's spec says."""
    status = runs["status"].astype(object).to_numpy()
    epochs = runs["epochs"].to_numpy()
    values = []
    for i, info in enumerate(results.infos):
        if status[i] == runstate.COMPLETED:
            values.append(int(epochs[i]) if info["amp"] is not None and epochs[i] > 0 else None)
        else:
            values.append(_spec_epochs(info))
    return _int_column(values)


# ---------------------------------------------------------------- columns


def _status_column(statuses: list) -> pd.Categorical:
    """Status as a categorical with the documented states first."""
    extra = sorted(set(statuses) - set(STATUSES) - {UNKNOWN})
    return pd.Categorical(statuses, categories=[*STATUSES, UNKNOWN, *extra])


def _int_column(values: Iterable) -> pd.arrays.IntegerArray:
    """Whole numbers with <NA> for missing (or beyond int64), as pandas' nullable Int64."""
    return pd.array([None if v is None or v != v or abs(v) >= 2**63 else int(v) for v in values], dtype="Int64")


def _time_column(texts: list) -> pd.Series:
    """ISO-8601 times as UTC datetimes, NaT where absent or unreadable."""
    return pd.to_datetime(pd.Series(texts, dtype=object), utc=True, errors="coerce", format="ISO8601")


def _text_column(values: list) -> pd.Series:
    """Text with missing values as NA, in pandas' string dtype."""
    return pd.Series(values, dtype="string")


def _field(results: Results, key: str) -> list:
    """One run.json field over all runs."""
    return [info[key] for info in results.infos]


def _run_fields(results: Results) -> dict:
    """The run.json columns of the runs table."""
    text = ("slurm_job_id", "backend", "amp", "git_sha", "error", "path")
    data: dict[str, "pd.Series | pd.arrays.IntegerArray"] = {key: _text_column(_field(results, key)) for key in text}
    for key in ("world_size", "requeues", "error_rank"):
        data[key] = _int_column(_field(results, key))
    data["pruned_rung"] = _int_column([(info.get("pruned") or {}).get("rung") for info in results.infos])
    for key in ("started_at", "finished_at"):
        data[key] = _time_column(_field(results, key))
    data["warnings"] = _text_column(["; ".join(p) or None for p in results.problems])
    data["straggler"] = _text_column([straggler_text(s) for s in _field(results, "straggler")])
    order = ("world_size", "slurm_job_id", "requeues", "started_at", "finished_at", "backend",
             "amp", "git_sha", "error", "error_rank", "path", "warnings", "straggler", "pruned_rung")
    return {key: data[key] for key in order}


def straggler_text(straggler: Optional[dict]) -> Optional[str]:
    """"rank 3 (node4) 45%": the rank the others waited for, and the share of their time."""
    if not straggler or straggler.get("rank") is None:
        return None
    pct = straggler.get("wait_pct")
    return f"rank {straggler['rank']} ({straggler.get('host') or '?'})" + (f" {pct:.0f}%" if pct is not None else "")


# Columns of the runs table that are no metric: a metric of the same name cannot be shown
# (nor one named as a provider's ``reserved`` columns).
RUN_FIELDS = ("run_id", "name", "status", "epochs", "planned_epochs", "best_val_acc", "best_epoch", "wall_time_s",
              "samples_per_s", "world_size", "slurm_job_id", "requeues", "started_at", "finished_at",
              "backend", "amp", "git_sha", "error", "error_rank", "path", "warnings", "straggler", "pruned_rung")


# ---------------------------------------------------------------- frames


def runs_frame(results: Results, metrics: Sequence[str] = (), keys: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per run; see ``results.load_runs``. ``metrics`` adds the last logged
    value of further metrics (a user's own), after the standard ones; ``keys`` are the
    key columns (default: ``shown_keys``)."""
    values = _run_values(results, metrics)
    data: dict = {
        "run_id": _text_column(_field(results, "run_id")),
        "name": _text_column(_field(results, "name")),
        "status": _status_column(_field(results, "status")),
        **_keys_table(results, keys),
        "epochs": values.pop("epochs"),
    }
    data.update((k, values.pop(k)) for k in ("val_acc", "best_val_acc"))
    data["best_epoch"] = _int_column(values.pop("best_epoch"))
    data.update(values)
    data.update(_run_fields(results))
    frame = pd.DataFrame(data)
    frame.attrs["warnings"] = results.warnings
    return frame


def _epoch_ints(col: np.ndarray) -> "np.ndarray | pd.arrays.IntegerArray":
    """Epoch or step numbers as int64, or nullable Int64 when some are missing; floats
    when some are not whole numbers (a user's own code may log any number)."""
    logged = col[~np.isnan(col)]
    if np.any(np.abs(logged) > 2**53) or np.any(logged != np.round(logged)):
        return col
    if len(logged) == len(col):
        return col.astype(np.int64)
    return _int_column(col)


def epochs_frame(results: Results) -> pd.DataFrame:
    """One row per run and logged line; see ``results.load_epochs``."""
    owner = np.repeat(np.arange(len(results.lengths)), results.lengths)
    data: dict = {}
    for key in ("run_id", "name"):
        codes, uniques = pd.factorize(pd.Series(_field(results, key), dtype=object))
        data[key] = pd.Categorical.from_codes(codes[owner], categories=uniques)
    for key, column in _keys_table(results).items():
        data[key] = column.take(owner).reset_index(drop=True)
    for name, col in results.columns.items():
        data[name] = _epoch_ints(col) if name in ("epoch", "step") else col
    frame = pd.DataFrame(data)
    frame.attrs["warnings"] = results.warnings
    return frame
