"""The run record: run.json as one typed, frozen ``RunRecord``, and the only code that
reads or writes run.json (docs/design.md, "Results layout").

run.json is the run's own record of its state, written by the run (not derived from
Slurm accounting) and read by every tool. Reading is tolerant: a damaged file or field
is a problem string naming it, never a crash (the report shows the problems as
warnings), and the record keeps what could be read. Writing is one atomic
read-modify-write (``update``) that accepts record fields only and writes just the
fields it was given, so run.json keeps its layout: keys never written stay absent,
keys the record does not know (from later versions) stay as they are.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import traceback as tb
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, TypeGuard

from clusterjob.core import runstate, unmade
from clusterjob.core.files import NOT_JSON, loads, locked, now_iso, publish, read_text, shown, write_atomic
from clusterjob.core.procs import ProcessRef
from clusterjob.core.runstate import Reason

INFO_FILE = "run.json"
LOCK_FILE = INFO_FILE + ".lock"  # held by each update of run.json, so that updates take turns
# A run writes a few KiB of run.json; anything far larger is not one of ours.
MAX_INFO_BYTES = 16 * 2**20


@dataclass(frozen=True)
class RunError:
    """Why a run failed: the rank that failed (None: no single rank), its message and
    traceback, and when (None where the failure was found afterwards, not raised)."""

    rank: Optional[int]
    message: Optional[str]
    traceback: Optional[str] = ""
    at: Optional[str] = None
    host: Optional[str] = None  # where the rank ran, as it wrote its own error (a node that failed it)

    @classmethod
    def of_exception(cls, rank: int, exc: BaseException) -> "RunError":
        lines = tb.format_exception(type(exc), exc, exc.__traceback__)
        return cls(rank, f"{type(exc).__name__}: {exc}", "".join(lines)[-4000:], now_iso())

    def to_dict(self) -> dict:
        """As run.json holds it; ``at`` and ``host`` only when known (errors found afterwards never had them)."""
        out = {"rank": self.rank, "message": self.message, "traceback": self.traceback}
        out = out if self.at is None else {**out, "at": self.at}
        return out if self.host is None else {**out, "host": self.host}


@dataclass(frozen=True)
class Attempt:
    """One session of a run that a failure of the machine ended (a rank killed by a
    signal, a communication error, a node failure): when it ended, on which hosts, why,
    and the retry it led to (its number; None: no retry left, or none allowed)."""

    at: Optional[str]
    hosts: list
    why: Optional[str]
    retry: Optional[int] = None
    job: Optional[str] = None  # the Slurm job (or array task) it ran in
    # A run submitted again with more (clusterjob.core.retry.escalate): what for (OOM, TIMEOUT,
    # GPU OOM), and the resources (mem_gb, time_min) or keys it had and got; new None: none left
    kind: Optional[str] = None
    old: Optional[dict] = None
    new: Optional[dict] = None

    def to_dict(self) -> dict:
        grown = {key: value for key in ("kind", "old", "new") if (value := getattr(self, key)) is not None}
        return {"at": self.at, "hosts": list(self.hosts), "why": self.why, "retry": self.retry, "job": self.job,
                **grown}


@dataclass(frozen=True)
class Session:
    """One start of the run's tasks (first start, requeue, retry, resume), as its rank 0
    recorded it: when, in which Slurm job, and the newest checkpoint in the run's
    checkpoints/ then (the one it resumes from; None: there was none). ``knows_checkpoints``
    is False for your own code with no checkpoint there: it may keep its own elsewhere,
    so the work a stop cost it is unknown."""

    at: Optional[str]
    job: Optional[str] = None
    checkpoint_at: Optional[str] = None
    knows_checkpoints: Optional[bool] = None

    def to_dict(self) -> dict:
        return {"at": self.at, "job": self.job, "checkpoint_at": self.checkpoint_at,
                "knows_checkpoints": self.knows_checkpoints}


SLURM = "slurm"  # the executor of every Slurm job, a raw sbatch template's run included


@dataclass(frozen=True)
class Job:
    """The job that runs the run, as its executor knows it: the executor's name and the
    job's id there (Slurm's: 123, or 123_4 for an array task)."""

    executor: str
    id: str

    def to_dict(self) -> dict:
        return {"executor": self.executor, "id": self.id}


@dataclass(frozen=True)
class Stall:
    """A stall the health watchdog saw (docs/design.md, "Hung and slow ranks"): its number
    (``logs/stall-<n>/``), when it was seen and when any rank last made progress before
    it, the culprit's line (``rank 1 on node2: time.sleep at train.py:40; rank 0 in
    all_reduce``), rank and host, what was done (retry, stop, warn; none: progress came
    back before the verdict) and when progress came back (None: still stalled)."""

    n: Optional[int]
    at: Optional[str]
    since: Optional[str]
    line: Optional[str]
    rank: Optional[int] = None
    host: Optional[str] = None
    action: Optional[str] = None
    ended_at: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Straggler:
    """The rank the others waited for in the last minute the watchdog measured: its rank
    and host, and the share of their time the others waited in collectives (median, %)."""

    rank: Optional[int]
    host: Optional[str]
    wait_pct: Optional[float]
    at: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunRecord:
    """Every field of run.json; None (``[]`` for hosts, warnings, attempts, sessions, after, stalls and
    excluded_hosts) where absent or unreadable."""

    run_id: Optional[str] = None
    name: Optional[str] = None
    status: Optional[str] = None
    params: Optional[dict] = None  # the resolved params, dotted keys (the sweep point, params.NAME)
    job: Optional[Job] = None  # what runs it, for its executor (run.json also keeps slurm_job_id: see update)
    # The SubmitTime (scontrol) of the job that made the run folder slurm-<job>, at its
    # first start: with the id it tells that job (and its requeues) from a later job
    # that got the same id. A requeue sets a new SubmitTime, so only the first start's counts.
    slurm_job_submitted: Optional[str] = None
    executor: Optional[str] = None  # local | slurm
    launcher: Optional[ProcessRef] = None  # the detached local supervisor
    hosts: list = field(default_factory=list)
    world_size: Optional[int] = None
    backend: Optional[str] = None
    amp: Optional[str] = None
    device: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    requeues: Optional[int] = None
    restarts: Optional[int] = None
    retries: Optional[int] = None  # restarts after a failure of the machine since the last submit or resume
    attempts: list = field(default_factory=list)  # Attempt: each session such a failure ended
    after: list = field(default_factory=list)  # the run folders this run waits for (submit --after)
    sessions: list = field(default_factory=list)  # Session: each start of the run's tasks (the report's cost)
    versions: Optional[dict] = None
    git_sha: Optional[str] = None  # of the submit folder
    submit_dir: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    stopped_at: Optional[str] = None  # a SIGTERM reached the entrypoint's rank 0
    cancel_requested_at: Optional[str] = None  # `clusterjob cancel` asked; cancelled once no rank is alive
    final: Optional[dict] = None  # the last epoch's metrics; your code's: each metric's latest value
    warnings: list = field(default_factory=list)  # what a finished run found wrong, one line each
    error: Optional[RunError] = None
    reason: Optional[Reason] = None  # why it ended so, where its status alone does not tell (clusterjob.core.runstate)
    entrypoint: Optional[dict] = None  # what ran, its resolved args, params, snapshot
    env: Optional[dict] = None  # the spec's env as its spec.yaml holds it: a secret's value is ***
    code_dir: Optional[str] = None  # the snapshot the code ran from
    snapshot_of: Optional[str] = None  # the folder the snapshot was taken of
    log_dir: Optional[str] = None  # submitit's folder of the job's logs
    # The loggers' own runs (logging: in the spec), so that a requeued, resumed or
    # restarted run continues the same one: set when the logger run is made.
    tensorboard_dir: Optional[str] = None  # the folder of its event files
    mlflow_tracking_uri: Optional[str] = None  # as resolved (a relative file: store made absolute)
    mlflow_experiment_id: Optional[str] = None
    mlflow_run_id: Optional[str] = None
    wandb_run_id: Optional[str] = None
    wandb_url: Optional[str] = None  # the run's page; None offline
    stalls: list = field(default_factory=list)  # Stall: each stall the health watchdog saw
    excluded_hosts: list = field(default_factory=list)  # hosts a retry after a stall keeps the Slurm job off
    straggler: Optional[Straggler] = None  # the rank the others waited for, last measured
    # A trial of a search (docs/design.md, "Search"): {"id": the search, "trial": its number, "slot": the
    # slot that runs it}; its folder's parent is the search's folder
    search: Optional[dict] = None
    # What its tasks run where that is not the runner, one per rank (clusterjob.launch.executor.Task.to_dict):
    # a search's slot, one per allocation
    task: Optional[dict] = None
    # The search stopped the trial at a rung (clusterjob.search.asha.Verdict.to_dict): the request that stops
    # its ranks, then the record of why it is pruned
    pruned: Optional[dict] = None

    def to_dict(self) -> dict:
        """Every field as run.json would hold it (for tables and views that want dicts)."""
        return {f.name: to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def slurm_job_id(self) -> Optional[str]:
        """The run's Slurm job (123, array task 123_4) when its job is Slurm's: what
        squeue, sacct, a raw template's run folder (slurm-<id>) and the report's
        slurm_job_id column name."""
        return self.job.id if self.job is not None and self.job.executor == SLURM else None


FIELDS = frozenset(f.name for f in dataclasses.fields(RunRecord))


def _known(fields: dict) -> None:
    """TypeError, as ``dataclasses.replace`` raises it, for a key that is no record field."""
    unknown = fields.keys() - FIELDS
    if unknown:
        raise TypeError(f"RunRecord has no field {sorted(unknown)[0]!r}")


def amended(record: RunRecord, **changes: Any) -> RunRecord:
    """``dataclasses.replace(record, **changes)`` without the generated ``__init__``,
    which sets 47 frozen fields one by one (13 µs): status gives each of 10,000 runs its
    job from its sweep's record through here. TypeError, as replace raises, for a key
    that is no field. The record holds nothing derived from its fields, so a copy of
    them is the whole record."""
    _known(changes)
    new = object.__new__(RunRecord)
    new.__dict__.update(record.__dict__, **changes)
    return new


def _whole(values: dict, **more: Any) -> RunRecord:
    """``RunRecord(**values, **more)`` where the two give every field (``checked``), made as
    ``amended`` makes a record: 9 µs less a run.json."""
    new = object.__new__(RunRecord)
    new.__dict__.update(values, **more)
    if new.__dict__.keys() != FIELDS:  # a field added to the record and not to ``checked``
        raise TypeError(f"RunRecord fields missing: {sorted(FIELDS - new.__dict__.keys())}")
    return new


def to_json(value: Any) -> Any:
    """A record value as JSON holds it (errors, process refs and attempts are records too)."""
    if isinstance(value, (RunError, ProcessRef, Attempt, Session, Job, Stall, Straggler)):
        return value.to_dict()
    if isinstance(value, list):
        return [to_json(item) for item in value]
    return value


def parse_time(text: Any) -> Optional[datetime]:
    """One of a run folder's times (ISO 8601) as a UTC datetime; the one parser of them, so
    that any two compare and subtract. clusterjob writes UTC with its offset; a time
    without one (a folder edited by hand, or merged from another tool) is taken as UTC
    too. None for anything else: absent, no text, unreadable, or out of datetime's range
    once in UTC (year 1 with a positive offset)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return found.replace(tzinfo=timezone.utc) if found.tzinfo is None else found.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        return None


