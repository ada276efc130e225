"""The local executor (docs/design.md, "Executors and scripts"): the runs go to a
supervisor on this machine (clusterjob.launch.supervisor), ``submit --wait`` itself or a
detached process, which runs them with ``tasks_per_node`` ranks each, a sweep's runs side
by side as the machine allows (clusterjob.launch.slots); a run whose task is one per
allocation (a search's slot) is one process in its slot of the machine.

Checked at submit (and resume), before anything is written: one node only, and with
``gpus_per_node > 0`` one visible GPU per task, counted without torch. A run lives in
its recorded processes (its supervisor, its ranks), each verified by its start time:
when every one of them ended without the run recording its end, the run is failed.
``cancel`` signals only processes it verified.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from clusterjob.core import claim, procs, runstate, sweep
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir, failure, natural_key
from clusterjob.launch import supervisor as sup
from clusterjob.launch.containers import plan as containers
from clusterjob.launch.executor import (
    PER_ALLOCATION,
    PER_RANK,
    RANKS,
    Dependency,
    Executor,
    RunView,
    Task,
    Waited,
    Watch,
    apply_found,
    cancel_unstarted,
    mark_task,
    register,
    unhanded,
)
from clusterjob.launch.progress import Line, OutputTail, ProgressTail, started_line
from clusterjob.launch.slots import gpus_here, visible_gpus  # noqa: F401  (the GPU facts, where check reads them)
from clusterjob.spec.schema import Spec
from clusterjob.taskenv.local import LocalEnvironment

CANCEL_POLL_S = 1.0
SUPERVISOR_GONE = "supervisor gone"


@register
class LocalExecutor(Executor):
    """Processes on this machine, under a supervisor."""

    name = "local"
    ranks_here = True
    debuggable = True
    environment = LocalEnvironment
    shapes = (PER_RANK, PER_ALLOCATION)  # a task per allocation: one process in its slot of the machine

    @classmethod
    def unavailable(cls) -> Optional[str]:
        return None

    @classmethod
    def adopts(cls, record: RunRecord) -> bool:
        return record.job is None  # started by hand, outside Slurm

    def check(self, spec: Spec, points: int, preflight: bool = True, after: Sequence[Dependency] = ()) -> None:
        """What this machine must offer a local run, checked before any process starts
        (the supervisor waits for runs of any executor: it asks theirs)."""
        if spec.resources.nodes > 1:
            raise BadInput(f"resources.nodes: {spec.resources.nodes} nodes cannot run with the local executor, "
                           "which uses this machine only; submit to Slurm (--executor slurm) or set "
                           "--set resources.nodes=1")
        if spec.resources.gpus_per_node > 0:  # on CPU the runner hides the GPUs: nothing to count
            visible, where = gpus_here(os.environ)
            check_gpus(spec.resources.tasks_per_node, spec.resources.gpus_per_node, visible, where)
        if spec.container is not None:
            containers.check(spec, slurm=False)

    def preview(self, spec: Spec, points: int, after: Sequence[Dependency] = (), task: Task = RANKS) -> list[str]:
        from clusterjob.spec.schema import expand_sweep

        wait = [f"each once these {len(after)} run(s) completed: {', '.join(str(d.run.path) for d in after)}"]
        if task.per == PER_ALLOCATION:
            return [f"would run {points} run(s) at once where this machine fits them, each one local process with "
                    f"its slot's cores and GPUs: python -m {task.module} --run <run>"] + (wait if after else [])
        return [f"would run {spec.resources.tasks_per_node} local processes: "
                f"python -m clusterjob.run <run>/spec.yaml  params={point.run_params}" for point in expand_sweep(spec)
                ] + _container_lines(spec) + (wait if after else [])

    def start(self, spec: Spec, runs: list[RunDir], follow: bool, after: Sequence[Dependency] = (),
              task: Task = RANKS) -> list[str]:
        """A detached supervisor takes the runs and their claims; with ``follow`` this
        process is their supervisor (``wait`` runs them) and keeps the claims. The
        supervisor waits for the runs of their run.json's ``after`` first."""
        mark_task(runs, task)
        if follow:
            record_launcher(runs, procs.current())
            return []
        for run in runs:  # each run's own claim, which the supervisor takes over; a resume
            if claim.held(run.path) is None:  # holds it already, and its words stay its own
                claim.take(run.path, "clusterjob submit")
        pid = detach(runs, spec.resources.tasks_per_node)
        claim.release(*(run.path for run in runs))  # the supervisor holds them now
        return [f"{run.path}  (local, supervisor pid {pid})" for run in runs]

    def wait(self, spec: Spec, runs: list[RunDir], watch: Watch) -> Waited:
        """Run the runs here, side by side as the machine allows; each one's summary as
        it ends; a stop signal cancels them (see clusterjob.launch.supervisor). With
        several runs at once, each progress line starts with its run's id."""
        supervisor, records = self.supervise(spec, runs, watch, sup.slots_of(spec.resources, runs))
        return Waited(records, supervisor.stop_signal)

    def supervise(self, spec: Spec, runs: list[RunDir], watch: Watch, slots: list,
                  feed: Optional[sup.Feed] = None, attached: bool = False) -> tuple[sup.Supervisor, list[RunRecord]]:
        """A supervisor in this process runs ``runs`` (and the runs ``feed`` gives its free
        slots: a search slot's trials, clusterjob.search.localslot) in ``slots``, showing their
        progress; with several slots each line starts with its run's id. ``attached``:
        rank 0 has this terminal (``submit --debug``)."""
        stall_s = spec.health.stall_s if spec.health is not None else None
        tail = ProgressTail(runs, own_code=spec.entrypoint is not None, stall_s=stall_s)
        several = len(slots) > 1 or len(runs) > 1 or feed is not None  # whose line it is needs saying
        own = {run.path for run in runs if Task.of(run.read()).per == PER_ALLOCATION}
        output = OutputTail([run for run in runs if run.path in own])

        def progress(run: RunDir) -> None:
            if run.path in own:  # a task per allocation prints what it shows (a slot: its trials' lines)
                watch.progress(output.new_lines(run))
                return
            lines = tail.new_lines(run)
            watch.progress([replace(line, text=f"{run.run_id}  {line.text}") for line in lines]
                           if several else lines)

        def ended(run: RunDir, record: RunRecord) -> None:
            progress(run)  # what rank 0 wrote after the last tick
            watch.ended(run, record)

        numbers = {run.path: number for number, run in enumerate(runs, 1)} if len(runs) > 1 and not own else {}

        def started(run: RunDir) -> None:
            if run.path in numbers:  # a sweep's runs; a search's trials say their own
                watch.progress([Line(started_line(run, numbers[run.path], len(runs)), kept=True)])

        supervisor = sup.Supervisor(spec.resources.tasks_per_node, on_tick=progress, on_end=ended,
                                    slots=slots, on_start=started, attached=attached).install()
        return supervisor, supervisor.run_all(runs, feed)

    def start_debug(self, spec: Spec, run: RunDir) -> None:
        """This process supervises the run, as with ``--wait`` (it keeps the run's claim)."""
        record_launcher([run], procs.current())

    def debug(self, spec: Spec, run: RunDir) -> RunRecord:
        """The run's ranks under a supervisor here, rank 0 on this terminal."""
        _, records = self.supervise(spec, [run], Watch(), sup.slots_for(spec.resources, 1), attached=True)
        return records[0]

    def refresh(self, found: list[tuple[RunDir, RunView]], write_back: bool) -> list[RunView]:
        return [_reconcile(run, view, write_back) for run, view in found]

    def live(self, run: RunDir, view: RunView) -> Optional[str]:
        found = processes(run, view.record)
        if found.alive:
            return f"its processes are alive: {', '.join(found.alive)}"
        if found.elsewhere and view.record.status in runstate.ACTIVE:
            return f"its processes ran {', '.join(found.elsewhere)}; this host cannot tell whether they still run"
        return None

    def cancel(self, run: RunDir, info: RunRecord, wait_s: float) -> list[str]:
        """The run's ranks (this start's, and an earlier start's that still live: see
        ``_rank_refs``), verified, get SIGTERM, then SIGKILL if they outlive ``wait_s``;
        ranks on other hosts, or not started yet, read the request in run.json (rank 0
        stops, or the supervisor skips the run). A live supervisor owns the ranks: it
        reads the request too, stops every rank it started (also one that had not
        recorded itself yet) and alone marks the run cancelled, once they all exited;
        cancel waits for that. Without one, cancel marks it once every rank here ended."""
        run.update(cancel_requested_at=now_iso())
        refs = _rank_refs(run, info.launcher)
        if not refs:
            return cancel_unstarted(run, info)
        here = [(rank, ref) for rank, ref in refs if _on_this_host(ref)]
        started = _Started()
        started.look(here)  # before the ranks end: their groups are theirs only while they live
        lines = [_stop_rank(rank, ref) for rank, ref in refs]
        lines += _await_ranks(here, wait_s, started)
        if info.launcher is not None and procs.check(info.launcher) is None:
            return lines + _await_supervisor(run, info.launcher)
        if len(here) == len(refs) and not _alive(here):
            run.update(runstate.cancel())
        return lines

    def shell(self, run: RunDir, info: RunRecord, node: str, command: list[str]) -> list[str]:
        """Here: the ranks run on this machine (one started on another host is out of reach)."""
        if node != socket.gethostname():
            raise BadInput(f"{run.path}: its ranks run on {node}, not on this host ({socket.gethostname()}); run "
                           "`clusterjob attach` there")
        return command


