"""A search (docs/design.md, "Search"): its folder, its record ``search.json``, its space
and the values the random method draws for a trial.

A search lives in ``<output.root>/<name>/<id>/``: ``spec.yaml`` (the search's resolved
spec), ``search.json`` (the search as it was resolved, and what runs it), the study
(``study.jsonl``), the records of its
pruner (``rungs.jsonl``, clusterjob.search.asha) and one ordinary run folder per trial,
``<id>-NNN``: the ids a sweep's runs have, so loggers and the report see the trials of one
search as one sweep.

search.json is read tolerantly (a damaged field is None, never an exception) and written
by one atomic read-modify-write under its lock, as run.json is. Stdlib only: the runner
(the pruner), status and the report read it on both sides.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from clusterjob.core.files import NO_LOCKS, loads, locked, open_lock, read_text, write_atomic
from clusterjob.core.rundir import SEARCH_FILE
from clusterjob.spec.searchspec import DISTRIBUTIONS

STUDY_FILE = "study.jsonl"  # the study, whatever the method (clusterjob.search.study)
RUNGS_FILE = "rungs.jsonl"  # the pruner's decisions (clusterjob.search.asha)
STUDY_LOCK = "study.lock"  # taken by every change of the study and the rungs
MAX_SEARCH_BYTES = 4 * 2**20


def trial_id(search_id: str, number: int) -> str:
    """The run id of trial ``number``: ``<search id>-NNN``, as a sweep point's."""
    return f"{search_id}-{number:03d}"


def trial_number(search_id: str, run_id: str) -> Optional[int]:
    """The trial number a run id names within search ``search_id``, else None."""
    head, _, tail = run_id.rpartition("-")
    return int(tail) if head == search_id and tail.isascii() and tail.isdigit() else None


def is_search(folder: "str | os.PathLike") -> bool:
    """Whether ``folder`` is a search's folder (it holds search.json)."""
    return os.path.isfile(os.path.join(folder, SEARCH_FILE))


# ----------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class Dimension:
    """One searched key: ``kind`` one of DISTRIBUTIONS, ``args`` its [low, high] or choices."""

    key: str
    kind: str
    args: tuple

    def draw(self, rng: random.Random) -> Any:
        low, high = (self.args + (None, None))[:2]
        if self.kind == "uniform":
            return rng.uniform(low, high)
        if self.kind == "log_uniform":
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        if self.kind == "int_uniform":
            return rng.randint(low, high)
        return self.args[rng.randrange(len(self.args))]

    def bounds(self) -> list:
        """The values that show what the key may take: both ends of a range, each choice."""
        return list(self.args)


def space_of(raw: Any) -> list[Dimension]:
    """The dimensions of a space as search.json (or a validated spec) holds it:
    ``{key: {kind: [args]}}``; entries of another shape are left out."""
    found = []
    for key, value in (raw or {}).items() if isinstance(raw, dict) else ():
        if isinstance(value, dict) and len(value) == 1:
            kind, args = next(iter(value.items()))
            if kind in DISTRIBUTIONS and isinstance(args, (list, tuple)) and args:
                found.append(Dimension(str(key), kind, tuple(args)))
    return found


def draw(space: list[Dimension], seed: int, number: int) -> dict:
    """Trial ``number``'s values under the random method: its own generator, seeded by
    (seed, number), so a trial's values never depend on which slot drew it or when."""
    rng = _trial_random(seed, number)
    return {dim.key: dim.draw(rng) for dim in space}


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s own sampler under the tpe method (Optuna's, given a
    fresh one per trial): from (seed, number) alone, as ``draw``'s generator, so that the
    slots' processes (each its own sampler) and a resumed search never draw alike."""
    return _trial_random(seed, number).getrandbits(32)


def _trial_random(seed: int, number: int) -> random.Random:
    return random.Random(f"clusterjob-search:{seed}:{number}")


# ----------------------------------------------------------------------------- search.json


