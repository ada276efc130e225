"""``clusterjob submit`` and ``clusterjob resume``: validate everything, make (or reopen) the
run folders, hand them to an executor (clusterjob.launch), and with ``--wait`` follow
them to the end: one summary line per run, then the report.

All checks run before anything is written, so bad input changes nothing on disk; a
submission that fails after its run folders were made and before the executor has them
(sbatch refusing the job, a snapshot that cannot be copied, Ctrl-C) leaves none of them
``pending`` (clusterjob.launch.handover).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from clusterjob.core import claim, metrics, procs, units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.rundir import FINAL_STATUSES, RunDir, RunRecord, make_runs
from clusterjob.launch.handover import Window
from clusterjob.spec.schema import Spec, SweepPoint, check_paths, dump_spec, expand_sweep, load_spec

POLL_FIRST_S, POLL_MAX_S = 2.0, 30.0  # Slurm polls back off from the first to the longest wait


def slurm_reachable(timeout_s: float = 10.0) -> bool:
    """True when ``sbatch`` exists and the controller answers."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_executor(requested: str) -> str:
    if requested == "auto":
        return "slurm" if slurm_reachable() else "local"
    if requested == "slurm" and not slurm_reachable():
        raise BadInput("--executor slurm: Slurm is not reachable from here (sbatch/sinfo missing or the "
                       "controller does not answer); check SLURM_CONF, or use --executor local")
    return requested


def check_local(spec: Spec) -> None:
    """What this machine must offer a local run, checked before any process starts."""
    if spec.resources.nodes > 1:
        raise BadInput(f"resources.nodes: {spec.resources.nodes} nodes cannot run with the local executor, "
                       "which uses this machine only; submit to Slurm (--executor slurm) or set "
                       "--set resources.nodes=1")
    if spec.resources.gpus_per_node > 0:  # on CPU the runner hides the GPUs: nothing to count
        from clusterjob.launch import local

        visible, where = local.gpus_here(os.environ)
        local.check_gpus(spec.resources.tasks_per_node, spec.resources.gpus_per_node, visible, where)


def submit(spec_path: str, overrides: list[str], executor: str = "auto", wait: bool = False,
           dry_run: bool = False, preflight: bool = True) -> int:
    """``clusterjob submit``: exit status 0 when submitted (with --wait: all completed)."""
    spec = load_spec(spec_path, overrides)
    points = expand_sweep(spec)
    check_paths(spec)
    executor = choose_executor(executor)
    if executor == "local":
        check_local(spec)
    elif preflight and not dry_run:
        _refuse_failed_preflight(spec, len(points))
    if dry_run:
        return _dry_run(spec, points, executor)
    snap = _snapshot_plan(spec)
    with Window(parent=Path(spec.output.root) / spec.name) as window:
        runs = window.hold(make_runs(Path(spec.output.root), spec.name,
                                     [(p.index, dump_spec(p.spec), p.run_params) for p in points],
                                     claim_as="clusterjob submit", executor=executor,
                                     **_origin()))  # resume's executor, if the start fails
        if snap is not None:
            from clusterjob.launch import snapshot

            snapshot.take(snap, points, runs)
        return _start(spec, runs, executor, wait, window)


def preflight_checks(spec: Spec, points: int) -> list:
    """The cluster's answers for ``spec`` (clusterjob.launch.preflight), read-only."""
    from clusterjob.launch import preflight, slurm

    scripts = slurm.scripts(spec, points, Path(spec.output.root) / spec.name / ".slurm")
    return preflight.run_checks(spec, points, scripts)


def cluster_preflight(spec: Spec, points: int) -> int:
    """``validate --cluster``: one line per check; exit 2 when any failed."""
    choose_executor("slurm")
    checks = preflight_checks(spec, points)
    for check in checks:
        print(check.line())
    failed = sum(not c.ok for c in checks)
    print(f"{'ok' if not failed else 'refused'}: {len(checks) - failed} of {len(checks)} checks passed",
          file=sys.stderr)
    return 2 if failed else 0


