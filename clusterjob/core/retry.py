"""Retries after a failure that points at the machine (docs/design.md, "Failures"):
which failures those are, how long to wait, and run.json's record of each attempt.

A failure of the machine is a rank killed by a signal nobody in clusterjob sent (kill -9,
a node going away; not Slurm's "Out Of Memory", which would come back), a NCCL or gloo
communication error or timeout, or Slurm's NODE_FAIL. A Python error in the training
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

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core import runstate
from clusterjob.core.files import now_iso
from clusterjob.core.record import Attempt, RunError, RunRecord
from clusterjob.core.rundir import RunDir

MAX_BACKOFF_S = 3600.0  # no wait between two attempts is longer
BAD_INPUT_EXIT = 2  # a rank's exit status for bad input (clusterjob.run)

# What torch, NCCL and gloo say when the connection between ranks broke or timed out.
_COMMUNICATION = re.compile(
    r"DistBackendError|DistNetworkError|DistStoreError|ProcessGroupNCCL|ProcessGroupGloo|NCCL (?:error|WARN)"
    r"|nccl(?:System|Remote|Internal|Unhandled)Error|Watchdog caught collective operation timeout"
    r"|gloo/transport|Connection (?:closed|reset) by peer|Broken pipe|Socket Timeout|collective operation timeout")


def communication_error(error: RunError) -> bool:
    """Whether a rank's error is the connection between the ranks failing (its message,
    or the last line of its traceback: the exception a wrapper re-raised)."""
    last = (error.traceback or "").strip().splitlines()[-1:]
    return any(_COMMUNICATION.search(text or "") for text in (error.message, *last))


def machine_cause(killed: Optional[str], errors: Sequence[RunError], exit_codes: Sequence[int] = ()) -> Optional[str]:
    """Why a failed session points at the machine, or None when it does not. ``killed``
    names a rank killed by a signal nobody sent; ``errors`` are the ranks' own error
    records; ``exit_codes`` their exit statuses, where known. Any error that is not a
    communication error (a Python error in the code) or a rank that exited with bad
    input means the code or the spec failed, whatever else happened."""
    if BAD_INPUT_EXIT in exit_codes or not all(communication_error(e) for e in errors):
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
