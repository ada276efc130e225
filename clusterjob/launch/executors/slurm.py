"""The Slurm executor: one job per run, one job array per sweep (split at MaxArraySize),
each a script submitit renders, submitted with one sbatch per array
(clusterjob.launch.arrays).

``start`` submits run folders that already exist and records each job in the sweep's
record (clusterjob.core.sweep), once per array, not in each run.json. Every task runs
``python -m clusterjob.run`` on its run folder, which records the job (its array task)
in run.json at its start and owns SIGUSR2 (it checkpoints and requeues the array task
itself), so the same behaviour holds for the raw sbatch templates. A teardown line
after srun records a run that ended without saying so (a task killed by a signal) as
failed in its run.json.

A run whose run.json does not say it ended is what the queue (squeue), then accounting
(sacct) say of its job, each array asked once for all its tasks; a job that left the
queue with no accounting and no final record is failed, never "unknown". Only an answer
from Slurm counts: when squeue cannot answer, the recorded state is shown with a note.
A run no job has yet is being handed over, or its submit died: then the job it may have
left unrecorded is looked for by the sweep's name, else the run is failed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional, Sequence

from clusterjob.core import claim, procs, retry, runstate, slurmctl, sweep
from clusterjob.core.errors import BadInput, Failure, SlurmUnreachable
from clusterjob.core.files import batched, now_iso
from clusterjob.core.ranks import clean_environ, scrubbed_environ
from clusterjob.core.record import SLURM, RunError, RunRecord, amended, is_job_id
from clusterjob.core.rundir import RunDir, failure, first_error, last_words, rank_errors
from clusterjob.health import badnodes, stalls
from clusterjob.launch import arrays, chain
from clusterjob.launch.containers import plan as containers
from clusterjob.launch.executor import (
    PER_ALLOCATION,
    PER_RANK,
    RANKS,
    WAITING,
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
    views,
)
from clusterjob.launch.progress import QUIET_S, ProgressTail
from clusterjob.launch.resources import SESSION_MARK, sbatch_options, submitit_parameters
from clusterjob.spec import escalation
from clusterjob.spec.rewrite import rewrite_keys
from clusterjob.spec.schema import Spec, load_spec
from clusterjob.taskenv.container import host_command
from clusterjob.taskenv.slurm import SlurmEnvironment, SlurmOptions

UNREACHABLE = "Slurm unreachable"
POLL_FIRST_S, POLL_MAX_S = 2.0, 30.0  # `submit --wait` polls back off from the first to the longest wait
CANCEL_POLL_S = 1.0
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's own default, where no cluster can be asked (a dry run)


@register
class SlurmExecutor(Executor):
    """Jobs on the Slurm cluster this machine reaches (SLURM_CONF)."""

    name = "slurm"
    debuggable = True
    auto_rank = 10
    options = SlurmOptions
    environment = SlurmEnvironment
    shapes = (PER_RANK, PER_ALLOCATION)  # a task per allocation: the batch script runs it, its steps its own

    @classmethod
    def unavailable(cls) -> Optional[str]:
        if slurmctl.reachable():
            return None
        return ("Slurm is not reachable from here (sbatch/sinfo missing or the controller does not answer); "
                "check SLURM_CONF, or use --executor local")

    @classmethod
    def adopts(cls, record: RunRecord) -> bool:
        return is_job_id(record.slurm_job_id)  # a raw sbatch template's run

    def check(self, spec: Spec, points: int, preflight: bool = True, after: Sequence[Dependency] = ()) -> None:
        """A job waits only for Slurm jobs; then the cluster's preflight
        (clusterjob.launch.preflight): each failed check on stderr, then bad input;
        ``preflight`` False asks nothing."""
        for dep in after:
            if dep.state == WAITING and _slurm_job(dep) is None:
                raise BadInput(f"--after: {dep.run.path} is {dep.why}, with no Slurm job to wait for (a local run, or "
                               "Slurm did not say); submit this one with --executor local, or once it completed")
        if not preflight:
            from clusterjob.launch.preflight import array_size

            if self.unavailable() is None:  # a dry run without a cluster: preview splits at the default
                array_size(points)  # a sweep's split needs the cluster's MaxArraySize, checked or not
            return
        if spec.container is not None:  # the runtime it picks and why, or one line and exit 2
            _check_container(spec)
        failed = [check for check in self.checks(spec, points) if not check.ok]
        for check in failed:
            print(check.line(), file=sys.stderr)
        if failed:
            # a sweep's split needs MaxArraySize with or without the preflight: skipping it helps only otherwise
            skip = "" if all(check.name == "array" for check in failed) else ", or pass --no-preflight to submit anyway"
            raise BadInput(f"the cluster would refuse or never run these jobs ({len(failed)} preflight check(s) "
                           f"failed, above); fix the spec{skip}")

    def checks(self, spec: Spec, points: int) -> list:
        """The cluster's answers for ``points`` runs of ``spec``, one Check each; read-only."""
        from clusterjob.launch import preflight

        try:
            rendered = scripts(spec, points, _folder(spec))
        except (BadInput, SlurmUnreachable):  # no array size: the array check says why
            rendered = []
        return _container_checks(spec, preflight.Check) + preflight.run_checks(spec, points, rendered)

    def preview(self, spec: Spec, points: int, after: Sequence[Dependency] = (), task: Task = RANKS) -> list[str]:
        # Without a cluster to ask (a dry run from a laptop), a sweep is split at Slurm's default
        # MaxArraySize: submit's note says so. With one, its own answer splits it, or refuses it.
        unasked = DEFAULT_MAX_ARRAY_SIZE if self.unavailable() is not None else None
        return scripts(spec, points, _folder(spec), _after_jobs(after), unasked, task)

    def makes_runs_at_start(self, points: int) -> bool:
        """A sweep's tasks make their own run folders: a submission of 10,000 points then
        writes a few files, not 10,000 folders (clusterjob.core.unmade); a single run
        is made at once, where submit says it is."""
        return points > 1

    def start(self, spec: Spec, runs: list[RunDir], follow: bool, after: Sequence[Dependency] = (),
              task: Task = RANKS) -> list[str]:
        mark_task(runs, task)
        job_ids = submit_runs(spec, runs, _after_jobs(after), task)
        claim.release(*(run.path for run in runs))  # handed over: the queue says whether they run
        return [f"{job_id}  {run.path}" for job_id, run in zip(job_ids, runs)]

    def wait(self, spec: Spec, runs: list[RunDir], watch: Watch) -> Waited:
        """Poll until every run is final (run.json, reconciled with squeue/sacct and
        written back), waiting longer between polls as time goes on; a running run with
        no progress for a minute gets a status line a minute. Ctrl-C stops waiting, not
        the jobs."""
        pause = POLL_FIRST_S
        tail = ProgressTail(runs, own_code=spec.entrypoint is not None,
                            stall_s=spec.health.stall_s if spec.health is not None else None)
        try:
            while True:
                records = [view.record for view in views(runs, write_back=True)]
                if all(r.status in runstate.FINAL_STATUSES for r in records):
                    break
                for run, record in zip(runs, records):
                    quiet = tail.quiet_lines(run) if record.status == runstate.RUNNING else []
                    watch.progress([replace(line, text=f"{run.run_id}  {line.text}") for line in quiet]
                                   if len(runs) > 1 else quiet)
                time.sleep(pause)
                running = any(record.status == runstate.RUNNING for record in records)
                pause = min(POLL_MAX_S if not running else QUIET_S / 4, pause * 1.5)  # a quiet run is said in time
        except KeyboardInterrupt:
            print(f"\nstopped waiting; the jobs go on: clusterjob status {runs[0].path.parent}", file=sys.stderr)
            raise
        for run, record in zip(runs, records):
            watch.ended(run, record)
        return Waited(records)

    def refresh(self, found: list[tuple[RunDir, RunView]], write_back: bool) -> list[RunView]:
        """squeue for the jobs of all runs, then sacct for those that left the queue (each
        array once for all its tasks, at most 500 jobs a call); a run no job has yet is
        being handed over, or left by a submit that died (``_handover``)."""
        live = {job for _, view in found if is_job_id(job := view.record.slurm_job_id)}
        queued = slurmctl.queue_states(sorted(live))
        gone = [] if queued is None else sorted(live - queued.keys())
        accounted = slurmctl.accounting_states(gone)
        records = sweep.Records()
        return [_handover(run, view, records, write_back) if _unhanded(view) else
                _reconcile(run, view, queued, accounted, write_back) for run, view in found]

    def live(self, run: RunDir, view: RunView) -> Optional[str]:
        if view.note == UNREACHABLE:
            return f"Slurm unreachable: cannot tell whether job {view.record.slurm_job_id} still runs"
        return None  # the queue and accounting said it left (the view is refreshed)

    def cancel(self, run: RunDir, info: RunRecord, wait_s: float) -> list[str]:
        job = info.slurm_job_id
        if not is_job_id(job):
            run.update(cancel_requested_at=now_iso())
            return cancel_unstarted(run, info)
        return _cancel_job(run, job, wait_s)

    def cancel_all(self, targets: list[tuple[RunDir, RunRecord]], wait_s: float) -> list[str]:
        """Many runs (a sweep) at once: one scancel for all their jobs, an array by its
        id when every task of it still in the queue is cancelled (never one call per
        task), then one wait until they all left the queue; run.json written in one batch."""
        jobs = [(run, info, job) for run, info in targets if is_job_id(job := info.slurm_job_id)]
        lines = [line for run, info in targets if not is_job_id(info.slurm_job_id)
                 for line in self.cancel(run, info, wait_s)]
        if jobs:
            lines += _cancel_jobs(jobs, wait_s)
        return lines

    def reopened(self) -> dict:
        return {"job": None}

    def start_debug(self, spec: Spec, run: RunDir) -> None:
        """Nothing yet: its task records its job as it starts; until then this process's
        claim on the run says it is being submitted."""

    def debug(self, spec: Spec, run: RunDir) -> RunRecord:
        """The run in an allocation of its own (``salloc``), its ranks one srun step with
        rank 0 in a pseudo-terminal (``srun --pty``) tied to this one; a Ctrl-C goes to
        rank 0 there (salloc takes one before the allocation starts), whose recorded stop
        makes the run cancelled once the allocation ended. A run whose tasks did not
        record their end is failed, saying what ended it."""
        with _ignored_interrupt():
            code = subprocess.run(salloc_command(spec, run), env=clean_environ(os.environ)).returncode
        claim.release(run.path)
        info = run.read()
        if info.status in runstate.FINAL_STATUSES:
            return info
        if is_job_id(info.slurm_job_id) and info.stopped_at is not None:
            # rank 0 recorded the stop (a Ctrl-C), to be cancelled once no rank lives: the allocation is gone
            return run.update(runstate.cancel())
        why = (f"its ranks ended without recording their end (salloc exited {code})" if is_job_id(info.slurm_job_id)
               else f"salloc exited {code} before its ranks started (what it said is above)")
        return run.update(runstate.fail(RunError(None, why)))

    def shell(self, run: RunDir, info: RunRecord, node: str, command: list[str]) -> list[str]:
        """A step of the run's job on ``node`` beside its ranks (``--overlap``), in a
        pseudo-terminal: it gets the job's GPUs and cores."""
        job = info.slurm_job_id
        if not is_job_id(job):
            raise BadInput(f"{run.path}: no Slurm job recorded yet; try again once its job runs")
        own = slurmctl.step_job_id(job)
        if own is None:
            raise BadInput(f"{run.path}: Slurm did not say which job array task {job} is (scontrol show job); "
                           "try again once Slurm answers")
        return ["srun", f"--jobid={own}", "--overlap", "--pty", "-w", node, "-N1", "-n1", "--quiet", *command]


