"""Runs that wait for other runs: ``submit SPEC --after RUN_OR_RESULTS_DIR``
(docs/design.md, "Chains").

A run waits until every run it names completed. Its run.json's ``after`` lists their
folders; its executor makes it wait (Slurm: ``--dependency=afterok`` on their jobs, the
local supervisor: it polls them) and fails it, "dependency failed", once one of them
never will complete. Reads only: the state of a dependency is what ``status`` shows of it.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core import runstate
from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import RunDir, find_runs
from clusterjob.launch import executor
from clusterjob.launch.executor import DONE, FAILED, WAITING, Dependency, RunView

_SHOWN = 3  # dependencies named in one line, the rest counted


def resolve(texts: Sequence[str]) -> list[RunDir]:
    """The runs ``--after`` names: each a run folder, or a folder of runs (every run in
    it: a sweep); each run once, in the order given. Bad input for a path that is
    neither."""
    found: dict[Path, RunDir] = {}
    for text in texts:
        runs = [RunDir(Path(text))] if RunDir(Path(text)).exists() else find_runs(Path(text))
        if not runs:
            raise BadInput(f"--after {text!r}: no run there (a run folder holding run.json, or a folder of runs such "
                           "as results/<name>); check the path")
        for run in runs:
            found.setdefault(run.path.resolve(), RunDir(run.path.resolve()))
    return list(found.values())


# True while states() asks the executors: a dependency's own dependencies are then taken
# as recorded, not asked after in turn (a re-entry flag).
_ASKING_EXECUTORS: contextvars.ContextVar[bool] = contextvars.ContextVar("asking_executors", default=False)


def states(paths: Sequence["str | Path"]) -> list[Dependency]:
    """What each run of ``paths`` is now, as ``status`` sees it (read-only). Within such a
    question (a dependency's executor asking after its own dependencies) the runs are
    taken as recorded, so that even run.json files naming each other end the question."""
    runs = [RunDir(Path(path)) for path in paths]
    if _ASKING_EXECUTORS.get():
        return [_dependency(run, RunView(*run.read_checked())) for run in runs]
    asking = _ASKING_EXECUTORS.set(True)
    try:
        return [_dependency(run, view) for run, view in zip(runs, executor.views(runs))]
    finally:
        _ASKING_EXECUTORS.reset(asking)


def _dependency(run: RunDir, view: RunView) -> Dependency:
    record = view.record
    status = record.status or runstate.UNKNOWN
    job = record.job if view.queue_state else None  # in its executor's queue
    if status == runstate.COMPLETED:
        return Dependency(run, DONE, status)
    if status in (runstate.FAILED, runstate.CANCELLED):
        said = f": {record.error.message}" if record.error is not None and record.error.message else ""
        return Dependency(run, FAILED, f"{status}{said}")
    owner = executor.of_record(record)
    live = view.queue_state or (owner.live(run, view) if owner is not None and run.exists() else None)
    if status in runstate.ACTIVE or live:
        return Dependency(run, WAITING, status + (f", job {job.id}" if job else ""), job)
    return Dependency(run, FAILED, f"{status} and nothing runs it (`clusterjob resume {run.path}` starts it)")


def failed(deps: Sequence[Dependency]) -> Optional[str]:
    """The reason a run waiting for ``deps`` never starts (one of them never completes), or None."""
    bad = [dep for dep in deps if dep.state == FAILED]
    if not bad:
        return None
    return f"dependency failed: {bad[0].run.path} is {bad[0].why}" + (
        f" (and {len(bad) - 1} more of the {len(deps)} runs it waits for)" if len(bad) > 1 else "")


def refuse_failed(deps: Sequence[Dependency]) -> None:
    """Bad input when a run would wait for a run that never completes."""
    reason = failed(deps)
    if reason is not None:
        raise BadInput(f"--after: {reason.removeprefix('dependency failed: ')}; resume or submit it again first, "
                       "then this run")


def waiting_line(deps: Sequence[Dependency]) -> str:
    """``waits for 2 of 3 runs: <path> (running), <path> (pending)`` for status."""
    left = [dep for dep in deps if dep.state != DONE]
    named = ", ".join(f"{dep.run.path} ({dep.why})" for dep in left[:_SHOWN])
    more = f", and {len(left) - _SHOWN} more" if len(left) > _SHOWN else ""
    return f"waits for {len(left)} of {len(deps)} run(s): {named}{more}"


def all_done(deps: Sequence[Dependency]) -> bool:
    return all(dep.state == DONE for dep in deps)
