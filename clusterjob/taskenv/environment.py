"""The task side of an executor (docs/design.md, "Architecture": an executor is a pair),
as submitit's JobEnvironment is the task side of its executors.

An executor is a pair: its login side (clusterjob.launch.executor.Executor: submit,
status, cancel) and its task side, a ``TaskEnvironment``: what a task of its runs asks
of it. This process's ranks, its job (as run.json records it), which task of its
submission it is, whether a stop may requeue the job and the requeue itself, the time
left before the job's limit, how the job's previous session ended, and the run folder
a job started by a raw script finds again. The task code (clusterjob.run, the runner,
the trainer) asks the environment ``current()`` gives and never names an executor; only
the task-side environments read rank variables from the environment.

``current()`` is the first environment whose ``activated`` says this process is one of
its tasks: clusterjob's own (core/plugins.py ``TASK_SIDES``, named as entry points name
objects, so that a task finds them without importing the login side), then those of
executors of other packages (the ``environment`` of the executor their entry point
names, looked at only when no built-in one is activated), else ``TaskEnvironment``
itself: a launch by hand (torchrun, the legacy launcher, hand-set variables, one
process), which has no job and requeues nothing.

Stdlib only, never torch: ``clusterjob env`` uses this on login nodes.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Optional, Sequence

from clusterjob.core import plugins
from clusterjob.core.errors import BadInput
from clusterjob.core.ranks import DistEnv
from clusterjob.core.record import Job
from clusterjob.core.rundir import RunDir
from clusterjob.taskenv import torchrun

if TYPE_CHECKING:
    from clusterjob.spec.options import ExecutorOptions
    from clusterjob.spec.schema import Spec

MakeRun = Callable[..., RunDir]  # makes a run folder: (its RunDir, run.json fields) -> the RunDir


class TaskEnvironment:
    """A task's view of the executor that started it; this class itself is a launch by
    hand. Subclasses override what their executor does; instances hold the environment
    they read (``environ``, ``argv``), nothing else."""

    name: ClassVar[str] = ""  # its executor's name, as run.json's ``job`` names it ("" by hand)
    label: ClassVar[str] = ""  # what runs the job, as a message names it ("Slurm")
    supervised: ClassVar[bool] = False  # a supervisor of the executor settles the run's end (the local one)
    # The resources keys its executor declares (clusterjob.spec.options), which both halves read
    options: ClassVar[Optional[type[ExecutorOptions]]] = None

    def __init__(self, environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None):
        self.environ = os.environ if environ is None else environ
        self.argv = sys.argv if argv is None else argv

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        """Whether a process with ``environ`` is a task of this executor."""
        return True

    def ranks(self) -> DistEnv:
        """This process's ranks: torchrun's variables when set (torchrun started inside a
        job sees both, and only its own describe the processes), else the executor's own
        layout, else one process. EnvError, naming the variable and its value, on
        anything missing or inconsistent, before any rendezvous."""
        return torchrun.detect(self.environ, self.argv, self.own_ranks, self.nodes)

    def own_ranks(self) -> Optional[DistEnv]:
        """The ranks as the executor itself lays them out (an srun step); None: none."""
        return None

    def nodes(self, count: int) -> Optional[tuple[str, ...]]:
        """The names of the job's ``count`` nodes, where the executor knows them (torchrun
        itself names only rank 0's address)."""
        return None

    def job(self) -> Optional[Job]:
        """The job this task belongs to, as run.json records it; None: no job (by hand,
        or a local run, whose processes are its ranks' own records)."""
        return None

    def array_task(self) -> Optional[str]:
        """Which task of its submission's array this job is (its sweep point, or the run
        a runs file lists at that index); None: no array."""
        return None

    def restarts(self) -> int:
        """How often the executor started this job again (requeues, restarts after a
        failure of a node)."""
        return 0

    def time_left_s(self) -> Optional[float]:
        """Seconds before the job's time limit; None: unknown or unlimited."""
        return None

    def can_requeue(self) -> bool:
        """Whether a stop may put the job back in its executor's queue (``requeue``)."""
        return False

    def requeue(self) -> bool:
        """Put the job (only this task of an array) back in the queue: it starts again
        and resumes; False when the executor refused or did not answer."""
        return False

    def max_requeues(self, spec: Spec) -> int:
        """How often a run of ``spec`` may be requeued before a stop fails it."""
        return 0

    def node_failure(self, hosts: Sequence[str]) -> Optional[str]:
        """Why the job's previous session ended, in words, when a failure of its nodes
        (``hosts``) ended it and the executor restarted it; None otherwise."""
        return None

    def since_restart_s(self) -> float:
        """Seconds since the executor restarted the job (its own hold before the start
        counts toward a retry's back-off); 0 when it does not say."""
        return 0.0

    def stop_hint(self) -> Optional[str]:
        """What becomes of a job stopped and not requeued by the run, when its executor
        decides ("Slurm requeues or ends the job"); None: ``resume`` continues it."""
        return None

    def end_own(self, parent: int) -> None:
        """As the task ends (``parent``: its parent's pid at its start): end what it
        started that its executor would not end with it (nothing where the executor does:
        a Slurm step's cgroup, a launch by hand)."""

    def own_run(self, parent: Path, spec_text: str, make: MakeRun) -> Optional[RunDir]:
        """The run folder under ``parent`` this job runs in, when the task was given none
        (a job of a raw script that is started again finds its run again), made with
        ``make`` where needed; None: the task makes a new one."""
        return None


def current(environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None) -> TaskEnvironment:
    """The task-side environment of this process (of ``environ`` and ``argv``)."""
    environ = os.environ if environ is None else environ
    found = next((cls for cls in built_in() if cls.activated(environ)), None)
    if found is None:
        found = next((cls for cls in foreign() if cls.activated(environ)), TaskEnvironment)
    return found(environ, argv)


def detect(environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None) -> DistEnv:
    """This process's ranks, as its task-side environment derives them."""
    return current(environ, argv).ranks()


def built_in() -> tuple[type[TaskEnvironment], ...]:
    """clusterjob's own executors' task sides, in the order a task asks them."""
    return plugins.task_sides()


@functools.cache
def foreign() -> tuple[type[TaskEnvironment], ...]:
    """The task sides of executors of other packages: each one's ``environment``. An
    entry point that cannot be loaded is passed over here (a task of that executor
    cannot be told apart; its submit says what is broken)."""
    found = []
    for name in plugins.names():
        try:
            executor = plugins.load(name)
        except BadInput:
            continue
        environment = getattr(executor, "environment", None)
        if environment is None:
            continue
        if not (isinstance(environment, type) and issubclass(environment, TaskEnvironment)
                and environment.name == name):
            raise BadInput(f"executor {name!r}: its environment is {environment!r}, not a TaskEnvironment "
                           f"(clusterjob.taskenv.environment) named {name!r}; fix its package or uninstall it")
        found.append(environment)
    return tuple(found)
