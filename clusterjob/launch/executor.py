"""What runs a run's ranks (docs/design.md, "Executors and scripts"): one protocol that
every executor implements, and a registry of them by name.

An executor is a pair (docs/design.md, "Architecture"): this login side, a subclass of
``Executor``, and its task side, the ``TaskEnvironment`` its tasks ask
(clusterjob.taskenv.environment: their ranks, their job, the requeue, the time left),
named as its ``environment``, as submitit registers an executor and its job environment
together. A built-in login side is a module of ``clusterjob/launch/executors/``, named as
the executor and decorated with ``@register``, its task side a module of
``clusterjob/taskenv/``. One of another package is registered by entry point in the
group ``clusterjob.executors`` (clusterjob.core.plugins), its class naming its task side
and the resources keys it reads (``options``, an ``ExecutorOptions``), so adding an
executor is adding that one module. (The built-in executors' keys are declared in their
task side, which every task reads without importing the login side.) A built-in name is
known from the module's file name, and the module is imported when the executor is first
used: listing the names (``--help``) imports none, ``status`` of finished runs imports
none, a run's executor imports its own module; entry points are read only for a name
that is not built in. submit, resume, status, logs and cancel speak to executors through
this protocol only:

- ``unavailable``: whether it can start runs from here (``--executor auto`` takes the
  available built-in one of the highest ``auto_rank``);
- ``check``: what this executor cannot run, as bad input, before anything is written
  (the local GPU count, the Slurm cluster's preflight);
- ``start``: hand run folders this process claimed over (a job, a supervisor), or,
  with ``follow``, keep them here, their tasks running a ``Task`` (the runner, one per
  rank; or a module of its own, one per allocation: a search's slot, where the executor
  lists that shape in ``shapes``); ``wait`` follows them to their end;
- ``refresh``: what became of runs whose run.json does not say yet (the queue, the
  processes), read-only unless ``write_back``; ``live``: why a run may still run.
  ``views`` (and ``records``, its records) is the one derivation of a run's state
  that every read-only view shows;
- ``cancel``: stop a run, and mark it cancelled once no rank of it is alive;
- ``shell``: the command that opens an interactive shell on a running rank's node
  (``clusterjob attach``);
- ``start_debug`` and ``debug`` (where ``debuggable``): ``submit --debug``, a run whose
  rank 0 runs in the foreground of this terminal.
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Optional, Sequence

from clusterjob.core import claim, plugins, procs, runstate, sweep
from clusterjob.core.errors import BadInput
from clusterjob.core.files import many_reads
from clusterjob.core.record import Job, RunError, RunRecord, amended
from clusterjob.core.rundir import RunDir
from clusterjob.launch import executors

if TYPE_CHECKING:  # the spec's module (and YAML) is not needed to list or read runs
    from clusterjob.spec.options import ExecutorOptions
    from clusterjob.spec.schema import Spec
    from clusterjob.taskenv.environment import TaskEnvironment


@dataclass(frozen=True)
class RunView:
    """A run as ``status`` shows it: its record reconciled by its executor, the problems
    of its run.json, and what the executor said (``queue_state``, a ``note`` shown
    beside the status) or could not say (``unanswered``: the warning that the recorded
    state is shown). ``orphaned``: what settles the run's end is gone (its ranks may
    still record their own stop)."""

    record: RunRecord
    problems: list
    note: Optional[str] = None
    queue_state: Optional[str] = None
    unanswered: Optional[str] = None
    orphaned: bool = False


@dataclass(frozen=True)
class Dependency:
    """A run another run waits for (``submit --after``), as its executor sees it now:
    ``state`` DONE (completed), WAITING (it may still complete) or FAILED (it never will:
    failed, cancelled, stopped with nothing to start it, gone), with its status in words
    (``why``) and its job while that is in its executor's queue (``job``: a Slurm job
    is what Slurm's afterok can name)."""

    run: RunDir
    state: str
    why: str
    job: Optional[Job] = None


DONE, WAITING, FAILED = "done", "waiting", "failed"


PER_RANK, PER_ALLOCATION = "rank", "allocation"


@dataclass(frozen=True)
class Task:
    """What the tasks of the runs ``start`` is given run: ``python -m <module> --runs
    <runs file>`` (the module finds its run as any task does: its job's array task) or
    ``--run <run folder>`` (a process started for that run). ``per`` says how many of it
    run: PER_RANK, one per rank of the run's resources (the runner, ``clusterjob.run``,
    what every run's tasks are unless said otherwise); PER_ALLOCATION, one process on the
    allocation's first node, with the whole of the allocation's resources for the steps
    it starts (a search's slot, clusterjob.search.slots). An executor runs the shapes of
    its ``shapes``."""

    module: str = "clusterjob.run"
    per: str = PER_RANK

    def to_dict(self) -> dict:
        return {"module": self.module, "per": self.per}

    @classmethod
    def of(cls, record: RunRecord) -> "Task":
        """The task a run's record names (run.json ``task``), else the runner's, one per rank."""
        found = record.task if isinstance(record.task, dict) else {}
        module, per = found.get("module"), found.get("per")
        if isinstance(module, str) and per in (PER_RANK, PER_ALLOCATION):
            return cls(module, per)
        return RANKS


