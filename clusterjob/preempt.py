"""The one owner of the stop signals: SIGUSR2 and SIGTERM.

SIGUSR2 is Slurm's warning before the time limit (``--signal=USR2@delay``, as submitit and
the sbatch templates ask) or a preemption notice: the run checkpoints and requeues itself.
SIGTERM is Slurm ending the job (preemption, ``scontrol requeue``, ``scancel``): the run
checkpoints if it can before the SIGKILL that follows, and leaves the requeue to Slurm.

The handler only sets a flag. The trainer asks ``agreed()`` at each progress line and at
each epoch end (a collective, so all ranks stop at the same step). NCCL takes SIGUSR1 for
itself, so USR1 is never used.
"""

from __future__ import annotations

import signal
import time
from typing import Optional

from clusterjob import dist


class StopSignal:
    def __init__(self) -> None:
        self.received_at: Optional[float] = None
        self.signal: Optional[str] = None

    def install(self) -> "StopSignal":
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received_at, self.signal = time.time(), signal.Signals(signum).name
        print(f"received {self.signal}: checkpointing at the next step boundary", flush=True)

    @property
    def requeue_wanted(self) -> bool:
        """Slurm requeues (or ends) a job it sent SIGTERM; after USR2 the run requeues itself."""
        return self.signal != "SIGTERM"

    def agreed(self) -> bool:
        """True on every rank when any rank got a signal. All ranks must call this."""
        return dist.any_rank(self.received_at is not None)
