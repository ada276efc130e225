"""Retries after a failure that points at the machine (docs/design.md, "Failures"):
which failures those are, how long to wait, and run.json's record of each attempt.

A failure of the machine is a rank killed by a signal nobody in clusterjob sent (kill -9,
a node going away; not Slurm's "Out Of Memory", which would come back), a NCCL or gloo
communication error or timeout, a node's GPU or driver failing (an ECC error, a lost
device), or Slurm's NODE_FAIL. A Python error in the training
code is not, and neither is bad input (exit 2): retrying would fail the same way. Up to
``resources.max_retries`` such failures restart the run from its last checkpoint, the
first after ``resources.retry_backoff_s`` and each further one after twice the wait
before, counted in ``retries``, apart from preemption's ``requeues``. Stdlib only: the
local supervisor, Slurm's teardown line and the runner all use it.

``decide`` is the one decision after such a failure (the attempt recorded, its number,
the wait, the line that says it); each caller keeps only its own action: the local
supervisor pauses, the Slurm job script requeues and holds its job, the runner that
starts after Slurm's NODE_FAIL waits out what Slurm's own hold did not cover.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core import runstate
from clusterjob.core.files import now_iso
from clusterjob.core.record import Attempt, RunError, RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.core.units import slurm_mem, slurm_time

MAX_BACKOFF_S = 3600.0  # no wait between two attempts is longer
BAD_INPUT_EXIT = 2  # a rank's exit status for bad input (clusterjob.run)

# What torch, NCCL and gloo say when the connection between ranks broke or timed out.
_COMMUNICATION = re.compile(
    r"DistBackendError|DistNetworkError|DistStoreError|ProcessGroupNCCL|ProcessGroupGloo|NCCL (?:error|WARN)"
    r"|nccl(?:System|Remote|Internal|Unhandled)Error|Watchdog caught collective operation timeout"
    r"|gloo/transport|Connection (?:closed|reset) by peer|Broken pipe|Socket Timeout|collective operation timeout")


# What CUDA, NVML and the driver say when the node's GPU or driver is broken, not the code:
# the same code on another node runs (a retry goes elsewhere; the node is listed as bad).
_NODE_FAULT = re.compile(
    r"uncorrectable ECC error|ECCUncorrectable|CUDA-capable device\(s\) \S+ busy or unavailable"
    r"|cudaErrorDevicesUnavailable|no CUDA-capable device is detected|CUDA driver initialization failed"
    r"|GPU is lost|fallen off the bus|Driver/library version mismatch|CUDA error: unknown error"
    r"|NVML_ERROR_GPU_IS_LOST|\bXid\b")


_NCCL = re.compile(r"NCCL|nccl")


def _says(error: RunError, pattern: "re.Pattern[str]") -> bool:
    """Whether a rank's error matches ``pattern``: its message, or the last line of its
    traceback (the exception a wrapper re-raised)."""
    last = (error.traceback or "").strip().splitlines()[-1:]
    return any(pattern.search(text or "") for text in (error.message, *last))


def communication_error(error: RunError) -> bool:
    """Whether a rank's error is the connection between the ranks failing."""
    return _says(error, _COMMUNICATION)


def node_fault(error: RunError) -> bool:
    """Whether a rank's error is its node's GPU or driver failing (ECC, a lost GPU, a
    busy or missing device, a driver mismatch)."""
    return _says(error, _NODE_FAULT)


def nccl_hosts(errors: Sequence[RunError]) -> list[str]:
    """The nodes whose ranks' errors are NCCL's, in order (suspects: every rank of a broken
    collective raises one, the sick node's among them)."""
    return list(dict.fromkeys(e.host for e in errors if e.host and _says(e, _NCCL)))


def faulty_hosts(errors: Sequence[RunError]) -> list[str]:
    """The nodes whose ranks' errors say the node failed them (``node_fault``), in order."""
    return list(dict.fromkeys(e.host for e in errors if e.host and node_fault(e)))


