"""The local executor's task side (its login side: clusterjob.launch.executors.local):
the ranks its supervisor starts on this machine. The supervisor gives each rank
torchrun's variables (clusterjob.core.ranks.export) and its mark, ``SUPERVISED_VAR``;
it settles the run's end itself (cancelled, failed), so a rank stopped by it only says
why. A local run has no job and nothing requeues it; a rank ends the rest of its process
group as it ends (``end_own``). Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Mapping

from clusterjob.core import procs
from clusterjob.taskenv.environment import TaskEnvironment

SUPERVISED_VAR = "CLUSTERJOB_SUPERVISED"  # set by the local supervisor for the ranks it starts


class LocalEnvironment(TaskEnvironment):
    """A rank the local supervisor started."""

    name = "local"
    supervised = True

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return environ.get(SUPERVISED_VAR) == "1"

    def end_own(self, parent: int) -> None:
        """The rest of the rank's process group (a session of its own, which the
        supervisor started it in): its subprocesses and DataLoader workers, once its
        supervisor is gone. A live supervisor kills that group itself once it reaped the
        rank; one killed itself (kill -9) does not, and the rank, ended by its parent's
        death (PR_SET_PDEATHSIG), ends them here. What left the group (a daemon in a
        session of its own) only a live supervisor finds."""
        me = procs.current()
        if os.getppid() == parent or me is None:
            return
        with contextlib.suppress(ValueError):  # DataLoader's SIGCHLD handler would raise for each worker killed
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for member in procs.group(me):  # none unless this rank leads its own group
            procs.terminate(member, signal.SIGKILL)
