"""The local executor's task side (its login side: clusterjob.launch.executors.local):
the ranks its supervisor starts on this machine. The supervisor gives each rank
torchrun's variables (clusterjob.core.ranks.export) and its mark, ``SUPERVISED_VAR``;
it settles the run's end itself (cancelled, failed), so a rank stopped by it only says
why. A local run has no job and nothing requeues it. Stdlib only.
"""

from __future__ import annotations

from typing import Mapping

from clusterjob.taskenv.environment import TaskEnvironment

SUPERVISED_VAR = "CLUSTERJOB_SUPERVISED"  # set by the local supervisor for the ranks it starts


class LocalEnvironment(TaskEnvironment):
    """A rank the local supervisor started."""

    name = "local"
    supervised = True

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return environ.get(SUPERVISED_VAR) == "1"
