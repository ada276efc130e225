"""Slurm executor through submitit: one job per run, one job array per sweep.

``start`` submits run folders that already exist and records each one's job id in its
run.json; waiting and reports are the caller's (clusterjob.launch.submit). Every task runs
``RunTask``: ``python -m clusterjob.run`` on its run folder's spec.yaml, which owns SIGUSR2
(it checkpoints and requeues the array task itself), so the same behaviour holds for the
raw sbatch templates. A teardown line after srun records a run that ended without saying
so (a task killed by a signal) as failed in its run.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Optional

from clusterjob.core import env as envmod
from clusterjob.core import slurmctl
from clusterjob.core.errors import BadInput, Failure
from clusterjob.core.rundir import RunDir, RunError, RunRecord, mark_failed, now_iso, tail_lines
from clusterjob.launch.resources import submitit_parameters
from clusterjob.spec.schema import Spec


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


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _teardown(runs_file: Path) -> list[str]:
    """The line after srun in the job script ($? is then srun's exit status); every path
    quoted, as output.root may hold spaces or shell characters."""
    command = [sys.executable, "-m", "clusterjob.launch.slurm", "finalize", str(runs_file)]
    return [f'{shlex.join(command)} "${{SLURM_ARRAY_TASK_ID:-0}}" "$?"']


def _executor(spec: Spec, folder: Path, runs_file: Path):
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.resources.max_requeues)
    executor.update_parameters(**submitit_parameters(spec, _teardown(runs_file)))
    return executor


def scripts(spec: Spec, points: int, folder: Path) -> list[str]:
    """The sbatch script(s) a submission of ``points`` runs would send (``--dry-run``)."""
    from submitit.slurm import slurm

    params = submitit_parameters(spec, _teardown(folder / "<stamp>.runs.json"))
    command = shlex.join([sys.executable, "-u", "-m", "submitit.core._submit", str(folder)])
    return [slurm._make_sbatch_string(command=command, folder=folder, map_count=len(part) if points > 1 else None,
                                      **params)
            for part in chunks(list(range(points)), slurmctl.max_array_size())]


def start(spec: Spec, runs: list[RunDir]) -> list[str]:
    """Submit ``runs`` (one job, or arrays of at most MaxArraySize tasks); each run.json
    gets its job id (``<array>_<task>`` for arrays). Returns the job ids in run order."""
    folder = runs[0].path.parent / ".slurm"
    folder.mkdir(exist_ok=True)
    with envmod.scrubbed_environ():
        for part in chunks(runs, slurmctl.max_array_size()):
            _submit_part(spec, part, folder)
    return [str(run.read().slurm_job_id) for run in runs]


def _submit_part(spec: Spec, runs: list[RunDir], folder: Path) -> None:
    runs_file = folder / f"{runs[0].run_id}.runs.json"
    before = set(os.listdir(folder))
    try:
        runs_file.write_text(json.dumps([str(r.path.resolve()) for r in runs]))
        jobs = _sbatch(spec, runs, folder, runs_file)
    except BaseException as err:
        _remove_leftovers(folder, before)
        if isinstance(err, (OSError, RuntimeError)):  # submitit's errors are RuntimeErrors
            raise refusal(spec, err) from None
        raise
    for run, job in zip(runs, jobs):
        run.update(executor="slurm", slurm_job_id=job.job_id, log_dir=str(folder.resolve()))
        _link_logs(run, folder, job.job_id, spec.world_size)


def _sbatch(spec: Spec, runs: list[RunDir], folder: Path, runs_file: Path) -> list:
    """submitit's jobs of ``runs``; submitit echoes a refusing sbatch's stderr, which the
    error says once (``refusal``)."""
    executor = _executor(spec, folder, runs_file)
    with contextlib.redirect_stderr(io.StringIO()):
        if len(runs) == 1:
            return [executor.submit(RunTask(str(runs[0].spec_file.resolve())))]
        with executor.batch():
            jobs = [executor.submit(RunTask(str(r.spec_file.resolve()))) for r in runs]
        return jobs


def _remove_leftovers(folder: Path, before: set) -> None:
    """The files a submission that failed left in ``folder``: its runs file, submitit's
    pickles and sbatch script (named by a fresh uuid each, so never another's)."""
    for name in set(os.listdir(folder)) - before:
        if name.endswith((".runs.json", ".pkl")) or name.startswith(".submission_file_"):
            with contextlib.suppress(OSError):
                (folder / name).unlink()


# sbatch's words for a request this cluster cannot take, and the spec key that asked for it
# (the first named wins: "Invalid account or account/partition combination" is the account's).
_REFUSED_KEYS = (("account", "resources.account"), ("partition", "resources.partition"),
                 ("qos", "resources.qos"), ("feature", "resources.constraint"),
                 ("generic resource", "resources.gpus_per_node"), ("gres", "resources.gpus_per_node"),
                 ("time limit", "resources.time_min"), ("memory", "resources.mem_gb"),
                 ("node count", "resources.nodes"), ("processors", "resources.cpus_per_task"))
_REFUSED = re.compile(r"invalid|not available|not permitted|than permitted|denied|exceeds", re.IGNORECASE)


def refusal(spec: Spec, err: Exception) -> Exception:
    """The error of a submission that failed: bad input (exit 2) naming the spec key when
    sbatch refused what the spec asked for (an account, a partition, a time limit the
    cluster does not have), else a Failure (exit 1: the controller is down, ...)."""
    if isinstance(err, OSError):
        return Failure(f"sbatch could not run: {err.strerror or err}; check that Slurm's commands work here")
    reason = _sbatch_reason(str(err))
    if not _REFUSED.search(reason):
        return Failure(f"sbatch failed: {reason}")
    key = next((key for word, key in _REFUSED_KEYS if word in reason.lower()), "resources")
    name = key.partition(".")[2]
    value = f" ({key}: {getattr(spec.resources, name)!r})" if name else ""
    return BadInput(f"{key}: sbatch refused the job: {reason}{value}; use a value this cluster offers "
                    "(sinfo, sacctmgr show assoc user=$USER) or leave it out for the default")


def _sbatch_reason(text: str) -> str:
    """sbatch's reason ("Invalid partition name specified") from its error output."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "submission failed:" in line:
            return line.split("submission failed:", 1)[1].strip()
    return lines[-1].removeprefix("sbatch: error: ") if lines else "no reason given"


def _link_logs(run: RunDir, folder: Path, job_id: str, world: int) -> None:
    """``<run>/logs/rank<N>.out`` -> submitit's per-task files, so each run holds its logs."""
    for rank in range(world):
        for kind in ("out", "err"):
            link = run.logs / f"rank{rank}.{kind}"
            if not (link.exists() or link.is_symlink()):
                link.symlink_to(folder.resolve() / f"{job_id}_{rank}_log.{kind}")


def finalize(runs_file: str, index: str, srun_status: str) -> int:
    """After srun: record a task that died without a traceback (killed by a signal) as the
    cause, over the other ranks' collateral "connection closed" errors; and mark a run
    that is still pending/running as failed."""
    run = RunDir(Path(json.loads(Path(runs_file).read_text())[int(index)]))
    info = run.read()
    if srun_status == "0" or info.status not in ("pending", "running", "failed"):
        return 0
    killed = killed_task(_batch_log(info))
    if killed and not run.error_file(killed[0]).exists():
        rank, node, reason = killed
        run.update(status="failed", finished_at=now_iso(), error=RunError(
            rank, f"task {rank} on {node}: {reason} (ended by a signal, no traceback)",
            "\n".join(tail_lines(run.logs / f"rank{rank}.err", 20))))
    elif info.status != "failed":
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