@dataclass(frozen=True)
class SearchRecord:
    """search.json: the resolved search section (method, trials, parallel, metric, mode,
    seed, space, prune, last: the planned epochs of the built-in trainer, None for your
    own code) and what runs it: ``executor``, ``job`` (the Slurm array of its slot runs,
    {executor, id}), ``cancel_requested_at``, ``restarts``. Its slot runs
    (clusterjob.search.slotruns) say what runs each slot."""

    id: Optional[str] = None
    name: Optional[str] = None
    method: Optional[str] = None
    trials: Optional[int] = None
    parallel: Optional[int] = None
    metric: Optional[str] = None
    mode: Optional[str] = None
    seed: Optional[int] = None
    space: Optional[dict] = None
    prune: Optional[dict] = None
    last: Optional[int] = None
    executor: Optional[str] = None
    job: Optional[dict] = None
    submit_dir: Optional[str] = None
    git_sha: Optional[str] = None
    created_at: Optional[str] = None
    cancel_requested_at: Optional[str] = None
    restarts: Optional[int] = None

    @property
    def dimensions(self) -> list[Dimension]:
        return space_of(self.space)

    @property
    def job_id(self) -> Optional[str]:
        """The Slurm array's id, when a Slurm array runs the search."""
        job = self.job or {}
        return job.get("id") if job.get("executor") == "slurm" and isinstance(job.get("id"), str) else None

    def describe(self) -> str:
        """``tpe, asha (min_epochs 1, reduction 3), val_acc max``."""
        prune = self.prune or {}
        pruning = (f"asha (min_epochs {prune.get('min_epochs')}, reduction {prune.get('reduction')})"
                   if prune else "no pruning")
        return f"{self.method}, {pruning}, {self.metric} {self.mode}"


_TYPES: dict[str, Any] = {"id": str, "name": str, "method": str, "trials": int, "parallel": int, "metric": str,
                          "mode": str, "seed": int, "space": dict, "prune": dict, "last": int, "executor": str,
                          "job": dict, "submit_dir": str, "git_sha": str, "created_at": str,
                          "cancel_requested_at": str, "restarts": int}


def _checked(raw: Any) -> tuple[SearchRecord, list[str]]:
    if not isinstance(raw, dict):
        return SearchRecord(), [f"{SEARCH_FILE} is not a JSON object; ignored"]
    values, problems = {}, []
    for key, kind in _TYPES.items():
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, kind) and not isinstance(value, bool):
            values[key] = value
        else:
            problems.append(f"{SEARCH_FILE}: {key} is {type(value).__name__}, not {kind.__name__}; ignored")
    return SearchRecord(**values), problems


def read(folder: "str | os.PathLike") -> tuple[SearchRecord, list[str]]:
    """The search's record with every problem found; never raises."""
    text, why = read_text(Path(folder) / SEARCH_FILE, MAX_SEARCH_BYTES)
    if text is None:
        return SearchRecord(), [f"{SEARCH_FILE} {why}"]
    return _checked(loads(text))


def update(folder: "str | os.PathLike", **fields: Any) -> SearchRecord:
    """Set ``fields`` (SearchRecord fields only) in search.json, atomically and in turn
    with other writers; returns the new record."""
    unknown = set(fields) - set(_TYPES)
    if unknown:
        raise TypeError(f"not fields of {SEARCH_FILE}: {', '.join(sorted(unknown))}")
    path = Path(folder) / SEARCH_FILE
    with locked(Path(folder) / (SEARCH_FILE + ".lock")):
        text, _ = read_text(path, MAX_SEARCH_BYTES)
        raw = loads(text) if text is not None else {}
        raw = raw if isinstance(raw, dict) else {}
        raw.update(fields)
        write_atomic(path, json.dumps(raw, indent=2) + "\n")
    return _checked(raw)[0]


# ----------------------------------------------------------------------------- the study's lock

STALE_LOCK_S = 30.0  # a lock folder older than this is left by a holder that died (a take lasts milliseconds)


@contextlib.contextmanager
def study_lock(folder: "str | os.PathLike") -> Iterator[None]:
    """The block under the study's exclusive lock, shared by every slot on every node:
    flock where the file system has it, else a lock folder (mkdir is atomic on NFS), one
    left by a dead holder broken after STALE_LOCK_S. Taking a trial, recording a rung
    and finishing a trial each take it; none of them may ever run unlocked (two slots
    would take the same trial)."""
    path = Path(folder) / STUDY_LOCK
    fd = open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in NO_LOCKS:
                raise
            with _folder_lock(Path(str(path) + ".d")):
                yield
            return
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _folder_lock(path: Path) -> Iterator[None]:
    while True:
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - os.stat(path).st_mtime > STALE_LOCK_S:
                    os.rmdir(path)
                    continue
            time.sleep(0.02)
        except OSError as err:
            if err.errno != errno.EEXIST:
                raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def append_line(path: Path, entry: dict) -> None:
    """One JSON line appended (the caller holds the study's lock), after a line break
    where a writer killed mid-line left none: the cut line is lost, never this one."""
    with open(path, "ab") as f:
        end = f.seek(0, os.SEEK_END)
        start = b""
        if end:
            with open(path, "rb") as r:
                r.seek(end - 1)
                start = b"" if r.read(1) == b"\n" else b"\n"
        f.write(start + json.dumps(entry).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: Path) -> list[dict]:
    """The JSON-object lines of a journal; a line cut short by a kill (the last) or not an
    object is skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [entry for entry in map(loads, text.splitlines()) if isinstance(entry, dict)]
