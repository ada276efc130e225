"""A submission's Slurm jobs: its runs split at MaxArraySize into parts, one job array
each (one job for a single run), submitted with one ``sbatch`` per part and recorded in
the sweep's record (clusterjob.core.sweep), not in each run.json (docs/design.md,
"Executors and scripts").

The script of a part is submitit's (clusterjob.launch.executors.slurm renders it); its
task command is ``python -u -m clusterjob.run --runs RUNS_FILE``, where RUNS_FILE lists
the part's run folders in task order, so array task k runs run k of its part and no
file per task is written (submitit's own arrays pickle one per task, after sbatch).
Everything a part's job reads is written and synced to disk before its sbatch; after
it only the part's job id is written. A submit killed in between leaves a job whose
runs find their folders all the same; it is named after the sweep, and ``orphans``
finds it again.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from clusterjob.core import procs, slurmctl, sweep
from clusterjob.core.files import batched
from clusterjob.core.record import SLURM, Job
from clusterjob.core.rundir import RunDir


@dataclass(frozen=True)
class Planned:
    """A part about to be submitted: its runs, its runs file and its number in the
    sweep's record (None for runs of no sweep, whose run.json gets the job instead)."""

    runs: list
    runs_file: Path
    number: Optional[int]


def array_of(count: int) -> Optional[int]:
    """The array size of a part of ``count`` runs: None (one job, no array) for a single
    run, the last part of a split sweep too; the dry run and the submit both ask here."""
    return count if count > 1 else None


def plan(runs: list[RunDir], size: int, folder: Path) -> list[Planned]:
    """The parts of ``runs`` (at most ``size`` each), their runs files written and the
    parts added to the sweep's record, not yet with a job; not synced (the caller's batch)."""
    parts = [runs[i:i + size] for i in range(0, len(runs), size)]
    where = sweep.member(runs[0].path)
    stem = where.stamp if where is not None else runs[0].run_id
    files = [folder / f"{stem}.{_free_suffix(folder, stem, i)}.runs.json" for i in range(len(parts))]
    for part, path in zip(parts, files):
        sweep.write_runs_file(path, [run.path for run in part])
    me = procs.current()
    made = [sweep.new_part([run.path for run in part], array=array_of(len(part)) is not None, by=me,
                           runs_file=str(path))
            for part, path in zip(parts, files)]
    numbers: list[Optional[int]] = [None] * len(parts)
    found = [each for each in made if each is not None]
    if len(found) == len(made):
        numbers = list(sweep.add_parts(found[0][0], [part for _, part in found]))
    return [Planned(part, path, number) for part, path, number in zip(parts, files, numbers)]


def _free_suffix(folder: Path, stem: str, index: int) -> str:
    """``p<index>``, or with a counter where an earlier submission (a resume) used it."""
    suffix, more = f"p{index}", 1
    while (folder / f"{stem}.{suffix}.runs.json").exists():
        suffix, more = f"p{index}-{more}", more + 1
    return suffix


def submit(planned: list[Planned], scripts: Sequence[str], refused: Callable[[str], Exception]) -> list[str]:
    """Submit each planned part (its script: ``scripts``, in the same order) after one
    sync of everything written so far; each part's job id goes into the sweep's record as
    soon as sbatch answered (or into the run.json of runs of no sweep). The job ids in run
    order; the first refusal raises ``refused(what sbatch said)``, the parts before it
    submitted."""
    with batched() as batch:
        batch.sync()  # the run folders, the record and the runs files reach the disk before any job exists
        ids: list[str] = []
        for number, (part, script) in enumerate(zip(planned, scripts)):
            job_id, said = slurmctl.submit(script)
            if job_id is None:
                discard(planned[number:])
                raise refused(said)
            _record(part, job_id)
            ids += [f"{job_id}_{k}" for k in range(len(part.runs))] if len(part.runs) > 1 else [job_id]
    return ids


def _record(part: Planned, job_id: str) -> None:
    job = Job(SLURM, job_id)
    if part.number is not None:
        where = sweep.member(part.runs[0].path)
        assert where is not None
        sweep.set_part(where.parent, where.stamp, part.number, job=job)
        return
    for k, run in enumerate(part.runs):
        run.update(job=Job(SLURM, f"{job_id}_{k}") if len(part.runs) > 1 else job)


def discard(planned: Sequence[Planned]) -> None:
    """The runs files of parts that were not submitted (their runs are removed or failed)."""
    for part in planned:
        with contextlib.suppress(OSError):
            part.runs_file.unlink()


# ----------------------------------------------------------------------------- jobs a dead submit left


def in_flight(record: sweep.SweepRecord) -> list[int]:
    """The numbers of the parts whose sbatch may have run without its job being recorded:
    no job, and the process that submitted them is gone."""
    return [number for number, part in enumerate(record.parts) if part.job is None and part.by is not None
            and (why := procs.check(part.by)) is not None and why.kind != "elsewhere"]


@dataclass(frozen=True)
class Orphan:
    """The job of an in-flight part that is in the queue though no part records it."""

    number: int  # the part's
    job: Job
    queued: dict  # {job or array task: state}, as squeue said

    def of(self, index: int, restarts: int, record: sweep.SweepRecord) -> Optional[tuple[Job, str]]:
        """(job, queue state) of run ``index`` (at ``restarts``) when it is in this job."""
        part = record.parts[self.number]
        for position, key in enumerate(zip(part.runs, part.restarts)):
            if key == (index, restarts):
                task = f"{self.job.id}_{position}" if part.array else self.job.id
                return (Job(SLURM, task), self.queued[task]) if task in self.queued else None
        return None


def orphan(record: sweep.SweepRecord) -> Optional[Orphan]:
    """The job a dead submit left unrecorded: a job named after the sweep that no part
    records, which is the in-flight part's (a part is recorded before the next one is
    submitted, so only one is ever in flight). None when there is none, or squeue did
    not answer."""
    flying = in_flight(record)
    if not flying:
        return None
    queued = slurmctl.queue_by_name(record.id)
    if not queued:
        return None
    known = {part.job.id for part in record.parts if part.job is not None}
    unknown = sorted({job.split("_")[0] for job in queued} - known, key=lambda job: (len(job), job))
    return Orphan(flying[0], Job(SLURM, unknown[0]), queued) if len(unknown) == 1 else None
