"""The registry of executors' halves (docs/design.md, "Executors and scripts"). An
executor of another package registers its executor class (the login side, which names
its task side as ``environment``) by entry point in the group ``clusterjob.executors``,
as submitit's plugins do:

    [project.entry-points."clusterjob.executors"]
    myexec = "mypackage.myexec:MyExecutor"

clusterjob's own executors are found without entry points: the login side by the module
names of clusterjob/launch/executors/, the task side here (``TASK_SIDES``), named as an
entry point names an object, so that a task, which may not import the login side, and
the spec it reads (their keys) find them.

Entry points are read with ``importlib.metadata``, which costs half of a bare start-up, so
only when asked: for a name no built-in executor has, for a spec key no built-in one
declares, or to list every name in an error. ``--help`` and ``status`` of built-in runs
never ask.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

from clusterjob.core.errors import BadInput

GROUP = "clusterjob.executors"
# clusterjob's own executors' task sides, in the order a task asks whether it is theirs
# (clusterjob.taskenv.environment.current): Slurm's variables, then the local supervisor's mark.
TASK_SIDES = ("clusterjob.taskenv.slurm:SlurmEnvironment", "clusterjob.taskenv.local:LocalEnvironment")


@functools.cache
def task_sides() -> tuple[Any, ...]:
    """The classes ``TASK_SIDES`` names, their modules imported on first use."""
    found = []
    for reference in TASK_SIDES:
        module, _, name = reference.partition(":")
        found.append(getattr(importlib.import_module(module), name))
    return tuple(found)


def _entry_points() -> list:
    """The group's entry points (every installed distribution's, and those of dist-info
    folders on the Python path), each name once: the first found wins, as Python's own
    import does."""
    from importlib.metadata import entry_points

    found: Any = entry_points()
    chosen = found.select(group=GROUP) if hasattr(found, "select") else found.get(GROUP, [])  # 3.9: a dict
    first: dict[str, Any] = {}
    for point in chosen:
        first.setdefault(point.name, point)
    return list(first.values())


def names() -> list[str]:
    """The names executors of other packages register, none of them imported."""
    return sorted(point.name for point in _entry_points())


def load(name: str) -> Optional[Any]:
    """What the entry point ``name`` names (an executor class), imported now; None when
    no package registers that name. One that cannot be imported is bad input naming its
    package: the installation is broken, not the run."""
    point = next((p for p in _entry_points() if p.name == name), None)
    if point is None:
        return None
    try:
        return point.load()
    except Exception as err:  # any error of a foreign module's import: ImportError, SyntaxError, ...
        package = getattr(getattr(point, "dist", None), "name", None) or "its package"
        raise BadInput(f"executor {name!r}: the entry point {point.value!r} of {GROUP} cannot be loaded "
                       f"({type(err).__name__}: {err}); reinstall or uninstall {package}") from None