def machine_cause(killed: Optional[str], errors: Sequence[RunError], exit_codes: Sequence[int] = ()) -> Optional[str]:
    """Why a failed session points at the machine, or None when it does not. ``killed``
    names a rank killed by a signal nobody sent; ``errors`` are the ranks' own error
    records; ``exit_codes`` their exit statuses, where known. Any error that is neither a
    communication error nor a node's fault (a Python error in the code) or a rank that
    exited with bad input means the code or the spec failed, whatever else happened."""
    if BAD_INPUT_EXIT in exit_codes or not all(communication_error(e) or node_fault(e) for e in errors):
        return None
    if killed is not None:
        return killed
    if errors:
        first = min(errors, key=lambda e: e.at or "")
        return f"rank {first.rank}: {first.message}"
    return None


def next_retry(info: RunRecord, max_retries: int) -> Optional[int]:
    """The number of the retry a failure of the machine leads to, None when none is left."""
    done = info.retries or 0
    return done + 1 if done < max_retries else None


def backoff_s(first_s: float, number: int) -> float:
    """The wait before retry ``number`` (1, 2, ...): ``first_s``, doubled for each further one."""
    return min(MAX_BACKOFF_S, first_s * 2 ** (number - 1))


@dataclass(frozen=True)
class Decision:
    """What follows a failure of the machine, once ``decide`` recorded it in run.json
    (``record``): retry ``number`` after ``wait_s``, or none left (``number`` None: the
    run stays failed); ``line`` says which, after the cause."""

    number: Optional[int]
    wait_s: float
    line: str
    record: RunRecord


def decide(run: RunDir, cause: str, max_retries: int, first_backoff_s: float, job: Optional[str] = None,
           hosts: Optional[list] = None) -> Optional[Decision]:
    """The decision after a failure of the machine (``cause``, in words): None when
    retries are off (``max_retries`` 0: the failure stands, nothing is recorded); else
    the attempt is recorded (``record_attempt``: with a retry left the run is reopened)
    and the decision returned."""
    if max_retries == 0:
        return None
    number = next_retry(run.read(), max_retries)
    record = record_attempt(run, cause, number, job, hosts)
    if number is None:
        return Decision(None, 0.0, f"{cause}; resources.max_retries={max_retries} reached", record)
    wait_s = backoff_s(first_backoff_s, number)
    return Decision(number, wait_s, f"{cause}; retry {number} of {max_retries} from the last checkpoint in "
                                    f"{wait_s:g} s", record)


def record_attempt(run: RunDir, why: str, retry: Optional[int], job: Optional[str] = None,
                   hosts: Optional[list] = None) -> RunRecord:
    """Add the attempt that ``why`` ended to run.json (on the hosts it recorded), and
    with a ``retry`` left reopen the run for it: pending, no error, ``retries`` counted.
    The ranks' error files of the attempt move to ``logs/attempt-N/``, so the next
    session's errors are its own."""
    info = run.read()
    attempt = Attempt(now_iso(), list(info.hosts if hosts is None else hosts), why, retry, job or info.slurm_job_id)
    if retry is None:
        return run.update(attempts=[*info.attempts, attempt])
    _keep_errors(run, len(info.attempts) + 1)
    return run.update(runstate.retry(), attempts=[*info.attempts, attempt], retries=retry)


def _keep_errors(run: RunDir, number: int) -> None:
    files = sorted(run.logs.glob("rank*.error.json"))
    if not files:
        return
    kept = run.logs / f"attempt-{number}"
    kept.mkdir(exist_ok=True)
    for path in files:
        shutil.move(str(path), str(Path(kept) / path.name))


# ----------------------------------------------------------------------------- more resources

