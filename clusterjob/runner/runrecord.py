"""What a running task writes about its run into run.json: started, finished,
stopped (and whether to requeue), failed. Rank 0 writes, except each rank's own crash
report.

``stop_outcome`` is the requeue decision as a pure function; ``record_stop`` applies it.
What the executor does (its job, the requeue, the time left, how its job's previous
session ended) is asked of its task side (clusterjob.taskenv.environment), never of the
executor by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Optional

from clusterjob.core import procs, retry, runstate, units
from clusterjob.core.files import is_number, now_iso
from clusterjob.core.provenance import git_sha, versions
from clusterjob.core.ranks import DistEnv
from clusterjob.core.record import RunError, RunRecord, Session
from clusterjob.core.rundir import RunDir, mark_failed, rank_errors, record_error
from clusterjob.health import badnodes
from clusterjob.runner.checkpoint import list_checkpoints
from clusterjob.runner.preempt import PRUNE
from clusterjob.taskenv import environment as taskenv

if TYPE_CHECKING:
    from clusterjob.spec.schema import Spec

HOLD_POLL_S = 0.5  # how often a rank waiting out a back-off looks for a stop signal
TIMEOUT_MARGIN_S = 180  # a stop signal with less time left than this is the time limit's warning (sent 120 s before)


@dataclass(frozen=True)
class StopOutcome:
    """What a stopped run becomes: its status, whether its job is requeued, and the
    error recorded when the requeue cap is reached."""

    status: str        # runstate's PREEMPTED, TIMEOUT, FAILED, CANCELLED or PRUNED
    requeue: bool
    error: Optional[str] = None


def stop_outcome(signal: Optional[str], requeues: int, max_requeues: int, seconds_left: Optional[float],
                 can_requeue: bool = True) -> StopOutcome:
    """The decision after every rank checkpointed on a stop signal.

    ``signal``: "SIGUSR2", "SIGTERM", "SIGINT", "cancel" or None (a debug stop); ``requeues``:
    how often the run was requeued already; ``seconds_left``: before the job's time limit
    (None: unknown or unlimited). Near the limit the stop is a timeout, else a preemption.
    USR2 asks the run to requeue itself; after SIGTERM the executor requeues or ends the
    job itself, and where it cannot requeue (``can_requeue``: no job) nothing requeues.
    """
    if signal in ("cancel", "SIGINT"):  # `clusterjob cancel`, Ctrl-C: the user's stop, never requeued
        return StopOutcome(runstate.CANCELLED, requeue=False)
    near_limit = signal is not None and seconds_left is not None and seconds_left <= TIMEOUT_MARGIN_S
    status = runstate.TIMEOUT if near_limit else runstate.PREEMPTED
    if not can_requeue or signal == "SIGTERM":
        return StopOutcome(status, requeue=False)
    if requeues >= max_requeues:
        return StopOutcome(runstate.FAILED, requeue=False, error=(
            f"{status} {requeues + 1} times; resources.max_requeues={max_requeues} reached, not requeued. "
            "Fix: raise resources.max_requeues or resources.time_min, then `clusterjob resume RUN` "
            "continues from the last checkpoint"))
    return StopOutcome(status, requeue=True)


def outcome_now(signal: Optional[str], requeues: int, spec: Spec) -> StopOutcome:
    """``stop_outcome`` with this job's facts, as its executor's task side gives them:
    whether it can requeue, how often it may, the time left."""
    env = taskenv.current()
    left = env.time_left_s() if signal not in (None, "cancel") else None
    return stop_outcome(signal, requeues, env.max_requeues(spec), left, can_requeue=env.can_requeue())


def record_stop(run: RunDir, spec: Spec, signal: Optional[str]) -> StopOutcome:
    """Rank 0, once every rank checkpointed: record why the run stopped, and requeue its
    job (an array's task only) when the outcome says so. The line it prints names the
    state the run ends in, as status does."""
    env = taskenv.current()
    job = env.job()
    info = run.read()
    if signal == PRUNE or (info.pruned is not None and info.cancel_requested_at is None):
        return _record_pruned(run, info)
    if signal in ("SIGTERM", "SIGINT") and job is None and _supervisor_alive(info):
        return _stopped_by_supervisor(run, info)
    cancelled = signal == "cancel" or info.cancel_requested_at is not None  # cancel asks before its SIGTERM
    outcome = outcome_now("cancel" if cancelled else signal, info.requeues or 0, spec)
    if outcome.status == runstate.CANCELLED:
        _record_cancel(run, job is not None)
    elif outcome.error:
        run.update(runstate.fail(RunError(None, outcome.error)))
        print(f"stopped: {outcome.error}", flush=True)
    elif outcome.requeue and outcome.status == runstate.TIMEOUT and \
            retry.resubmits_timeout(run, spec.resources.on_timeout is not None):
        run.update(runstate.stop(outcome.status))  # a requeue would start over and time out the same way
        print(f"stopped ({outcome.status}) with no checkpoint: its job's end submits it again with more time "
              "(resources.on_timeout)", flush=True)
    elif outcome.requeue:
        run.update(runstate.requeue(outcome.status), requeues=(info.requeues or 0) + 1)
        assert job is not None  # only a job that can be requeued is told to (stop_outcome)
        ok = env.requeue()
        print(f"{outcome.status}: {'requeued' if ok else 'could not requeue'} job {job.id}", flush=True)
    else:
        run.update(runstate.stop(outcome.status))
        hint = env.stop_hint() or f"`clusterjob resume {run.path}` continues it"
        print(f"stopped ({outcome.status}); {hint}", flush=True)
    return outcome


def _record_pruned(run: RunDir, info: RunRecord) -> StopOutcome:
    """A trial its search pruned: pruned, at once and for good (the verdict is the
    search's, not the launcher's: its slot takes the next trial once the ranks ended)."""
    run.update(runstate.prune(), stopped_at=now_iso())
    verdict = info.pruned or {}
    at = f" at rung {verdict.get('rung')} (position {verdict.get('at')})" if verdict else ""
    print(f"stopped (pruned){at}: its search stopped it early; the slot takes the next trial", flush=True)
    return StopOutcome(runstate.PRUNED, requeue=False)


def _supervisor_alive(info: RunRecord) -> bool:
    """Whether this rank's local supervisor (run.json's ``launcher``, verified) is alive:
    then its SIGTERM (or the SIGINT of a Ctrl-C) is its own stop of the ranks, and it
    records how the run ended."""
    return taskenv.current().supervised and info.launcher is not None and procs.check(info.launcher) is None


def _stopped_by_supervisor(run: RunDir, info: RunRecord) -> StopOutcome:
    """The local supervisor stops healthy ranks after another rank failed (the run is
    failed), else for the user (Ctrl-C, ``clusterjob cancel``: cancelled). It records that
    itself once no rank is alive; this rank only says which."""
    run.update(stopped_at=now_iso())
    started = info.sessions[-1].at if info.sessions else ""
    failed = sorted({e.rank for e in rank_errors(run) if e.rank not in (None, 0) and (e.at or "") >= started})
    if failed:
        print(f"stopped (failed): rank {failed[0]} failed", flush=True)
        return StopOutcome(runstate.FAILED, requeue=False)
    print("stopped (cancelled)", flush=True)
    return StopOutcome(runstate.CANCELLED, requeue=False)


def _record_cancel(run: RunDir, in_job: bool) -> None:
    """A cancelled run is marked cancelled once none of its ranks is alive: by the local
    supervisor or ``clusterjob cancel`` once they all exited, by status once its job left
    its executor's queue. Only a run with neither (started by hand) is marked here, at
    its end."""
    if in_job or taskenv.current().supervised:
        run.update(stopped_at=now_iso())
    else:
        run.update(runstate.cancel())
    print("stopped (cancelled)", flush=True)


def mark_running(run: RunDir, env: DistEnv, facts: dict, own_code: bool = False) -> None:
    """Rank 0 at the start of every session of the run (first start, resume, requeue),
    recorded in ``sessions``. ``facts`` adds what the task knows of itself (backend, amp,
    device, entrypoint...); ``own_code``: the code is yours, not the built-in trainer."""
    info = run.read()
    task = taskenv.current()
    job = task.job()
    session = new_session(run, job.id if job else None, own_code)
    # a requeue by hand too; the requeues of retries after a failure of the machine are counted apart. A
    # trial of a search shares its slot's job with the slot's other trials: its own stops count its requeues
    restarted = task.restarts() - (info.retries or 0) if job and info.search is None else 0
    requeues = max(info.requeues or 0, restarted)
    # A cancelled run is reopened only by `resume` (which makes it pending first): a cancel
    # that came while the ranks were starting, or a requeue of a cancelled job, stands (the
    # start is ignored: runstate), and rank 0's watcher stops the ranks at their first
    # progress line. A pruned trial is never started again.
    run.update(runstate.start(), requeues=requeues, hosts=list(env.hosts),
               world_size=env.world_size, master_addr=env.master_addr, master_port=env.master_port,
               job=job or info.job, versions=versions(),
               git_sha=info.git_sha or git_sha(), started_at=info.started_at or now_iso(),
               sessions=[*info.sessions, session], **facts)


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


GO, FAILED, WAIT = "go", "failed", "wait"  # what ``after_requeue`` tells every rank


def after_requeue(run: RunDir, max_retries: int, retry_backoff_s: float = 0.0) -> str:
    """Rank 0 as a job starts again: a restart that no stop of the run counted, after a
    session its executor ended for a failure of a node (the task side's
    ``node_failure``), is a retry when retries are on (``resources.max_retries`` > 0;
    clusterjob.core.retry.decide): recorded as an attempt and counted in ``retries``.
    "failed" when none was left (the run is marked failed and does not start); "wait S"
    when S seconds of the back-off are left after the hold the executor gave the
    restarted job (its own delay, from the restart); else "go"."""
    task = taskenv.current()
    job = task.job()
    if max_retries == 0 or job is None:
        return GO
    info = run.read()
    if info.search is not None or task.restarts() <= (info.requeues or 0) + (info.retries or 0):
        return GO  # a trial: its slot's job restarts for its other trials too (the slot settles its retries)
    why = task.node_failure(info.hosts)
    if why is None:
        return GO  # a requeue by hand or a preemption: counted as a requeue (mark_running)
    if len(info.hosts) == 1:  # a job on several nodes: Slurm's word does not say which one failed
        badnodes.add(badnodes.root_of(run.path), info.hosts, why, run.path)
    decision = retry.decide(run, why, max_retries, retry_backoff_s, job=job.id)
    assert decision is not None  # max_retries > 0
    if decision.number is None:
        run.update(runstate.fail(RunError(None, (
            f"{decision.line}. Fix: `clusterjob resume {run.path}` continues it from the last checkpoint"))))
        return FAILED
    left = round(decision.wait_s - task.since_restart_s(), 1)  # one value, said and returned
    print(decision.line + (f" ({left:.0f} s left after {task.label}'s own hold)" if left > 0 else ""), flush=True)
    return f"{WAIT} {left:.1f}" if left > 0 else GO


def hold(decided: str, stopped: Callable[[], bool]) -> None:
    """Every rank: wait out ``after_requeue``'s "wait S" before the code starts (each
    rank waits itself: a wait on rank 0 alone would run into the store's timeout), unless
    a stop signal comes first (the code then stops at its first check)."""
    kind, _, seconds = decided.partition(" ")
    deadline = time.monotonic() + (float(seconds) if kind == WAIT else 0.0)
    while time.monotonic() < deadline and not stopped():
        time.sleep(min(HOLD_POLL_S, max(0.0, deadline - time.monotonic())))


def finish(run: RunDir, **fields: Any) -> None:
    """Record the run completed; its log's last line says so with its final metrics, each
    in its unit (core/units.py: val_acc 97.46%, not 0.9746)."""
    info = run.update(runstate.complete(), **fields)
    final = " ".join(f"{name} {units.quantity(name, value)}" for name, value in (info.final or {}).items()
                     if is_number(value))
    print(f"completed {run.path}" + (f": {final}" if final else ""), flush=True)


def on_failure(run: Optional[RunDir], rank: int, exc: BaseException, note: str = "") -> None:
    """Each rank reports its own crash (``note`` added to its message: the ranks that
    had ended before it); rank 0 also marks the run failed."""
    if run is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    record_error(run, rank, exc, note)
    if rank == 0:
        mark_failed(run, f"{type(exc).__name__}: {exc}")  # not over a stall's verdict (record.update)
