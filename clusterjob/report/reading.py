"""Reading run folders: every run under a root parsed into one ``Results`` (per-run
fields and the metrics of all lines), with the cache. ``clusterjob.report.results`` turns it
into the public pandas tables (through ``tables``).

Damaged input (a truncated last line of metrics.jsonl, a missing, cut-off or
mistyped run.json, values that are not numbers) never raises: each problem is
emitted as a ``ResultsWarning`` through Python's ``warnings`` module, listed in
``df.attrs["warnings"]`` and in the run's ``warnings`` column, and the run keeps
what could be read (status ``unknown`` when run.json gives none).

Parsed runs are cached in ``<root>/.clusterjob-cache.npz``, keyed by the size,
mtime and inode of each run's two files, so a second report over a large sweep
only re-reads the runs that changed. A run's spec.yaml, as flat keys
(``specfile``), is read and cached with it: it is written once, at submit. The cache holds plain arrays and a JSON
header and is loaded with ``allow_pickle=False``: a results folder shared with
others cannot make the reader run code. ``collect`` only reads it; the cache is
written by ``Results.save_cache``, which callers run once their work succeeded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from clusterjob.core import metrics, record
from clusterjob.core.files import many_reads
from clusterjob.core.rundir import METRICS_FILE, NO_STAMP, FoundRun, file_stamp, found_run, scan_runs
from clusterjob.core.runstate import FINAL_STATUSES, UNKNOWN
from clusterjob.report import specfile

__all__ = ["ResultsWarning", "Results", "RunStates", "collect", "row_fields", "with_states"]

# The records of run folders as their executors see them now (the queue, the processes):
# clusterjob.launch.executor.records, the one derivation ``status`` and ``logs -f`` use,
# read-only. The report may not import the launch side: the command line hands it in.
RunStates = Callable[[list], list]

CACHE_NAME = ".clusterjob-cache.npz"
# 3: the lines of one step meet in one row (each metric at its own steps); 4: sessions;
# 5: the spec's values, stopped_at and attempts; 6: straggler; 7: a trial's search and prune verdict;
# 8: the row fields it holds named in its header
CACHE_VERSION = 8


class ResultsWarning(UserWarning):
    """A run folder could be read only in part (truncated, missing or mistyped files)."""


@dataclass
class ParsedRun:
    """What one run folder holds: run.json fields, problems, per-line metrics."""

    info: dict
    problems: list
    names: list  # metric names, one per column of ``values``
    values: np.ndarray  # float64, shape (lines, len(names))


@dataclass
class CachePlan:
    """What ``Results.save_cache`` writes: the runs as parsed and stacked."""

    root: Path
    runs: list
    parsed: list
    names: list
    matrix: np.ndarray
    fields: tuple  # the run.json fields of each row


@dataclass
class Results:
    """All runs under a root: per-run fields and the metrics of all lines.

    ``columns`` holds every metric of every run concatenated in run order
    (NaN where a run lacks that metric); run i owns rows
    ``offsets[i]:offsets[i + 1]``.
    """

    root: Path
    infos: list
    problems: list  # per run: list of problem strings
    lengths: np.ndarray
    columns: dict = field(default_factory=dict)
    cache_plan: Optional[CachePlan] = None  # None: the cache is current (or not used)

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

    def subset(self, indices: Sequence[int]) -> "Results":
        """These runs only (``indices`` in run order), with the metrics they logged; the
        whole when it is all of them. Writes no cache (``save_cache`` of the whole does)."""
        if len(indices) == len(self.infos):
            return self
        offsets = self.offsets
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indices] or [np.arange(0)])
        columns = {name: col[rows] for name, col in self.columns.items()}
        columns = {name: col for name, col in columns.items() if not np.isnan(col).all()}
        return Results(self.root, [self.infos[i] for i in indices], [self.problems[i] for i in indices],
                       self.lengths[list(indices)], columns)

    def save_cache(self) -> None:
        """Write the cache of what ``collect`` read, when it changed; a folder that is not
        writable is skipped silently (the cache only makes the next read faster)."""
        plan, self.cache_plan = self.cache_plan, None
        if plan is not None:
            _save_cache(plan)


# ---------------------------------------------------------------- one run


# The run.json fields of every run's row that the tables read (tables.runs_frame, stats); a
# report provider names the others it reads (``Provider.fields``), and ``collect`` adds
# them: a new family of columns never edits this list.
TABLE_FIELDS = ("params", "slurm_job_id", "world_size", "requeues", "backend", "amp", "git_sha", "started_at",
                "finished_at", "stopped_at", "final", "sessions", "attempts", "straggler", "search", "pruned")
# its fields and what it derives from them (slurm_job_id, from its job)
_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(record.RunRecord)) | frozenset(
    name for name, value in vars(record.RunRecord).items() if isinstance(value, property))


def row_fields(more: Sequence[str] = ()) -> tuple:
    """The run.json fields a row carries: the tables' and ``more`` (in that order, once
    each). Raises ValueError for a name that is no field of run.json (a provider's typo
    would otherwise be a column of None)."""
    unknown = sorted(set(more) - _RECORD_FIELDS)
    if unknown:
        raise ValueError(f"not fields of {record.INFO_FILE}: {', '.join(unknown)}")
    return tuple(dict.fromkeys((*TABLE_FIELDS, *more)))


def _info(info: record.RunRecord, run: FoundRun, spec: Optional[dict], fields: Sequence[str]) -> dict:
    """The run's row of ``fields`` (the tables want mappings), gaps filled from the folder names."""
    folder = Path(os.path.abspath(run.path))  # string work only: no syscalls per run
    error = info.error or record.RunError(None, None)
    return {
        "path": run.path,
        "run_id": info.run_id or folder.name,
        "name": info.name or folder.parent.name,
        "status": info.status or UNKNOWN,
        **{key: record.to_json(getattr(info, key)) for key in fields},  # sessions as run.json holds them
        "error": error.message,
        "error_rank": error.rank,
        "spec": spec,
    }