# Why a run is submitted again with more (docs/design.md, "Resubmit with more memory or time"):
# unlike a failure of the machine, the same request would end the same way.
OOM, TIMEOUT, GPU_OOM = "OOM", "TIMEOUT", "GPU OOM"
# What an out-of-memory kill leaves in the job's log: Slurm's cgroup (Out Of Memory), its
# accounting poller (JobAcctGatherParams=OverMemoryKill), the kernel's OOM killer.
MEMORY_KILL = re.compile(r"Out Of Memory|exceeded (?:job |step )?memory limit|oom[-_ ]kill", re.IGNORECASE)
GPU_MEMORY = re.compile(r"OutOfMemoryError|CUDA out of memory|HIP out of memory|CUDA error: out of memory"
                        r"|Cuda failure \d* ?'out of memory'|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED")
# A rank's own error when the host's memory ran out without a kill (an address-space limit,
# no overcommit): Python's MemoryError, torch's CPU allocator, C++'s bad_alloc, errno 12;
# and a DataLoader worker the kernel's OOM killer ended (the rank only sees it gone).
HOST_MEMORY = re.compile(
    r"(?<![A-Za-z])MemoryError\b|_ArrayMemoryError\b|DefaultCPUAllocator: can't allocate memory|std::bad_alloc"
    r"|\[Errno 12\] Cannot allocate memory|DataLoader worker \(pid\(?s?\)? [\d, ]+\) is killed by signal: Killed")
# slurmstepd's line when the OOM killer ended a process of the step, whichever (a worker, a
# subprocess), also where the task itself then exited with an error of its own.
STEP_OOM = re.compile(r"Detected \d+ oom[-_ ]kill events?", re.IGNORECASE)


def out_of_memory(errors: Sequence[RunError], log: str) -> Optional[tuple[str, str]]:
    """(kind, cause) of a session that ran out of GPU memory (GPU_OOM) or host memory
    (OOM) by the ranks' errors or the job's log (``log``), else None. A kill of the rank
    itself is its launcher's report (the caller's)."""
    for kind, pattern, what in ((GPU_OOM, GPU_MEMORY, "out of GPU memory"), (OOM, HOST_MEMORY, "out of memory")):
        found = next((e for e in errors if _says(e, pattern)), None)
        if found is not None:
            return kind, f"rank {found.rank}: {what}"
    if STEP_OOM.search(log):
        return OOM, "a process of the step was killed out of memory"
    return None


@dataclass(frozen=True)
class Policy:
    """A spec's rule for one kind of escalation: its key in the spec (``name``:
    resources.on_oom), how often, and per resource (mem_gb, time_min) or spec key
    (train.batch_size) the factor it is grown by and the ceiling (value, as written)."""

    kind: str
    name: str
    retry: int
    factors: dict
    ceilings: dict
    whole: tuple = ()  # keys whose grown value is rounded up to a whole number (Slurm's minutes)


@dataclass(frozen=True)
class Escalation:
    """What follows a run that outgrew its request, once ``escalate`` recorded it: the
    values it had (``old``) and gets (``new``; None: none left, the run stays as it
    ended), and the line that says which."""

    kind: str
    old: dict
    new: Optional[dict]
    line: str
    record: RunRecord


def current(info: RunRecord, key: str, default: float) -> float:
    """The value ``key`` (mem_gb, time_min, a spec key) has now: the last escalation's, else ``default``."""
    for attempt in reversed(info.attempts):
        if attempt.new and key in attempt.new:
            return attempt.new[key]
    return default


def escalations(info: RunRecord, kind: Optional[str] = None) -> list:
    """The attempts that submitted the run again with more (of ``kind``, or of any)."""
    return [a for a in info.attempts if a.kind is not None and a.new and (kind is None or a.kind == kind)]


def grown(old: float, factor: float, ceiling: Optional[float], whole: bool = False) -> Optional[float]:
    """``old`` times ``factor``, at most ``ceiling`` (rounded up where ``whole``; a
    divisor's result at least 1, whole where ``old`` is); None once nothing is left to
    grow (or shrink)."""
    new = math.ceil(old * factor) if whole else old * factor
    if isinstance(old, int) and factor < 1:
        new = max(1, int(new))
    if ceiling is not None and factor > 1:
        new = min(new, ceiling)
    return None if new == old or (factor > 1 and new < old) else new


