"""The local executor's supervisor (docs/design.md, "Executors and scripts"; what its
faults end in: "Failures"): ``tasks_per_node`` ranks of ``python -m clusterjob.run`` on
this machine (gloo on CPU, one per GPU with CUDA), the same run folders as on Slurm,
per-rank logs in ``<run>/logs/``.

A supervisor runs its runs (``submit --wait`` itself, else a detached ``python -m
clusterjob.launch.supervisor WORLD CLAIM_FDS RUN...``, so closing the terminal ends
nothing) side by side, in their order, one per slot (clusterjob.launch.slots): up to
``resources.array_parallelism`` at once (null: as many as fit), never more than have
GPUs of their own (each run's CUDA_VISIBLE_DEVICES is its own GPUs), each with its share
of the cores (its ranks' CPU affinity and OMP_NUM_THREADS). Each run is one
``SupervisedRun``, which the supervisor's loop ticks every ``POLL_S``; it holds the run's
claim from its first tick to its end, and alone decides its run's end. It owns its ranks:

- each rank has its own process group, so a Ctrl-C in the terminal reaches the supervisor
  only, and the kernel sends each rank SIGTERM when the supervisor dies (even by kill -9):
  no rank outlives it;
- nothing a rank started outlives the rank: once a rank exited, every process left in
  its group (its children, theirs, DataLoader workers) is killed before the rank is
  reaped (its unreaped exit keeps the group's id its own), and what left the group for
  a session of its own (a daemon) comes to the supervisor, a subreaper, as its parent
  ends, and is killed once the rank's session ended: after a stall, a failure, a
  retry's first start, a cancel, a prune or a stop alike;
- on SIGINT (Ctrl-C) the supervisor says ``stopping N ranks`` and sends every rank of
  every running run SIGINT, as torchrun does: a plain script gets ``KeyboardInterrupt``
  (one that catches it and tests its best model goes on to its end, its metrics taken);
  on SIGTERM or SIGHUP it sends them SIGTERM (a plain script gets ``StopRequested``).
  The built-in trainer (and code that asks ``should_stop()``) checkpoints at its next
  step boundary either way; a plain script still alive ``entrypoint.stop_grace_s``
  later is killed; a second Ctrl-C, or ``STOP_GRACE_S``, kills them all. Once no rank
  is alive the run is ``cancelled``, also when the script exited 0 (``resume``
  continues it), and so are the runs not started yet; the same after ``clusterjob
  cancel`` (read from run.json at each tick: the supervisor stops the ranks it started
  with SIGTERM, also those that had not recorded themselves yet when the cancel looked,
  and it alone marks the run cancelled once they all exited);
- every rank is polled at each tick: when one exits non-zero or is killed, the others
  are stopped within seconds (SIGTERM, SIGKILL after ``GRACE_S``), and the run fails or
  is retried naming that rank and how it ended; a rank killed by a signal nobody here
  sent is named as the cause, over the other ranks' "connection reset" errors;
- a run that waits for other runs (run.json's ``after``, from ``submit --after``) starts
  once they completed, and is failed ("dependency failed") once one never will;
- a failure that points at the machine (clusterjob.core.retry) starts the run again
  from its last checkpoint after a back-off, up to ``resources.max_retries`` times (the
  run keeps its slot meanwhile); so does a stall the health watchdog ended with
  ``on_stall: retry`` (its reason ``stalled: <culprit line>``), and one it ended with
  ``stop`` keeps its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from clusterjob.core import claim, procs, retry, runstate
from clusterjob.core.files import now_iso
from clusterjob.core.ranks import DistEnv, clean_environ, export
from clusterjob.core.record import RunError, RunRecord
from clusterjob.core.rundir import RunDir, first_error, last_words, mark_failed, rank_errors
from clusterjob.health import stalls
from clusterjob.launch import chain, progress, slots
from clusterjob.launch.containers import plan as containers
from clusterjob.launch.executor import PER_ALLOCATION, Task
from clusterjob.launch.slots import WHOLE, Slot
from clusterjob.spec import escalation
from clusterjob.spec.rewrite import rewrite_keys
from clusterjob.spec.schema import ResourcesSpec, load_spec
from clusterjob.taskenv.container import carry
from clusterjob.taskenv.local import SUPERVISED_VAR

POLL_S = 0.2
GRACE_S = 5.0         # after one rank fails, the others get this long to exit before SIGKILL
STOP_GRACE_S = 60.0   # after a stop request, time to reach a progress line and checkpoint
ORPHANS_WAIT_S = 5.0  # at the end, how long what the ranks started gets to be killed and reaped
ORPHANS_EVERY_S = 5.0  # how often what came to us is looked at (and at each session's end)
DEPENDENCY_POLL_S, DEPENDENCY_POLL_MAX_S = 1.0, 10.0  # how often a waiting run asks after its dependencies
_PR_SET_PDEATHSIG = 1
NO_BREAKPOINT = ("PYTHONBREAKPOINT", "0")  # breakpoint() does nothing (read at each call)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environ(base: dict, rank: int, world: int, port: int, slot: Slot = WHOLE) -> dict:
    """The child environment: the caller's, minus any launcher/Slurm variables, plus ranks
    and what the run's slot gives it (its GPUs, its threads)."""
    env = DistEnv(source="torchrun", rank=rank, local_rank=rank, world_size=world,
                         local_world_size=world, node_rank=0, num_nodes=1, master_addr="127.0.0.1",
                         master_port=port, hosts=("127.0.0.1",))
    child = clean_environ(base)
    export(env, child)
    child.update(slot.environ(child))
    child["PYTHONUNBUFFERED"] = "1"
    child[SUPERVISED_VAR] = "1"  # the ranks leave the run's end to us (cancelled, failed...)
    return child


