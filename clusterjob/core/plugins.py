"""Executors of other packages: each registers by entry point in the group
``clusterjob.executors`` (docs/design.md, "Executors and scripts"), as submitit's plugins do:

    [project.entry-points."clusterjob.executors"]
    myexec = "mypackage.myexec:MyExecutor"

Entry points are read with ``importlib.metadata``, which costs half of a bare start-up, so
only when asked: for a name no built-in executor has, for a spec key no built-in one
declares, or to list every name in an error. ``--help`` and ``status`` of built-in runs
never ask.
"""

from __future__ import annotations

from typing import Any, Optional

from clusterjob.core.errors import BadInput

GROUP = "clusterjob.executors"


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
