"""What a running task writes about its run into run.json: started, finished,
stopped (and whether to requeue), failed. Rank 0 writes, except each rank's own crash
report.

``stop_outcome`` is the requeue decision as a pure function; ``record_stop`` applies it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from clusterjob.core import env as envmod
from clusterjob.core import retry, slurmctl
from clusterjob.core.provenance import git_sha, versions
from clusterjob.core.record import Session
from clusterjob.core.rundir import RunDir, RunError, mark_failed, now_iso, record_error
from clusterjob.runner.checkpoint import list_checkpoints

TIMEOUT_MARGIN_S = 180  # a stop signal with less time left than this is the time limit's warning (sent 120 s before)


@dataclass(frozen=True)
class StopOutcome:
    """What a stopped run becomes: its status, whether its Slurm job is requeued, and
    the error recorded when the requeue cap is reached."""

    status: str        # "preempted", "timeout" or "failed"
    requeue: bool
    error: Optional[str] = None


def stop_outcome(signal: Optional[str], requeues: int, max_requeues: int, seconds_left: Optional[float],
                 in_slurm: bool = True) -> StopOutcome:
    """The decision after every rank checkpointed on a stop signal.

    ``signal``: "SIGUSR2", "SIGTERM", "cancel" or None (a debug stop); ``requeues``: how often the
    run was requeued already; ``seconds_left``: before the job's time limit (None:
    unknown or unlimited). Near the limit the stop is a timeout, else a preemption. USR2
    asks the run to requeue itself; after SIGTERM Slurm requeues or ends the job itself,
    and outside Slurm there is nothing to requeue.
    """
    if signal == "cancel":  # `clusterjob cancel`: stays cancelled, never requeued
        return StopOutcome("cancelled", requeue=False)
    near_limit = signal is not None and seconds_left is not None and seconds_left <= TIMEOUT_MARGIN_S
    status = "timeout" if near_limit else "preempted"
    if not in_slurm or signal == "SIGTERM":
        return StopOutcome(status, requeue=False)
    if requeues >= max_requeues:
        return StopOutcome("failed", requeue=False, error=(
            f"{status} {requeues + 1} times; resources.max_requeues={max_requeues} reached, not requeued. "
            "Fix: raise resources.max_requeues or resources.time_min, then `clusterjob resume RUN` "
            "continues from the last checkpoint"))
    return StopOutcome(status, requeue=True)


def outcome_now(signal: Optional[str], requeues: int, max_requeues: int) -> StopOutcome:
    """``stop_outcome`` with this job's facts: inside Slurm or not, the time left."""
    job = envmod.slurm_job()
    left = slurmctl.time_left_s(job.run_key) if job is not None and signal not in (None, "cancel") else None
    return stop_outcome(signal, requeues, max_requeues, left, in_slurm=job is not None)


def record_stop(run: RunDir, max_requeues: int, signal: Optional[str]) -> StopOutcome:
    """Rank 0, once every rank checkpointed: record why the run stopped, and requeue its
    Slurm job (the array task only) when the outcome says so."""
    job = envmod.slurm_job()
    requeues = run.read().requeues or 0
    outcome = outcome_now(signal, requeues, max_requeues)
    if outcome.status == "cancelled":
        _record_cancel(run, job is not None)
    elif outcome.error:
        run.update(status="failed", finished_at=now_iso(), error=RunError(None, outcome.error))
        print(f"stopped: {outcome.error}", flush=True)
    elif outcome.requeue:
        run.update(status=outcome.status, requeues=requeues + 1)
        assert job is not None  # only a Slurm job's run is told to requeue (stop_outcome)
        ok = slurmctl.requeue(job.run_key)
        print(f"{outcome.status}: {'requeued' if ok else 'could not requeue'} job {job.run_key}", flush=True)
    else:
        run.update(status=outcome.status)
        hint = "Slurm requeues or ends the job" if job else f"`clusterjob resume {run.path}` continues it"
        print(f"stopped ({outcome.status}); {hint}", flush=True)
    return outcome