def _parse_run(run: FoundRun, specs: specfile.Reader, lines: tuple, fields: Sequence[str]) -> ParsedRun:
    """Read one run folder (its spec.yaml through ``specs``; ``lines``: its metrics.jsonl
    as ``metrics.read_matrices`` read it); never raises for damaged files."""
    reading = record.read(record.info_path(run.path))
    names, matrix, more = lines
    problems = reading.file_problems
    if problems and reading.empty and not names:
        problems = [f"{record.INFO_FILE} and {METRICS_FILE} are both unreadable"]
    info = _info(reading.record, run, specs.read(run.path), fields)
    return ParsedRun(info, problems + reading.field_problems + more, names, matrix)


# ---------------------------------------------------------------- cache


@dataclass
class Cache:
    """The parsed runs of a root as last saved: {key: (stamp, ParsedRun)}, the stacked
    matrix they came from and the run.json fields each row holds."""

    runs: dict
    names: list
    matrix: np.ndarray
    fields: tuple


def _load_cache(root: Path, fields: tuple = TABLE_FIELDS) -> Optional[Cache]:
    """The root's cache; None when absent, unreadable, not exactly what ``_save_cache``
    writes, or when its rows lack one of ``fields``. The folder may be shared: a foreign or
    tampered file must cost a re-read of the runs, never a crash, so every array, type and
    count is checked before use."""
    path = root / CACHE_NAME
    if file_stamp(str(path)) == NO_STAMP:  # absent, or a FIFO or device np.load would block on
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not isinstance(npz, np.lib.npyio.NpzFile) or sorted(npz.files) != ["header", "values"]:
                return None
            header = _header(npz["header"])
            matrix = npz["values"]
        if header is None or not _fits(header, matrix) or not set(fields) <= set(header["fields"]):
            return None
        return Cache(_runs_from_cache(header, matrix), header["names"], matrix, tuple(header["fields"]))
    except Exception:  # any unreadable cache is only a slower start, never an error
        return None


def _header(raw: np.ndarray) -> Optional[dict]:
    """The cache's JSON header: a mapping of this version with a list of names and of runs."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        return None
    header = json.loads(raw.tobytes().decode("utf-8"))
    if not isinstance(header, dict) or header.get("version") != CACHE_VERSION:
        return None
    names, runs, bases = header.get("names"), header.get("runs"), header.get("spec_bases")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)):
        return None
    if not (isinstance(bases, dict) and all(isinstance(b, dict) and specfile.is_flat_spec(b) for b in bases.values())):
        return None
    fields = header.get("fields")
    if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields) and set(fields) <= _RECORD_FIELDS):
        return None
    keys = _FIXED_KEYS | set(fields)
    return header if isinstance(runs, list) and all(_entry_ok(entry, keys) for entry in runs) else None


def _fits(header: dict, matrix: np.ndarray) -> bool:
    """Whether the matrix is float64 with a column per name and a row per cached line,
    and every entry's columns exist and its key is unique."""
    runs, width = header["runs"], len(header["names"])
    if matrix.dtype != np.float64 or matrix.ndim != 2 or matrix.shape[1] != width:
        return False
    if sum(entry["rows"] for entry in runs) != matrix.shape[0]:
        return False
    keys = [entry["key"] for entry in runs]
    return len(set(keys)) == len(keys) and all(max(entry["cols"], default=-1) < width for entry in runs)


