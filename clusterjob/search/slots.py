"""How a search's slots run on each executor (docs/design.md, "Search"): the search is a
client of its executor, which knows nothing of searches. Each slot takes its trials from
the study (clusterjob.search.trials.Feed) and runs each as an ordinary run.

- local: one supervisor (``submit --wait`` itself, or a detached process) whose
  ``search.parallel`` slots of the machine each take their next trial as they come free,
  every trial supervised as any local run is (clusterjob.launch.supervisor);
- slurm: one job array of ``search.parallel`` tasks, each a slot whose batch script runs
  the slot driver (clusterjob.search.slurmarray, clusterjob.search.slotdriver).

Another package's executor runs no search: ``of`` says so at submit, before anything is
written. The checks and the cancel of single runs are the executor's own (``check``,
``cancel``), asked through its protocol.
"""

from __future__ import annotations

import abc
import subprocess
import sys
from pathlib import Path
from typing import Optional

from clusterjob.core import claim, procs, slurmctl
from clusterjob.core.errors import BadInput
from clusterjob.core.runstate import FINAL_STATUSES
from clusterjob.launch import supervisor as sup
from clusterjob.launch.executor import Executor, Waited, Watch, views
from clusterjob.launch.executors.local import LocalExecutor
from clusterjob.launch.executors.slurm import SlurmExecutor
from clusterjob.launch.slots import Slot
from clusterjob.search import record as searchmod
from clusterjob.search import slurmarray
from clusterjob.search.record import SearchRecord
from clusterjob.search.trials import SPEC_FILE, Feed, trial_runs
from clusterjob.spec.schema import Spec, load_spec

LOCAL_SUPERVISOR = "clusterjob.search.slots"  # python -m: the detached supervisor of a local search


class Slots(abc.ABC):
    """The slots of a search on ``executor``: checked, previewed, started, followed,
    asked whether they may still run, and stopped."""

    def __init__(self, executor: Executor):
        self.executor = executor

    @abc.abstractmethod
    def check(self, spec: Spec, preflight: bool = True) -> None:
        """Bad input for slots of ``spec`` the executor cannot run (``spec.search.parallel``
        of them); before anything is written. ``preflight`` False asks no cluster."""

    @abc.abstractmethod
    def preview(self, spec: Spec, folder: Path) -> list[str]:
        """``--dry-run`` of a search: what would be started for its slots."""

    @abc.abstractmethod
    def start(self, spec: Spec, folder: Path, follow: bool) -> list[str]:
        """Start the slots of the search in ``folder`` (claimed by this process), recording
        in search.json what runs them; with ``follow`` they may stay with this process for
        ``wait``. The lines to print."""

    @abc.abstractmethod
    def wait(self, spec: Spec, folder: Path, watch: Watch) -> Waited:
        """Follow a search started with ``follow`` until every trial is taken and ended."""

    @abc.abstractmethod
    def live(self, folder: Path, record: SearchRecord) -> Optional[str]:
        """Why the search's slots may still run (``resume`` refuses it), in words; None
        when none does. Reads only."""

    @abc.abstractmethod
    def cancel(self, folder: Path, record: SearchRecord, wait_s: float) -> list[str]:
        """Stop every slot of the search (its cancel request is written already) and mark
        its unfinished trials cancelled once none of their ranks is alive."""


def of(executor: Executor) -> Slots:
    """The slots of a search on ``executor``; bad input for an executor that runs none."""
    if isinstance(executor, LocalExecutor):
        return LocalSlots(executor)
    if isinstance(executor, SlurmExecutor):
        return SlurmSlots(executor)
    raise BadInput(f"--executor {executor.name}: this executor runs no search (search: in the spec); submit it "
                   "with --executor local or --executor slurm")


# ----------------------------------------------------------------------------- local