def salloc_command(spec: Spec, run: RunDir) -> list[str]:
    """``submit --debug``'s command: an allocation of the spec's resources (the options
    the job scripts take, ``sbatch_options``), in which the spec's setup lines run and
    then the ranks, as one ``srun --pty`` step. Only rank 0 has the terminal: the others
    write their logs (``logs/rankN.out|err``) and run past their ``breakpoint()``."""
    options = [f"--{name}={value}" for name, value in sbatch_options(spec).items() if value is not None]
    task = shlex.join([sys.executable, "-u", "-m", "clusterjob.run", str(run.spec_file)])
    logs = shlex.quote(str(run.logs))
    others = (f"export PYTHONBREAKPOINT=0; mkdir -p {logs}; "
              f'exec >>{logs}/"rank$SLURM_PROCID.out" 2>>{logs}/"rank$SLURM_PROCID.err"')
    ranks = ["srun", "--pty", "--kill-on-bad-exit=1", "bash", "-c",
             f'if [ "$SLURM_PROCID" != 0 ]; then {others}; fi; exec {task}']
    script = [*spec.resources.setup, f"export SRUN_CPUS_PER_TASK={spec.resources.cpus_per_task}",
              f"exec {shlex.join(ranks)}"]
    return ["salloc", *options, "bash", "-c", "\n".join(script)]