_ENTRY_INFO: dict[str, Any] = {"path": str, "run_id": str, "name": str, "status": str, "error": (str, type(None)),
               "error_rank": (int, type(None))}
_FIXED_KEYS = frozenset(_ENTRY_INFO) | {"spec"}  # what _info returns besides the row fields


def _entry_ok(entry: object, keys: frozenset) -> bool:
    """Whether one cached run is what ``_save_cache`` writes: key, stamp, a run's fields as
    ``_info`` makes them (run.json's fields passing ``record.checked`` with no problem),
    problems as text, and its rows and columns."""
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        return False
    stamp, rows, cols = entry.get("stamp"), entry.get("rows"), entry.get("cols")
    if not (isinstance(stamp, list) and len(stamp) == 6 and all(type(v) is int for v in stamp)):
        return False
    if not (type(rows) is int and rows >= 0 and isinstance(cols, list)):
        return False
    if not all(type(c) is int and c >= 0 for c in cols) or len(set(cols)) != len(cols):
        return False
    problems = entry.get("problems")
    texts = isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    return texts and _info_ok(entry.get("info"), keys)


def _info_ok(info: object, keys: frozenset) -> bool:
    if not isinstance(info, dict) or set(info) != keys:
        return False
    if not all(isinstance(info[key], kind) and type(info[key]) is not bool for key, kind in _ENTRY_INFO.items()):
        return False
    if not specfile.is_encoded(info["spec"]):
        return False
    checked, problems = record.checked({k: v for k, v in info.items() if k not in _ENTRY_INFO and k != "spec"})
    return not problems and checked.final == info.get("final") and checked.params == info.get("params")


def _runs_from_cache(header: dict, matrix: np.ndarray) -> dict:
    """Rebuild the cached runs; each gets a view of its block of ``matrix``."""
    names, bases = header["names"], header["spec_bases"]
    cached, start = {}, 0
    for entry in header["runs"]:
        info = entry["info"]
        info["spec"] = specfile.decode(info["spec"], bases.get(info["name"]))
        rows, cols = entry["rows"], entry["cols"]
        block = matrix[start:start + rows]
        if cols != list(range(len(names))):  # the common case, all metrics, stays a view
            block = block[:, cols]
        start += rows
        run = ParsedRun(entry["info"], entry["problems"], [names[c] for c in cols], block)
        cached[entry["key"]] = (tuple(entry["stamp"]), run)
    return cached


def _save_cache(plan: CachePlan) -> None:
    """Write the cache atomically (temp file + rename); a folder that is not writable,
    or any failure to write, leaves no file behind."""
    if not os.access(plan.root, os.W_OK):
        return
    index = {name: i for i, name in enumerate(plan.names)}
    bases: dict = {}  # each name's first spec: the others are kept as what differs from it
    for p in plan.parsed:
        if p.info["spec"] is not None:
            bases.setdefault(p.info["name"], p.info["spec"])
    entries = [
        {"key": run.key, "stamp": list(run.stamp), "problems": p.problems, "rows": len(p.values),
         "info": {**p.info, "spec": specfile.encode(p.info["spec"], bases.get(p.info["name"]))},
         "cols": [index[n] for n in p.names]}
        for run, p in zip(plan.runs, plan.parsed)
    ]
    tmp = plan.root / f"{CACHE_NAME}.{os.getpid()}.tmp"
    try:
        header = json.dumps({"version": CACHE_VERSION, "names": plan.names, "spec_bases": bases, "runs": entries,
                             "fields": list(plan.fields)},
                            separators=(",", ":"), check_circular=False)  # plain data: no cycle to look for
        with open(tmp, "wb") as f:
            np.savez(f, header=np.frombuffer(header.encode("utf-8"), np.uint8), values=plan.matrix)
        os.replace(tmp, plan.root / CACHE_NAME)
    except Exception:  # a cache that cannot be written is only a slower next report
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- assembly


