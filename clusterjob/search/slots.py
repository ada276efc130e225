"""How a search's slots run on each executor (docs/design.md, "Search"): the search is a
client of its executor, which knows nothing of searches. Each slot is an ordinary run
(clusterjob.search.slotruns, ``<search>/.slots/slot-K``) that the executor starts with
``Executor.start`` as it starts any run, its task a slot driver, one process per
allocation (``Task``, PER_ALLOCATION), which takes the slot's trials from the study
(clusterjob.search.trials.Feed) and runs each as an ordinary run:

- local: the slot runs under one supervisor (``submit --wait`` itself, or a detached
  process), each in its share of the machine, its task clusterjob.search.localslot, which
  supervises its trials' ranks there; what it prints is passed on by ``submit --wait``;
- slurm: the slot runs as one job array, each task's batch script the driver
  clusterjob.search.slotdriver, each trial an srun step of the task's allocation.

Status, resume and cancel ask the executor about the slot runs as about any runs
(``views``, ``live``, ``cancel_all``). Another package's executor runs no search: ``of``
says so at submit, before anything is written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import ClassVar, Optional

from clusterjob.core import claim, runstate, slurmctl
from clusterjob.core.errors import BadInput, Failure
from clusterjob.core.files import now_iso
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.core.runstate import FINAL_STATUSES
from clusterjob.launch import control
from clusterjob.launch.executor import PER_ALLOCATION, Executor, Task, Waited, Watch, check_shape, views
from clusterjob.launch.executors.local import LocalExecutor
from clusterjob.launch.executors.slurm import SlurmExecutor
from clusterjob.search import record as searchmod
from clusterjob.search import slotruns
from clusterjob.search.record import SearchRecord
from clusterjob.search.trials import trial_runs
from clusterjob.spec.schema import Spec

POLL_S = 2.0  # how often a wait on Slurm asks whether the slot runs ended


class Slots:
    """The slots of a search on ``executor``, as runs of the task ``task``: checked,
    previewed, started, followed, asked whether they may still run, and stopped."""

    task: ClassVar[Task]

    def __init__(self, executor: Executor):
        self.executor = executor

    def check(self, spec: Spec, preflight: bool = True) -> None:
        """Bad input for slots of ``spec`` the executor cannot run (``spec.search.parallel``
        of them); before anything is written. ``preflight`` False asks no cluster."""
        check_shape(self.executor, self.task, "a search")
        self.executor.check(spec, self.checked_runs(spec), preflight)

    def checked_runs(self, spec: Spec) -> int:
        """How many runs of ``spec`` the executor's check is asked about: every slot."""
        return _count(spec)

    def preview(self, spec: Spec, folder: Path) -> list[str]:
        """``--dry-run`` of a search: what would be started for its slots."""
        return [f"would start {_count(spec)} slot run(s), {folder}/{slotruns.SLOTS}/slot-K, each one task per "
                f"allocation: python -m {self.task.module}", *self.executor.preview(spec, _count(spec), task=self.task)]

    def start(self, spec: Spec, folder: Path, follow: bool) -> list[str]:
        """Start the slot runs of the search in ``folder`` (claimed by this process), made
        or reopened; with ``follow`` they may stay with this process for ``wait``. The
        lines to print."""
        runs = slotruns.prepared(folder, _count(spec), "clusterjob submit", self.executor.name,
                                 **self.executor.reopened())
        try:
            lines = self.executor.start(spec, runs, follow, task=self.task)
        except BaseException:
            claim.release(*(run.path for run in runs))
            raise
        searchmod.update(folder, executor=self.executor.name)
        claim.release(folder)  # the slot runs say whether the search runs
        return self.started(folder, runs, lines)

    def started(self, folder: Path, runs: list[RunDir], lines: list[str]) -> list[str]:
        """What ``start`` says once the executor has the slot runs (its own lines)."""
        return lines

    def wait(self, spec: Spec, folder: Path, watch: Watch) -> Waited:
        """Follow a search started with ``follow`` until every slot run ended: the slots'
        output (each trial's progress, prune and end) as they print it; the trials' records."""
        waited = self.executor.wait(spec, slotruns.slot_runs(folder), Watch(progress=watch.progress))
        return Waited([view.record for view in views(trial_runs(folder))], waited.stop_signal)

    def live(self, folder: Path, record: SearchRecord) -> Optional[str]:
        """Why the search's slots may still run (``resume`` refuses it), in words; None
        when none does. Reads only."""
        slots = slotruns.slot_runs(folder)
        for run, view in zip(slots, views(slots)):
            said = control.still_running(run, view)  # the one answer for any run
            if said:
                return f"its slot run {run.path.name} may still run: {said}"
        return None

    def cancel(self, folder: Path, record: SearchRecord, wait_s: float) -> list[str]:
        """Stop every slot of the search (its cancel request is written already): its
        unfinished trials asked to stop (their ranks, or their slot, record the stop as a
        cancel), its slot runs cancelled as any runs are, then the trials still unfinished
        marked cancelled once no slot runs."""
        unfinished = [run for run in trial_runs(folder) if run.read().status not in FINAL_STATUSES]
        for run in unfinished:
            run.update(cancel_requested_at=now_iso())
        slots = [(run, run.read()) for run in slotruns.slot_runs(folder)]
        targets = [(run, info) for run, info in slots if info.status not in FINAL_STATUSES]
        lines = [f"slot runs: {line}" for line in self.executor.cancel_all(targets, wait_s)] if targets else []
        if any(run.read().status not in FINAL_STATUSES for run, _ in slots):
            return lines
        for run in unfinished:
            if run.read().status not in FINAL_STATUSES:
                run.update(runstate.cancel())
        return lines + self.cancelled(record)

    def cancelled(self, record: SearchRecord) -> list[str]:
        """What ``cancel`` says once every slot run ended."""
        return []