def _die_with(parent: int, slot: Slot) -> Callable[[], None]:
    """In the child before exec: SIGTERM when ``parent`` dies (PR_SET_PDEATHSIG); if it
    died already, between fork and here, at once. It runs on its slot's cores."""
    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        slot.pin()
    return arm


def start_ranks(run: RunDir, world: int, slot: Slot = WHOLE, port: Optional[int] = None,
                attached: bool = False) -> list[subprocess.Popen]:
    """Start the run's ranks in ``slot`` (their rendezvous on ``port``, default a free
    one), each recorded in ``logs/rankN.proc.json`` at once (the rank records itself
    again once it runs): a ``cancel`` finds every rank of this start from its first
    instant, never only the records of an earlier start. ``attached``: rank 0 reads and
    writes this process's terminal instead of its logs (``breakpoint()`` works there); in
    a session of its own still, so a Ctrl-C reaches the supervisor, which stops the ranks.
    The other ranks then run past their ``breakpoint()`` (no terminal to stop at)."""
    run.logs.mkdir(parents=True, exist_ok=True)
    port, ranks, parent = port or free_port(), [], os.getpid()
    task = Task.of(run.read())
    command, environ = rank_command(run, task)
    world = 1 if task.per == PER_ALLOCATION else world  # one process, with its slot's resources
    for rank in range(world):
        with open(run.logs / f"rank{rank}.out", "ab") as out, open(run.logs / f"rank{rank}.err", "ab") as err:
            here = attached and rank == 0
            env = rank_environ(dict(os.environ), rank, world, port, slot)
            if attached and not here:
                env[NO_BREAKPOINT[0]] = NO_BREAKPOINT[1]
            ranks.append(subprocess.Popen(command, env=environ(env),
                                          stdout=None if here else out, stderr=None if here else err,
                                          stdin=None if here else subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_die_with(parent, slot)))
        if (ref := procs.current(ranks[-1].pid)) is not None:
            procs.save(run.proc_file(rank), ref)
    return ranks


def rank_command(run: RunDir, task: Task) -> tuple[list[str], Callable[[dict], dict]]:
    """The command of each rank of ``run`` (its tasks running ``task``) and what its
    environment gets: ``python -m clusterjob.run``, or that inside the spec's container
    (clusterjob.launch.containers), whose runtime execs the rank, with clusterjob's
    variables carried in by name."""
    if task.per == PER_ALLOCATION:  # its own command on this machine (a search's slot: its trials' ranks in theirs)
        return [sys.executable, "-m", task.module, "--run", str(run.path)], lambda environ: environ
    spec = load_spec(run.spec_file)
    if spec.container is None:
        return [sys.executable, "-m", "clusterjob.run", str(run.spec_file)], lambda environ: environ
    runtime = containers.pick(spec, slurm=False)[0]
    wrapped = containers.wrapped(spec, runtime)
    return wrapped.command([str(run.spec_file)]), lambda environ: carry(environ, spec.env)