def _refuse_failed_preflight(spec: Spec, points: int) -> None:
    failed = [c for c in preflight_checks(spec, points) if not c.ok]
    for check in failed:
        print(check.line(), file=sys.stderr)
    if failed:
        raise BadInput(f"the cluster would refuse or never run these jobs ({len(failed)} preflight check(s) failed, "
                       "above); fix the spec, or pass --no-preflight to submit anyway")


def _snapshot_plan(spec: Spec):
    if spec.entrypoint is None or not spec.entrypoint.snapshot:
        return None
    from clusterjob.launch import snapshot

    return snapshot.plan(spec)


def _origin() -> dict:
    """Where the submission came from: its folder (the runs' working directory) and commit."""
    from clusterjob.core.provenance import git_sha

    return {"submit_dir": os.getcwd(), "git_sha": git_sha()}


def _dry_run(spec: Spec, points: list[SweepPoint], executor: str) -> int:
    if executor == "local":
        for point in points:
            print(f"would run {spec.resources.tasks_per_node} local processes: "
                  f"python -m clusterjob.run <run>/spec.yaml  params={point.run_params}")
        return 0
    from clusterjob.launch import slurm

    folder = Path(spec.output.root) / spec.name / ".slurm"
    for script in slurm.scripts(spec, len(points), folder):
        print(script)
    return 0


def _start(spec: Spec, runs: list[RunDir], executor: str, wait: bool, window: Window) -> int:
    """Hand the runs (claimed by this process) to the executor, closing the ``window``;
    that ends the claims: a Slurm run's once its job id is recorded, a local run's with
    the run (the supervisor takes them over); with ``wait``, follow them to the end and
    report."""
    if executor == "local":
        return _start_local(spec, runs, wait, window)
    from clusterjob.launch import slurm

    with window.handing_over():
        job_ids = slurm.start(spec, runs)
    claim.release(*(run.path for run in runs))  # handed over: the queue says whether they run
    for job_id, run in zip(job_ids, runs):
        print(f"{job_id}  {run.path}")
    if not wait:
        print(f"follow with: clusterjob status {runs[0].path.parent}")
        return 0
    return _finish(runs, wait_slurm(runs))


def _start_local(spec: Spec, runs: list[RunDir], wait: bool, window: Window) -> int:
    from clusterjob.launch import local

    world = spec.resources.tasks_per_node
    if not wait:
        with window.handing_over():
            pid = local.detach(runs, world)
        claim.release(*(run.path for run in runs))  # the supervisor holds them now
        for run in runs:
            print(f"{run.path}  (local, supervisor pid {pid})")
        print(f"follow with: clusterjob status {runs[0].path.parent}")
        return 0
    line = LiveLine(sys.stdout)
    for run in runs:
        run.update(executor="local", launcher=procs.current())  # this process is their supervisor
    window.close()  # this process supervises the runs: its Supervisor owns the stop signals from here
    supervisor = local.Supervisor(world, on_tick=lambda run: line.show(local.last_progress(run))).install()
    infos = []
    for run in runs:
        infos += supervisor.run_all([run])
        line.clear()
        print(summary_line(infos[-1], run))
    code = _finish(runs, infos, summaries=False)
    return 128 + supervisor.stop_signal if supervisor.stop_signal else code


def wait_slurm(runs: list[RunDir]) -> list[RunRecord]:
    """Poll until every run is final (run.json, reconciled with squeue/sacct and written
    back), waiting longer between polls as time goes on. Ctrl-C stops waiting, not the jobs."""
    from clusterjob.launch import control

    pause = POLL_FIRST_S
    try:
        while True:
            infos = [view.record for view in control.views(runs, write_back=True)]
            if all(i.status in FINAL_STATUSES for i in infos):
                return infos
            time.sleep(pause)
            pause = min(POLL_MAX_S, pause * 1.5)
    except KeyboardInterrupt:
        print(f"\nstopped waiting; the jobs go on: clusterjob status {runs[0].path.parent}", file=sys.stderr)
        raise