def _reconcile(run: RunDir, view: RunView, write_back: bool) -> RunView:
    """A run without a Slurm job lives in its recorded processes: its supervisor (while
    the run is pending or running) and its ranks, each verified by its start time, not
    just its pid. When every one of them ended (kill -9 of all, the OOM killer, a
    reboot) the run is failed, whatever run.json still says; with ``write_back`` that is
    recorded. A supervisor gone while ranks live on: they got SIGTERM from the kernel
    and record their own stop, and the view says so meanwhile."""
    if view.record.status not in runstate.ACTIVE:
        return view  # stopped (preempted, timeout): its ranks recorded it
    if view.record.status == runstate.PENDING and view.record.launcher is None and not _supervised(run):
        return unhanded(run, view, write_back)  # no supervisor yet, and no rank started by hand
    found = processes(run, view.record)
    if found.alive or found.elsewhere or not found.gone:
        supervisor_gone = any(line.startswith(SUPERVISOR_WORD) for line in found.gone)
        return replace(view, note=SUPERVISOR_GONE, orphaned=True) if found.alive and supervisor_gone else view
    ended = runstate.fail(failure(
        run, f"every process of the run ended before it recorded its end ({'; '.join(found.gone)}): killed, "
             f"out of memory, or the host rebooted; `clusterjob resume {run.path}` continues it"))
    return apply_found(run, view, ended, write_back)