RANKS = Task()


@dataclass(frozen=True)
class Watch:
    """What ``submit --wait`` shows while it follows runs: ``progress`` while a run runs
    in this process (its new progress lines, clusterjob.launch.progress.Line), ``ended``
    once a run is final (its summary line)."""

    progress: Callable[[list], None] = lambda lines: None
    ended: Callable[[RunDir, RunRecord], None] = lambda run, info: None


@dataclass(frozen=True)
class Waited:
    """The runs' final records, and the stop signal that ended the wait early (None:
    every run ended by itself)."""

    records: list
    stop_signal: Optional[int] = None


class Executor(abc.ABC):
    """One way to run runs. Instances hold no state: the run folders do."""

    name: ClassVar[str]
    auto_rank: ClassVar[int] = 0  # `--executor auto` takes the available executor of the highest rank
    ranks_here: ClassVar[bool] = False  # its ranks run on this machine (what the submit can tell of them)
    debuggable: ClassVar[bool] = False  # it runs ``submit --debug`` (start_debug, debug)
    # The resources keys this executor declares for itself (clusterjob.spec.options), read
    # with ``options.of(spec)``; None: it has none.
    options: ClassVar[Optional[type[ExecutorOptions]]] = None
    # Its task side: what its tasks ask of it (clusterjob.taskenv.environment); None: its
    # tasks are launched as by hand (torchrun's variables, or one process), with no job.
    environment: ClassVar[Optional[type[TaskEnvironment]]] = None
    # The task shapes it runs (``Task.per``): one task per rank is every executor's.
    shapes: ClassVar[tuple[str, ...]] = (PER_RANK,)

    @classmethod
    @abc.abstractmethod
    def unavailable(cls) -> Optional[str]:
        """None when this executor can start runs from here; else why not, with the fix."""

    @classmethod
    def adopts(cls, record: RunRecord) -> bool:
        """Whether a run whose run.json names no executor (started by hand) is this one's."""
        return False

    @abc.abstractmethod
    def check(self, spec: Spec, points: int, preflight: bool = True, after: Sequence[Dependency] = ()) -> None:
        """Bad input for what this executor cannot run (``points`` runs of ``spec``, each
        waiting for ``after``); before anything is written. ``preflight`` False skips
        questions to a cluster."""

    def checks(self, spec: Spec, points: int) -> list:
        """The read-only questions to a cluster that ``validate --cluster`` prints, one
        ``clusterjob.launch.preflight.Check`` each; none by default."""
        return []

    def makes_runs_at_start(self, points: int) -> bool:
        """Whether the runs of a sweep of ``points`` are made by their tasks as they start
        (clusterjob.core.unmade), not by ``submit``: none of this executor's writes goes
        into a run folder before its run starts. False by default."""
        return False

    @abc.abstractmethod
    def preview(self, spec: Spec, points: int, after: Sequence[Dependency] = (), task: Task = RANKS) -> list[str]:
        """What a submission would send (``--dry-run``), writing nothing: the request
        ``start`` sends, built the same way (torchx's ``submit_dryrun``), with the names
        only a submission makes (the sweep's stamp, its files) as placeholders."""

    @abc.abstractmethod
    def start(self, spec: Spec, runs: list[RunDir], follow: bool, after: Sequence[Dependency] = (),
              task: Task = RANKS) -> list[str]:
        """Hand ``runs`` (made or reopened and claimed by this process) over, recording
        in each run.json what has it; with ``follow`` the runs may stay with this
        process for ``wait``. Each run starts once every run of ``after`` completed
        (their folders are in its run.json's ``after``), and is failed when one of them
        never will. Their tasks run ``task`` (a shape of ``shapes``). The lines to
        print (job ids, the supervisor)."""

    @abc.abstractmethod
    def wait(self, spec: Spec, runs: list[RunDir], watch: Watch) -> Waited:
        """Follow ``runs`` of ``spec`` (started with ``follow``) until each is final."""

    @abc.abstractmethod
    def refresh(self, found: list[tuple[RunDir, RunView]], write_back: bool) -> list[RunView]:
        """The views of this executor's runs that are not final, with what their jobs or
        processes say; written to run.json only with ``write_back``."""

    @abc.abstractmethod
    def live(self, run: RunDir, view: RunView) -> Optional[str]:
        """Why the run (not final, its view refreshed) may still be running, in words;
        None when it verifiably stopped. Reads only."""

    @abc.abstractmethod
    def cancel(self, run: RunDir, info: RunRecord, wait_s: float) -> list[str]:
        """Stop the run; mark it cancelled once none of its ranks is alive. What was done."""

    def cancel_all(self, targets: list[tuple[RunDir, RunRecord]], wait_s: float) -> list[str]:
        """Stop many runs (a sweep's: ``cancel`` of a results folder or a sweep id) as
        ``cancel`` stops one; an executor whose jobs hold many runs stops them at once."""
        return [line for run, info in targets for line in self.cancel(run, info, wait_s)]

    def reopened(self) -> dict:
        """run.json fields ``resume`` clears before starting a run again."""
        return {}

    def start_debug(self, spec: Spec, run: RunDir) -> None:
        """``submit --debug``, as the run is handed over (the submit holds its claim): what
        has the run, recorded where ``status`` looks (only where ``debuggable``)."""
        raise NotImplementedError

    def debug(self, spec: Spec, run: RunDir) -> RunRecord:
        """``submit --debug``: run ``run``, its rank 0 with this process's terminal (stdin
        too: ``breakpoint()`` stops there), until it is final; its final record."""
        raise NotImplementedError

    def shell(self, run: RunDir, info: RunRecord, node: str, command: list[str]) -> list[str]:
        """The command (of ``clusterjob attach``) that runs ``command`` interactively on
        ``node``, where a rank of the running ``run`` runs, with what of its job that rank
        has (its GPUs); bad input where this executor cannot reach it. None by default."""
        raise BadInput(f"{run.path}: the {self.name} executor cannot open a shell on its ranks; use its own tools "
                       "to reach the node")


