"""A toy executor of another package, for tests/launch/test_foreign_executor.py: one module,
registered by entry point (``toy = toyexec:ToyExecutor`` in the group clusterjob.executors),
with one resources key of its own. No file of clusterjob/ names it.

Its "queue" is a file in each run folder: ``start`` queues the runs and records each
one's job (toy-0, toy-1, ...), ``status`` (refresh) shows them queued with the toy's note,
``cancel`` takes one out. The runs never run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clusterjob.core import claim
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso
from clusterjob.core.record import Job
from clusterjob.launch.executor import Executor, Waited
from clusterjob.spec.fields import opt
from clusterjob.spec.options import ExecutorOptions

QUEUE_FILE = "toy-queue"


@dataclass(frozen=True)
class ToyOptions(ExecutorOptions):
    """The toy's own key: how many runs its queue holds."""

    toy_slots: int = opt(1, "runs the toy queue holds at once", ge=1)


class ToyExecutor(Executor):
    """Queues runs and keeps them queued until they are cancelled."""

    name = "toy"
    options = ToyOptions

    @classmethod
    def unavailable(cls):
        return None

    def check(self, spec, points, preflight=True, after=()):
        slots = ToyOptions.of(spec).toy_slots
        if points > slots:
            raise BadInput(f"resources.toy_slots: {slots} slot(s) cannot hold {points} runs; "
                           f"set resources.toy_slots to at least {points}")

    def preview(self, spec, points, after=()):
        return [f"toy: {points} run(s) into {ToyOptions.of(spec).toy_slots} slot(s)"]

    def start(self, spec, runs, follow, after=()):
        for index, run in enumerate(runs):
            (run.path / QUEUE_FILE).write_text("queued\n")
            run.update(job=Job(self.name, f"toy-{index}"))  # its id in the toy queue
        claim.release(*(run.path for run in runs))  # the toy queue has them now
        return [f"toy: queued {run.path.name}" for run in runs]

    def wait(self, spec, runs, watch):
        return Waited([run.read() for run in runs])

    def refresh(self, found, write_back):
        return [replace(view, note=f"in the toy queue ({(run.path / QUEUE_FILE).read_text().strip()})",
                        queue_state="QUEUED") for run, view in found]

    def live(self, run, view):
        return "it is in the toy queue"

    def cancel(self, run, info, wait_s):
        (run.path / QUEUE_FILE).unlink()
        run.update(status="cancelled", finished_at=now_iso())
        return ["taken out of the toy queue"]
