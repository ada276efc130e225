"""What the raw sbatch templates run after srun (docs/design.md, "Executors and scripts"):

    "$PYTHON" -m clusterjob.launch.teardown "$status" "$@"

``$status`` is srun's exit status; the rest are the job script's arguments, which srun
gave every task: ``SPEC [--set KEY=VALUE ...] [--run-dir DIR] [--point N]``. The teardown
finds the run the job's tasks ran in by the runner's own rule (clusterjob.spec.task,
clusterjob.taskenv.jobrun) and settles it as submitit's jobs are settled
(clusterjob.launch.executors.slurm ``settle``): a rank killed by a signal, or one that
exited non-zero without a traceback, is named (from srun's report in the job script's
stderr, which is this process's stderr too, or torchrun's in its node's log), a failure
of the machine is retried (``resources.max_retries``), and the exit status is 0 only
for a completed run. Where the tasks made no run (bad input, which they said), srun's
status stands.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import RunDir, run_dir_of_spec
from clusterjob.launch.executors import slurm
from clusterjob.spec import task
from clusterjob.taskenv import jobrun
from clusterjob.taskenv.slurmjob import SlurmJob, slurm_job

PROG = "python -m clusterjob.launch.teardown SRUN_STATUS"


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isascii() or not argv[0].isdigit():
        print(f"usage: {PROG} SPEC [--set KEY=VALUE ...]", file=sys.stderr)
        return 2
    status = argv[0]
    try:
        args = task.parse(argv[1:], prog=PROG)
        run = job_run(args, slurm_job())
    except BadInput as err:
        print(f"clusterjob: teardown: {err}", file=sys.stderr)
        run = None
    if run is None:
        return min(int(status), 255)
    return slurm.settle(run, status, batch_log())


def job_run(args: argparse.Namespace, job: Optional[SlurmJob]) -> Optional[RunDir]:
    """The run folder the tasks of these arguments ran in, as clusterjob.run chose it
    (``--run-dir``, the run folder holding SPEC, else the job's own); None where they
    made none."""
    if args.run_dir:
        given = RunDir(Path(args.run_dir))
        return given if given.exists() else None
    found = run_dir_of_spec(Path(args.spec))
    if found is not None or job is None:
        return found
    spec, _ = task.point(args, job.array_task_id)
    return jobrun.find(Path(spec.output.root) / spec.name, job)


def batch_log() -> str:
    """The job script's stderr, where srun reports its tasks: this process's own stderr
    (a file, as the templates' ``--error`` makes it); "" where it is not a file."""
    try:
        path = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        return ""
    return slurm.log_tail(path) if path.is_file() else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
