"""Slurm executor through submitit: one job per run, one job array per sweep.

Every task runs ``RunTask``: ``python -m clusterjob.run`` on its run folder's spec.yaml,
which owns SIGUSR2 (clusterjob.preempt): it checkpoints and requeues the job itself, so the
same behaviour holds for the raw sbatch templates. A teardown line after srun records a run
that ended without saying so (a task killed by a signal) as failed in its run.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from clusterjob import env as envmod
from clusterjob.rundir import FINAL_STATUSES, RunDir, mark_failed, now_iso, tail_lines
from clusterjob.spec import Spec, SweepPoint

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to reach a step boundary


class RunTask:
    """The callable a submitit task runs (pickled by reference, so the submitting process
    never imports the trainer): it replaces the task's process with
    ``python -m clusterjob.run SPEC``, the entry every launch uses. The runner then owns
    the stop signals alone; submitit's own handlers go with the replaced process."""

    def __init__(self, spec_file: str) -> None:
        self.spec_file = spec_file

    def __call__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-u", "-m", "clusterjob.run", self.spec_file])


def slurm_parameters(spec: Spec, teardown: list[str]) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the spec's resources."""
    r = spec.resources
    params: dict[str, Any] = {
        "job_name": spec.name, "nodes": r.nodes, "ntasks_per_node": r.tasks_per_node,
        "cpus_per_task": r.cpus_per_task, "time": r.time_min,
        "signal_delay_s": min(SIGNAL_DELAY_S, r.time_min * 60 // 4),
        # Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation
        "setup": [*r.setup, f"export SRUN_CPUS_PER_TASK={r.cpus_per_task}"],
        "teardown": teardown,
        "srun_args": ["--kill-on-bad-exit=1"],  # one failed rank ends the step: no rank hangs
        "additional_parameters": {"requeue": True},
    }
    optional = {"gpus_per_node": r.gpus_per_node or None, "mem": f"{round(r.mem_gb * 1024)}M" if r.mem_gb else None,
                "partition": r.partition, "account": r.account, "qos": r.qos, "constraint": r.constraint,
                "array_parallelism": r.array_parallelism}
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def max_array_size() -> int:
    """The cluster's MaxArraySize (job arrays hold indices 0 .. MaxArraySize-1)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1001
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return 1001


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _teardown(runs_file: Path) -> list[str]:
    """The line after srun in the job script ($? is then srun's exit status)."""
    return [f'{sys.executable} -m clusterjob.launch.slurm finalize {runs_file} "${{SLURM_ARRAY_TASK_ID:-0}}" $?']


def _executor(spec: Spec, folder: Path, runs_file: Path):
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.resources.max_requeues)
    executor.update_parameters(**slurm_parameters(spec, _teardown(runs_file)))
    return executor


def dry_run(spec: Spec, points: list[SweepPoint]) -> int:
    """Print the sbatch script(s) submitit would submit; write nothing."""
    from submitit.slurm import slurm

    folder = Path(spec.output.root) / spec.name / ".slurm"
    params = slurm_parameters(spec, _teardown(folder / "<stamp>.runs.json"))
    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    for part in chunks(points, max_array_size()):
        print(slurm._make_sbatch_string(command=command, folder=folder,
                                        map_count=len(part) if len(points) > 1 else None, **params))
    return 0


def submit(spec: Spec, points: list[SweepPoint], args) -> int:
    if args.dry_run:
        return dry_run(spec, points)
    from clusterjob.submit import make_runs

    runs = make_runs(spec, points)
    folder = runs[0].path.parent / ".slurm"
    folder.mkdir(exist_ok=True)
    with envmod.scrubbed_environ():
        for part in chunks(runs, max_array_size()):
            _submit_part(spec, part, folder)
    for run in runs:
        print(f"{run.read_info().get('slurm_job_id')}  {run.path}")
    if not args.wait:
        print(f"follow with: clusterjob status {runs[0].path.parent}")
        return 0
    return wait_and_report(runs)


def _submit_part(spec: Spec, runs: list[RunDir], folder: Path) -> None:
    runs_file = folder / f"{runs[0].run_id}.runs.json"
    runs_file.write_text(json.dumps([str(r.path.resolve()) for r in runs]))
    executor = _executor(spec, folder, runs_file)
    if len(runs) == 1:
        jobs = [executor.submit(RunTask(str(runs[0].spec_file.resolve())))]
    else:
        with executor.batch():
            jobs = [executor.submit(RunTask(str(r.spec_file.resolve()))) for r in runs]
    for run, job in zip(runs, jobs):
        run.update(executor="slurm", slurm_job_id=job.job_id, log_dir=str(folder.resolve()))
        _link_logs(run, folder, job.job_id, spec.world_size)


def _link_logs(run: RunDir, folder: Path, job_id: str, world: int) -> None:
    """``<run>/logs/rank<N>.out`` -> submitit's per-task files, so each run holds its logs."""
    for rank in range(world):
        for kind in ("out", "err"):
            link = run.logs / f"rank{rank}.{kind}"
            if not link.exists():
                link.symlink_to(folder.resolve() / f"{job_id}_{rank}_log.{kind}")


def wait_and_report(runs: list[RunDir], poll_s: float = 2.0) -> int:
    """Block until every run is final (run.json, reconciled with the queue), then report."""
    from clusterjob import control
    from clusterjob.submit import print_report, summary_line

    while True:
        infos = control.refresh(runs)
        if all(i.get("status") in FINAL_STATUSES for i in infos):
            break
        time.sleep(poll_s)
    for run, info in zip(runs, infos):
        print(summary_line(info, run))
    print_report(runs)
    return 0 if all(i.get("status") == "completed" for i in infos) else 1


def finalize(runs_file: str, index: str, srun_status: str) -> int:
    """After srun: record a task that died without a traceback (killed by a signal) as the
    cause, over the other ranks' collateral "connection closed" errors; and mark a run
    that is still pending/running as failed."""
    run = RunDir(Path(json.loads(Path(runs_file).read_text())[int(index)]))
    info = run.read_info()
    if srun_status == "0" or info.get("status") not in ("pending", "running", "failed"):
        return 0
    killed = killed_task(_batch_log(info))
    if killed and not run.error_file(killed[0]).exists():
        rank, node, reason = killed
        run.update(status="failed", finished_at=now_iso(), error={
            "rank": rank, "message": f"task {rank} on {node}: {reason} (ended by a signal, no traceback)",
            "traceback": "\n".join(tail_lines(run.logs / f"rank{rank}.err", 20))})
    elif info.get("status") != "failed":
        mark_failed(run, f"srun exited with status {srun_status}: a task was killed or failed "
                         f"(see `clusterjob logs {run.path}`)")
    return 0


_SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)")


def killed_task(batch_log: str) -> Optional[tuple[int, str, str]]:
    """(rank, node, reason) of the first task srun reports as ended by a signal of its own;
    "Exited with exit code" (a traceback exists) and "Terminated" (srun's own kill of the
    other tasks) are not causes."""
    for node, rank, reason in _SRUN_TASK_ERROR.findall(batch_log):
        if not reason.startswith(("Exited with exit code", "Terminated")):
            return int(rank), node, reason.strip()
    return None


def _batch_log(info: dict) -> str:
    """The batch script's stderr, where srun reports its tasks (submitit: task 0's file)."""
    path = Path(info.get("log_dir") or ".") / f"{info.get('slurm_job_id')}_0_log.err"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


if __name__ == "__main__":
    if sys.argv[1:2] == ["finalize"]:
        sys.exit(finalize(*sys.argv[2:5]))
    sys.exit(f"usage: {sys.argv[0]} finalize RUNS_FILE INDEX SRUN_STATUS")
