"""Which run folder a raw sbatch job's task runs in (docs/design.md, "Results layout"):
``slurm-<job>``, or ``slurm-<job>-N`` where that name holds a run this job may not
continue. The runner (clusterjob.run) finds or makes it as the task starts; the
templates' teardown (clusterjob.launch.teardown) finds it again after srun, by the same
rule. A run is this job's when it records the job id and either (first start) the job's
SubmitTime or (after a requeue, which sets a new SubmitTime) it is the newest folder of
that id. Runs of other jobs that had the same id are left as they are. Stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from clusterjob.core import slurmctl
from clusterjob.core.env import SlurmJob
from clusterjob.core.rundir import RunDir


def submitted(job: SlurmJob) -> Optional[str]:
    """The job's SubmitTime as its first start knows it; None after a requeue (which sets
    a new one) or where scontrol does not answer."""
    return slurmctl.submit_time(job.run_key) if job.restart_count == 0 else None


def job_runs(parent: Path, key: str) -> list[tuple[int, RunDir]]:
    """The folders named after job ``key``, oldest first: (1, slurm-<key>), (2, slurm-<key>-2), ..."""
    numbered = {1: parent / f"slurm-{key}"}
    for path in parent.glob(f"slurm-{key}-*"):
        suffix = slurmctl.number(path.name[len(f"slurm-{key}-"):])
        if suffix is not None:
            numbered[suffix] = path
    return [(n, RunDir(numbered[n])) for n in sorted(numbered) if os.path.lexists(numbered[n])]


def own_run(runs: list[RunDir], job: SlurmJob, submitted_at: Optional[str]) -> Optional[RunDir]:
    """The run of ``runs`` this job made, if any (see the module's rule)."""
    ours = [run for run in runs if run.read().slurm_job_id == job.run_key]
    if job.restart_count > 0:
        return ours[-1] if ours else None
    same = [run for run in ours if submitted_at is not None and run.read().slurm_job_submitted == submitted_at]
    return same[-1] if same else None


def find(parent: Path, job: SlurmJob) -> Optional[RunDir]:
    """The run folder under ``parent`` (``<output.root>/<name>``) that this job's tasks
    run in, once they made it; None before."""
    return own_run([run for _, run in job_runs(parent, job.run_key)], job, submitted(job))