def _supervised(run: RunDir) -> bool:
    """Whether a process has the run though no supervisor is recorded for it yet: a
    supervisor that holds its claim (its submit died before it said which process it
    started), or ranks started by hand that recorded themselves."""
    said = claim.holder(run.path)
    return (said is not None and said[0] == claim.SUPERVISOR) or bool(_rank_refs(run, None))


def detach(runs: list[RunDir], world: int) -> int:
    """Start a supervisor in its own session that runs ``runs``; its pid.
    The runs' claims this process holds are handed to it as they are (the same locks, so
    no other command can start a run in between); each run.json records which process it
    is (``status`` says when it is gone)."""
    fds = [held.fd if (held := claim.held(r.path)) is not None else -1 for r in runs]
    log = runs[0].logs / "supervisor.log"  # the supervisor of a sweep logs in its first run
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", sup.__name__, str(world),
                                 ",".join(map(str, fds)), *(str(r.path) for r in runs)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=[fd for fd in fds if fd >= 0])
    record_launcher(runs, procs.current(proc.pid))
    return proc.pid


def record_launcher(runs: list[RunDir], ref: Optional[procs.ProcessRef]) -> None:
    """Which process supervises the runs: once, in their sweep's record (runs of no
    sweep: each run.json), where ``status`` finds it (clusterjob.core.sweep.resolved)."""
    found = sweep.new_part([run.path for run in runs], launcher=ref, by=procs.current())
    if found is not None:
        sweep.add_parts(found[0], [found[1]])
        return
    for run in runs:
        run.update(executor="local", launcher=ref)


def _container_lines(spec: Spec) -> list[str]:
    """The runtime a dry run of a container spec would use, why, and each rank's command."""
    if spec.container is None:
        return []
    runtime, why = containers.pick(spec, slurm=False)
    command = containers.wrapped(spec, runtime).command(["<run>/spec.yaml"])
    return [why, f"each rank in the container: {shlex.join(command)}"]


def check_gpus(tasks: int, gpus_per_node: int, visible: int, where: str) -> None:
    """A local run on GPUs needs one visible GPU per task: more tasks would share a GPU,
    which NCCL refuses only after every rank has started and loaded its data."""
    if gpus_per_node == 0 or tasks <= visible:
        return
    fix = (f"set resources.tasks_per_node: {visible}, or" if visible else "submit to Slurm (--executor slurm), or set")
    raise BadInput(f"resources.tasks_per_node: {tasks} needs {_gpus(tasks)} here (one per task), but {_gpus(visible)} "
                   f"{'is' if visible == 1 else 'are'} visible ({where}); {fix} resources.gpus_per_node: 0 "
                   "to train on CPU")


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


SUPERVISOR_WORD = "supervisor"


@dataclass(frozen=True)
class Processes:
    """A run's recorded processes by what became of them, each as "supervisor pid N" or
    "rank R pid N" (with why, for the ended): alive on this host, on another host (this
    one cannot tell), or verifiably ended (exited, its pid reused, its host rebooted)."""

    alive: list
    elsewhere: list
    gone: list