def slots_of(resources: ResourcesSpec, runs: list[RunDir]) -> list[Slot]:
    """The slots of one submission's ``runs`` of these resources: tasks per allocation
    (a search's slots) all at once, as a Slurm array of them runs; others as
    ``resources.array_parallelism`` says (``slots_for``)."""
    together = any(Task.of(run.read()).per == PER_ALLOCATION for run in runs)
    return slots_for(resources, len(runs), len(runs) if together else None)


def slots_for(resources: ResourcesSpec, runs: int, parallel: Optional[int] = None) -> list[Slot]:
    """The slots of ``runs`` runs of these resources on this machine (clusterjob.launch.slots):
    at most ``parallel`` (a search's), else ``resources.array_parallelism``."""
    return slots.here(runs, resources.tasks_per_node, resources.cpus_per_task, resources.gpus_per_node,
                      parallel or resources.array_parallelism, os.environ)


class Feed(Protocol):
    """Runs that the free slots take one at a time, made as they are taken (a search's
    trials: clusterjob.search.trials.Feed). ``take`` the next run of slot ``slot`` (None:
    none is left); ``ended`` is told each such run's final record; ``stopping`` is set
    once the supervisor was asked to stop."""

    stopping: bool

    def take(self, slot: int) -> Optional[RunDir]: ...

    def ended(self, run: RunDir, info: RunRecord) -> None: ...


class Supervisor:
    """Runs run folders with ``world`` local ranks each, one per slot at a time (one slot:
    one after another). ``on_start`` is called as a run's ranks start, ``on_tick`` for each
    run whose ranks run at every tick, ``on_end`` once a run is final. ``attached``: rank 0
    of each run has this process's terminal (``submit --debug``: stdin, stdout, stderr)."""

    def __init__(self, world: int, on_tick: Callable[[RunDir], None] = lambda run: None,
                 on_end: Callable[[RunDir, RunRecord], None] = lambda run, info: None,
                 slots: Sequence[Slot] = (WHOLE,), on_start: Callable[[RunDir], None] = lambda run: None,
                 attached: bool = False):
        self.world, self.on_tick, self.on_end, self.on_start = world, on_tick, on_end, on_start
        self.attached = attached
        self.slots = list(slots) or [WHOLE]
        self.stop_signal: Optional[int] = None  # the signal that asked us to stop
        self.requests = 0  # a second Ctrl-C does not wait for the checkpoint
        self.ticks = 0
        self._asked: dict[tuple, tuple[int, list]] = {}  # the dependencies' states, asked once a tick
        self.runs: list[SupervisedRun] = []

    def install(self) -> "Supervisor":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = self.stop_signal or signum
        self.requests += 1

    def run_all(self, runs: list[RunDir], feed: Optional[Feed] = None) -> list[RunRecord]:
        """Each run's final run.json, in the order of ``runs``. They start in that order,
        each once a slot is free and the runs it waits for completed; after a stop
        request the runs not started yet are cancelled. With ``feed`` (a search's trials),
        each free slot takes its next run from it, until none is left."""
        supervised = self.runs = [SupervisedRun(self, run) for run in runs]
        procs.become_subreaper()  # what a rank started in a session of its own comes back to us
        for one in supervised:
            one.begin()
        free, said, sweep_at = list(self.slots), False, 0.0
        while True:
            if time.monotonic() >= sweep_at:  # a look at every process here: not at every tick
                self.end_orphans()
                sweep_at = time.monotonic() + ORPHANS_EVERY_S
            if feed is not None:
                feed.stopping = feed.stopping or self.stop_signal is not None
                supervised += _fed(self, feed, free)
            unfinished = [one for one in supervised if one.record is None]
            if not unfinished:
                break
            if self.stop_signal is not None and not said:
                said = _say_stopping(unfinished)
            for one in unfinished:
                if one.wants_slot() and free:
                    one.start(free.pop(0))
                    if one.state == one.RUNNING:  # not a run cancelled before its turn
                        self.on_start(one.run)
                one.tick()
                if one.record is not None:
                    free = sorted([*free, *([one.slot] if one.slot else [])], key=lambda slot: slot.index)
                    self.on_end(one.run, one.record)
                    if feed is not None:
                        feed.ended(one.run, one.record)
            self.ticks += 1
            if any(one.record is None for one in supervised):
                time.sleep(POLL_S)
        deadline = time.monotonic() + ORPHANS_WAIT_S
        while self.end_orphans() and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)
        return [one.record for one in supervised if one.record is not None]

    def end_orphans(self) -> int:
        """What a rank started in a session of its own (a daemon, ``start_new_session``)
        leaves the rank's group, but comes to this process (a subreaper) once its parent
        ended: killed once its rank's session ended (its environment names that
        session's MASTER_PORT, the rank's CLUSTERJOB_SUPERVISED), reaped once it ended,
        as is any other process that ends here. A child of ours keeps its pid until we
        reap it: the pid names that very process. How many were left to end."""
        ranks = {p.pid for one in self.runs for p in one.ranks if p.returncode is None}
        live = {one.port for one in self.runs if one.alive()}
        left = 0
        for pid, state in procs.children():
            if pid in ranks:
                continue
            left += 1
            if state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            env = procs.environ(pid)
            if env.get(SUPERVISED_VAR) != "1" or env.get("MASTER_PORT") in live or _watcher(pid):
                left -= 1  # not a rank's, its session runs on, or a watcher (it ends itself, after its last words)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return left

    def rank_signal(self) -> int:
        """What the ranks get for the stop request: SIGINT after Ctrl-C (as torchrun passes
        it on: a plain script sees KeyboardInterrupt), else SIGTERM."""
        return signal.SIGINT if self.stop_signal == signal.SIGINT else signal.SIGTERM

    def dependencies(self, after: list) -> list:
        """The states of the runs ``after`` names (clusterjob.launch.chain), asked once a
        tick: the runs of a sweep wait for the same runs."""
        key = tuple(after)
        tick, deps = self._asked.get(key, (-1, []))
        if tick != self.ticks:
            deps = chain.states(after)
            self._asked[key] = (self.ticks, deps)
        return deps