class LocalSlots(Slots):
    """The slots of the machine, in one supervisor that holds the search's claim."""

    executor: LocalExecutor

    def check(self, spec: Spec, preflight: bool = True) -> None:
        self.executor.check(spec, 1, preflight)

    def preview(self, spec: Spec, folder: Path) -> list[str]:
        assert spec.search is not None  # only a search is previewed here
        return [f"would run a search of {spec.search.trials} trial(s), {len(machine_slots(spec))} at once "
                f"(search.parallel {spec.search.parallel}), each {spec.resources.tasks_per_node} local process(es): "
                f"python -m clusterjob.run <trial>/spec.yaml, the trials in {folder}/<id>-NNN"]

    def start(self, spec: Spec, folder: Path, follow: bool) -> list[str]:
        """A detached supervisor takes the search and its claim; with ``follow`` this
        process runs it (``wait``)."""
        if follow:
            searchmod.update(folder, executor="local", launcher=_ref_dict(procs.current()))
            return []
        held = claim.held(folder)
        fd = held.fd if held is not None else -1
        with open(folder / "supervisor.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", LOCAL_SUPERVISOR, str(fd), str(folder)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, pass_fds=[fd] if fd >= 0 else [])
        searchmod.update(folder, executor="local", launcher=_ref_dict(procs.current(proc.pid)))
        claim.release(folder)  # the supervisor holds it now
        return [f"{folder}  (local search, supervisor pid {proc.pid})"]

    def wait(self, spec: Spec, folder: Path, watch: Watch) -> Waited:
        """Run the search's trials here, its slots side by side; each trial's summary as it ends."""
        slots = machine_slots(spec)
        claim.take(folder, claim.SUPERVISOR)
        supervisor, records = self.executor.supervise(spec, [], watch, slots, supervised_feed(folder, slots))
        return Waited(records, supervisor.stop_signal)

    def live(self, folder: Path, record: SearchRecord) -> Optional[str]:
        ref = procs.ProcessRef.from_dict(record.launcher) if record.launcher else None
        why = procs.check(ref) if ref is not None else None
        if ref is not None and why is None:
            return f"its supervisor (pid {ref.pid}) is alive"
        if ref is not None and why is not None and why.kind == "elsewhere":
            return f"its supervisor ran on {ref.host}; this host cannot tell whether it still runs"
        return None

    def cancel(self, folder: Path, record: SearchRecord, wait_s: float) -> list[str]:
        """Each unfinished trial cancelled as a run is (its supervisor stops its ranks; one
        not started yet never starts: the supervisor takes no trial after the request)."""
        lines = []
        for run in trial_runs(folder):
            info = run.read()
            if info.status not in FINAL_STATUSES:
                lines += [f"{run.run_id}: {line}" for line in self.executor.cancel(run, info, wait_s)]
        return lines


def machine_slots(spec: Spec) -> list[Slot]:
    """The slots of a search's trials on this machine: ``search.parallel`` where they fit."""
    assert spec.search is not None  # only a search's spec
    return sup.slots_for(spec.resources, spec.search.parallel, spec.search.parallel)


def supervised_feed(folder: Path, slots: list[Slot]) -> Feed:
    """The trials of the search in ``folder`` for this supervisor's ``slots``: each made
    (and claimed) by this process, which is their supervisor."""
    return Feed(folder, len(slots), claim_as=claim.SUPERVISOR, executor="local", launcher=procs.current())


def _ref_dict(ref: Optional[procs.ProcessRef]) -> Optional[dict]:
    return ref.to_dict() if ref is not None else None


def main(argv: list[str]) -> int:
    """``python -m clusterjob.search.slots CLAIM_FD SEARCH``: the detached supervisor
    of a local search. It holds the search's claim (handed over by ``submit`` or
    ``resume``: -1 for none) while it runs, and ends once every trial is taken and ended
    (or it was stopped)."""
    fd, folder = int(argv[0]), Path(argv[1])
    if fd >= 0:
        claim.adopt(fd, folder, claim.SUPERVISOR)
    spec = load_spec(folder / SPEC_FILE)
    slots = machine_slots(spec)
    supervisor = sup.Supervisor(spec.resources.tasks_per_node, slots=slots,
                                on_end=lambda run, info: print(f"{run.path}: {info.status}", flush=True)).install()
    supervisor.run_all([], supervised_feed(folder, slots))
    return 0


# ----------------------------------------------------------------------------- slurm


class SlurmSlots(Slots):
    """One job array of ``search.parallel`` tasks, each a slot (clusterjob.search.slurmarray)."""

    def check(self, spec: Spec, preflight: bool = True) -> None:
        assert spec.search is not None  # only a search is checked here
        self.executor.check(spec, spec.search.parallel, preflight)  # an array of slots: the partition, the limits
        if preflight:  # one array, never split as a sweep is
            most = slurmctl.max_array_size()
            if spec.search.parallel > most:
                raise BadInput(f"search.parallel: {spec.search.parallel} slots is more than this cluster's "
                               f"MaxArraySize ({most}), the most tasks of one array; set parallel to at most {most}")

    def preview(self, spec: Spec, folder: Path) -> list[str]:
        return slurmarray.preview(spec, folder)

    def start(self, spec: Spec, folder: Path, follow: bool) -> list[str]:
        lines = slurmarray.start(spec, folder)
        claim.release(folder)  # handed over: the queue says whether it runs
        return lines

    def wait(self, spec: Spec, folder: Path, watch: Watch) -> Waited:
        """Until no slot is in the queue; each trial's summary then."""
        try:
            slurmarray.wait(folder)
        except KeyboardInterrupt:
            print(f"\nstopped waiting; the search goes on: clusterjob status {folder}", file=sys.stderr)
            raise
        runs = trial_runs(folder)
        records = [view.record for view in views(runs, write_back=True)]
        for run, record in zip(runs, records):
            watch.ended(run, record)
        return Waited(records)

    def live(self, folder: Path, record: SearchRecord) -> Optional[str]:
        return slurmarray.live(folder)

    def cancel(self, folder: Path, record: SearchRecord, wait_s: float) -> list[str]:
        return slurmarray.cancel(folder, trial_runs(folder), wait_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