def escalate(run: RunDir, policy: Policy, cause: str, start: dict, job: Optional[str] = None) -> Escalation:
    """The decision on a run that ended for want of resources (``cause``, in words): the
    values it has now (``start``: the spec's, grown by earlier escalations) times the
    policy's factors, up to its ceilings and retries. Recorded in run.json as an attempt
    with the old and new values; with more to give the run is reopened (pending, as a
    retry) for its new job, else failed with the line that says why not."""
    info = run.read()
    old = {key: current(info, key, start[key]) for key in policy.factors}
    number = len(escalations(info, policy.kind)) + 1
    new: Optional[dict] = None
    if number > policy.retry:
        line = f"{cause}; {policy.name}.retry={policy.retry} reached, not submitted again"
    else:
        grows = {key: grown(old[key], factor, policy.ceilings.get(key, (None, ""))[0], key in policy.whole)
                 for key, factor in policy.factors.items()}
        stuck = [key for key, value in grows.items() if value is None]
        if stuck:
            written = policy.ceilings.get(stuck[0], (None, ""))[1]
            line = (f"{cause}; {stuck[0]} is at {policy.name}'s limit ({written or described(stuck[0], old[stuck[0]])})"
                    f", not submitted again. Fix: raise it, or make the run need less")
        else:
            new = {key: value for key, value in grows.items() if value is not None}
            line = f"{cause}; submitted again ({number} of {policy.retry}) with {changes(old, new)}"
    attempt = Attempt(now_iso(), list(info.hosts), cause, number if new else None, job or info.slurm_job_id,
                      policy.kind, old, new)
    if new is None:  # failed with the line, in the same write as the attempt (a reader sees both or neither)
        return Escalation(policy.kind, old, None, line,
                          run.update(runstate.fail(RunError(None, line)), attempts=[*info.attempts, attempt]))
    _keep_errors(run, len(info.attempts) + 1)
    return Escalation(policy.kind, old, new, line,
                      run.update(runstate.retry(), attempts=[*info.attempts, attempt]))


def described(key: str, value: float) -> str:
    """A value as ``status`` shows it: memory as Slurm writes it, a time limit, a key's value."""
    if key == "mem_gb":
        return slurm_mem(value)
    if key == "time_min":
        return slurm_time(value)
    return f"{value:g}"


_WORDS = {"mem_gb": "mem", "time_min": "time"}


def changes(old: dict, new: dict) -> str:
    """"mem 32G -> 64G": each value that changed."""
    return ", ".join(f"{_WORDS.get(key, key)} {described(key, old[key])} -> {described(key, new[key])}"
                     for key in new)


def escalated_line(info: RunRecord) -> str:
    """``status``'s word on a run given more: "retried (OOM) 2x: mem 32G -> 64G -> 128G"."""
    done = escalations(info)
    if not done:
        return ""
    kinds = list(dict.fromkeys(a.kind for a in done))
    keys = list(dict.fromkeys(key for a in done for key in a.new))
    chains = []
    for key in keys:
        steps = [a for a in done if key in a.new]
        values = [steps[0].old.get(key, steps[0].new[key]), *(a.new[key] for a in steps)]
        chains.append(f"{_WORDS.get(key, key)} " + " -> ".join(described(key, v) for v in values))
    return f"retried ({', '.join(kinds)}) {len(done)}x: {'; '.join(chains)}"


def resubmits_timeout(run: RunDir, on_timeout: bool) -> bool:
    """Whether the time limit's stop of ``run`` submits it again with more time (its
    spec's ``resources.on_timeout`` set, ``on_timeout``) rather than requeuing it as it
    is: only with no checkpoint in its checkpoints/ to go on from, where a requeue would
    start over and time out the same way. The runner asks it before it requeues, the job
    script's end after."""
    try:
        saved = any(path.is_file() for path in run.checkpoints.iterdir())
    except OSError:
        saved = False
    return on_timeout and not saved