class SupervisedRun:
    """One run of a supervisor, from ``begin`` to its final record (``record``): it waits
    for the runs of its ``after``, then for a slot, runs its ranks (a session), settles
    how they ended, and after a failure of the machine waits out the back-off and starts
    them again in the same slot. The claim of the run is held from ``begin`` to the end
    (no resume starts it meanwhile; it dies with this process)."""

    QUEUED, WAITING, RUNNING, PAUSED = "queued", "waiting", "running", "paused"

    def __init__(self, boss: Supervisor, run: RunDir):
        self.boss, self.run = boss, run
        self.state: Optional[str] = None  # None before ``begin``
        self.record: Optional[RunRecord] = None
        self.slot: Optional[Slot] = None
        self.ranks: list[subprocess.Popen] = []
        self.port = ""  # its session's MASTER_PORT, which what its ranks start inherits
        self.sent: dict[int, int] = {}  # rank -> the last signal we sent it
        # A task per allocation (a search's slot) supervises ranks of its own: it is given
        # each stop request and twice the grace to stop them, and killed only after that.
        self.grace, self.passed = 1, 1
        self.kill_at: Optional[float] = None
        self.until = 0.0  # the next look at the dependencies, or the end of the back-off
        self.pause, self.said = DEPENDENCY_POLL_S, False

    def wants_slot(self) -> bool:
        return self.state == self.QUEUED

    def begin(self) -> None:
        """Take the run's claim (this process holds it already, handed over by submit or
        the local executor: it now says the supervisor runs it)."""
        claim.take(self.run.path, claim.SUPERVISOR)
        self.state = self.WAITING if self.run.read().after else self.QUEUED

    def tick(self) -> None:
        """One look at the run, every POLL_S; a queued run's turn is the loop's to give."""
        if self.state == self.WAITING:
            self._await_dependencies()
        elif self.state == self.QUEUED:
            self._cancelled_before_its_turn()
        elif self.state == self.RUNNING:
            self._watch_ranks()
        elif self.state == self.PAUSED:
            self._await_retry()

    def start(self, slot: Slot) -> None:
        """Its turn, in ``slot``: the ranks start unless it was stopped or cancelled first."""
        self.slot = slot
        if not self._cancelled_before_its_turn():
            self._start_session()

    def _start_session(self) -> None:
        assert self.slot is not None  # a session runs in a slot
        if self.run.read().launcher != procs.current():
            # submit recorded this supervisor once, in the sweep's record; the ranks read
            # run.json (whether their supervisor records their stop): it says so from now on
            self.run.update(launcher=procs.current())
        self.grace = 2 if Task.of(self.run.read()).per == PER_ALLOCATION else 1
        port = free_port()
        self.port = str(port)
        self.ranks, self.sent, self.kill_at = start_ranks(self.run, self.boss.world, self.slot, port,
                                                               attached=self.boss.attached), {}, None
        self.state = self.RUNNING

    def _end(self, record: RunRecord) -> None:
        self.record = record
        claim.release(self.run.path)

    def _cancelled_before_its_turn(self) -> bool:
        """A stop request, or a cancel (run.json, read at its turn), ends a run not started."""
        if self.boss.stop_signal is not None:
            self._end(self.run.update(runstate.cancel()))
        elif self.state == self.QUEUED and self.slot is not None:
            info = self.run.read()
            if info.status == runstate.CANCELLED:  # `clusterjob cancel` before its turn
                self._end(info)
            elif info.cancel_requested_at is not None:
                self._end(self.run.update(runstate.cancel()))
        return self.record is not None

    def _await_dependencies(self) -> None:
        """Until every run of its ``after`` completed (asked every DEPENDENCY_POLL_S, backing
        off to DEPENDENCY_POLL_MAX_S): failed ("dependency failed") when one never will,
        cancelled by a stop or a cancel meanwhile (read every tick)."""
        if self._stopped_meanwhile() or time.monotonic() < self.until:
            return
        deps = self.boss.dependencies(self.run.read().after)
        reason = chain.failed(deps)
        if reason is not None:
            print(f"{self.run.path}: {reason}", flush=True)
            self._end(self.run.update(runstate.fail(RunError(None, reason, "", now_iso()))))
        elif chain.all_done(deps):
            self.state = self.QUEUED
        else:
            if not self.said:
                print(f"{self.run.path}: {chain.waiting_line(deps)}", flush=True)
                self.said = True
            self.until = time.monotonic() + self.pause
            self.pause = min(DEPENDENCY_POLL_MAX_S, self.pause * 1.5)

    def _stopped_meanwhile(self) -> bool:
        """While it waits (dependencies, a back-off): a stop signal or a cancel ends it cancelled."""
        info = self.run.read()
        asked = info.cancel_requested_at is not None or info.status == runstate.CANCELLED
        if self.boss.stop_signal is not None or asked:
            self._end(self.run.update(runstate.cancel()))
        return self.record is not None

    def _watch_ranks(self) -> None:
        """Every rank is polled: a rank waiting in a collective must not hide a sibling that
        died (it would wait for it until ``dist.timeout_s``). When one fails (exits
        non-zero or is killed) the others are stopped; all on a stop request or a
        ``clusterjob cancel`` of the run. A rank that exits 0 finished its part: the
        others run on to their own end (docs/design.md, "Failures")."""
        alive = [p for p in self.ranks if not _ended(p)]
        if not alive:
            self._session_ended()
            return
        self.boss.on_tick(self.run)
        failed = any(p.returncode not in (None, 0) for p in self.ranks)
        stopped = self.boss.stop_signal is not None
        asked = None if failed or stopped or self.kill_at is not None else _stop_asked(self.run)
        if self.kill_at is None and (failed or stopped or asked):
            if asked:
                _say_cancel(self.run, len(alive), asked)
            _signal(self.ranks, signal.SIGTERM if failed else self.boss.rank_signal(), self.sent)
            self.kill_at = time.monotonic() + (GRACE_S if failed else STOP_GRACE_S * self.grace)
        if self.kill_at is None:
            return
        if self.grace > 1 and self.boss.requests > self.passed:  # its own supervisor hears each Ctrl-C
            self.passed = self.boss.requests
            _signal(self.ranks, self.boss.rank_signal(), self.sent)
        elif time.monotonic() > self.kill_at or (self.boss.requests > 1 and self.grace == 1):
            _signal(self.ranks, signal.SIGKILL, self.sent)

    def _session_ended(self) -> None:
        """Every rank exited: the run's record, or a retry when the machine failed it."""
        codes = [p.returncode for p in self.ranks]
        self.boss.end_orphans()
        info = _settle(self.run, codes, self.sent, self.boss.stop_signal is not None)
        if info.status != runstate.FAILED or self.boss.stop_signal is not None:
            self._end(info)
            return
        stalled = stalls.verdict(info)  # the health watchdog ended the ranks: retry or stop, as it said
        if stalled is not None:
            cause = stalls.reason(stalled) if stalled.action == "retry" else None
        else:
            killed = _killed(self.run, [(rank, code) for rank, code in enumerate(codes) if code != 0], self.sent)
            cause = retry.machine_cause(killed and killed[1], rank_errors(self.run), codes)
        if cause is not None:
            self._retry(cause)
        elif not self._shrunk():
            self._end(self.run.read())

    def _shrunk(self) -> bool:
        """A rank out of GPU memory, where the spec asks for it (``resources.on_gpu_oom``):
        the keys it names divided in the run's spec.yaml (retry.escalate: the one
        decision, as for a Slurm run's new job) and the run started again in its slot;
        False where there is nothing to shrink (the run stays failed, with the line)."""
        found = retry.out_of_memory(rank_errors(self.run), "")
        asked = escalation.policy(load_spec(self.run.spec_file), retry.GPU_OOM) if found else None
        if found is None or asked is None or found[0] != retry.GPU_OOM:
            return False
        decision = retry.escalate(self.run, asked[0], found[1], asked[1])
        print(f"{self.run.path}: {decision.line}", flush=True)
        if decision.new is None:  # the run is failed with the line already
            return False
        rewrite_keys(self.run.spec_file, decision.new)
        self.state, self.until = self.PAUSED, time.monotonic()
        return True

    def _retry(self, cause: str) -> None:
        """After a failure of the machine: the run is reopened for a retry and waits out
        its back-off in its slot; else its final record (no retry left)."""
        resources = load_spec(self.run.spec_file).resources
        decision = retry.decide(self.run, cause, resources.max_retries, resources.retry_backoff_s,
                                hosts=[socket.gethostname()])
        if decision is None:
            self._end(self.run.read())
            return
        print(f"{self.run.path}: {decision.line}", flush=True)
        if decision.number is None:
            self._end(decision.record)
        else:
            self.state, self.until = self.PAUSED, time.monotonic() + decision.wait_s

    def _await_retry(self) -> None:
        if not self._stopped_meanwhile() and time.monotonic() >= self.until:
            self._start_session()

    def alive(self) -> int:
        """How many of its ranks are alive."""
        return sum(not _ended(p) for p in self.ranks) if self.state == self.RUNNING else 0