_REGISTRY: dict[str, type[Executor]] = {}  # the built-in executors imported so far
_FOREIGN: dict[str, type[Executor]] = {}  # the executors of other packages loaded so far
_SEARCHED: list[str] = []  # the folders of executors whose modules were all imported


def mark_task(runs: list[RunDir], task: Task) -> None:
    """Each run's run.json names its task where that is not the runner's (``Task.of``
    reads it back: a supervisor, ``status``)."""
    if task != RANKS:
        for run in runs:
            run.update(task=task.to_dict())


def check_shape(executor: Executor, task: Task, what: str) -> None:
    """Bad input where ``executor`` does not run ``task``'s shape (``what`` needs it)."""
    if task.per not in executor.shapes:
        raise BadInput(f"--executor {executor.name}: {what} needs one task per {task.per}, which this executor "
                       f"does not run (it runs one per {' or '.join(executor.shapes)}); submit it with an "
                       "executor that does (--executor slurm)")


def register(cls: type[Executor]) -> type[Executor]:
    """Class decorator of a built-in executor: known by ``cls.name``. (An executor of
    another package is known by its entry point's name.)"""
    _REGISTRY[cls.name] = cls
    return cls


def listed_names() -> list[str]:
    """The built-in executors' names as their modules are named in
    clusterjob/launch/executors/, none of them imported (what ``--help`` shows), in
    alphabetical order."""
    return sorted({module.name for module in pkgutil.iter_modules(executors.__path__)
                   if not module.name.startswith("_")})


def _known() -> dict[str, type[Executor]]:
    """Every built-in executor, once each module of clusterjob/launch/executors/ was imported."""
    if _SEARCHED != list(executors.__path__):
        for name in listed_names():
            importlib.import_module(f"{executors.__name__}.{name}")
        _SEARCHED[:] = executors.__path__
    return _REGISTRY


def _load(name: str) -> Optional[type[Executor]]:
    """The executor ``name``: a built-in one's own module imported on first use (a name
    no module is called imports every module: a module may register another name), else
    an executor of another package, by its entry point (clusterjob.core.plugins)."""
    if name not in _REGISTRY and name in listed_names():
        importlib.import_module(f"{executors.__name__}.{name}")
    return _REGISTRY.get(name) or _known().get(name) or _foreign(name)


def _foreign(name: str) -> Optional[type[Executor]]:
    """The executor of another package registered as ``name``, imported now; None when
    none is. What its entry point names must be an ``Executor`` of that name."""
    if name not in _FOREIGN:
        found = plugins.load(name)
        if found is None:
            return None
        if not (isinstance(found, type) and issubclass(found, Executor) and found.name == name):
            raise BadInput(f"executor {name!r}: its entry point ({plugins.GROUP}) names {found!r}, not an "
                           f"Executor (clusterjob.launch.executor) named {name!r}; fix its package or uninstall it")
        _FOREIGN[name] = found
    return _FOREIGN[name]


