"""The Slurm commands clusterjob runs (squeue, sacct, scontrol, sinfo, scancel), and the
one reader of what they answer.

Reading: every answer is read by name, never by position. A table (``sacct -P``,
``sacctmgr -P``, ``squeue``/``sinfo -o`` with ``|``) by its header line (``table``);
``scontrol show ... -o`` as ``Key=Value`` records (``records``); ``scontrol show config``
as ``Key = Value`` lines (``settings``). Every number goes through ``number``: ASCII
digits only, at most ``MOST``. A number that cannot be read is unknown (None), never 0
and never a crash: the report shows ``-``, the preflight a line from ``unreadable``.

Asking: none of the queries raises on a missing or unreachable Slurm. They tell a
failed query (None: no Slurm here, controller down, timed out) from an answer ({}:
none of these jobs is in the queue), so that callers never take an error for "the job
ended".
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Optional

from clusterjob.core import runstate
from clusterjob.core.errors import BadInput, SlurmUnreachable, brief, escape

TIMEOUT_S = 15
_IDS_PER_QUERY = 500  # jobs per squeue or sacct call: a command line of a few KiB, whatever the sweep
# squeue's answer for a single job id that has left the controller's memory (MinJobAge):
# an answer ("not in the queue"), not a failure, although squeue exits 1.
_GONE = "Invalid job id specified"
# Slurm keeps its counts and seconds in 32 bits and writes NO_VAL (0xfffffffe) and
# INFINITE (0xffffffff) as words; a number at or above them is garbage, and so is a
# longer digit run (int() of thousands of digits is slow or refused).
MOST = 0xFFFFFFFD
_DIGITS = re.compile(r"[0-9]{1,18}")
# The start of a field of ``scontrol show ... -o``: a word such as JobId=, CPUs/Task=,
# AllocNode:Sid= after a blank (a value may hold blanks: JobName=a b).
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")


class Unreadable(BadInput):
    """A Slurm command answered, but not with something that can be read (the message
    names the command, the field and what it said)."""


# ----------------------------------------------------------------------------- reading


def number(text: Optional[str], most: int = MOST) -> Optional[int]:
    """A whole number as Slurm writes it (ASCII digits; blanks around it allowed), at most
    ``most``; None for anything else: words (Unknown, N/A), other digits (², ٣), signs,
    fractions, a number past the bound, no text at all."""
    stripped = (text or "").strip(" \t")
    if not _DIGITS.fullmatch(stripped):
        return None
    value = int(stripped)
    return value if value <= most else None


def parse_duration(text: str) -> Optional[int]:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` / ``MM`` in seconds; None for anything else
    (UNLIMITED, INVALID, a part that is no number or is 60 or more after the first)."""
    days, dash, clock = text.strip().rpartition("-")
    parts = [number(part) for part in clock.split(":")]
    day_count = number(days) if dash else 0
    if len(parts) > 3 or day_count is None or None in parts or any(p >= 60 for p in parts[1:] if p is not None):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + (part or 0)
    return seconds + day_count * 86400


def table(text: str) -> list[dict[str, str]]:
    """The rows of a ``|``-separated answer whose first line names the columns, each as
    {column: value}. A row with more or fewer fields than the header (a value that held
    ``|``) is left out: its columns cannot be told apart."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    rows = (line.split("|") for line in lines[1:])
    return [dict(zip(header, values)) for values in rows if len(values) == len(header)]


def records(text: str) -> list[dict[str, str]]:
    """``scontrol show <thing> -o``: one record per line, each {key: value}. A value runs
    to the next ``Key=`` word, so it may hold blanks; a key found twice in a line (a value
    that held `` Key=`` text, such as a hostile job name) is left out (``_once``)."""
    found = []
    for line in text.splitlines():
        keys = list(_KEY.finditer(line))
        record = _once((here.group(1), line[here.end():after.start() if after else len(line)].strip())
                       for here, after in zip(keys, [*keys[1:], None]))
        if record:
            found.append(record)
    return found


def settings(text: str) -> dict[str, str]:
    """``scontrol show config``: its ``Key = Value`` lines as {key: value}; a key found
    twice is left out, as in ``records``."""
    pairs = (line.partition("=") for line in text.splitlines())
    return _once((key.strip(), value.strip()) for key, sep, value in pairs
                 if sep and key.strip() and not any(char.isspace() for char in key.strip()))


def _once(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """{key: value} of ``pairs`` without the keys found twice: which value is Slurm's own
    cannot be told."""
    found: dict[str, str] = {}
    twice = set()
    for key, value in pairs:
        if key in found:
            twice.add(key)
        found[key] = value
    return {key: value for key, value in found.items() if key not in twice}


def unreadable(command: str, field: str, text: Optional[str]) -> str:
    """The line that says a field of the cluster's answer could not be read."""
    said = f"no {field}" if text is None else f"{field}={brief(text)}"
    return f"the cluster's answer could not be read: `{command}` gave {said}"