@contextlib.contextmanager
def _ignored_interrupt() -> Iterator[None]:
    """SIGINT does nothing here for the block: the terminal's Ctrl-C is for the child (a
    handler, not SIG_IGN, which the child would inherit)."""
    saved = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def _check_container(spec: Spec) -> None:
    """The runtime a container spec gets and why, then the probe on a node (cached for a
    day): an image that cannot run a rank there is bad input, one line."""
    from clusterjob.launch.containers import probe

    runtime, why = containers.check(spec, slurm=True)
    print(why, file=sys.stderr)
    passed, line = probe.probe(spec, runtime)
    if passed is False:
        raise BadInput(line)
    print(line, file=sys.stderr)


def _container_checks(spec: Spec, check: type) -> list:
    """The runtime of a container spec, and why (``validate --cluster``), or why none."""
    if spec.container is None:
        return []
    try:
        return [check("container", True, containers.check(spec, slurm=True)[1])]
    except BadInput as error:
        return [check("container", False, str(error))]  # its line says the fix


def _slurm_job(dep: Dependency) -> Optional[str]:
    """The Slurm job (or array task) of a run this one waits for, while it is queued;
    None for none, or another executor's job."""
    job = dep.job
    return job.id if job is not None and job.executor == SLURM and is_job_id(job.id) else None


def _after_jobs(after: Sequence[Dependency]) -> list[str]:
    """The queued Slurm jobs of the runs still waited for: what afterok names."""
    return [job for dep in after if dep.state == WAITING and (job := _slurm_job(dep)) is not None]


def _folder(spec: Spec) -> Path:
    """Where submitit keeps the scripts and logs of ``spec``'s jobs."""
    return Path(spec.output.root) / spec.name / ".slurm"


def _reconcile(run: RunDir, view: RunView, queued: Optional[dict], accounted: Optional[dict],
               write_back: bool) -> RunView:
    """The run as its job's state says: in the queue, or gone (accounting's final state;
    failed when there is none). When sacct did not answer (``accounted`` None: no
    accounting here, or unreachable), the job's end is shown as failed but not written:
    a later status, with sacct answering, records what Slurm says it was."""
    info = view.record
    job = info.slurm_job_id
    if not is_job_id(job):  # no job (yet), or a recorded id no Slurm command would take
        return view
    if queued is None:
        return replace(view, note=UNREACHABLE, unanswered="squeue did not answer; showing the states the runs recorded")
    if job in queued:
        return replace(view, queue_state=queued[job])
    if accounted is None and not info.cancel_requested_at:
        write_back, view = False, replace(view, unanswered=NO_SACCT)
    return apply_found(run, view, _found_end(run, info, job, accounted or {}), write_back)


