"""Run folders (DESIGN section 3) as pandas tables.

``load_runs(root)`` gives one row per run, ``load_epochs(root)`` one row per run
and epoch. ``root`` is ``results/<name>`` (a folder of run folders), ``results/``
(several names) or a single run folder; a run is a folder holding a ``run.json``
or a ``metrics.jsonl``.

Damaged input (a truncated last line of metrics.jsonl, a missing or cut-off
run.json) never raises: each problem is emitted as a ``ResultsWarning`` through
Python's ``warnings`` module, listed in ``df.attrs["warnings"]`` and in the run's
``warnings`` column, and the run keeps what could be read (status ``unknown``
when run.json gives none).

Parsed runs are cached in ``<root>/.clusterjob-cache.npz``, keyed by the size,
mtime and inode of each run's two files, so a second report over a large sweep
only re-reads the runs that changed. The cache holds plain arrays and a JSON
header and is loaded with ``allow_pickle=False``: a results folder shared with
others cannot make the reader run code.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "STATUSES",
    "ResultsWarning",
    "Results",
    "collect",
    "find_runs",
    "load_runs",
    "load_epochs",
    "runs_frame",
    "epochs_frame",
]

STATUSES = ("pending", "running", "completed", "failed", "timeout", "preempted", "cancelled")
UNKNOWN = "unknown"
CACHE_NAME = ".clusterjob-cache.npz"
CACHE_VERSION = 1
RUN_JSON = "run.json"
METRICS = "metrics.jsonl"

# Column order of the epochs table; metrics not named here follow in the order seen.
_METRIC_ORDER = (
    "epoch", "step", "train_loss", "train_acc", "val_loss", "val_acc", "val_acc_ema",
    "val_acc_tta", "lr", "epoch_time_s", "samples_per_s",
)
# Metrics whose last-epoch value the runs table carries under the same name
# (the first four always, the others when some run logged them).
_LAST_VALUE = ("val_acc", "val_loss", "train_loss", "train_acc", "val_acc_ema", "val_acc_tta")
_NO_STAMP = (-1, -1, -1)


class ResultsWarning(UserWarning):
    """A run folder could be read only in part (truncated or missing files)."""


@dataclass
class RunFiles:
    """Where one run lives and the (size, mtime_ns, inode) stamp of its two files."""

    path: str  # a str, not a Path: pathlib costs more than the parse of a cached run
    key: str  # path relative to the root, "." for a root that is itself a run
    stamp: tuple


@dataclass
class ParsedRun:
    """What one run folder holds: run.json fields, problems, per-epoch metrics."""

    info: dict
    problems: list
    names: list  # metric names, one per column of ``values``
    values: np.ndarray  # float64, shape (epochs, len(names))


@dataclass
class Results:
    """All runs under a root: per-run fields and the metrics of all epochs.

    ``columns`` holds every metric of every run concatenated in run order
    (NaN where a run lacks that metric); run i owns rows
    ``offsets[i]:offsets[i + 1]``.
    """

    root: Path
    infos: list
    problems: list  # per run: list of problem strings
    lengths: np.ndarray
    columns: dict = field(default_factory=dict)

    @property
    def offsets(self) -> np.ndarray:
        """Start row of each run, then the total row count."""
        return np.concatenate(([0], np.cumsum(self.lengths)))

    @property
    def warnings(self) -> list:
        """Every problem as "<run folder>: <problem>", in run order."""
        return [f"{info['path']}: {p}" for info, ps in zip(self.infos, self.problems) for p in ps]

    @property
    def param_keys(self) -> list:
        """The swept keys: every key of any run's params, in first-seen order."""
        keys: dict = {}
        for info in self.infos:
            keys.update(dict.fromkeys(info["params"] or {}))
        return list(keys)


# ---------------------------------------------------------------- discovery