def names() -> list[str]:
    """The executors' names: the built-in ones (importing each), the one ``auto`` tries
    first first; then those of other packages (their entry points listed, none imported)."""
    built_in = sorted(_known(), key=lambda name: (-_known()[name].auto_rank, name))
    return built_in + [name for name in plugins.names() if name not in built_in]


def get(name: str) -> Executor:
    found = _load(name)
    if found is None:
        raise BadInput(f"--executor {name!r}: no such executor; choose one of: auto, {', '.join(names())}")
    return found()


def choose(requested: str) -> Executor:
    """The executor of ``--executor``: ``auto`` is the first available built-in one (an
    executor of another package runs only when named); a named one that is not
    available is bad input saying why."""
    if requested == "auto":
        built_in = sorted(_known().values(), key=lambda cls: (-cls.auto_rank, cls.name))
        found = next((cls.name for cls in built_in if cls.unavailable() is None), None)
        if found is None:
            raise BadInput("--executor auto: no executor can run here")
        return get(found)
    executor = get(requested)
    why = executor.unavailable()
    if why is not None:
        raise BadInput(f"--executor {requested}: {why}")
    return executor


def of_record(record: RunRecord) -> Optional[Executor]:
    """The executor a run.json names, else the built-in one that adopts a run naming
    none (or a name no executor has)."""
    named = _load(record.executor) if isinstance(record.executor, str) else None
    if named is not None:
        return named()
    adopter = next((cls for cls in _known().values() if cls.adopts(record)), None)
    return adopter() if adopter is not None else None


def views(runs: list[RunDir], write_back: bool = False) -> list[RunView]:
    """Each run's run.json (type-checked, with its problems, and the job or supervisor
    its sweep's record gives it: clusterjob.core.sweep.resolved), refreshed by its
    executor where it is not final: one call per executor for all of its runs. With
    ``write_back``, what an answer taught is written to run.json; without, nothing."""
    records = sweep.Records()
    found = []
    with many_reads():
        for run in runs:
            record, problems = run.read_checked()
            found.append(RunView(sweep.resolved(run.path, record, records), problems))
    groups: dict[str, list[int]] = {}
    for index, view in enumerate(found):
        executor = of_record(view.record) if view.record.status not in runstate.FINAL_STATUSES else None
        if executor is not None:
            groups.setdefault(executor.name, []).append(index)
    for name, indices in groups.items():
        fresh = get(name).refresh([(runs[i], found[i]) for i in indices], write_back)
        for index, view in zip(indices, fresh):
            found[index] = view
    return found


def records(folders: Sequence) -> list[RunRecord]:
    """The records of the run ``folders`` as ``views`` derives them, read-only: the one
    state every read-only view shows (status, logs -f, report, report --watch, the
    ``submit --wait`` report), handed to the report, which may not import this side."""
    return [view.record for view in views([RunDir(Path(folder)) for folder in folders])]


def apply_found(run: RunDir, view: RunView, move: runstate.Move, write_back: bool) -> RunView:
    """The view after ``move``, what the executor found (a job's or the processes' end);
    written to run.json with ``write_back``, unless the run recorded its own end meanwhile
    (its word wins)."""
    if not write_back:
        return replace(view, record=amended(view.record, **runstate.written(view.record, {}, move)))
    now = run.read()
    if now.status in runstate.FINAL_STATUSES:
        return RunView(now, view.problems)
    return RunView(run.update(move), view.problems)


def unhanded(run: RunDir, view: RunView, write_back: bool) -> RunView:
    """A pending run that no job and no supervisor has yet: being handed over while a
    live submit or resume holds its claim or its sweep's (pending, with a note); else
    the command that made it ended before it handed it over (killed, or its machine
    went down) and nothing will ever start it: failed, and ``resume`` starts it."""
    if claim.handing_over(run.path) is not None:
        return replace(view, note=BEING_SUBMITTED)
    ended = runstate.fail(RunError(
        None, "its submission ended before it handed the run over (the submit or resume was killed, or its "
              f"machine went down): no job or process has it; `clusterjob resume {run.path}` starts it"))
    return apply_found(run, view, ended, write_back)


BEING_SUBMITTED = "being submitted"


def cancel_unstarted(run: RunDir, info: RunRecord) -> list[str]:
    """No rank recorded yet: a live supervisor skips the run (or its rank 0 stops at once);
    with none, nothing will start it."""
    if info.launcher is not None and procs.check(info.launcher) is None:
        return ["no rank started yet: its supervisor will not start it (or stops it at once)"]
    run.update(runstate.cancel())
    return ["no rank process recorded yet: the run will not start"]