def _found_end(run: RunDir, info: RunRecord, job: str, accounted: dict) -> runstate.Move:
    """How a run whose job left the queue without the run recording its end ended, as
    Slurm says (slurmctl.ENDED; failed where accounting has no word), or cancelled."""
    said = slurmctl.ENDED.get(accounted.get(job, ""), runstate.FAILED)
    final = runstate.CANCELLED if info.cancel_requested_at else said
    never = _dependency_failed(info) if final == runstate.CANCELLED and not info.cancel_requested_at else None
    if never is not None:  # Slurm cancelled the job as one it waited for (afterok) failed
        return runstate.fail(RunError(None, never))
    if final == runstate.FAILED:
        return runstate.fail(failure(run, f"job {job} left the queue ({accounted.get(job) or 'no accounting record'}) "
                                          "without the run recording its end"))
    return runstate.cancel() if final == runstate.CANCELLED else runstate.stop(final, ended=True)


NO_SACCT = ("sacct did not answer: a run whose job left the queue without recording its end is shown failed, "
            "and not written, until accounting says how its job ended")


def _dependency_failed(info: RunRecord) -> Optional[str]:
    """Why a run that never started waits in vain (a run of its ``after`` failed), or None."""
    if info.status != runstate.PENDING or not info.after:
        return None
    return chain.failed(chain.states(info.after))


def _unhanded(view: RunView) -> bool:
    """A pending run no job has yet (made, not yet handed over)."""
    return view.record.status == runstate.PENDING and view.record.job is None


def _handover(run: RunDir, view: RunView, records: sweep.Records, write_back: bool) -> RunView:
    """A pending run no job has: the job a submit that died left unrecorded, found by
    the sweep's name (with ``write_back`` recorded in the sweep's record: adopted);
    else being handed over, or failed (``unhanded``)."""
    where = sweep.member(run.path)
    record = records.of(where) if where is not None else None
    found = _orphan(record, records) if record is not None and where is not None else None
    said = found.of(where.index, view.record.restarts or 0, record) if found and where and record else None
    if found is None or said is None or record is None or where is None:
        return unhanded(run, view, write_back)
    job, state = said
    if write_back:
        sweep.set_part(where.parent, where.stamp, found.number, job=found.job)
    return replace(view, record=amended(view.record, job=job), queue_state=state)


def _orphan(record: sweep.SweepRecord, records: sweep.Records) -> Optional[arrays.Orphan]:
    """The sweep's job a dead submit left unrecorded, asked once per sweep and refresh."""
    key = ("orphan", record.stamp, record.name)
    if key not in records.asked:
        records.asked[key] = arrays.orphan(record)
    return records.asked[key]


def _cancel_jobs(jobs: list[tuple[RunDir, RunRecord, str]], wait_s: float) -> list[str]:
    """``cancel_all``'s runs that have a job: asked to stop (run.json: rank 0 then records
    cancelled, not preempted), one scancel, then cancelled once their jobs left the queue."""
    tasks = {job for _, _, job in jobs}
    queued = slurmctl.queue_states(sorted(tasks))
    if queued is None:
        raise SlurmUnreachable("squeue did not answer: Slurm is unreachable from here; nothing was cancelled: run "
                               "`clusterjob cancel` again where squeue and scancel work")
    ids = _scancel_ids(tasks, queued)
    with batched():
        for run, _, _ in jobs:
            run.update(cancel_requested_at=now_iso())
    if ids and not slurmctl.cancel(*ids):
        raise SlurmUnreachable(f"scancel {' '.join(ids[:5])} failed: Slurm is unreachable from here (or refused "
                               "the cancel); run `clusterjob cancel` again where scancel works")
    deadline = time.monotonic() + wait_s
    while (left := slurmctl.queue_states(sorted(tasks))) is None or tasks & left.keys():
        if time.monotonic() > deadline:
            return [f"scancel {' '.join(ids)}: {len(tasks & (left or {}).keys())} run(s) still ending: "
                    "`clusterjob status` shows them cancelled once they left the queue"]
        time.sleep(CANCEL_POLL_S)
    with batched():
        for run, _, _ in jobs:
            if run.read().status not in runstate.FINAL_STATUSES:
                run.update(runstate.cancel())
    return [f"scancel {' '.join(ids)}: {len(jobs)} run(s) cancelled" if ids else
            f"{len(jobs)} run(s) had left the queue already: marked cancelled"]


def _scancel_ids(tasks: set, queued: dict) -> list[str]:
    """What one scancel names for ``tasks`` still in the queue: an array's id where every
    task of it in the queue is one of them, else the tasks themselves."""
    arrays_of: dict[str, set] = {}
    for task in queued:
        arrays_of.setdefault(task.split("_")[0], set()).add(task)
    ids = []
    for array, members in sorted(arrays_of.items()):
        wanted = members & tasks
        if wanted and wanted == members:
            ids.append(array)
        else:
            ids += sorted(wanted)
    return ids


def _cancel_job(run: RunDir, job: str, wait_s: float) -> list[str]:
    """scancel (Slurm sends SIGTERM, then SIGKILL after KillWait), then wait until the job
    left the queue before the run is marked cancelled."""
    if not slurmctl.cancel(job):
        raise SlurmUnreachable(f"scancel {job} failed: Slurm is unreachable from here (or refused the cancel); "
                               f"the run is not marked cancelled: run `clusterjob cancel {run.path}` again "
                               "where scancel works")
    run.update(cancel_requested_at=now_iso())
    deadline = time.monotonic() + wait_s
    while (queued := slurmctl.queue_states([job])) is None or job in queued:
        if time.monotonic() > deadline:
            return [f"cancelled Slurm job {job}; it is still ending (state {(queued or {}).get(job, 'unknown')}): "
                    "`clusterjob status` shows it cancelled once it left the queue"]
        time.sleep(CANCEL_POLL_S)
    run.update(runstate.cancel())
    return [f"cancelled Slurm job {job}"]


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _teardown(runs_file: Path) -> list[str]:
    """The line after srun in the job script ($? is then srun's exit status); every path
    quoted, as output.root may hold spaces or shell characters."""
    command = [sys.executable, "-m", "clusterjob.launch.executors.slurm", "finalize", str(runs_file)]
    return [f'{shlex.join(command)} "${{SLURM_ARRAY_TASK_ID:-0}}" "$?"']