def unanswered(command: str, done: Optional[object]) -> str:
    """The line that says a command did not answer, with what it said instead."""
    if done is None:
        return f"`{command}` did not answer (it could not run, or ran past {TIMEOUT_S} s)"
    said = escape(" ".join((getattr(done, "stderr", "") or "").split()))
    return f"`{command}` did not answer: " + (said[:300] if said else f"exit {getattr(done, 'returncode', '?')}")


# ----------------------------------------------------------------------------- asking


def _query(cmd: list[str], env: Optional[dict] = None, stdin: Optional[str] = None,
           timeout_s: float = 0) -> Optional[subprocess.CompletedProcess]:
    """The finished command, or None when it could not run or ran past TIMEOUT_S."""
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s or TIMEOUT_S,
                              stdin=None if stdin is not None else subprocess.DEVNULL, errors="replace", env=env)
    except (OSError, subprocess.SubprocessError):
        return None


def _run(cmd: list[str], env: Optional[dict] = None) -> Optional[str]:
    done = _query(cmd, env)
    return done.stdout if done is not None and done.returncode == 0 else None


def ask(cmd: list[str], stdin: Optional[str] = None) -> Optional[subprocess.CompletedProcess]:
    """A read-only Slurm command's result (any exit status), None when it could not run."""
    return _query(cmd, stdin=stdin)


class AskedAtOnce:
    """An ``ask`` (cmd, stdin=None) whose commands named in ``start`` run at once, each in
    a thread of its own, so that a caller with several independent questions (the
    preflight: partitions, config, queue, association, test-only) waits about as long
    as the slowest, not for their sum: each is a round trip to the controller, seconds
    on a busy one. A command asked that was started is answered from its run (once);
    any other runs then. Only for read-only commands: a started one that nobody asks
    has still run."""

    def __init__(self, asker: Callable[..., Optional[object]]) -> None:
        from concurrent.futures import ThreadPoolExecutor  # here: status and the other commands never need it

        self._ask = asker
        self._started: dict[tuple, Any] = {}  # (command, stdin) -> its Future
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="slurm-ask")

    def start(self, *commands: "list[str] | tuple[list[str], str]") -> "AskedAtOnce":
        """Run ``commands`` (a command, or (command, stdin)) now, in the background."""
        for command in commands:
            cmd, stdin = command if isinstance(command, tuple) else (command, None)
            key = (tuple(cmd), stdin)
            if key not in self._started:
                self._started[key] = self._pool.submit(self._call, list(cmd), stdin)
        return self

    def _call(self, cmd: list[str], stdin: Optional[str]) -> Optional[object]:
        return self._ask(cmd) if stdin is None else self._ask(cmd, stdin=stdin)

    def __call__(self, cmd: list[str], stdin: Optional[str] = None) -> Optional[object]:
        started = self._started.get((tuple(cmd), stdin))
        return started.result() if started is not None else self._call(cmd, stdin)

    def close(self) -> None:
        """Wait for what was started (read-only commands: nothing to undo) and end the threads."""
        self._pool.shutdown(wait=True)


def reachable(timeout_s: float = 10.0) -> bool:
    """True when ``sbatch`` exists and the controller answers ``sinfo``."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    done = _query(["sinfo", "-h", "-o", "%P"], timeout_s=timeout_s)
    return done is not None and done.returncode == 0


def requeue(job_id: str, hold: bool = False) -> bool:
    """Requeue one job or one array task (``123_4``), not the whole array; with ``hold``
    held until ``release`` (so that it is changed before it can start)."""
    return _run(["scontrol", "requeuehold" if hold else "requeue", job_id]) is not None


def exclude_nodes(job_id: str, nodes: list[str]) -> bool:
    """Keep a pending job off ``nodes`` (its ExcNodeList)."""
    return _run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"]) is not None


def release(job_id: str) -> bool:
    """Let a held job start."""
    return _run(["scontrol", "release", job_id]) is not None


def _job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` of one job (its first record); {} when it does not answer."""
    return next(iter(records(_run(["scontrol", "show", "job", "-o", job_id]) or "")), {})