def _stat(path: str) -> tuple:
    """(size, mtime_ns, inode) of a file, or _NO_STAMP when it is absent."""
    try:
        st = os.stat(path)
    except OSError:
        return _NO_STAMP
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _run_files(path: str, key: str) -> Optional[RunFiles]:
    """The run in folder ``path``, or None when it holds neither run file."""
    stamp = _stat(os.path.join(path, RUN_JSON)) + _stat(os.path.join(path, METRICS))
    if stamp == _NO_STAMP + _NO_STAMP:
        return None
    return RunFiles(path, key, stamp)


def _subdirs(path: str) -> list:
    """Visible sub-folders of ``path`` as (name, full path), sorted naturally."""
    try:
        entries = [(e.name, e.path) for e in os.scandir(path) if e.is_dir() and e.name[0] != "."]
    except OSError:
        return []
    return sorted(entries, key=lambda e: _natural_key(e[0]))


_DIGITS = re.compile(r"(\d+)")


def _natural_key(text: str) -> list:
    """Sort key that puts run "2" before run "10"."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)]


def _scan(root: Path) -> list:
    """Run folders at ``root``, one level below it, or two levels below it."""
    itself = _run_files(str(root), ".")
    if itself is not None:
        return [itself]
    found = []
    for name, path in _subdirs(str(root)):
        run = _run_files(path, name)
        if run is not None:
            found.append(run)
            continue
        for sub, subpath in _subdirs(path):  # root is results/: results/<name>/<run_id>
            run = _run_files(subpath, f"{name}/{sub}")
            if run is not None:
                found.append(run)
    return found


def find_runs(root: "str | os.PathLike") -> list:
    """The run folders under ``root`` (see the module docstring), in natural order."""
    return [Path(run.path) for run in _scan(Path(root))]


# ---------------------------------------------------------------- run.json


def _read_text(path: str) -> Optional[str]:
    """A file's text (bad bytes replaced), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return None