@dataclass(frozen=True)
class Request:
    """What a submission sends to Slurm: one sbatch script per part of its runs (a job
    array, or one job), each given to ``sbatch --parsable`` in turn. ``--dry-run`` prints
    it; ``start`` builds it by the same function (``request``) and sends it."""

    scripts: tuple[str, ...]

    def lines(self) -> list[str]:
        return list(self.scripts)


def request(spec: Spec, folder: Path, name: str, parts: Sequence[tuple[Path, Optional[int]]],
            after_jobs: Sequence[str] = (), task: Task = RANKS) -> Request:
    """The request of ``parts`` (each: the runs file its tasks read, and its array's task
    count, None for one job) of a submission named ``name`` (its sweep's id), each job
    waiting for ``after_jobs``, its tasks running ``task``."""
    return Request(tuple(_render(spec, folder, runs_file, array, after_jobs, name, task)
                         for runs_file, array in parts))


def scripts(spec: Spec, points: int, folder: Path, after_jobs: Sequence[str] = (),
            array_max: Optional[int] = None, task: Task = RANKS) -> list[str]:
    """The sbatch script(s) a submission of ``points`` runs would send (``--dry-run``: the
    runs file and the sweep's stamp are named, not made), each array at most
    ``array_max`` tasks (None: as many as the cluster's MaxArraySize allows)."""
    size = _array_max(points, task) if array_max is None else array_max
    runs_file = folder / "<stamp>.p<part>.runs.json"
    parts = [(runs_file, arrays.array_of(len(part))) for part in chunks(list(range(points)), size)]
    return request(spec, folder, _job_name(spec, task, spec.name, "<stamp>"), parts, after_jobs, task).lines()


def _job_name(spec: Spec, task: Task, name: str, stamp: str) -> str:
    """The jobs' name: their sweep's id (``name``-``stamp``), or the spec's own name for
    tasks per allocation (a search's slots: the search's name)."""
    return spec.name if task.per == PER_ALLOCATION else sweep.sweep_id(name, stamp)


def _array_max(points: int, task: Task) -> int:
    """The most tasks of one array for ``points`` runs: the cluster's MaxArraySize, except
    for tasks per allocation (a search's slots), which go in one array whatever its size
    (one job to follow, cancel and account for; sbatch refuses one too large)."""
    from clusterjob.launch.preflight import array_size

    return max(1, points) if task.per == PER_ALLOCATION else array_size(points)


def _render(spec: Spec, folder: Path, runs_file: Path, array: Optional[int], after_jobs: Sequence[str],
            name: str, task: Task = RANKS) -> str:
    """The script of one job (an array of ``array`` tasks) running the runs ``runs_file``
    lists, named ``name`` (its sweep's id): submitit's, as its executor would write it.
    submitit 1.5 has no public call that renders a script without submitting it, so this
    is the one place that calls its private ``_make_sbatch_string``; the task command is
    clusterjob's own, so that no file per task is needed (clusterjob.launch.arrays).
    A task per allocation is the batch script's own command (no srun), on the host, and
    records its own end (no teardown); its array runs every task at once."""
    from submitit.slurm import slurm

    per_rank = task.per == PER_RANK
    params = {**submitit_parameters(spec, _teardown(runs_file) if per_rank else [], after_jobs), "job_name": name}
    args = ["--runs", str(runs_file)]
    if spec.container is None or not per_rank:
        command = shlex.join([sys.executable, "-u", "-m", task.module, *args])
    else:
        command, srun_options = _in_container(spec, args)
        params["srun_args"] = [*params["srun_args"], *srun_options]
    if not per_rank and array:
        params["array_parallelism"] = array
    return slurm._make_sbatch_string(command=command, folder=folder, map_count=array, use_srun=per_rank, **params)


def _in_container(spec: Spec, args: list[str]) -> tuple[str, tuple[str, ...]]:
    """Each task's command in the spec's container, and the options srun gets for it
    (pyxis): a runtime other than pyxis is started by the task's host side, which
    carries clusterjob's variables in (clusterjob.taskenv.container)."""
    wrapped = containers.wrapped(spec, containers.chosen(spec, slurm=True))
    host = host_command(spec.env) if wrapped.carried_by_host else []
    return shlex.join([*host, *wrapped.command(args)]), wrapped.srun_options