def _union_names(parsed: list) -> list:
    """All metric names in the order of the tables (metrics.table_order)."""
    return metrics.table_order(name for p in parsed for name in p.names)


def _stack(parsed: list, names: list) -> np.ndarray:
    """One float64 matrix of all runs' lines, NaN where a run lacks a metric."""
    if all(p.names == names or not len(p.values) for p in parsed):  # a sweep of one trainer: one copy
        return np.concatenate([p.values for p in parsed if len(p.values)] or [np.empty((0, len(names)))])
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


def _parse_all(runs: list, cached: dict, fields: tuple) -> tuple:
    """Parsed runs (from the cache where the stamps match; the others with ``fields``) and
    whether any was re-read."""
    hits = [cached.get(run.key) for run in runs]
    missed = [run for run, hit in zip(runs, hits) if hit is None or hit[0] != run.stamp]
    # every metrics.jsonl read afresh at once: files of one layout are parsed together
    lines = iter(metrics.read_matrices([os.path.join(run.path, METRICS_FILE) for run in missed]))
    specs = specfile.Reader()  # a sweep's specs differ in a line or two: read as such
    parsed = [hit[1] if hit is not None and hit[0] == run.stamp else _parse_run(run, specs, next(lines), fields)
              for run, hit in zip(runs, hits)]
    return parsed, bool(missed)


def _runs_of(root: "str | os.PathLike | Sequence") -> tuple[Path, list[FoundRun], bool]:
    """(folder, runs, whether to cache) of a root folder or a list of run folders."""
    if not isinstance(root, (str, os.PathLike)):  # a list of run folders
        found = [found_run(os.fspath(p), Path(p).name) for p in root]
        base = os.path.commonpath([os.path.abspath(p) for p in root]) if root else "."
        return Path(base), [run for run in found if run is not None], False
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no such results folder: {root}")
    runs = scan_runs(root)
    return root, runs, not (len(runs) == 1 and runs[0].key == ".")


def collect(root: "str | os.PathLike | Sequence", cache: bool = True, fields: Sequence[str] = ()) -> Results:
    """Read every run under ``root``; the basis of load_runs, load_epochs and reports.

    ``root`` may also be a list of run folders (as ``submit --wait`` has): those
    runs only, without a cache. With ``cache`` the cache is read, and
    ``Results.save_cache()`` writes it back when it changed. Each run's row holds
    the tables' run.json fields and ``fields`` (``row_fields``); a cache whose rows
    lack one is read afresh. Emits no warnings itself (see ``Results.warnings``);
    raises FileNotFoundError when ``root`` is not a folder.
    """
    wanted = row_fields(fields)
    with many_reads():
        root, runs, use_cache = _runs_of(root)
        use_cache = use_cache and cache
        saved = _load_cache(root, wanted) if use_cache else None
        cached = saved.runs if saved else {}
        wanted = saved.fields if saved else wanted  # the runs read afresh match the cached rows
        parsed, fresh = _parse_all(runs, cached, wanted)
    unchanged = saved is not None and not fresh and list(cached) == [run.key for run in runs]
    if unchanged:  # the cached matrix is exactly what _stack would build
        assert saved is not None  # unchanged says so
        names, matrix = saved.names, saved.matrix
    else:
        names = _union_names(parsed)
        matrix = _stack(parsed, names)
    plan = CachePlan(root, runs, parsed, names, matrix, wanted) if use_cache and not unchanged else None
    columns = {name: matrix[:, i] for i, name in enumerate(names)}
    lengths = np.array([len(p.values) for p in parsed], dtype=np.int64)
    return Results(root, [p.info for p in parsed], [p.problems for p in parsed], lengths, columns, plan)


def with_states(results: Results, states: Optional[RunStates]) -> Results:
    """``results`` with the status and error that ``states`` derives for each run whose
    run.json does not say it ended (every process of a local run gone, a Slurm job that
    left the queue): what ``status`` shows. The cache keeps what run.json says (its rows
    are copied, not changed); ``states`` None leaves ``results`` as they are."""
    open_ = [i for i, info in enumerate(results.infos) if info["status"] not in FINAL_STATUSES]
    if states is None or not open_:
        return results
    infos = list(results.infos)
    for i, now in zip(open_, states([infos[i]["path"] for i in open_])):
        error = now.error or record.RunError(None, None)
        infos[i] = {**infos[i], "status": now.status or UNKNOWN, "error": error.message, "error_rank": error.rank}
    return dataclasses.replace(results, infos=infos)