_SALVAGE_STR = re.compile(
    r'"(run_id|name|status|slurm_job_id|started_at|finished_at|git_sha)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_SALVAGE_INT = re.compile(r'"(world_size|requeues)"\s*:\s*(\d+)')
_SALVAGE_PARAMS = re.compile(r'"params"\s*:\s*(\{[^{}]*\})')


def _salvage(text: str) -> dict:
    """The fields that can still be read from a cut-off run.json."""
    raw: dict = {}
    for key, value in _SALVAGE_STR.findall(text):
        try:
            raw.setdefault(key, json.loads(f'"{value}"'))
        except ValueError:  # a bad escape: the value is as lost as the rest
            pass
    for key, value in _SALVAGE_INT.findall(text):
        raw.setdefault(key, int(value))
    match = _SALVAGE_PARAMS.search(text)
    if match:
        try:
            raw["params"] = json.loads(match.group(1))
        except ValueError:
            pass
    return raw


def _read_run_json(path: str) -> tuple:
    """(fields of run.json, problems); a damaged file yields what is readable."""
    text = _read_text(os.path.join(path, RUN_JSON))
    if text is None:
        return {}, [f"{RUN_JSON} is missing; status unknown"]
    try:
        raw = json.loads(text)
        if isinstance(raw, dict):
            return raw, []
    except ValueError:
        pass
    raw = _salvage(text)
    got = ", ".join(sorted(raw)) or "nothing"
    return raw, [f"{RUN_JSON} is cut off or not a JSON object (read: {got})"]


def _opt_str(value: Any) -> Optional[str]:
    """``value`` as a string, None staying None."""
    return None if value is None else str(value)


def _opt_int(value: Any) -> Optional[int]:
    """``value`` as an int when it is a number, else None."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _info(raw: dict, run: RunFiles) -> dict:
    """The run's fields with types checked and gaps filled from the folder names."""
    error = raw.get("error") if isinstance(raw.get("error"), dict) else {}
    params = raw.get("params")
    folder = Path(os.path.abspath(run.path))  # string work only: no syscalls per run
    return {
        "path": run.path,
        "run_id": _opt_str(raw.get("run_id")) or folder.name,
        "name": _opt_str(raw.get("name")) or folder.parent.name,
        "status": _opt_str(raw.get("status")) or UNKNOWN,
        "params": params if isinstance(params, dict) else None,
        "slurm_job_id": _opt_str(raw.get("slurm_job_id")),
        "world_size": _opt_int(raw.get("world_size")),
        "requeues": _opt_int(raw.get("requeues")),
        "backend": _opt_str(raw.get("backend")),
        "amp": _opt_str(raw.get("amp")),
        "git_sha": _opt_str(raw.get("git_sha")),
        "started_at": _opt_str(raw.get("started_at")),
        "finished_at": _opt_str(raw.get("finished_at")),
        "final": raw.get("final") if isinstance(raw.get("final"), dict) else None,
        "error": _opt_str(error.get("message")),
        "error_rank": _opt_int(error.get("rank")),
    }


# ---------------------------------------------------------------- metrics.jsonl


def _parse_lines(text: str) -> list:
    """The epoch objects of a well-formed metrics.jsonl text, in one ``json.loads``.

    Joining the lines into one array is about 3x faster than a call per line;
    raises ValueError for anything else, which then takes the slow path.
    """
    body = text.strip()
    return json.loads("[" + body.replace("\n", ",") + "]") if body else []


def _parse_lines_slowly(text: str) -> tuple:
    """Line-by-line parse that skips bad lines and names them."""
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows, bad = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(i)
    return rows, _line_problems(bad, last, len(rows))


def _line_problems(bad: list, last: int, kept: int) -> list:
    """Problems for the unreadable lines (0-based indexes) of metrics.jsonl."""
    problems = []
    if bad and bad[-1] == last:
        # A writer killed mid-line leaves exactly this: every line but the last is whole.
        problems.append(f"{METRICS}: last line is cut off (run stopped mid-write?); "
                        f"ignored it, kept {kept} epochs")
        bad = bad[:-1]
    if bad:
        shown = ", ".join(str(i + 1) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
        problems.append(f"{METRICS}: {len(bad)} line(s) not a JSON object (line {shown}); skipped")
    return problems


def _to_float(values: list) -> np.ndarray:
    """Numbers as float64; None, strings and other non-numbers as NaN."""
    try:
        return np.array(values, dtype=float)
    except (TypeError, ValueError):
        return np.array([v if isinstance(v, (int, float)) else np.nan for v in values], dtype=float)


def _fast_matrix(rows: list) -> tuple:
    """(metric names, float64 matrix, one row per epoch) when every line has the
    first line's keys and only numbers; raises otherwise.

    One C-level ``itemgetter`` call per line: this is the hot loop of a report.
    """
    if not rows:
        return [], np.empty((0, 0))
    names = list(rows[0])
    if len(set(map(len, rows))) != 1:
        raise ValueError("lines differ in their keys")
    table = list(map(itemgetter(*names), rows))
    return names, np.array(table, dtype=float).reshape(len(rows), len(names))


def _rows_to_matrix(rows: list) -> tuple:
    """(metric names, float64 matrix) from epoch dicts with any keys and values."""
    if not rows:
        return [], np.empty((0, 0))
    names = list(dict.fromkeys(key for row in rows for key in row))
    columns = [_to_float([row.get(name) for row in rows]) for name in names]
    return names, np.column_stack(columns)


def _dedupe_epochs(names: list, matrix: np.ndarray) -> tuple:
    """Keep the last line of each epoch number, in epoch order; problems found."""
    if "epoch" not in names or len(matrix) < 2:
        return matrix, []
    epochs = matrix[:, names.index("epoch")]
    if np.all(np.diff(epochs) > 0):
        return matrix, []
    _, first_of_reversed = np.unique(epochs[::-1], return_index=True)
    keep = len(epochs) - 1 - first_of_reversed
    dropped = epochs[np.setdiff1d(np.arange(len(epochs)), keep)]
    repeated = sorted(set(dropped[~np.isnan(dropped)].tolist()))
    problem = f"{METRICS}: epochs out of order or repeated ({_short_list(repeated)}); kept the last line of each"
    return matrix[keep], [problem]


def _short_list(values: list) -> str:
    """At most five values, comma separated."""
    shown = ", ".join(f"{v:g}" for v in values[:5])
    return shown + (", ..." if len(values) > 5 else "")


def _read_metrics(path: str) -> tuple:
    """(names, matrix, problems) of a run's metrics.jsonl; absent means no epochs."""
    text = _read_text(os.path.join(path, METRICS)) or ""
    try:
        names, matrix = _fast_matrix(_parse_lines(text))
        problems = []
    except (ValueError, TypeError, KeyError, AttributeError):
        rows, problems = _parse_lines_slowly(text)
        names, matrix = _rows_to_matrix(rows)
    matrix, more = _dedupe_epochs(names, matrix)
    return names, matrix, problems + more


def _parse_run(run: RunFiles) -> ParsedRun:
    """Read one run folder; never raises for damaged files."""
    raw, problems = _read_run_json(run.path)
    names, matrix, more = _read_metrics(run.path)
    if problems and not raw and not names:
        problems = [f"{RUN_JSON} and {METRICS} are both unreadable"]
    return ParsedRun(_info(raw, run), problems + more, names, matrix)


# ---------------------------------------------------------------- cache


@dataclass
class Cache:
    """The parsed runs of a root as last saved: {key: (stamp, ParsedRun)} and the
    stacked matrix they came from."""

    runs: dict
    names: list
    matrix: np.ndarray


def _load_cache(root: Path) -> Optional[Cache]:
    """The root's cache; None when absent or unusable."""
    try:
        with np.load(root / CACHE_NAME, allow_pickle=False) as npz:
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if header.get("version") != CACHE_VERSION:
                return None
            matrix = npz["values"]
        return Cache(_runs_from_cache(header, matrix), header["names"], matrix)
    except Exception:  # any unreadable cache is only a slower start, never an error
        return None


def _runs_from_cache(header: dict, matrix: np.ndarray) -> dict:
    """Rebuild the cached runs; each gets a view of its block of ``matrix``."""
    names = header["names"]
    cached, start = {}, 0
    for entry in header["runs"]:
        rows, cols = entry["rows"], entry["cols"]
        block = matrix[start:start + rows]
        if cols != list(range(len(names))):  # the common case, all metrics, stays a view
            block = block[:, cols]
        start += rows
        run = ParsedRun(entry["info"], entry["problems"], [names[c] for c in cols], block)
        cached[entry["key"]] = (tuple(entry["stamp"]), run)
    return cached


def _save_cache(root: Path, runs: list, parsed: list, names: list, matrix: np.ndarray) -> None:
    """Write the cache atomically (temp file + rename); a read-only root is fine.

    ``matrix`` is ``_stack(parsed, names)``: every run's epochs, in run order.
    """
    index = {name: i for i, name in enumerate(names)}
    entries = [
        {"key": run.key, "stamp": list(run.stamp), "info": p.info, "problems": p.problems,
         "rows": len(p.values), "cols": [index[n] for n in p.names]}
        for run, p in zip(runs, parsed)
    ]
    header = json.dumps({"version": CACHE_VERSION, "names": names, "runs": entries})
    tmp = root / f"{CACHE_NAME}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, header=np.frombuffer(header.encode("utf-8"), np.uint8), values=matrix)
        os.replace(tmp, root / CACHE_NAME)
    except OSError:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- assembly


def _union_names(parsed: list) -> list:
    """All metric names, known ones in _METRIC_ORDER first, others as first seen."""
    seen: dict = {}
    for p in parsed:
        seen.update(dict.fromkeys(p.names))
    known = [n for n in _METRIC_ORDER if n in seen]
    return known + [n for n in seen if n not in _METRIC_ORDER]


def _stack(parsed: list, names: list) -> np.ndarray:
    """One float64 matrix of all runs' epochs, NaN where a run lacks a metric."""
    total = sum(len(p.values) for p in parsed)
    out = np.full((total, len(names)), np.nan)
    index = {name: i for i, name in enumerate(names)}
    start = 0
    for p in parsed:
        rows = len(p.values)
        if rows:
            out[start:start + rows, [index[n] for n in p.names]] = p.values
        start += rows
    return out


def _parse_all(runs: list, cached: dict) -> tuple:
    """Parsed runs (from the cache where the stamps match) and whether any was re-read."""
    parsed, fresh = [], False
    for run in runs:
        hit = cached.get(run.key)
        if hit is not None and hit[0] == run.stamp:
            parsed.append(hit[1])
        else:
            parsed.append(_parse_run(run))
            fresh = True
    return parsed, fresh


def _runs_of(root: "str | os.PathLike | Sequence") -> tuple:
    """(folder, run files, whether to cache) of a root folder or a list of run folders."""
    if isinstance(root, (list, tuple)):
        runs = [_run_files(str(p), Path(p).name) for p in root]
        base = os.path.commonpath([os.path.abspath(p) for p in root]) if root else "."
        return Path(base), [run for run in runs if run is not None], False
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no such results folder: {root}")
    runs = _scan(root)
    return root, runs, not (len(runs) == 1 and runs[0].key == ".")


def collect(root: "str | os.PathLike | Sequence", cache: bool = True) -> Results:
    """Read every run under ``root``; the basis of load_runs, load_epochs and reports.

    ``root`` may also be a list of run folders (as ``submit --wait`` has): those
    runs only, without a cache. Emits no warnings itself (see
    ``Results.warnings``); raises FileNotFoundError when ``root`` is not a folder.
    """
    root, runs, use_cache = _runs_of(root)
    use_cache = use_cache and cache
    saved = _load_cache(root) if use_cache else None
    cached = saved.runs if saved else {}
    parsed, fresh = _parse_all(runs, cached)
    unchanged = saved is not None and not fresh and list(cached) == [run.key for run in runs]
    if unchanged:  # the cached matrix is exactly what _stack would build
        names, matrix = saved.names, saved.matrix
    else:
        names = _union_names(parsed)
        matrix = _stack(parsed, names)
    if use_cache and not unchanged:
        _save_cache(root, runs, parsed, names, matrix)
    columns = {name: matrix[:, i] for i, name in enumerate(names)}
    lengths = np.array([len(p.values) for p in parsed], dtype=np.int64)
    return Results(root, [p.info for p in parsed], [p.problems for p in parsed], lengths, columns)


# ---------------------------------------------------------------- per-run values


def _segment_last(results: Results, name: str) -> np.ndarray:
    """Each run's value of ``name`` at its last epoch (NaN with no epochs)."""
    out = np.full(len(results.lengths), np.nan)
    col = results.columns.get(name)
    has = results.lengths > 0
    if col is not None:
        out[has] = col[results.offsets[1:][has] - 1]
    return out


def _segment_reduce(results: Results, name: str, ufunc: np.ufunc) -> np.ndarray:
    """``ufunc.reduceat`` of ``name`` over each run's epochs (NaN with no epochs)."""
    out = np.full(len(results.lengths), np.nan)
    col = results.columns.get(name)
    has = results.lengths > 0
    if col is not None and has.any():
        out[has] = ufunc.reduceat(col, results.offsets[:-1][has])
    return out


def _segment_mean(results: Results, name: str) -> np.ndarray:
    """Each run's mean of ``name`` over the epochs that logged it."""
    col = results.columns.get(name)
    if col is None:
        return np.full(len(results.lengths), np.nan)
    logged = ~np.isnan(col)
    sums = _reduce_array(results, np.where(logged, col, 0.0))
    counts = _reduce_array(results, logged.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _reduce_array(results: Results, values: np.ndarray) -> np.ndarray:
    """Per-run sums of an array aligned with the epoch rows (0 with no epochs)."""
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


def _timestamp(text: Optional[str]) -> Optional[datetime]:
    """An ISO-8601 time, or None when absent or unreadable."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _wall_time(results: Results) -> np.ndarray:
    """finished_at - started_at where both exist, else the sum of epoch_time_s."""
    summed = _segment_reduce(results, "epoch_time_s", np.add)
    out = summed.copy()
    for i, info in enumerate(results.infos):
        start, end = _timestamp(info["started_at"]), _timestamp(info["finished_at"])
        if start is not None and end is not None:
            try:
                out[i] = (end - start).total_seconds()
            except TypeError:  # one time with an offset, one without: no honest difference
                pass
    return out


def _fill_from_final(results: Results, values: dict) -> None:
    """Runs without metrics.jsonl take their last values from run.json's "final"."""
    for i, info in enumerate(results.infos):
        final = info["final"]
        if results.lengths[i] or not final:
            continue
        for name in _LAST_VALUE:
            if name in values and isinstance(final.get(name), (int, float)):
                values[name][i] = final[name]
        if isinstance(final.get("epoch"), (int, float)):
            values["epochs"][i] = final["epoch"]


def _run_values(results: Results) -> dict:
    """The per-run numbers of the runs table, as arrays in run order."""
    names = [n for n in _LAST_VALUE if n in results.columns or n in _LAST_VALUE[:4]]
    values = {name: _segment_last(results, name) for name in names}
    epochs = _segment_last(results, "epoch")
    values["epochs"] = np.where(np.isnan(epochs), results.lengths, epochs)
    values["best_val_acc"] = _segment_reduce(results, "val_acc", np.fmax)
    values["best_epoch"] = _best_epoch(results, values["best_val_acc"])
    values["wall_time_s"] = _wall_time(results)
    values["samples_per_s"] = _segment_mean(results, "samples_per_s")
    _fill_from_final(results, values)
    return values


# ---------------------------------------------------------------- frames


def _param_column(values: list) -> pd.Series:
    """One swept key's values; lists and dicts become JSON text so they can group."""
    values = [json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for v in values]
    return pd.Series(values, dtype=None if any(v is not None for v in values) else float)


def _params_from_spec(path: str, keys: list) -> dict:
    """Swept values read back from spec.yaml, for a run whose run.json lost them."""
    try:
        import yaml  # only damaged runs need it

        with open(Path(path) / "spec.yaml") as f:
            spec = yaml.safe_load(f)
    except Exception:  # no spec either: the run stays in a group of unknown keys
        return {}
    found = {}
    for key in keys:
        node = spec
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            found[key] = node
    return found


def _params_table(results: Results) -> dict:
    """{swept key: Series over runs}; runs without params try their spec.yaml."""
    keys = results.param_keys
    params = []
    for info in results.infos:
        known = info["params"]
        params.append(known if known is not None else _params_from_spec(info["path"], keys))
    return {key: _param_column([p.get(key) for p in params]) for key in keys}


def _status_column(statuses: list) -> pd.Categorical:
    """Status as a categorical with the documented states first."""
    extra = sorted(set(statuses) - set(STATUSES) - {UNKNOWN})
    return pd.Categorical(statuses, categories=[*STATUSES, UNKNOWN, *extra])


def _int_column(values: Iterable) -> pd.array:
    """Whole numbers with <NA> for missing, as pandas' nullable Int64."""
    return pd.array([None if v is None or v != v else int(v) for v in values], dtype="Int64")


def _time_column(texts: list) -> pd.Series:
    """ISO-8601 times as UTC datetimes, NaT where absent or unreadable."""
    return pd.to_datetime(pd.Series(texts, dtype=object), utc=True, errors="coerce", format="ISO8601")


def _text_column(values: list) -> pd.Series:
    """Text with missing values as NA, in pandas' string dtype."""
    return pd.Series(values, dtype="string")


def _field(results: Results, key: str) -> list:
    """One run.json field over all runs."""
    return [info[key] for info in results.infos]


def runs_frame(results: Results) -> pd.DataFrame:
    """One row per run; see ``load_runs``."""
    values = _run_values(results)
    data: dict = {
        "run_id": _text_column(_field(results, "run_id")),
        "name": _text_column(_field(results, "name")),
        "status": _status_column(_field(results, "status")),
        **_params_table(results),
        "epochs": values.pop("epochs").astype(np.int64),
    }
    data.update((k, values.pop(k)) for k in ("val_acc", "best_val_acc"))
    data["best_epoch"] = _int_column(values.pop("best_epoch"))
    data.update(values)
    data.update(_run_fields(results))
    frame = pd.DataFrame(data)
    frame.attrs["warnings"] = results.warnings
    return frame


def _run_fields(results: Results) -> dict:
    """The run.json columns of the runs table."""
    text = ("slurm_job_id", "backend", "amp", "git_sha", "error", "path")
    data = {key: _text_column(_field(results, key)) for key in text}
    for key in ("world_size", "requeues", "error_rank"):
        data[key] = _int_column(_field(results, key))
    for key in ("started_at", "finished_at"):
        data[key] = _time_column(_field(results, key))
    data["warnings"] = _text_column(["; ".join(p) or None for p in results.problems])
    order = ("world_size", "slurm_job_id", "requeues", "started_at", "finished_at", "backend",
             "amp", "git_sha", "error", "error_rank", "path", "warnings")
    return {key: data[key] for key in order}


def _epoch_ints(col: np.ndarray) -> "np.ndarray | pd.arrays.IntegerArray":
    """Epoch or step numbers as int64, or nullable Int64 when some are missing."""
    if not np.isnan(col).any():
        return col.astype(np.int64)
    return _int_column(col)


def epochs_frame(results: Results) -> pd.DataFrame:
    """One row per run and epoch; see ``load_epochs``."""
    owner = np.repeat(np.arange(len(results.lengths)), results.lengths)
    data: dict = {}
    for key in ("run_id", "name"):
        codes, uniques = pd.factorize(pd.Series(_field(results, key), dtype=object))
        data[key] = pd.Categorical.from_codes(codes[owner], categories=uniques)
    for key, column in _params_table(results).items():
        data[key] = column.take(owner).reset_index(drop=True)
    for name, col in results.columns.items():
        data[name] = _epoch_ints(col) if name in ("epoch", "step") else col
    frame = pd.DataFrame(data)
    frame.attrs["warnings"] = results.warnings
    return frame


def _warn(results: Results) -> None:
    """Emit each problem as a ResultsWarning."""
    for message in results.warnings:
        warnings.warn(message, ResultsWarning, stacklevel=3)


def load_runs(root: "str | os.PathLike", cache: bool = True) -> pd.DataFrame:
    """One row per run under ``root``.

    Columns: run_id, name, status (categorical: the DESIGN states, then
    ``unknown`` for runs whose run.json is missing or unreadable), one column per
    swept key by its dotted name (e.g. ``train.lr``), epochs (last epoch logged,
    0 if none), val_acc (last epoch), best_val_acc (max over epochs), best_epoch,
    val_loss, train_loss, train_acc (last epoch; val_acc_ema / val_acc_tta too
    when logged), wall_time_s (finished_at - started_at, else the sum of
    epoch_time_s), samples_per_s (mean over epochs), world_size, slurm_job_id,
    requeues, started_at, finished_at (UTC datetimes), backend, amp, git_sha,
    error, error_rank, path, warnings. Numbers are float64 with NaN for missing,
    except counts (epochs int64; best_epoch, world_size, requeues, error_rank
    nullable Int64). Problems are emitted as ``ResultsWarning`` and kept in
    ``df.attrs["warnings"]``.
    """
    results = collect(root, cache=cache)
    _warn(results)
    return runs_frame(results)


def load_epochs(root: "str | os.PathLike", cache: bool = True) -> pd.DataFrame:
    """One row per run and epoch under ``root``.

    Columns: run_id and name (categoricals), the swept keys, then every metric
    logged by any run (epoch and step int64; the others float64, NaN where a
    run did not log it). Rows are in run order, then epoch order. Problems are
    emitted as ``ResultsWarning`` and kept in ``df.attrs["warnings"]``.
    """
    results = collect(root, cache=cache)
    _warn(results)
    return epochs_frame(results)
