"""Which run folder a raw sbatch job's task runs in (docs/design.md, "Results layout"):
``slurm-<job>``, or ``slurm-<job>-N`` where that name holds a run this job may not
continue. The runner (clusterjob.run) finds or makes it as the task starts, through
the Slurm task side (clusterjob.taskenv.slurm, ``own_run``); the templates' teardown
(clusterjob.launch.teardown) finds it again after srun, by the same rule. A run is this
job's when it records the job id and either (first start) the job's SubmitTime or (after
a requeue, which sets a new SubmitTime) it is the newest folder of that id. Runs of
other jobs that had the same id are left as they are. Stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from clusterjob.core import runstate, slurmctl
from clusterjob.core.files import read_text
from clusterjob.core.record import SLURM, Job
from clusterjob.core.rundir import RunDir
from clusterjob.taskenv.slurmjob import SlurmJob


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


def job_folder(parent: Path, job: SlurmJob, spec_text: str, make: Callable[..., RunDir]) -> RunDir:
    """This job's run folder under ``parent``: its own run, which it continues unless it
    holds another spec (``spec_text``: the run's spec.yaml) or is completed; else a new
    ``slurm-<job>[-N]``, made with ``make`` (the RunDir and its run.json fields)."""
    at = submitted(job)
    taken = job_runs(parent, job.run_key)
    mine = own_run([run for _, run in taken], job, at)
    why = "a run of another job with the same id" if mine is None else _why_not_continued(mine, spec_text)
    if mine is not None and why is None:
        return mine
    run = RunDir(parent / (f"slurm-{job.run_key}-{taken[-1][0] + 1}" if taken else f"slurm-{job.run_key}"))
    if taken:
        print(f"{(mine or taken[-1][1]).path} is {why}; this job runs in {run.path}", flush=True)
    return make(run, job=Job(SLURM, job.run_key), slurm_job_submitted=at)


def _why_not_continued(run: RunDir, spec_text: str) -> Optional[str]:
    """None when this job may continue its ``run``; else why not: it is completed, or its
    spec.yaml holds another spec (the script's arguments or the spec file changed)."""
    if run.read().status == runstate.COMPLETED:
        return "completed"
    if read_text(run.spec_file)[0] != spec_text:
        return "a run of another spec"
    return None