def info_path(folder: "str | os.PathLike") -> str:
    """Where a run folder keeps its run.json."""
    return os.path.join(folder, INFO_FILE)


# ----------------------------------------------------------------------------- reading

_SALVAGE_STR = re.compile(
    r'"(run_id|name|status|slurm_job_id|started_at|finished_at|git_sha)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_SALVAGE_INT = re.compile(r'"(world_size|requeues)"\s*:\s*(\d{1,18})\b')
_SALVAGE_PARAMS = re.compile(r'"params"\s*:\s*(\{[^{}]*\})')


def _salvage(text: str) -> dict:
    """The fields that can still be read from a cut-off run.json."""
    raw: dict = {}
    for key, value in _SALVAGE_STR.findall(text):
        value = loads(f'"{value}"')
        if value is not NOT_JSON:  # a bad escape: the value is as lost as the rest
            raw.setdefault(key, value)
    for key, value in _SALVAGE_INT.findall(text):
        raw.setdefault(key, int(value))
    match = _SALVAGE_PARAMS.search(text)
    params = loads(match.group(1)) if match else NOT_JSON
    if isinstance(params, dict):
        raw["params"] = params
    return raw


def read_raw(path: "str | os.PathLike") -> tuple[dict, list[str]]:
    """(fields, problems) of a run.json as JSON holds it; never raises. A damaged file yields the fields
    that can still be read, and a problem saying what was wrong."""
    text, why = read_text(path, MAX_INFO_BYTES)
    if text is None and why == "is missing":  # a run its task has not made yet: its sweep's store says what it holds
        found = unmade.raw_record(os.path.dirname(os.fspath(path)))
        if found is not None:
            return found, []
    if text is None:
        suffix = "; status unknown" if why == "is missing" else "; ignored it, status unknown"
        return {}, [f"{INFO_FILE} {why}{suffix}"]
    raw = loads(text)
    if isinstance(raw, dict):
        return raw, []
    raw = _salvage(text)
    got = ", ".join(sorted(raw)) or "nothing"
    return raw, [f"{INFO_FILE} is cut off or not a JSON object (read: {got})"]



_TEXT_FIELDS = ("run_id", "name", "status", "executor", "backend", "amp", "device", "git_sha", "started_at",
                "finished_at", "master_addr", "log_dir", "submit_dir", "code_dir", "snapshot_of", "stopped_at",
                "cancel_requested_at", "slurm_job_submitted", "tensorboard_dir", "mlflow_tracking_uri",
                "mlflow_experiment_id", "mlflow_run_id", "wandb_run_id", "wandb_url")
_INT_FIELDS = ("world_size", "requeues", "restarts", "retries", "master_port")
_JOB_ID = re.compile(r"[0-9]{1,18}(?:[_+][0-9]{1,9})?")  # 123, array task 123_4, het job 123+1
_MAX_DEPTH = 16  # a swept value nested deeper is no sweep point
def _kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else type(value).__name__


def _bad(field: str, value: Any, wanted: str) -> str:
    return f"{INFO_FILE}: {field} is {shown(value)} ({_kind(value)}), not {wanted}; ignored"


_NUMBER_TYPES = frozenset((int, float))


def _text_field(raw: dict, key: str, problems: list) -> Optional[str]:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    problems.append(_bad(key, value, "text"))
    return None


def _int_field(raw: dict, key: str, problems: list) -> Optional[int]:
    value = raw.get(key)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if value is None or (whole and abs(value) < 2**53):
        return value
    problems.append(_bad(key, value, "a whole number below 2**53" if whole else "a whole number"))
    return None


def _numbers_field(raw: dict, key: str, problems: list) -> Optional[dict]:
    """A mapping of names to numbers (an attempt's old and new resources)."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, dict) and all(isinstance(k, str) and type(v) in _NUMBER_TYPES for k, v in value.items()):
        return dict(value)
    problems.append(_bad(key, value, "a mapping of names to numbers"))
    return None


def _job_field(raw: dict, problems: list) -> Optional[Job]:
    """The run's job: ``job`` (executor, id); else, as a run.json of an earlier version
    has it (or a cut-off one still shows it), ``slurm_job_id``: a Slurm job's id."""
    value = raw.get("job")
    if isinstance(value, dict) and type(value.get("executor")) is str and type(value.get("id")) is str:
        return Job(value["executor"], value["id"])
    if value is not None:
        problems.append(_bad("job", value, 'a job such as {"executor": "slurm", "id": "123_4"}'))
    old = _slurm_job_id(raw, problems)
    return Job(SLURM, old) if old is not None else None


def _slurm_job_id(raw: dict, problems: list) -> Optional[str]:
    value = raw.get("slurm_job_id")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    problems.append(_bad("slurm_job_id", value, "a Slurm job id such as 123 or 123_4"))
    return None


def is_job_id(text: Optional[str]) -> TypeGuard[str]:
    """A Slurm job id that can be handed to squeue/sacct: 123, array task 123_4, het job 123+1."""
    return text is not None and _JOB_ID.fullmatch(text) is not None  # the pattern matches no ""


def _depth(value: Any) -> int:
    """How deeply lists and mappings nest in ``value`` (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)) and depth < _MAX_DEPTH + 1:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _params_field(raw: dict, problems: list) -> Optional[dict]:
    value = _mapping_field(raw, "params", problems, "a mapping of swept keys")
    if value is None:
        return None
    deep = [key for key, v in value.items() if _depth(v) > _MAX_DEPTH]
    for key in deep:
        problems.append(f"{INFO_FILE}: params.{key} nests deeper than {_MAX_DEPTH} levels; ignored")
    return {k: v for k, v in value.items() if k not in deep} if deep else value


def _final_field(raw: dict, problems: list) -> Optional[dict]:
    """The last epoch's metrics: numbers only (null means not logged)."""
    value = _mapping_field(raw, "final", problems, "a mapping of metrics")
    if value is None:
        return None
    final = {key: v for key, v in value.items() if type(v) in _NUMBER_TYPES}  # bool is no number
    # float64-sized and finite: NaN or Infinity (tokens json reads) would rank a run best or nowhere
    final = {key: v for key, v in final.items() if (math.isfinite(v) if type(v) is float else -2**63 <= v < 2**63)}
    if len(final) < len(value):
        problems += [_bad(f"final.{key}", v, "a finite number") for key, v in value.items()
                     if v is not None and key not in final]
    return final


def _error_field(raw: dict, problems: list) -> Optional[RunError]:
    """The failure record: rank, message, traceback, at, host."""
    value = _mapping_field(raw, "error", problems, "a mapping (rank, message, traceback)")
    if value is None:
        return None
    inner: list = []
    error = RunError(_int_field(value, "rank", inner), *(_text_field(value, key, inner)
                                                        for key in ("message", "traceback", "at", "host")))
    problems += [p.replace(f"{INFO_FILE}: ", f"{INFO_FILE}: error.", 1) for p in inner]
    return error


def _launcher_field(raw: dict, problems: list) -> Optional[ProcessRef]:
    """The detached local supervisor: which process it is (clusterjob.core.procs)."""
    value = raw.get("launcher")
    if value is None:
        return None
    ref = ProcessRef.from_dict(value)
    if ref is None:
        problems.append(_bad("launcher", value, "a process record (host, boot_id, pid, start_ticks)"))
    return ref


def _attempts_field(raw: dict, problems: list) -> list:
    """The attempts a failure of the machine ended, each type-checked."""
    def attempt(item: dict, inner: list) -> Attempt:
        return Attempt(_text_field(item, "at", inner), _text_list_field(item, "hosts", inner, "a list of nodes"),
                       _text_field(item, "why", inner), _int_field(item, "retry", inner),
                       _text_field(item, "job", inner), _text_field(item, "kind", inner),
                       _numbers_field(item, "old", inner), _numbers_field(item, "new", inner))

    return _entries_field(raw, "attempts", problems, "a mapping (at, hosts, why, retry)", attempt)


def _sessions_field(raw: dict, problems: list) -> list:
    """Each start of the run's tasks, type-checked."""
    def session(item: dict, inner: list) -> Session:
        knows = item.get("knows_checkpoints")
        if knows is not None and type(knows) is not bool:
            inner.append(_bad("knows_checkpoints", knows, "true or false"))
            knows = None
        return Session(_text_field(item, "at", inner), _text_field(item, "job", inner),
                       _text_field(item, "checkpoint_at", inner), knows)

    return _entries_field(raw, "sessions", problems, "a mapping (at, job, checkpoint_at)", session)


def _stalls_field(raw: dict, problems: list) -> list:
    """The stalls the health watchdog recorded, each type-checked."""
    def stall(item: dict, inner: list) -> Stall:
        text = {key: _text_field(item, key, inner) for key in ("at", "since", "line", "host", "action", "ended_at")}
        return Stall(n=_int_field(item, "n", inner), rank=_int_field(item, "rank", inner), **text)

    return _entries_field(raw, "stalls", problems, "a mapping (n, at, since, line, rank, host, action)", stall)


def _straggler_field(raw: dict, problems: list) -> Optional[Straggler]:
    value = _mapping_field(raw, "straggler", problems, "a mapping (rank, host, wait_pct)")
    if value is None:
        return None
    inner: list = []
    pct = value.get("wait_pct")
    if pct is not None and (type(pct) not in _NUMBER_TYPES or not math.isfinite(pct)):
        inner.append(_bad("wait_pct", pct, "a finite number"))
        pct = None
    found = Straggler(_int_field(value, "rank", inner), _text_field(value, "host", inner), pct,
                      _text_field(value, "at", inner))
    problems += [p.replace(f"{INFO_FILE}: ", f"{INFO_FILE}: straggler.", 1) for p in inner]
    return found


def _entries_field(raw: dict, key: str, problems: list, wanted: str, parse: Any) -> list:
    """A list of records, each mapping parsed by ``parse(item, problems)``; entries that
    are no mapping are left out with a problem, and the problems name the entry."""
    found: list = []
    if raw.get(key) is None:  # most run.json files have none: no more work for them
        return found
    for index, item in enumerate(_list_field(raw, key, problems, f"a list of {key}")):
        if not isinstance(item, dict):
            problems.append(_bad(f"{key}[{index}]", item, wanted))
            continue
        inner: list = []
        found.append(parse(item, inner))
        problems += [p.replace(f"{INFO_FILE}: ", f"{INFO_FILE}: {key}[{index}].", 1) for p in inner]
    return found


def _list_field(raw: dict, key: str, problems: list, wanted: str) -> list:
    """The field when it is a list; [] when absent, or (a problem) of another kind."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(_bad(key, value, wanted))
        return []
    return value


def _text_list_field(raw: dict, key: str, problems: list, wanted: str) -> list:
    """A list of strings ([] when absent, or, with a problem, of another kind)."""
    value = _list_field(raw, key, problems, wanted)
    if all(isinstance(item, str) for item in value):
        return value
    problems.append(_bad(key, value, wanted))
    return []


def _mapping_field(raw: dict, key: str, problems: list, wanted: str = "a mapping") -> Optional[dict]:
    """The field when it is a mapping; None when absent, or (a problem) of another kind."""
    value = raw.get(key)
    if value is None or isinstance(value, dict):
        return value
    problems.append(_bad(key, value, wanted))
    return None


# The error of a run the health watchdog's verdict ended (clusterjob.health.stalls): what tells
# such a run in a run.json written before the record had its ``reason``.
STALLED_ERROR = "stalled: "


def _reason_field(raw: dict, problems: list, error: Optional[RunError]) -> Optional[Reason]:
    """Why the run ended so (clusterjob.core.runstate.REASONS); a run.json of an earlier
    version has no ``reason``: there a stall's failure is told by its error, here once."""
    if "reason" not in raw:
        return runstate.STALLED if error is not None and (error.message or "").startswith(STALLED_ERROR) else None
    value = raw["reason"]
    if value is None or value in runstate.REASONS:
        return value
    problems.append(_bad("reason", value, f"a reason ({', '.join(runstate.REASONS)})"))
    return None


def error_of(raw: Any) -> Optional[RunError]:
    """A rank's error file (logs/rankN.error.json) as a record, fields type-checked;
    None when it is no mapping."""
    return _error_field({"error": raw}, []) if isinstance(raw, dict) else None


def checked(raw: dict) -> tuple[RunRecord, list[str]]:
    """run.json's fields as a record, each type-checked: a field of the wrong type
    becomes None ([] for hosts and warnings) and a problem naming it. Keys the record
    does not know are left out; nothing here raises."""
    problems: list = []
    values = {key: raw.get(key) for key in _TEXT_FIELDS + _INT_FIELDS}
    for key in _TEXT_FIELDS:  # inline, absent fields first: a report checks 10,000 run.json files
        if values[key] is not None and type(values[key]) is not str:
            values[key] = _text_field(raw, key, problems)
    for key in _INT_FIELDS:
        value = values[key]
        if value is not None and (not isinstance(value, int) or type(value) is bool or abs(value) >= 2**53):
            values[key] = _int_field(raw, key, problems)
    return _whole(
        values, job=_job_field(raw, problems), params=_params_field(raw, problems),
        final=_final_field(raw, problems), error=(error := _error_field(raw, problems)),
        reason=_reason_field(raw, problems, error),
        hosts=_text_list_field(raw, "hosts", problems, "a list of node names"),
        warnings=_text_list_field(raw, "warnings", problems, "a list of lines of text"),
        after=_text_list_field(raw, "after", problems, "a list of run folders"),
        attempts=_attempts_field(raw, problems), sessions=_sessions_field(raw, problems),
        stalls=_stalls_field(raw, problems), straggler=_straggler_field(raw, problems),
        excluded_hosts=_text_list_field(raw, "excluded_hosts", problems, "a list of node names"),
        launcher=_launcher_field(raw, problems), versions=_mapping_field(raw, "versions", problems),
        entrypoint=_mapping_field(raw, "entrypoint", problems),
        env=_mapping_field(raw, "env", problems, "a mapping of variables"),
        search=_mapping_field(raw, "search", problems), pruned=_mapping_field(raw, "pruned", problems),
        task=_mapping_field(raw, "task", problems)), problems


@dataclass(frozen=True)
class Reading:
    """What reading one run.json gave: the record, the problems of the file itself
    (missing, cut off) and of its fields, and whether anything at all was read."""

    record: RunRecord
    file_problems: list
    field_problems: list
    empty: bool


def read(path: "str | os.PathLike") -> Reading:
    """The run.json at ``path`` read and checked; never raises."""
    raw, file_problems = read_raw(path)
    record, field_problems = checked(raw)
    return Reading(record, file_problems, field_problems, not raw)


def read_record(folder: "str | os.PathLike") -> tuple[RunRecord, list[str]]:
    """A run folder's record with every problem found; never raises."""
    reading = read(info_path(folder))
    return reading.record, reading.file_problems + reading.field_problems


# ----------------------------------------------------------------------------- writing


def create(folder: "str | os.PathLike", **fields: Any) -> None:
    """Write the run.json of a run folder being made, holding ``fields`` (record fields
    only), whole (readers find the run by this file: they see all of it or none). No
    lock: no other process writes a run whose run.json does not exist yet."""
    _known(fields)
    raw = {key: to_json(value) for key, value in fields.items()}
    if "job" in fields:
        raw["slurm_job_id"] = _slurm_id(fields["job"])
    publish(Path(info_path(folder)), json.dumps(raw, indent=2, default=str) + "\n")


def _slurm_id(job: Any) -> Optional[str]:
    """The copy of a job earlier versions read as ``slurm_job_id`` (docs/design.md, "Results layout")."""
    return job.id if isinstance(job, Job) and job.executor == SLURM else None


def materialize(folder: "str | os.PathLike") -> bool:
    """Make the run ``folder`` that its sweep left to its task (clusterjob.core.unmade)
    as submit would have, run.json last (True); False when it holds run.json already or
    is no such run. Any number of processes may make it at once (the ranks of its task,
    a cancel): each file is made once, whole, and none replaces another's."""
    path = info_path(folder)
    if os.path.lexists(path):
        return False
    raw = unmade.make_folder(folder)
    if raw is None:
        return False
    unmade.create_once(Path(path), json.dumps(raw, indent=2, default=str) + "\n")
    return True


def update(folder: "str | os.PathLike", move: Optional[runstate.Move] = None, reopen: bool = False,
           **fields: Any) -> RunRecord:
    """Set ``fields`` (record fields only: anything else raises TypeError) in a run
    folder's run.json, atomically, with the state ``move`` leads to (clusterjob.core.runstate);
    returns the new record. Only the given keys change on disk, and with ``job`` its
    Slurm id as ``slurm_job_id`` (null for another executor's job), the key earlier
    versions read. A cancelled (or pruned) run stays so, and so does a run a stall failed,
    but for the moves that start it again (``runstate.written``); a write of ``status``
    without a move follows the same table, ``reopen`` as the move of that name. Updates
    take turns (a lock file beside run.json): each reads what the one before wrote, so
    none undoes another's fields."""
    path = info_path(folder)
    materialize(folder)  # a run its task has not made yet: made here first
    with locked(Path(folder) / LOCK_FILE):
        raw, _ = read_raw(path)
        record, _ = checked(raw)
        _known(fields)
        if move is None and "error" in fields and "reason" in raw:
            fields = {"reason": None, **fields}  # the reason went with the error it explained (``_reason_field``)
        fields = runstate.written(record, fields, move, reopen)
        raw.update((key, to_json(value)) for key, value in fields.items())
        if "job" in fields:
            raw["slurm_job_id"] = _slurm_id(fields["job"])
        write_atomic(Path(path), json.dumps(raw, indent=2, default=str) + "\n")
    return checked(raw)[0]