def _count(spec: Spec) -> int:
    assert spec.search is not None  # only a search has slots
    return spec.search.parallel


def of(executor: Executor) -> Slots:
    """The slots of a search on ``executor``; bad input for an executor that runs none."""
    if isinstance(executor, LocalExecutor):
        return LocalSlots(executor)
    if isinstance(executor, SlurmExecutor):
        return SlurmSlots(executor)
    raise BadInput(f"--executor {executor.name}: this executor runs no search (search: in the spec); submit it "
                   "with --executor local or --executor slurm")


class LocalSlots(Slots):
    """The slot runs under one supervisor, each in its share of this machine."""

    task = Task("clusterjob.search.localslot", PER_ALLOCATION)

    def checked_runs(self, spec: Spec) -> int:
        return 1  # what one trial needs of this machine

    def started(self, folder: Path, runs: list[RunDir], lines: list[str]) -> list[str]:
        launcher = runs[0].read().launcher
        if not lines or launcher is None:
            return lines  # followed: this process is their supervisor
        return [f"{folder}  (local search: {len(runs)} slot run(s), supervisor pid {launcher.pid})"]


class SlurmSlots(Slots):
    """The slot runs as one job array, every task a slot."""

    task = Task("clusterjob.search.slotdriver", PER_ALLOCATION)

    def check(self, spec: Spec, preflight: bool = True) -> None:
        super().check(spec, preflight)  # an array of slots: the partition, the limits
        if preflight:  # one array, never split as a sweep is
            most = slurmctl.max_array_size()
            if _count(spec) > most:
                raise BadInput(f"search.parallel: {_count(spec)} slots is more than this cluster's "
                               f"MaxArraySize ({most}), the most tasks of one array; set parallel to at most {most}")

    def start(self, spec: Spec, folder: Path, follow: bool) -> list[str]:
        try:
            return super().start(spec, folder, follow=False)
        except (BadInput, Failure) as err:
            raise BadInput(f"sbatch refused the search's array: {err}; fix resources, or submit with --executor "
                           "local") from None

    def started(self, folder: Path, runs: list[RunDir], lines: list[str]) -> list[str]:
        """The array's id, in search.json too (its jobs: ``<array>_K``)."""
        array = (runs[0].read().slurm_job_id or "").split("_")[0]
        searchmod.update(folder, job={"executor": "slurm", "id": array})
        return [f"{array}  {folder}  (a Slurm array of {len(runs)} slot(s))"]

    def wait(self, spec: Spec, folder: Path, watch: Watch) -> Waited:
        """Until every slot run is final; each trial's summary then."""
        slots = slotruns.slot_runs(folder)
        try:
            while any(view.record.status not in FINAL_STATUSES for view in views(slots, write_back=True)):
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            print(f"\nstopped waiting; the search goes on: clusterjob status {folder}", file=sys.stderr)
            raise
        runs = trial_runs(folder)
        records: list[RunRecord] = [view.record for view in views(runs, write_back=True)]
        for run, record in zip(runs, records):
            watch.ended(run, record)
        return Waited(records)

    def cancelled(self, record: SearchRecord) -> list[str]:
        return [f"cancelled Slurm array {record.job_id}"]