def step_job_id(job_id: str) -> Optional[str]:
    """The id ``srun --jobid`` takes for ``job_id``: an array task's own job id (``123_4``
    is the job ``scontrol show job`` names by its JobId; srun refuses the array form),
    else the id itself; None when Slurm does not answer."""
    if "_" not in job_id:
        return job_id
    return _job(job_id).get("JobId") or None


def start_later(job_id: str, seconds: float) -> bool:
    """Hold a requeued (pending) job until ``seconds`` from now, unless Slurm holds it
    longer already (its own delay of a requeued job); False when that did not work."""
    try:
        held_s = (datetime.fromisoformat(_job(job_id).get("StartTime", "")) - datetime.now()).total_seconds()
    except ValueError:  # StartTime=Unknown, or not said
        held_s = 0.0
    if held_s >= seconds:
        return True
    return _run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{math.ceil(seconds)}"]) is not None


def submit_time(job_id: str) -> Optional[str]:
    """The job's SubmitTime as ``scontrol show job`` gives it (None when it does not
    answer). A requeue sets it anew; a later job that gets the same id has its own."""
    return _job(job_id).get("SubmitTime") or None


def previous_state(job_id: str) -> Optional[str]:
    """How the job's session before this one ended (sacct -D lists each session of a
    requeued job: REQUEUED, PREEMPTED, NODE_FAIL, ...); None without accounting or
    without an earlier session."""
    listed = (segments([job_id]) or {}).get(job_id, [])
    return listed[-2].state if len(listed) >= 2 else None


def cancel(*job_ids: str) -> bool:
    """scancel of jobs, whole arrays (``123``) or array tasks (``123_4``), in one call."""
    return _run(["scancel", *job_ids]) is not None


SBATCH_TIMEOUT_S = 120  # sbatch waits on a busy controller, and retries on its own


def submit(script: str) -> tuple[Optional[str], str]:
    """``sbatch --parsable`` of ``script`` (on stdin): (the job id, "") or (None, what
    sbatch said, for the refusal's one line)."""
    done = _query(["sbatch", "--parsable"], stdin=script, timeout_s=SBATCH_TIMEOUT_S)
    if done is None:
        return None, f"sbatch did not answer (it could not run, or ran past {SBATCH_TIMEOUT_S} s)"
    if done.returncode != 0:
        return None, done.stderr or done.stdout or f"exit {done.returncode}"
    found = _SUBMITTED.search(done.stdout)
    job = found.group(1) if found else ""
    return (job, "") if number(job) is not None else (None, f"sbatch answered {brief(done.stdout)}, not a job id")


# --parsable's ``123`` (``123;cluster``), or the ``Submitted batch job 123`` of an sbatch that ignores it (a wrapper)
_SUBMITTED = re.compile(r"(?:^|Submitted batch job )([0-9]{1,18})(?:;\S*)?\s*$", re.MULTILINE)


def _arrays(job_ids: list[str]) -> list[str]:
    """The jobs to ask for ``job_ids``: an array once for all its tasks (``123`` for
    ``123_4``), each once, in order."""
    return sorted({job.split("_")[0] for job in job_ids}, key=lambda job: (len(job), job))


def queue_states(job_ids: list[str]) -> Optional[dict[str, str]]:
    """State of jobs still in the queue, e.g. {"123_4": "RUNNING"}; jobs that left it are
    absent; None when squeue did not answer. An array is asked once for all its tasks,
    at most ``_IDS_PER_QUERY`` jobs a call."""
    found: dict[str, str] = {}
    asked = _arrays(job_ids)
    for first in range(0, len(asked), _IDS_PER_QUERY):
        done = _query(["squeue", "-r", "-o", "%i|%T", "-j", ",".join(asked[first:first + _IDS_PER_QUERY])])
        if done is None:
            return None
        if done.returncode != 0:
            if _GONE in done.stderr:
                continue
            return None
        found.update((row["JOBID"], row["STATE"]) for row in table(done.stdout) if row.get("JOBID") and "STATE" in row)
    return found


def queue_by_name(name: str) -> Optional[dict[str, str]]:
    """{job or array task: state} of the jobs named ``name`` in the queue (a submission's
    jobs are named after its sweep); None when squeue did not answer."""
    done = _query(["squeue", "-r", "-o", "%i|%T", "-n", name])
    if done is None or done.returncode != 0:
        return None
    return {row["JOBID"]: row["STATE"] for row in table(done.stdout) if row.get("JOBID") and "STATE" in row}


# sacct's row of an array's tasks that never started: 123_[5-999%256] or 123_[1,3,5-7]
_TASK_RANGE = re.compile(r"([0-9]{1,18})_\[([0-9,\-]+)(?:%[0-9]+)?\]")


