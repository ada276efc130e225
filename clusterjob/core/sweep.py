"""A submission's record: what one ``submit`` made and what has its runs (docs/design.md,
"Results layout").

Every submission is a sweep (of one run, or of one per sweep point), named by the stamp
its run ids share: runs ``<stamp>`` or ``<stamp>-NNN`` under ``<output.root>/<name>/``,
its id ``<name>-<stamp>``. Its record, ``<name>/.sweeps/<stamp>.json``, is written by
``submit`` before any run folder and then once per part handed over: each job (a Slurm
job array of up to MaxArraySize runs, or one job) or local supervisor with the runs it
has. So submitting N runs writes N run.json files once and this file a few times, never
every run.json again to say which job runs it; a run learns its job from here (``job_of``)
until its own ranks record it at their start.

A part names its runs by index with the ``restarts`` each had when it was handed over,
so that a later part (``resume``) takes over from an earlier one exactly for the runs it
restarted. ``by`` is the process that hands the part over; a part whose job is still
None was being submitted: if ``by`` is gone, its job (a Slurm array named after the
sweep) may exist without being recorded (the executor looks for it).

``<name>/.sweeps/<stamp>.lock`` is the sweep's claim (clusterjob.core.claim): the submit
holds it from before it makes the run folders until they are handed over. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

from clusterjob.core.files import loads, locked, now_iso, read_text, write_atomic
from clusterjob.core.procs import ProcessRef
from clusterjob.core.record import INFO_FILE, Job, RunRecord, amended, info_path, materialize, read_record
from clusterjob.core.sweepnames import (  # noqa: F401  (this module's names, where its readers look)
    FOLDER,
    Member,
    lock_file,
    member,
    parse_id,
    record_file,
    run_name,
    sweep_id,
)

_MOST_RUNS = 1_000_000  # far past any sweep (the spec allows 10,000 points); a range past it is garbage
_RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?")


# ----------------------------------------------------------------------------- index ranges


def to_ranges(indices: list[int]) -> str:
    """``0-3,7,9-10``: indices in their order, runs of consecutive ones as ranges."""
    parts: list[str] = []
    start = prev = None
    for index in indices:
        if prev is not None and index == prev + 1:
            prev = index
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = index
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def from_ranges(text: Any) -> Optional[list[int]]:
    """The indices of ``to_ranges``' text; None for anything else (or more than any sweep holds)."""
    if not isinstance(text, str):
        return None
    found: list[int] = []
    for piece in text.split(",") if text else []:
        match = _RANGE.fullmatch(piece)
        if match is None:
            return None
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first or len(found) + last - first >= _MOST_RUNS:
            return None
        found.extend(range(first, last + 1))
    return found


# ----------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Part:
    """Runs handed over together: ``runs`` (indices, in task order) with the ``restarts``
    each had then; the ``job`` that has them (a Slurm array when ``array``: run k of the
    part is its task k) or the ``launcher`` (a local supervisor); ``by`` hands it over;
    ``runs_file`` is what the job reads to find its runs."""

    runs: tuple
    restarts: tuple
    at: Optional[str] = None
    job: Optional[Job] = None
    array: bool = False
    launcher: Optional[ProcessRef] = None
    by: Optional[ProcessRef] = None
    runs_file: Optional[str] = None

    def job_of(self, position: int) -> Optional[Job]:
        """The job of the part's run at ``position`` (an array's task)."""
        if self.job is None:
            return None
        return Job(self.job.executor, f"{self.job.id}_{position}") if self.array else self.job

    def to_dict(self) -> dict:
        uniform = len(set(self.restarts)) <= 1
        return {"runs": to_ranges(list(self.runs)),
                "restarts": (self.restarts[0] if self.restarts else 0) if uniform else list(self.restarts),
                "at": self.at, "job": self.job.to_dict() if self.job else None, "array": self.array,
                "launcher": self.launcher.to_dict() if self.launcher else None,
                "by": self.by.to_dict() if self.by else None, "runs_file": self.runs_file}


@dataclass(frozen=True)
class SweepRecord:
    """``.sweeps/<stamp>.json``: the submission's name, stamp, run count and executor,
    when it was made, and its parts, oldest first."""

    name: Optional[str]
    stamp: str
    runs: Optional[int] = None
    executor: Optional[str] = None
    created_at: Optional[str] = None
    parts: tuple = ()

    @property
    def id(self) -> str:
        return sweep_id(self.name or "", self.stamp)

    @cached_property
    def _placed(self) -> dict:
        """{(index, restarts): (part, position)} of the newest part that has each run."""
        placed: dict = {}
        for part in self.parts:
            for position, key in enumerate(zip(part.runs, part.restarts)):
                placed[key] = (part, position)
        return placed

    def place(self, index: int, restarts: int) -> Optional[tuple[Part, int]]:
        """(part, position) that has run ``index`` at its ``restarts``; None: no part has it."""
        return self._placed.get((index, restarts))

    def to_dict(self) -> dict:
        return {"sweep": self.id, "name": self.name, "stamp": self.stamp, "runs": self.runs,
                "executor": self.executor, "created_at": self.created_at,
                "parts": [part.to_dict() for part in self.parts]}


