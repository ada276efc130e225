"""The spec keys an executor declares for itself (docs/design.md, "Executors and scripts"),
as torchx's schedulers declare their run options: the Slurm executor's partition, account,
qos, constraint and max_requeues, and those of executors of other packages (a key every
executor honours, such as array_parallelism, is resources' own).

A spec writes them under ``resources``, beside clusterjob's own keys, where they always
were (``resources.partition``). Each executor's keys are one frozen ``ExecutorOptions``
section, checked like every section (a bad value is one line naming the key, the value
and the fix) and read back typed by its executor (``SlurmOptions.of(spec)``).

Every task reads its spec too, and may not import the login side of an executor, so
clusterjob's own executors declare their keys in their task side, which both halves
import (clusterjob.taskenv.slurm ``SlurmOptions``, the ``options`` of its
``SlurmEnvironment`` and of its ``SlurmExecutor``), found through the registry of task
sides (clusterjob.core.plugins ``TASK_SIDES``) as the spec is read. An executor of
another package declares its options in its own module, as its class's ``options``; they
are found through its entry point only when a spec names a key that no built-in executor
declares.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from clusterjob.core import plugins
from clusterjob.core.errors import BadInput
from clusterjob.spec.fields import Section, key_fields

Held = TypeVar("Held", bound="ExecutorOptions")


@dataclass(frozen=True)
class ExecutorOptions(Section):
    """Base of an executor's options: a frozen dataclass of ``opt`` fields, each a key
    under ``resources``, with ``check()`` for what involves several of them."""

    @classmethod
    def of(cls: type[Held], spec: Any) -> Held:
        """These options as ``spec`` (a Spec) holds them; their defaults where it names
        none of their keys."""
        return spec.resources.held(cls)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in key_fields(cls))


def built_in() -> tuple[type[ExecutorOptions], ...]:
    """The options of clusterjob's own executors (the local one has none), from their
    task sides."""
    return tuple(side.options for side in plugins.task_sides() if side.options is not None)


def declaring(key: str, reserved: frozenset) -> Optional[type[ExecutorOptions]]:
    """The options that declare ``resources.<key>``: a built-in executor's, else those of
    an executor of another package (their entry points read now, once). ``reserved``:
    the keys of resources itself, which no executor may declare."""
    found = next((options for options in built_in() if key in options.keys()), None)
    return found or next((options for options in foreign(reserved) if key in options.keys()), None)


@functools.cache
def foreign(reserved: frozenset) -> tuple[type[ExecutorOptions], ...]:
    """The options of the executors of other packages (entry points), each checked: an
    ``ExecutorOptions`` whose keys are nobody else's."""
    taken = {key: "clusterjob's own resources" for key in reserved}
    taken.update((key, "the built-in executors'") for options in built_in() for key in options.keys())
    found = []
    for name in plugins.names():
        options = getattr(plugins.load(name), "options", None)
        if options is None or options in built_in():  # no keys of its own, or it extends a built-in one
            continue
        if not (isinstance(options, type) and issubclass(options, ExecutorOptions)):
            raise BadInput(f"executor {name!r}: its options are {options!r}, not an ExecutorOptions "
                           "(clusterjob.spec.options); fix its package or uninstall it")
        for key in options.keys():
            if key in taken:
                raise BadInput(f"executor {name!r} declares resources.{key}, which is {taken[key]} key; "
                               "rename it in its package, or uninstall it")
            taken[key] = f"executor {name!r}'s"
        found.append(options)
    return tuple(found)