def _tasks(job: str) -> list[str]:
    """The ids of one JobID of sacct: itself, or each task of a row of tasks that never
    started (at most 10**6: anything longer is no answer of Slurm's)."""
    found = _TASK_RANGE.fullmatch(job)
    if found is None:
        return [job]
    tasks: list[str] = []
    for piece in found.group(2).split(","):
        first, _, last = piece.partition("-")
        low, high = number(first), number(last or first)
        if low is None or high is None or high < low or len(tasks) + high - low >= 10**6:
            return []
        tasks += [f"{found.group(1)}_{task}" for task in range(low, high + 1)]
    return tasks


# Slurm's states of a job that ended (sacct's State, squeue -t all's %T), each with the
# state of a run whose job ended so without the run recording its own end: the one table
# of both (the Slurm executor's found ends, the preflight's count of jobs that ended). A
# job that completed without its run saying so lost its end: failed; any other state a
# job has in the queue (PENDING, RUNNING, REQUEUED, ...).
ENDED = {"COMPLETED": runstate.FAILED, "FAILED": runstate.FAILED, "NODE_FAIL": runstate.FAILED,
         "OUT_OF_MEMORY": runstate.FAILED, "BOOT_FAIL": runstate.FAILED, "REVOKED": runstate.FAILED,
         "DEADLINE": runstate.TIMEOUT, "TIMEOUT": runstate.TIMEOUT, "PREEMPTED": runstate.PREEMPTED,
         "CANCELLED": runstate.CANCELLED}


def accounting_states(job_ids: list[str]) -> Optional[dict[str, str]]:
    """Final states from sacct (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...); None when
    sacct did not answer (no accounting on this cluster, or unreachable). An array is
    asked once for all its tasks, at most ``_IDS_PER_QUERY`` jobs a call; the tasks sacct
    lists as one row (``123_[5-999]``: cancelled before they started) each get its state."""
    found: dict[str, str] = {}
    asked = _arrays(job_ids)
    for first in range(0, len(asked), _IDS_PER_QUERY):
        out = _run(["sacct", "-X", "-P", "-o", "JobID,State", "-j", ",".join(asked[first:first + _IDS_PER_QUERY])])
        if out is None:
            return None
        for row in table(out):
            state = _state(row.get("State"))
            found.update((task, state) for task in _tasks(row.get("JobID") or ""))
    found.pop("", None)
    return found


def _state(text: Optional[str]) -> str:
    """A job state without sacct's words after it: "CANCELLED by 0" -> CANCELLED."""
    return (text or "").split(" ", 1)[0]


def time_left_s(job_id: str) -> Optional[int]:
    """Seconds before the job's time limit, from squeue (None if unknown or unlimited)."""
    rows = table(_run(["squeue", "-o", "%L", "-j", job_id]) or "")
    return parse_duration(rows[0].get("TIME_LEFT", "")) if rows else None


CONFIG = ["scontrol", "show", "config"]


def max_array_size(asker: Optional[Callable[..., Optional[object]]] = None) -> int:
    """The cluster's MaxArraySize (array indices run 0 .. MaxArraySize-1; 0: job arrays
    are off). SlurmUnreachable when ``scontrol show config`` does not answer, Unreadable
    when its MaxArraySize cannot be read: the split of a sweep is never a guess."""
    return config_number("MaxArraySize", asker)


def config_number(key: str, asker: Optional[Callable[..., Optional[object]]] = None) -> int:
    """A number of ``scontrol show config`` (MaxArraySize, MaxJobCount): SlurmUnreachable
    when it does not answer, Unreadable when the number cannot be read."""
    text = config(asker).get(key)
    found = number(text)
    if found is None:
        raise Unreadable(unreadable("scontrol show config", key, text))
    return found


def config(asker: Optional[Callable[..., Optional[object]]] = None) -> dict[str, str]:
    """``scontrol show config`` as {key: value}; SlurmUnreachable when it does not answer."""
    done = (asker or ask)(CONFIG)
    if done is None or getattr(done, "returncode", 1) != 0:
        raise SlurmUnreachable(unanswered("scontrol show config", done))
    return settings(getattr(done, "stdout", "") or "")


# ----------------------------------------------------------------------------- sessions (sacct -D)


@dataclass(frozen=True)
class Segment:
    """One session of a job as sacct -D lists it (a requeued job has one per start): its
    state, when it was (re)submitted, started and ended (Unix seconds; None: not yet),
    seconds it ran, and the CPUs and GPUs it held (None: AllocTRES is empty, as for a
    session that never started)."""

    job: str
    state: str
    submit: Optional[int]
    start: Optional[int]
    end: Optional[int]
    elapsed_s: int
    cpus: Optional[int]
    gpus: Optional[int]