def _job(raw: Any) -> Optional[Job]:
    if isinstance(raw, dict) and type(raw.get("executor")) is str and type(raw.get("id")) is str:
        return Job(raw["executor"], raw["id"])
    return None


def _part(raw: Any) -> Optional[Part]:
    """A part as the file holds it; None when damaged (its runs then have no part)."""
    if not isinstance(raw, dict):
        return None
    runs = from_ranges(raw.get("runs"))
    restarts = raw.get("restarts", 0)
    if runs is None:
        return None
    if isinstance(restarts, int) and not isinstance(restarts, bool):
        restarts = [restarts] * len(runs)
    if not (isinstance(restarts, list) and len(restarts) == len(runs) and all(type(r) is int for r in restarts)):
        return None
    at, runs_file = raw.get("at"), raw.get("runs_file")
    return Part(tuple(runs), tuple(restarts), at if isinstance(at, str) else None, _job(raw.get("job")),
                raw.get("array") is True, ProcessRef.from_dict(raw.get("launcher")) if raw.get("launcher") else None,
                ProcessRef.from_dict(raw.get("by")) if raw.get("by") else None,
                runs_file if isinstance(runs_file, str) else None)


def _of(raw: Any, stamp: str) -> Optional[SweepRecord]:
    if not isinstance(raw, dict):
        return None
    listed = raw.get("parts")
    parts = listed if isinstance(listed, list) else []
    runs = raw.get("runs")
    text = {key: raw.get(key) if isinstance(raw.get(key), str) else None for key in ("name", "executor", "created_at")}
    return SweepRecord(text["name"], stamp, runs if type(runs) is int else None, text["executor"], text["created_at"],
                       tuple(part for part in map(_part, parts) if part is not None))


def read(parent: "str | os.PathLike", stamp: str) -> Optional[SweepRecord]:
    """The sweep's record; None when it is absent or not one (never raises)."""
    text, _ = read_text(record_file(parent, stamp), limit=64 * 2**20)
    return None if text is None else _of(loads(text), stamp)


_MADE: set = set()  # the sweeps this process made: their runs are fresh (restarts 0)


def create(parent: "str | os.PathLike", stamp: str, name: str, runs: int, executor: str) -> SweepRecord:
    """The record of a submission about to make its ``runs`` run folders (no part yet)."""
    made = SweepRecord(name, stamp, runs, executor, now_iso())
    record_file(parent, stamp).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(record_file(parent, stamp), json.dumps(made.to_dict(), indent=1) + "\n")
    _MADE.add((os.path.abspath(parent), stamp))
    return made


def made_here(parent: "str | os.PathLike", stamp: str) -> bool:
    """Whether this process made the sweep, so that its runs never started nor restarted
    (what its first parts record for them without reading each run.json)."""
    return (os.path.abspath(parent), stamp) in _MADE


def update(parent: "str | os.PathLike", stamp: str, change: Callable[[SweepRecord], SweepRecord]) -> SweepRecord:
    """Read, ``change`` and write the record atomically, under its lock (a resume of one
    run and one of another may add their parts at once); a record that is missing (runs
    of an earlier version) starts empty."""
    path = record_file(parent, stamp)
    path.parent.mkdir(exist_ok=True)
    with locked(path.with_name(path.name + ".lock")):
        found = read(parent, stamp) or SweepRecord(os.path.basename(os.path.abspath(parent)), stamp)
        changed = change(found)
        write_atomic(path, json.dumps(changed.to_dict(), indent=1) + "\n")
    return changed


def new_part(folders: list, **fields: Any) -> Optional[tuple[Member, Part]]:
    """The part of the runs in ``folders`` (``fields``: its job, launcher, ...) with their
    indices and restarts (0 for a sweep this process made, else each run.json's), and
    where it goes; None unless they are runs of one sweep."""
    found = [member(folder) for folder in folders]
    first = found[0] if found else None
    if first is None or any(m is None or (m.parent, m.stamp) != (first.parent, first.stamp) for m in found):
        return None
    fresh = made_here(first.parent, first.stamp)
    restarts = [0 if fresh else (read_record(folder)[0].restarts or 0) for folder in folders]
    return first, Part(tuple(m.index for m in found if m is not None), tuple(restarts), now_iso(), **fields)