def _settle(run: RunDir, codes: list[int], sent: dict, stopped: bool) -> RunRecord:
    """The run's final state from the ranks' exit codes and what they recorded
    (``stopped``: the supervisor got a stop signal)."""
    info = run.read()
    status = info.status
    if info.pruned is not None and info.cancel_requested_at is None:
        # its search pruned it: the verdict stands, whatever the ranks stopped for it exited with
        return info if status in runstate.FINAL_STATUSES else run.update(runstate.prune())
    if stopped or info.cancel_requested_at is not None:
        # Ctrl-C or `cancel`: the user's stop, checkpointed or not (resume continues it),
        # also when the code caught it and exited 0; an end the run recorded first (or a
        # cancel that marked it) stands
        return info if status in runstate.FINAL_STATUSES else run.update(runstate.cancel())
    if stalls.verdict(info) is not None:
        return info  # a stall's verdict: the ranks were ended on purpose
    bad = [(rank, code) for rank, code in enumerate(codes) if code != 0]
    if not bad:
        if status in runstate.ACTIVE:
            return run.update(runstate.fail(RunError(None, "the ranks exited without finishing the run")))
        return info
    return _record_failure(run, bad, sent)


def _fed(boss: Supervisor, feed: Feed, free: list[Slot]) -> list[SupervisedRun]:
    """Each free slot's next run of the feed, started in that slot (a search's trial is
    taken by the slot of its number: a slot started again takes back the trial it holds)."""
    started = []
    for slot in list(free):
        run = feed.take(slot.index)
        if run is None:
            break
        one = SupervisedRun(boss, run)
        one.begin()
        free.remove(slot)
        one.start(slot)
        started.append(one)
    return started


