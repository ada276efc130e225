"""Process group setup and collectives that fall back to no-ops in a single process.

Functions documented "all ranks must call this" are collectives: calling them on some
ranks only hangs the others until the timeout.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterator

import torch
import torch.distributed as tdist


def initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def rank() -> int:
    return tdist.get_rank() if initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if initialized() else 1


def is_main() -> bool:
    """The one predicate for side effects: printing, metrics, checkpoints, run.json."""
    return rank() == 0


def init(env, backend: str, init_method: str, timeout_s: int) -> None:
    """Join the process group (no-op for one process). ``env`` is a clusterjob.env.DistEnv."""
    if env.world_size == 1:
        return
    from clusterjob import env as envmod

    if init_method == "env":
        envmod.export(env)  # torch's env:// reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
    tdist.init_process_group(
        backend=backend,
        init_method="env://" if init_method == "env" else init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def destroy() -> None:
    """Leave the process group; safe to call on every exit path."""
    if initialized():
        tdist.destroy_process_group()


def barrier() -> None:
    """All ranks must call this."""
    if initialized():
        tdist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place and return it. All ranks must call this."""
    if initialized():
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank. All ranks must call this."""
    if not initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


@contextlib.contextmanager
def rank0_first(local_rank: int) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. a download), then each node's local rank 0
    (node-local storage), then everyone else. All ranks must enter it."""
    stage = 0 if rank() == 0 else (1 if local_rank == 0 else 2)
    for turn in range(3):
        if turn == stage:
            yield
        barrier()
