"""The one owner of SIGUSR2: Slurm's warning before the time limit, or a preemption notice.

The handler only sets a flag. The trainer asks ``agreed()`` at each progress line and at
each epoch end (a collective, so all ranks stop at the same step), then every rank
checkpoints, rank 0 requeues the job, and all exit. NCCL takes SIGUSR1 for itself;
submitit also sends USR2 (``--signal=USR2@delay``), so one mechanism serves both.
"""

from __future__ import annotations

import signal
import time
from typing import Optional

import torch

from clusterjob import dist


class StopSignal:
    def __init__(self) -> None:
        self.received_at: Optional[float] = None

    def install(self) -> "StopSignal":
        signal.signal(signal.SIGUSR2, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received_at = time.time()
        print(f"received {signal.Signals(signum).name}: checkpointing at the next step boundary", flush=True)

    def agreed(self) -> bool:
        """True on every rank when any rank got the signal. All ranks must call this."""
        flag = torch.tensor([1.0 if self.received_at is not None else 0.0])
        return dist.all_reduce_sum(flag).item() > 0


class NeverStop:
    """Stands in for StopSignal where no signal handling is wanted (tests, notebooks)."""

    def agreed(self) -> bool:
        return False