_SEGMENT_FIELDS = "JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES"
_NOT_YET = ("Unknown", "None", "")  # sacct's times of a session that has not started or ended


def segments(job_ids: list[str]) -> Optional[dict[str, list[Segment]]]:
    """{job id: its sessions, oldest first} from sacct (every requeued session, -D); a
    job sacct does not know, or whose answer cannot be read, is absent; None when sacct
    did not answer (no accounting on this cluster, or unreachable). An array is asked
    once for all its tasks. Times are asked as Unix seconds (SLURM_TIME_FORMAT), so no
    time zone is guessed."""
    wanted = set(job_ids)
    asked = sorted({job.split("_")[0] for job in wanted})
    found: dict[str, list[Segment]] = {}
    unread = set()
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    for first in range(0, len(asked), _IDS_PER_QUERY):
        chunk = ",".join(asked[first:first + _IDS_PER_QUERY])
        out = _run(["sacct", "-D", "-X", "-P", "-o", _SEGMENT_FIELDS, "-j", chunk], env)
        if out is None:
            return None
        for row in table(out):
            segment = _segment(row) if row.get("JobID") in wanted else None
            if segment is not None:
                found.setdefault(segment.job, []).append(segment)
            elif row.get("JobID") in wanted:
                unread.add(row["JobID"])
    return {job: sorted(listed, key=lambda seg: seg.submit or 0) for job, listed in found.items() if job not in unread}


def _segment(row: dict[str, str]) -> Optional[Segment]:
    """One row of ``segments``' sacct query; None when a field of it cannot be read."""
    elapsed, times, held = number(row.get("ElapsedRaw")), _times(row), _held(row.get("AllocTRES"))
    if elapsed is None or times is None or held is None:
        return None
    return Segment(row["JobID"], _state(row.get("State")), *times, elapsed, *held)


def _times(row: dict[str, str]) -> Optional[tuple[Optional[int], Optional[int], Optional[int]]]:
    """Submit, Start and End in Unix seconds (None: not yet); None when one cannot be read."""
    texts = [row.get(key) for key in ("Submit", "Start", "End")]
    values = [None if text in _NOT_YET else number(text) for text in texts]
    if any(value is None and text not in _NOT_YET for value, text in zip(values, texts)):
        return None
    return values[0], values[1], values[2]


def _held(text: Optional[str]) -> Optional[tuple[Optional[int], Optional[int]]]:
    """(CPUs, GPUs) of an AllocTRES such as ``billing=8,cpu=4,gres/gpu=2,mem=8G``: no
    ``gres/gpu`` is no GPU; empty is (None, None), not said; None when it cannot be read."""
    if text is None:
        return None
    if not text.strip():
        return None, None
    tres = dict(item.partition("=")[::2] for item in text.split(","))
    cpus = number(tres.get("cpu"))
    gpus = number(tres["gres/gpu"]) if "gres/gpu" in tres else 0
    return None if cpus is None or gpus is None else (cpus, gpus)


_RSS_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def rss_bytes(text: Optional[str]) -> Optional[int]:
    """sacct's MaxRSS ("642404K", "1.50G", "0") in bytes; None for none or unreadable."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", (text or "").strip())
    return int(float(found[1]) * _RSS_UNITS[found[2]]) if found else None


def peaks(job_ids: list[str]) -> Optional[dict[str, tuple[Optional[int], int]]]:
    """{job: (the most memory a task of it used, sacct's MaxRSS over its steps, in bytes;
    the seconds it ran)} of each job sacct knows (its latest session); None when sacct did
    not answer (no accounting, or unreachable)."""
    wanted = set(job_ids)
    found: dict[str, tuple[Optional[int], int]] = {}
    for first in range(0, len(job_ids), _IDS_PER_QUERY):
        chunk = ",".join(job_ids[first:first + _IDS_PER_QUERY])
        out = _run(["sacct", "-P", "-o", "JobID,MaxRSS,ElapsedRaw", "-j", chunk])
        if out is None:
            return None
        for row in table(out):
            job = (row.get("JobID") or "").split(".")[0]
            if job not in wanted:
                continue
            rss, ran = found.get(job, (None, 0))
            said = rss_bytes(row.get("MaxRSS"))
            most = max(rss, said) if rss is not None and said is not None else rss if said is None else said
            found[job] = (most, max(ran, number(row.get("ElapsedRaw")) or 0))
    return found