def _finish(runs: list[RunDir], infos: list[RunRecord], summaries: bool = True) -> int:
    """Summary lines (unless printed already) and the report; 0 when all completed."""
    if summaries:
        for run, info in zip(runs, infos):
            print(summary_line(info, run))
    print_report(runs)
    return 0 if all(i.status == "completed" for i in infos) else 1


class LiveLine:
    """One terminal line rewritten in place; on a pipe, a plain line every 10 s at most."""

    def __init__(self, stream) -> None:
        self.stream, self.tty, self.clock = stream, stream.isatty(), time.monotonic
        self.last, self.shown_at = None, 0.0

    def show(self, text) -> None:
        if not text or text == self.last:
            return
        if self.tty:
            self.stream.write("\r\033[K" + text[: shutil.get_terminal_size().columns - 1])
        elif self.clock() - self.shown_at >= 10:
            self.stream.write(text + "\n")
            self.shown_at = self.clock()
        self.last = text
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r\033[K")
            self.stream.flush()


def summary_line(info: RunRecord, run: RunDir) -> str:
    """`<run_id> completed val_acc 95.12% val_loss 0.163 epoch 5 -> <path>` (your own
    code: `train_loss 1.234 (step 20)`, its first metric), or the error; then the run's
    warnings, one line each."""
    final = info.final or {}
    parts = [run.run_id, str(info.status)]
    own = metrics.own_latest(run.path, info.entrypoint)
    for key in () if own else ("val_acc", "val_loss"):
        if isinstance(final.get(key), (int, float)):
            parts.append(f"{key} {units.quantity(key, final[key])}")  # one unit per quantity, as the report
    if own:
        parts.append(escape(str(own)))  # names from the code's own file: safe for a terminal
    elif "epoch" in final:
        parts.append(f"epoch {final['epoch']}")
    if info.error is not None:
        parts.append(f"error (rank {info.error.rank}): {info.error.message}")
    return "\n".join(["  ".join(parts) + f"  -> {run.path}", *(f"  warning: {escape(w)}" for w in info.warnings)])


def print_report(runs: list[RunDir]) -> None:
    """The report (markdown) of the runs just finished."""
    from clusterjob.report import build as report

    print()
    print(report.format_report([run.path for run in runs], fmt="md"))


# ----------------------------------------------------------------------------- resume


def resume(run_text: str, wait: bool = False) -> int:
    """``clusterjob resume RUN``: start a stopped, failed or timed-out run again in its own
    folder, from its last checkpoint, with the executor and resources it had. A run
    whose every process died without recording its end (kill -9, the OOM killer, a
    reboot) counts as stopped. The run is claimed (clusterjob.core.claim) from the check
    of its state until it is handed over, so of several resumes at once one starts it."""
    from clusterjob.launch import control

    run = control.resolve_run(run_text)
    control.readable_record(run)  # before anything is started or written
    _check_resumable(run)  # first without the claim: a refused resume makes no lock file
    spec = load_spec(run.spec_file)
    check_paths(spec)
    executor = "slurm" if run.read().executor == "slurm" else "local"
    if executor == "slurm":
        choose_executor("slurm")
    else:
        check_local(spec)
    with claim.claimed(run.path, "clusterjob resume"), Window(runs=[run]) as window:
        _check_resumable(run)  # again, now that no other command can start it
        restarts = run.read().restarts or 0
        run.update(reopen=True, status="pending", restarts=restarts + 1, finished_at=None, error=None,
                   launcher=None, cancel_requested_at=None, **({"slurm_job_id": None} if executor == "slurm" else {}))
        print(f"resuming {run.path} ({executor}) from its last checkpoint")
        return _start(spec, [run], executor, wait, window)


def _check_resumable(run: RunDir) -> None:
    """Bad input unless the run stopped: completed, or still running (its job in the
    queue, a process of it alive), it is refused. Reads only."""
    from clusterjob.launch import control

    (view,) = control.views([run])
    status = view.record.status
    if status == "completed":
        raise BadInput(f"{run.path} is completed; there is nothing to resume")
    live = control.still_running(run, view)
    if live:
        raise BadInput(f"{run.path} is {status} ({live}); resume continues a run that stopped: "
                       f"`clusterjob cancel {run.path}` first")
