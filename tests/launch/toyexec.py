"""A toy executor of another package, for tests/launch/test_foreign_executor.py: one module,
registered by entry point (``toy = toyexec:ToyExecutor`` in the group clusterjob.executors),
with one resources key of its own, and both halves of an executor: the login side
(``ToyExecutor``) and the task side its ranks ask (``ToyEnvironment``, its
``environment``). No file of clusterjob/ names it.

Its "queue" is a file in each run folder: ``start`` queues the runs and records each
one's job (toy-0, toy-1, ...), ``status`` (refresh) shows them queued with the toy's note,
``cancel`` takes one out. The runs run only when the toy's worker, ``serve``, takes one:
it starts its ranks on this machine with the toy's own variables (TOY_JOB, TOY_RANK,
TOY_WORLD, TOY_PORT), which only ``ToyEnvironment`` reads.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from clusterjob.core import claim
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso
from clusterjob.core.ranks import DistEnv
from clusterjob.core.record import Job
from clusterjob.core.rundir import RunDir
from clusterjob.launch.executor import Executor, Waited
from clusterjob.spec.fields import opt
from clusterjob.spec.options import ExecutorOptions
from clusterjob.taskenv.environment import TaskEnvironment

QUEUE_FILE = "toy-queue"


@dataclass(frozen=True)
class ToyOptions(ExecutorOptions):
    """The toy's own key: how many runs its queue holds."""

    toy_slots: int = opt(1, "runs the toy queue holds at once", ge=1)


class ToyEnvironment(TaskEnvironment):
    """The toy's task side: a rank ``serve`` started knows its job and its place from the
    toy's own variables."""

    name = "toy"
    label = "the toy queue"

    @classmethod
    def activated(cls, environ):
        return "TOY_JOB" in environ

    def own_ranks(self):
        rank, world = int(self.environ["TOY_RANK"]), int(self.environ["TOY_WORLD"])
        return DistEnv(source="toy", rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                       node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=int(self.environ["TOY_PORT"]),
                       hosts=("127.0.0.1",))

    def job(self):
        return Job(self.name, self.environ["TOY_JOB"])


class ToyExecutor(Executor):
    """Queues runs and keeps them queued until they are cancelled (or ``serve`` runs them)."""

    name = "toy"
    options = ToyOptions
    environment = ToyEnvironment

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


def serve(run_dir: Path, world: int, environ: dict, timeout_s: float = 300) -> list[tuple[int, str]]:
    """The toy queue's worker: take the queued run out of the queue and run it, ``world``
    processes of ``python -m clusterjob.run`` on its spec.yaml, each told its job and
    place in the toy's own variables; (exit status, stderr) of each rank."""
    run = RunDir(run_dir)
    job = run.read().job
    (run.path / QUEUE_FILE).unlink()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    said = [tempfile.TemporaryFile("w+") for _ in range(world)]  # a file: a pipe left unread could block a rank
    ranks = [subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(run.spec_file)], cwd=run.path,
                              env={**environ, "TOY_JOB": job.id, "TOY_RANK": str(rank), "TOY_WORLD": str(world),
                                   "TOY_PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=said[rank]) for rank in range(world)]
    codes = [rank.wait(timeout_s) for rank in ranks]
    for file in said:
        file.seek(0)
    return [(code, file.read()) for code, file in zip(codes, said)]
