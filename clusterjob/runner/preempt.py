"""The one owner of the stop signals: SIGUSR2 and SIGTERM.

SIGUSR2 is Slurm's warning before the time limit (``--signal=USR2@delay``, as submitit and
the sbatch templates ask) or a preemption notice: the run checkpoints and requeues itself.
SIGTERM is Slurm ending the job (preemption, ``scontrol requeue``, ``scancel``): the run
checkpoints if it can before the SIGKILL that follows, and leaves the requeue to Slurm.

The handler only sets a flag. The trainer asks ``agreed()`` at each progress line and at
each epoch end (a collective, so all ranks stop at the same step). NCCL takes SIGUSR1 for
itself, so USR1 is never used. A cancelled run stops the same way, without a requeue.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Optional

from clusterjob.core.rundir import RunDir
from clusterjob.runner import dist


class StopSignal:
    """The stop flag of this process: set by SIGUSR2/SIGTERM, or on rank 0 when
    ``clusterjob cancel`` marked the run cancelled (a run started by hand, or ranks on
    other hosts, have no process that cancel could signal; they read run.json)."""

    def __init__(self) -> None:
        self.received_at: Optional[float] = None
        self.signal: Optional[str] = None  # "SIGUSR2", "SIGTERM", or "cancel"
        self._run: Optional[RunDir] = None
        # Called on SIGTERM (rank 0 of the user's own code): records the stop at once,
        # as the code may never get back to the runner before Slurm's SIGKILL.
        self.on_term: Optional[Callable[[], None]] = None

    def install(self) -> "StopSignal":
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        return self

    def watch(self, run: RunDir) -> None:
        """Rank 0: also stop when the run's status becomes cancelled."""
        self._run = run

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received_at, self.signal = time.time(), signal.Signals(signum).name
        # os.write, not print: a handler that prints while the main thread prints raises
        os.write(1, f"received {self.signal}: checkpointing at the next step boundary\n".encode())
        if signum == signal.SIGTERM and self.on_term is not None:
            self.on_term()

    def _cancelled(self) -> bool:
        if self._run is None or self._run.read().status != "cancelled":
            return False
        self.signal = "cancel"
        return True

    @property
    def requested(self) -> bool:
        """This process got a stop signal, or (rank 0) the run was cancelled."""
        return self.received_at is not None or self._cancelled()

    def agreed(self) -> bool:
        """True on every rank when any rank was asked to stop. All ranks must call this."""
        return dist.any_rank(self.requested)