def submit_runs(spec: Spec, runs: list[RunDir], after_jobs: Sequence[str] = (), task: Task = RANKS) -> list[str]:
    """Submit ``runs`` (one job, or arrays of at most MaxArraySize tasks), each waiting
    for ``after_jobs``, their tasks running ``task``; the sweep's record (or, for runs of
    no sweep, each run.json) gets each part's job id (``<array>_<task>`` for a run of an
    array). Returns the job ids in run order."""
    folder = runs[0].path.parent / ".slurm"
    folder.mkdir(exist_ok=True)
    where = sweep.member(runs[0].path)
    name = _job_name(spec, task, runs[0].path.parent.name, where.stamp if where else runs[0].run_id)
    planned = arrays.plan(runs, _array_max(len(runs), task), folder)
    with scrubbed_environ():
        parts = [(part.runs_file, arrays.array_of(len(part.runs))) for part in planned]
        sent = request(spec, folder, name, parts, after_jobs, task)
        return arrays.submit(planned, sent.scripts, lambda said: refusal(spec, said))


# sbatch's words for a request this cluster cannot take, and the spec key that asked for it
# (the first named wins: "Invalid account or account/partition combination" is the account's).
_REFUSED_KEYS = (("account", "resources.account"), ("partition", "resources.partition"),
                 ("qos", "resources.qos"), ("feature", "resources.constraint"),
                 ("generic resource", "resources.gpus_per_node"), ("gres", "resources.gpus_per_node"),
                 ("time limit", "resources.time_min"), ("memory", "resources.mem_gb"),
                 ("node count", "resources.nodes"), ("processors", "resources.cpus_per_task"))
_REFUSED = re.compile(r"invalid|not available|not permitted|than permitted|denied|exceeds", re.IGNORECASE)


def refusal(spec: Spec, said: str) -> Exception:
    """The error of a submission that failed (``said``: what sbatch said): bad input
    (exit 2) naming the spec key when sbatch refused what the spec asked for (an
    account, a partition, a time limit the cluster does not have), else a Failure
    (exit 1: the controller is down, ...)."""
    reason = _sbatch_reason(said)
    if not _REFUSED.search(reason):
        return Failure(f"sbatch failed: {reason}")
    key = next((key for word, key in _REFUSED_KEYS if word in reason.lower()), "resources")
    name = key.partition(".")[2]
    holder = SlurmOptions.of(spec) if name in SlurmOptions.keys() else spec.resources
    value = f" ({key}: {getattr(holder, name)!r})" if name else ""
    return BadInput(f"{key}: sbatch refused the job: {reason}{value}; use a value this cluster offers "
                    "(sinfo, sacctmgr show assoc user=$USER) or leave it out for the default")