def _say_stopping(running: list) -> bool:
    """One line as the ranks of every running run are asked to stop (a plain script is
    killed after its grace period; the built-in trainer checkpoints first); True once said."""
    alive = sum(one.alive() for one in running)
    if alive:
        runs = sum(one.alive() > 0 for one in running)
        noun = "rank" if alive == 1 else "ranks"
        print(f"\nstopping {alive} {noun}{f' of {runs} runs' if runs > 1 else ''} (Ctrl-C again to kill them now)",
              file=sys.stderr, flush=True)
    return True


def _say_cancel(run: RunDir, alive: int, why: str) -> None:
    """One line as ``clusterjob cancel`` (or a trial's prune: the trial, its rung and the
    cut, on stdout among the progress lines, a live line on a terminal cleared) stops a
    run's ranks."""
    if why == PRUNED:
        print(("\r\033[K" if sys.stdout.isatty() else "") + progress.prune_line(run, alive), flush=True)
        return
    print(f"\n{why}: stopping {alive} {'rank' if alive == 1 else 'ranks'}", file=sys.stderr, flush=True)


def _stop_asked(run: RunDir) -> Optional[str]:
    """Why the run is to stop, as run.json says: ``clusterjob cancel`` asked, or its
    search pruned it (every rank stops, a plain script's too); None when neither. The
    supervisor stops the ranks it started, whatever records the cancel found."""
    info = run.read()
    if info.cancel_requested_at is not None:
        return "cancel requested"
    return PRUNED if info.pruned is not None else None