def processes(run: RunDir, info: RunRecord) -> Processes:
    """What became of the run's supervisor (counted while the run is pending or running:
    a supervisor of a sweep lives on after this run) and of the ranks of its current
    start (``_rank_refs``; a pending run with no supervisor recorded is being handed
    over: its records are of an earlier start); reads only."""
    handed = info.status == runstate.PENDING and info.launcher is None
    refs = [] if handed else [(f"rank {rank}", ref) for rank, ref in _rank_refs(run, info.launcher)]
    if info.launcher is not None and info.status in runstate.ACTIVE:
        refs.insert(0, (SUPERVISOR_WORD, info.launcher))
    found = Processes([], [], [])
    for who, ref in refs:
        why = procs.check(ref)
        if why is None:
            found.alive.append(f"{who} pid {ref.pid}")
        elif why.kind == "elsewhere":
            found.elsewhere.append(f"{who} on {ref.host}")
        else:
            found.gone.append(f"{who} pid {ref.pid} {why.kind}")
    return found


def _on_this_host(ref: procs.ProcessRef) -> bool:
    why = procs.check(ref)
    return why is None or why.kind != "elsewhere"


def _alive(ranks: list) -> list:
    return [(rank, ref) for rank, ref in ranks if procs.check(ref) is None]


class _Started:
    """The processes the ranks of this host started (each rank's process group), looked
    up while each rank lives and so is verified; ended once the ranks ended."""

    def __init__(self) -> None:
        self.found: dict = {}  # pid -> ProcessRef

    def look(self, ranks: list) -> None:
        for _, ref in ranks:
            self.found.update((member.pid, member) for member in procs.group(ref))

    def end(self) -> int:
        """SIGKILL to each that still lives (verified); how many got it."""
        return sum(procs.terminate(ref, signal.SIGKILL) is None for ref in self.found.values())


def _await_ranks(ranks: list, wait_s: float, started: _Started) -> list[str]:
    """Wait until the ranks of this host ended; SIGKILL (verified) those alive after
    ``wait_s``; then what they started (``started``) that lives on."""
    begun = time.monotonic()
    while _alive(ranks) and time.monotonic() - begun < wait_s:
        started.look(ranks)
        time.sleep(CANCEL_POLL_S / 4)
    lines = []
    for rank, ref in _alive(ranks):
        started.look([(rank, ref)])
        if procs.terminate_group(ref, signal.SIGKILL) is None:
            lines.append(f"rank {rank}: still running after {wait_s:g} s: sent SIGKILL to pid {ref.pid}")
    kill_deadline = time.monotonic() + 10
    while _alive(ranks) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    if killed := started.end():
        lines.append(f"{killed} process(es) the ranks started outlived them: sent SIGKILL")
    left = _alive(ranks)
    if left:
        lines.append(f"{len(left)} rank(s) still alive; the run is not marked cancelled yet")
    elif ranks:
        lines.append(f"all {len(ranks)} rank(s) here ended after {time.monotonic() - begun:.1f} s")
    return lines


def _rank_refs(run: RunDir, launcher: Optional[procs.ProcessRef]) -> list:
    """(rank, ProcessRef) of each rank that recorded which process it is. A record of a
    rank that started before the run's ``launcher`` (its supervisor, or the ``submit
    --wait`` that runs it) is of an earlier start: it counts only while that process
    lives, so an ended rank of an earlier start is never taken for an ended rank of
    this one."""
    found = []
    for path in sorted(run.logs.glob("rank*.proc.json"), key=lambda p: natural_key(p.name)):
        ref = procs.load(path)
        earlier = ref is not None and launcher is not None and procs.started_before(ref, launcher)
        if ref is not None and (not earlier or procs.check(ref) is None):
            found.append((path.name.split(".")[0][len("rank"):], ref))
    return found


SETTLE_WAIT_S = 10.0  # how long cancel waits for a live supervisor to settle the run once its ranks ended


def _await_supervisor(run: RunDir, launcher: procs.ProcessRef) -> list[str]:
    """Wait until the run's supervisor settled it (it stops every rank it started and
    marks the run once they all exited); what it recorded, in a line."""
    deadline = time.monotonic() + SETTLE_WAIT_S
    while (status := run.read().status) not in runstate.FINAL_STATUSES and time.monotonic() < deadline:
        time.sleep(CANCEL_POLL_S / 4)
    if status in runstate.FINAL_STATUSES:
        return [f"its supervisor (pid {launcher.pid}) recorded the run {status}"]
    return [f"its supervisor (pid {launcher.pid}) marks the run cancelled once every rank it started ended"]


def _stop_rank(rank: str, ref) -> str:
    why = procs.terminate(ref)
    if why is None:
        return f"rank {rank}: sent SIGTERM to pid {ref.pid}"
    if why.kind == "elsewhere":
        return f"rank {rank}: {why.message}; its rank 0 reads the cancel and stops"
    if why.kind == "exited":
        return f"rank {rank}: {why.message}"
    return f"rank {rank}: not signalled: {why.message}"