def _sbatch_reason(text: str) -> str:
    """sbatch's reason ("Invalid partition name specified") from its error output."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "submission failed:" in line:
            return line.split("submission failed:", 1)[1].strip()
    return lines[-1].removeprefix("sbatch: error: ") if lines else "no reason given"


def finalize(runs_file: str, index: str, srun_status: str) -> int:
    """After srun, in the job script clusterjob renders: ``settle`` the run of this array task."""
    run = RunDir(sweep.task_run(runs_file, int(index)))
    info = sweep.resolved(run.path, run.read())  # its job, where its ranks never recorded it
    if info.log_dir is None:  # where the job script's logs are: beside the runs file
        info = replace(info, log_dir=str(Path(runs_file).parent))
    return settle(run, srun_status, _batch_log(info), info)


def settle(run: RunDir, srun_status: str, batch_log: str, info: Optional[RunRecord] = None) -> int:
    """After srun, in the job script (clusterjob's, or the raw templates' teardown):
    record how a session that srun ended badly ended, naming the rank that ended it
    (``ended_rank``: srun's report in ``batch_log``, the job script's stderr, or
    torchrun's), retry it when the machine failed it (``resources.max_retries``), and
    exit 0 only for a completed run, so that Slurm counts the job failed otherwise (a
    job waiting for it with afterok then never starts). ``info``: its run.json with
    what its sweep's record adds (default: as read now)."""
    info = info or run.read()
    log = session_log(batch_log)
    if srun_status != "0" and _unsettled(run, info, log):
        stalled = stalls.verdict(info)  # the health watchdog ended the tasks: retry off the culprit's node, or stop
        cause = _record_end(run, info, srun_status, log) if stalled is None else \
            stalls.reason(stalled) if stalled.action == "retry" else None
        exclude = [stalled.host] if stalled is not None and stalled.host else []
        exclude = exclude or retry.faulty_hosts(rank_errors(run))  # a rank's GPU or driver failed there
        if cause is not None:  # the machine failed it: its node goes on the list of bad nodes
            _list_nodes(run, exclude or _killed_on(run, log), cause)
        if cause is not None and _retried(run, cause, exclude):
            return 0
    outgrown = _outgrown(run, run.read(), log)
    if outgrown is not None:
        resubmit(run, *outgrown)
    return 0 if run.read().status == runstate.COMPLETED else 1


def _list_nodes(run: RunDir, nodes: list[str], cause: str) -> None:
    """The nodes that failed the run on the list of bad nodes; where none is named, the
    nodes of the ranks that raised NCCL errors are suspects (listed after two runs)."""
    root = badnodes.root_of(run.path)
    if nodes:
        badnodes.add(root, nodes, cause, run.path)
    else:
        badnodes.suspect(root, retry.nccl_hosts(rank_errors(run)), cause, run.path)


def _killed_on(run: RunDir, log: str) -> list[str]:
    """The node of the rank a signal nobody sent ended (srun's report), if any."""
    end = ended_rank(run, log)
    return [end.node] if end is not None and end.by_signal and not end.memory and end.node else []


def _outgrown(run: RunDir, info: RunRecord, log: str) -> Optional[tuple[str, str]]:
    """(kind, cause) of a session that ended for want of resources its spec may give it
    (retry.OOM, TIMEOUT, GPU_OOM), else None: a rank killed out of memory, a rank's
    torch OutOfMemoryError, a time limit's stop that the runner did not requeue for want
    of a checkpoint (retry.resubmits_timeout)."""
    if info.status == runstate.TIMEOUT:
        spec = load_spec(run.spec_file)
        if retry.resubmits_timeout(run, spec.resources.on_timeout is not None):
            return retry.TIMEOUT, "timed out with no checkpoint to go on from"
        return None
    if info.status != runstate.FAILED:
        return None
    end = ended_rank(run, log)
    if end is not None and end.memory:
        return retry.OOM, f"{end.said}: out of memory"
    return retry.out_of_memory(rank_errors(run), log)


def resubmit(run: RunDir, kind: str, cause: str) -> bool:
    """Submit a run that outgrew its request again, as a new job of its own (a run of an
    array leaves the array as it is), with what its spec's rule for ``kind`` gives
    (retry.escalate: the one decision); False where the spec asks for none, none is
    left, or sbatch refused."""
    spec = load_spec(run.spec_file)
    asked = escalation.policy(spec, kind)
    if asked is None:
        return False
    found = sweep.job_of(run.path, run.read())
    decision = retry.escalate(run, asked[0], cause, asked[1], job=found.id if found is not None else None)
    if decision.new is None:  # the run is failed with the line already
        print(f"clusterjob: {decision.line}", file=sys.stderr)
        return False
    try:
        shrunk = {key: value for key, value in decision.new.items() if key not in ("mem_gb", "time_min")}
        if shrunk:  # on_gpu_oom's keys: the run's next start reads them from its spec.yaml
            rewrite_keys(run.spec_file, shrunk)
        _unlink_logs(run)
        (job,) = submit_runs(escalation.resized(spec, decision.record), [run])
    except (BadInput, Failure, SlurmUnreachable) as err:
        run.update(runstate.fail(RunError(None, f"{decision.line}, but sbatch failed: {err}")))
        return False
    print(f"clusterjob: {decision.line}: job {job}", file=sys.stderr)
    return True


def _unlink_logs(run: RunDir) -> None:
    """Drop the run's links to the old job's rank logs: the new job's ranks link theirs
    (rundir.link_rank_logs makes a link only where none is); the old logs stay in .slurm/."""
    for link in [*run.logs.glob("rank*.out"), *run.logs.glob("rank*.err")]:
        if link.is_symlink():
            link.unlink(missing_ok=True)


@dataclass(frozen=True)
class RankEnd:
    """A rank that ended a session by itself, as its launcher reported it: ``said`` names
    it and how it ended ("task 1 on node2: Killed", "rank 1 on node1 was killed by
    SIGKILL"), ``message`` is the run's error line; ``by_signal`` it was killed (else it
    exited non-zero); ``memory``: Slurm's out-of-memory kill (a retry would end the same way)."""

    rank: int
    said: str
    message: str
    by_signal: bool
    memory: bool = False
    node: Optional[str] = None  # where it ran, as its launcher said


def ended_rank(run: RunDir, log: str) -> Optional[RankEnd]:
    """The rank that ended this session (``log``: its part of the job script's stderr):
    a task srun reports as ended by a signal of its own, else the root cause torchrun
    reported in its node's log (under the torchrun template, srun sees only torchrun
    exit), else the first task srun reports as exited non-zero."""
    killed = killed_task(log)
    if killed is not None:
        rank, node, reason = killed
        said = f"task {rank} on {node}: {reason}"
        memory = retry.MEMORY_KILL.match(reason) is not None or (reason == "Killed" and retry.MEMORY_KILL.search(log))
        how = "out of memory: Slurm ended it over its memory request" if memory else "ended by a signal"
        return RankEnd(rank, said, f"{said} ({how}, no traceback)", True, memory=bool(memory), node=node)
    found = torchrun_root_cause(run)
    if found is not None:
        return found
    for node, rank, reason in _SRUN_TASK_ERROR.findall(log):
        code = _EXIT_CODE.match(reason)
        if code:
            said = f"task {rank} on {node}: exited with code {code.group(1)}"
            return RankEnd(int(rank), said, f"{said} (no traceback)", False)
    return None


def torchrun_root_cause(run: RunDir) -> Optional[RankEnd]:
    """The "Root Cause (first observed failure)" that torchrun's agent printed in this
    session of its node's log (the files the run's ``logs/rank*.err`` point at): the
    rank, its host, and its exit status (negative: the signal)."""
    seen = set()
    for link in sorted(run.logs.glob("rank*.err")):
        path = link.resolve()
        if path in seen:
            continue
        seen.add(path)
        found = _ROOT_CAUSE.search(session_log(log_tail(path)))
        if found:
            rank, code = int(found["rank"]), int(found["code"])
            said = f"rank {rank} on {found['host']} {procs.ended(code)}"
            return RankEnd(rank, said, f"{said} (no traceback)", code < 0)
    return None


def log_tail(path: Path, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a log, as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _unsettled(run: RunDir, info: RunRecord, log: str) -> bool:
    """Whether the record may not yet say how a session srun ended badly ended: pending,
    running, failed (the cause may be a task killed without a word), or a stop the others
    recorded as srun (or torchrun) ended the step for a rank that ended by itself
    (--kill-on-bad-exit sends the others SIGTERM: a preemption or a time limit never
    lets this line run)."""
    if info.status in (*runstate.ACTIVE, runstate.FAILED):
        return True
    return info.status in runstate.STOPPED and ended_rank(run, log) is not None


def _record_end(run: RunDir, info: RunRecord, srun_status: str, log: str) -> Optional[str]:
    """Record a rank that died without a traceback (killed by a signal) as the cause, over
    the other ranks' collateral "connection closed" errors, and mark a run that is still
    pending/running (or stopped by srun for that rank) as failed. Why the machine failed
    the session, or None."""
    end = ended_rank(run, log)
    named = None
    if end is not None and end.by_signal and not run.error_file(end.rank).exists():
        run.update(runstate.fail(RunError(end.rank, end.message, last_words(run, end.rank))))
        named = None if end.memory else end.said
    elif info.status != runstate.FAILED:
        run.update(runstate.fail(first_error(run) or _exited(run, end, srun_status)))
    if end is not None and end.by_signal and named is None:
        return None  # the job's own memory (or a traceback): a retry would end the same way
    return retry.machine_cause(named, rank_errors(run), exit_codes(log))


def _exited(run: RunDir, end: Optional[RankEnd], srun_status: str) -> RunError:
    """With no traceback anywhere: the rank reported as exited non-zero, else srun's own status."""
    if end is not None and not end.by_signal:
        return RunError(end.rank, end.message, last_words(run, end.rank))
    return RunError(None, f"srun exited with status {srun_status}: a task was killed or failed "
                          f"(see `clusterjob logs {run.path}`)")


def _retried(run: RunDir, cause: str, exclude: Sequence[str] = ()) -> bool:
    """Requeue the job of a run the machine failed, when a retry is left (retry.decide):
    its start held back by the back-off (or Slurm's own delay, when longer), and kept
    off the nodes of ``exclude`` (a stall's culprit; run.json's ``excluded_hosts``)
    before it may start."""
    resources = load_spec(run.spec_file).resources
    found = sweep.job_of(run.path, run.read())
    job = found.id if found is not None and found.executor == SLURM else None
    if job is None:
        return False
    decision = retry.decide(run, cause, resources.max_retries, resources.retry_backoff_s)
    if decision is None or decision.number is None:
        if decision is not None:
            print(f"clusterjob: {decision.line}", file=sys.stderr)
        return False
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue ends this script: the lines after it still run
    requeued = slurmctl.requeue(job, hold=True) if exclude else slurmctl.requeue(job)
    if not requeued:
        run.update(runstate.fail(RunError(
            None, f"{cause}; retry {decision.number} could not requeue job {job} (scontrol requeue failed)")))
        return False
    if exclude:
        _exclude(run, job, exclude)
    slurmctl.start_later(job, decision.wait_s)
    if exclude:
        slurmctl.release(job)  # held until it was kept off the culprit's node
    print(f"clusterjob: {decision.line}: job {job} requeued", file=sys.stderr)
    return True


def _exclude(run: RunDir, job: str, hosts: Sequence[str]) -> None:
    """Keep the held, requeued job off ``hosts`` and the hosts excluded before; recorded
    in run.json once Slurm took it."""
    excluded = sorted({*run.read().excluded_hosts, *hosts})
    if slurmctl.exclude_nodes(job, excluded):
        run.update(excluded_hosts=excluded)
    else:
        print(f"clusterjob: could not keep job {job} off {','.join(excluded)} (scontrol update failed)",
              file=sys.stderr)


_SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
# torch.distributed.elastic's error summary (its _FAILURE_FORMAT_TEMPLATE), first observed failure
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\n\s*\[\d+\]:\s*\n(?:\s*time\s*:.*\n)?"
                         r"\s*host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\b.*\n"
                         r"\s*exitcode\s*:\s*(?P<code>-?\d+)")


def session_log(batch_log: str) -> str:
    """What the job script's stderr holds of its latest session (the log is appended to
    by each session of a requeued job; each starts with SESSION_MARK)."""
    start = batch_log.rfind(SESSION_MARK)
    return batch_log[start:] if start >= 0 else batch_log


def killed_task(batch_log: str) -> Optional[tuple[int, str, str]]:
    """(rank, node, reason) of the first task srun reports as ended by a signal of its own;
    "Exited with exit code" (a traceback exists) and "Terminated" (srun's own kill of the
    other tasks) are not causes."""
    for node, rank, reason in _SRUN_TASK_ERROR.findall(batch_log):
        if not reason.startswith(("Exited with exit code", "Terminated")):
            return int(rank), node, reason.strip()
    return None


def exit_codes(batch_log: str) -> list[int]:
    """The exit statuses srun reports for its tasks (2: bad input)."""
    return [int(code) for *_, reason in _SRUN_TASK_ERROR.findall(batch_log) for code in _EXIT_CODE.findall(reason)]


def _batch_log(info: RunRecord) -> str:
    """The batch script's stderr, where srun reports its tasks (submitit: task 0's file)."""
    path = Path(info.log_dir or ".") / f"{info.slurm_job_id}_0_log.err"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


if __name__ == "__main__":
    if sys.argv[1:2] == ["finalize"]:
        sys.exit(finalize(*sys.argv[2:5]))
    sys.exit(f"usage: {sys.argv[0]} finalize RUNS_FILE INDEX SRUN_STATUS")