PRUNED = "pruned by its search"


def _signal(ranks: list[subprocess.Popen], sig: int, sent: dict) -> None:
    for rank, p in enumerate(ranks):
        if not _ended(p):
            p.send_signal(sig)
            sent[rank] = sig


def _watcher(pid: int) -> bool:
    """Whether ``pid`` is a rank's stall watcher (clusterjob.runner.watchdog)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"\0clusterjob.runner.watchdog\0" in f.read(4096)
    except OSError:
        return False


def _ended(rank: subprocess.Popen) -> bool:
    """Whether the rank exited, and then every process of its group (what it started, its
    children's children, DataLoader workers: nothing of a rank outlives it) is killed
    before the rank is reaped: until then its exit keeps its pid, and so the group's id,
    from any other process. A rank is only ever reaped here."""
    if rank.returncode is not None:
        return True
    try:
        exited = os.waitid(os.P_PID, rank.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (not by us): its group's id is no longer its own
        return rank.poll() is not None
    if exited is None:
        return False
    procs.end_group(rank.pid)
    return rank.poll() is not None


def _killed(run: RunDir, bad: list[tuple[int, int]], sent: dict) -> Optional[tuple[int, str]]:
    """(rank, "rank R was killed by SIG") of the first rank killed by a signal nobody here
    sent, without a traceback; None when there is none."""
    for rank, code in bad:
        if code < 0 and rank not in sent and not run.error_file(rank).exists():
            return rank, f"rank {rank} {procs.ended(code)}"
    return None


def _record_failure(run: RunDir, bad: list[tuple[int, int]], sent: dict) -> RunRecord:
    """A rank killed by a signal that nobody here sent, without a traceback, is the cause
    (the others then fail on a closed connection); else the first traceback; else the
    first rank that exited non-zero by itself (not the siblings stopped for it)."""
    killed = _killed(run, bad, sent)
    if killed is None and first_error(run) is not None:
        return mark_failed(run, "")
    if killed is None:
        first, code = next(((rank, code) for rank, code in bad if rank not in sent), bad[0])
        killed = first, f"rank {first} {procs.ended(code)}"
    rank, said = killed
    return run.update(runstate.fail(RunError(rank, f"{said} (no traceback)", last_words(run, rank))))


def main(argv: list[str]) -> int:
    """``python -m clusterjob.launch.supervisor WORLD CLAIM_FDS RUN...``: CLAIM_FDS are the
    descriptors of the runs' claims that the local executor handed over (-1: none), in
    run order. The runs (one submission's) share their first run's resources."""
    world, fds, paths = int(argv[0]), [int(fd) for fd in argv[1].split(",")], argv[2:]
    for fd, path in zip(fds, paths):
        if fd >= 0:
            claim.adopt(fd, path, claim.SUPERVISOR)
    runs = [RunDir(Path(p)) for p in paths]
    supervisor = Supervisor(world, on_end=lambda run, info: print(f"{run.path}: {info.status}", flush=True),
                            slots=slots_of(load_spec(runs[0].spec_file).resources, runs)).install()
    supervisor.run_all(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