def add_parts(where: Member, parts: list[Part]) -> list[int]:
    """Append ``parts`` to the record of ``where``'s sweep in one write; their numbers."""
    made = update(where.parent, where.stamp, lambda found: dataclasses.replace(found, parts=(*found.parts, *parts)))
    return list(range(len(made.parts) - len(parts), len(made.parts)))


def set_part(parent: "str | os.PathLike", stamp: str, number: int, **fields: Any) -> None:
    """Set ``fields`` of part ``number`` (its job once sbatch answered, its launcher)."""
    def change(found: SweepRecord) -> SweepRecord:
        parts = list(found.parts)
        parts[number] = dataclasses.replace(parts[number], **fields)
        return dataclasses.replace(found, parts=tuple(parts))
    update(parent, stamp, change)


# ----------------------------------------------------------------------------- a run's job


class Records:
    """Sweep records read once each: the runs of one sweep share theirs."""

    def __init__(self) -> None:
        self._read: dict = {}
        self.asked: dict = {}  # what the readers asked once per sweep (the job of a dead submit)

    def of(self, where: Member) -> Optional[SweepRecord]:
        key = (where.parent, where.stamp)
        if key not in self._read:
            self._read[key] = read(where.parent, where.stamp)
        return self._read[key]


def placed(folder: "str | os.PathLike", record: RunRecord,
           records: Optional[Records] = None) -> Optional[tuple[Part, int]]:
    """(part, position) of the run in ``folder`` (``record``: its run.json) in its
    sweep's record, at its current ``restarts``; None when no part has it."""
    where = member(folder)
    if where is None:
        return None
    found = (records or Records()).of(where)
    return found.place(where.index, record.restarts or 0) if found is not None else None


def job_of(folder: "str | os.PathLike", record: RunRecord, records: Optional[Records] = None) -> Optional[Job]:
    """The job that has the run: the one its run.json names (its ranks record it at each
    start), else the one its sweep's record gives it. Every reader of a run's job asks
    here (status, cancel, resume, the report's cost, ``submit --after``)."""
    if record.job is not None:
        return record.job
    found = placed(folder, record, records)
    return found[0].job_of(found[1]) if found is not None else None


def resolved(folder: "str | os.PathLike", record: RunRecord, records: Optional[Records] = None) -> RunRecord:
    """``record`` with the job and the local supervisor its sweep's record gives it,
    where its run.json names none yet."""
    if record.job is not None and record.launcher is not None:
        return record
    found = placed(folder, record, records)
    if found is None:
        return record
    part, position = found
    job = record.job or part.job_of(position)
    launcher = record.launcher or part.launcher
    return record if (job, launcher) == (record.job, record.launcher) else amended(record, job=job, launcher=launcher)


def has_job_of(executor: str, folder: "str | os.PathLike", records: Optional[Records] = None) -> bool:
    """Whether the sweep record of the run in ``folder`` gives any of its parts a job of
    ``executor``: where not, a run whose run.json names no job has none of that executor
    (the report's cost asks this first, so as not to read 10,000 run.json files again)."""
    where = member(folder)
    found = (records or Records()).of(where) if where is not None else None
    return found is not None and any(part.job is not None and part.job.executor == executor for part in found.parts)


def job_of_folder(folder: "str | os.PathLike", records: Optional[Records] = None) -> Optional[Job]:
    """``job_of`` for a run known by its folder alone (the report's rows): its run.json read here."""
    return job_of(folder, read_record(folder)[0], records)


# ----------------------------------------------------------------------------- a part's runs file


def write_runs_file(path: Path, runs: list) -> None:
    """The run folders of a job's tasks, in task order: what each task (``python -m
    clusterjob.run --runs FILE``) and the job's teardown read."""
    write_atomic(path, json.dumps([os.path.abspath(run) for run in runs]) + "\n")


def task_run(runs_file: "str | os.PathLike", task: int) -> Path:
    """The run folder of task ``task`` of a job (its runs file), or ValueError."""
    text, why = read_text(runs_file)
    listed = loads(text or "")
    if not isinstance(listed, list) or not 0 <= task < len(listed) or not isinstance(listed[task], str):
        raise ValueError(f"{runs_file}: {why or 'no run folder for task ' + str(task)}")
    folder = Path(listed[task])
    materialize(folder)  # the task makes its run folder where submit left that to it
    if not os.path.exists(info_path(folder)):
        raise ValueError(f"{runs_file}: task {task}'s run folder {folder} holds no {INFO_FILE}")
    return folder