def _record_cancel(run: RunDir, in_slurm: bool) -> None:
    """A cancelled run is marked cancelled once none of its ranks is alive: by the local
    supervisor or ``clusterjob cancel`` once they all exited, by status once Slurm's job
    left the queue. Only a run with neither (started by hand) is marked here, at its end."""
    if in_slurm or envmod.supervised():
        run.update(stopped_at=now_iso())
    else:
        run.update(status="cancelled", finished_at=now_iso())
    print("stopped (cancelled)", flush=True)


def mark_running(run: RunDir, env: envmod.DistEnv, facts: dict, own_code: bool = False) -> None:
    """Rank 0 at the start of every session of the run (first start, resume, requeue),
    recorded in ``sessions``. ``facts`` adds what the task knows of itself (backend, amp,
    device, entrypoint...); ``own_code``: the code is yours, not the built-in trainer."""
    info = run.read()
    job = envmod.slurm_job()
    session = new_session(run, job.run_key if job else None, own_code)
    # scontrol requeue too; the requeues of retries after a failure of the machine are counted apart
    requeues = max(info.requeues or 0, (job.restart_count - (info.retries or 0)) if job else 0)
    # A cancelled run is reopened only by `resume` (which makes it pending first): a cancel
    # that came while the ranks were starting, or a requeue of a cancelled job, stands, and
    # rank 0's watcher stops the ranks at their first progress line.
    run.update(reopen=info.status != "cancelled", status="running", requeues=requeues, hosts=list(env.hosts),
               world_size=env.world_size, master_addr=env.master_addr, master_port=env.master_port,
               slurm_job_id=job.run_key if job else info.slurm_job_id, versions=versions(),
               git_sha=info.git_sha or git_sha(), started_at=info.started_at or now_iso(),
               finished_at=None, error=None, sessions=[*info.sessions, session], **facts)


def new_session(run: RunDir, job: Optional[str], own_code: bool) -> Session:
    """This start of the run: now, in ``job``, resuming the newest checkpoint of the
    run's checkpoints/ (its time: when it was written). Your own code with none there
    may keep its checkpoints elsewhere: the work a stop cost it is unknown."""
    found = list_checkpoints(run.checkpoints)
    written, knows = None, not own_code
    if found:
        try:
            written = datetime.fromtimestamp(found[-1].stat().st_mtime, timezone.utc).isoformat(timespec="milliseconds")
            knows = True
        except OSError:  # gone while we looked: nothing known
            knows = False
    return Session(now_iso(), job, written, knows)


def after_requeue(run: RunDir, max_retries: int) -> str:
    """Rank 0 as a Slurm job starts again: a requeue that no stop of the run counted,
    after a session Slurm ended with NODE_FAIL (sacct), is a retry when retries are on
    (``resources.max_retries`` > 0): recorded as an attempt and counted in ``retries``.
    "failed" when none was left (the run is marked failed and does not start), else "go"."""
    job = envmod.slurm_job()
    if max_retries == 0 or job is None:
        return "go"
    info = run.read()
    if job.restart_count <= (info.requeues or 0) + (info.retries or 0):
        return "go"
    if slurmctl.previous_state(job.run_key) != "NODE_FAIL":
        return "go"  # a requeue by hand or a preemption: counted as a requeue (mark_running)
    why = f"node failure (Slurm ended job {job.run_key} with NODE_FAIL on {', '.join(info.hosts) or 'its nodes'})"
    number = retry.next_retry(info, max_retries)
    retry.record_attempt(run, why, number, job=job.run_key)
    if number is not None:
        print(f"{why}; retry {number} of {max_retries} from the last checkpoint", flush=True)
        return "go"
    run.update(status="failed", finished_at=now_iso(), error=RunError(None, (
        f"{why}; resources.max_retries={max_retries} reached. Fix: `clusterjob resume {run.path}` continues it "
        "from the last checkpoint")))
    return "failed"


def finish(run: RunDir, **fields: Any) -> None:
    info = run.update(status="completed", finished_at=now_iso(), **fields)
    print(f"completed {run.path}" + (f": {json.dumps(info.final)}" if info.final else ""), flush=True)


def on_failure(run: Optional[RunDir], rank: int, exc: BaseException) -> None:
    """Each rank reports its own crash; rank 0 also marks the run failed."""
    if run is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    record_error(run, rank, exc)
    if rank == 0:
        mark_failed(run, f"{type(exc).__name__}: {exc}")  # not over a stall's verdict (record.update)
