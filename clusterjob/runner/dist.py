"""The one door to torch.distributed: rendezvous, process group, collectives (the rule:
docs/design.md, "Architecture").

No other module of clusterjob touches ``torch.distributed`` (DDP and DistributedSampler
aside); a test reads the imports to keep it so. The reason is the device rule of the
backends: NCCL (and the ``cuda:gloo`` test backend) serve CUDA tensors only, gloo serves
CPU tensors. Every helper here puts its tensors on the process group's device, so no
caller has to remember which one that is.

Functions documented "all ranks must call this" are collectives: calling them on some
ranks only hangs the others until the timeout. In a single process they are no-ops.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as tdist

from clusterjob.core.errors import BadInput
from clusterjob.spec.schema import check_rendezvous_file

# How long a rank waits for rank 0 to finish a dataset download (a rank that dies meanwhile
# is ended by its launcher: srun --kill-on-bad-exit, the local supervisor).
DOWNLOAD_WAIT_S = 4 * 3600

_device: Optional[torch.device] = None  # the group's device, once ``init`` made the group
_store: Optional[tdist.Store] = None
_store_world, _store_rank = 1, 0
_FAILED = "\0failed"


def initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def rank() -> int:
    return tdist.get_rank() if initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if initialized() else 1


def is_main() -> bool:
    """The one predicate for side effects: printing, metrics, checkpoints, run.json."""
    return rank() == 0


def device() -> torch.device:
    """The device of the process group's tensors: cuda:LOCAL_RANK under NCCL, else cpu.
    A group made by the user's own code (an entrypoint) is asked for its backend."""
    if _device is not None:
        return _device
    if initialized() and "nccl" in str(tdist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_device(backend: str, training_device: str) -> torch.device:
    """NCCL and ``cuda:...`` backends take tensors on the training GPU; gloo takes CPU ones."""
    return torch.device(training_device) if backend == "nccl" or backend.startswith("cuda:") else torch.device("cpu")


# ----------------------------------------------------------------------------- rendezvous


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """Inside a rendezvous torch waits in C++, where Python's signal handlers never run: let
    SIGTERM and SIGINT end the process at once (nothing is trained yet) instead of after
    the timeout."""
    saved = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def rendezvous(env, init_method: str, timeout_s: float) -> None:
    """Meet the other ranks in a key-value store (before any process group, so that a
    dataset download can wait on it without the collective timeout). ``env`` is a
    clusterjob.core.ranks.DistEnv. No-op for one process. All ranks must call this."""
    global _store, _store_world, _store_rank
    if env.world_size == 1:
        return
    if init_method.startswith("file://"):
        check_rendezvous_file(init_method)  # torch would spin forever, deaf to the timeout and signals
    _store_world, _store_rank = env.world_size, env.rank
    timeout = datetime.timedelta(seconds=timeout_s)
    with _signals_end_the_wait():
        if init_method.startswith("file://"):
            _store = tdist.FileStore(init_method[len("file://"):], env.world_size)
            _store.set_timeout(timeout)
        else:
            host, port = _tcp_address(env, init_method)
            # torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; multi_tenant lets
            # a process group made later in this process (the user's own code) share ours.
            hosted = init_method == "env" and env.agent_store
            _store = tdist.TCPStore(host, port, env.world_size, is_master=env.rank == 0 and not hosted,
                                    timeout=timeout, multi_tenant=True)


def _tcp_address(env, init_method: str) -> tuple[str, int]:
    if init_method == "env":
        return env.master_addr, env.master_port
    host, _, port = init_method[len("tcp://"):].rpartition(":")
    return host, int(port)


def init(env, backend: str, training_device: str, timeout_s: float) -> None:
    """Make the process group on the rendezvous store; the group's collectives use
    ``group_device(backend, training_device)``. All ranks must call this."""
    global _device
    if env.world_size == 1:
        return
    _device = group_device(backend, training_device)
    extra: dict[str, Any] = {"device_id": _device} if backend == "nccl" else {}  # eager NCCL init: errors show here
    assert _store is not None  # rendezvous made it: more than one process
    with _signals_end_the_wait():
        tdist.init_process_group(backend=backend, store=tdist.PrefixStore("clusterjob/pg", _store),
                                 rank=env.rank, world_size=env.world_size,
                                 timeout=datetime.timedelta(seconds=timeout_s), **extra)


def destroy() -> None:
    """Leave the process group after a clean run (every rank gets here)."""
    if initialized():
        tdist.destroy_process_group()


def abort() -> None:
    """Leave the process group after an error: destroy_process_group could wait behind a
    collective that the other ranks never match, and then the launcher's kill of the
    failed task (srun --kill-on-bad-exit) never comes."""
    if initialized():
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()


# ----------------------------------------------------------------------------- collectives


def barrier() -> None:
    """All ranks must call this."""
    if initialized():
        tdist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over ranks (on the group's device). All ranks must call this."""
    if not initialized():
        return tensor
    tensor = tensor.to(device())
    tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank (one host sync). All ranks
    must call this."""
    if not initialized():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32, device=device())
    tdist.all_reduce(value, op=tdist.ReduceOp.MAX)
    return bool(value.item())


def all_gather_object(obj: Any) -> list:
    """Every rank's ``obj`` (picklable), in rank order. All ranks must call this."""
    if not initialized():
        return [obj]
    out: list = [None] * world_size()
    tdist.all_gather_object(out, obj)  # torch stages the bytes on the group's device
    return out


# ----------------------------------------------------------------------------- before the group


def _store_barrier(store: tdist.Store, key: str, timeout_s: float) -> None:
    """Wait on the rendezvous ``store`` until all ``_store_world`` ranks arrived at ``key``."""
    if store.add(f"clusterjob/{key}", 1) == _store_world:
        store.set(f"clusterjob/{key}/done", "1")  # the same bytes as b"1"
    store.wait([f"clusterjob/{key}/done"], datetime.timedelta(seconds=timeout_s))


def _timeout_s(store: tdist.Store) -> float:
    """The store's own timeout (rendezvous set it)."""
    return store.timeout.total_seconds()  # type: ignore[attr-defined]  # a property the torch stubs lack


@contextlib.contextmanager
def rank0_first(env) -> Iterator[None]:
    """Rank 0 runs the block first (a download), then each node's local rank 0 (node-local
    storage), then everyone else. It waits on the rendezvous store, before the process
    group exists, so a long download is not bound by the collective timeout. An error in
    the block is raised after the last turn, so no rank waits for one that already failed.
    All ranks must enter it (after ``rendezvous``)."""
    stage = 0 if env.rank == 0 else (1 if env.local_rank == 0 else 2)
    error: Optional[BaseException] = None
    for turn in range(3):
        if turn == stage:
            try:
                yield
            except Exception as exc:  # re-raised below, after the other turns
                error = exc
        if _store is not None:
            _store_barrier(_store, f"rank0-first/{turn}", DOWNLOAD_WAIT_S)
    if error is not None:
        raise error


def from_rank0(key: str, make: Callable[[], str]) -> str:
    """Rank 0's ``make()`` on every rank, through the rendezvous store (no process group
    needed). When it raises on rank 0, the other ranks raise too instead of waiting.
    All ranks must call this (after ``rendezvous``)."""
    if _store is None:
        return make()
    name = f"clusterjob/value/{key}"
    if _store_rank != 0:
        value = _store.get(name).decode()
        if value == _FAILED:
            raise BadInput(f"rank 0 could not set up the run ({key}); its log says why")
        return value
    try:
        value = make()
    except BaseException:
        _store.set(name, _FAILED)
        raise
    _store.set(name, value)
    return value


def exchange(key: str, value: Any) -> list:
    """Every rank's ``value`` (JSON: tuples come back as lists), in rank order, through
    the rendezvous store: no process group needed, so facts that decide whether the
    group can be made at all (two ranks on one GPU under NCCL) are shared before it is.
    All ranks must call this once per ``key`` (after ``rendezvous``)."""
    if _store is None:
        return [json.loads(json.dumps(value))]
    prefix = f"clusterjob/exchange/{key}"
    _store.set(f"{prefix}/{_store_rank}", json.dumps(value))
    values = [json.loads(_store.get(f"{prefix}/{rank}")) for rank in range(_store_world)]  # get waits for the key
    # Rank 0 serves the store: it stays until every rank has read, since a rank that leaves
    # at once (bad input found in the values) would cut the others off mid-read. The others
    # leave after their last write, which the store has taken once rank 0 sees it.
    _store.set(f"{prefix}/read/{_store_rank}", "1")
    if _store_rank == 0:
        _store.wait([f"{prefix}/read/{rank}" for rank in range(_store_world)])
    return values


# ----------------------------------------------------------------------------- with or without a group


_agreements = 0


def any_rank_anywhere(flag: bool) -> bool:
    """``any_rank`` through the process group when there is one (the user's own code
    made it), else through the rendezvous store. All ranks must call this."""
    global _agreements
    if initialized() or _store is None:
        return any_rank(flag)
    _agreements += 1
    key = f"clusterjob/any/{_agreements}"
    _store.add(key, int(flag))
    _store_barrier(_store, f"any/{_agreements}", _timeout_s(_store))
    return int(_store.get(key)) > 0


def barrier_anywhere() -> None:
    """``barrier`` through the process group when there is one, else the rendezvous store.
    All ranks must call this."""
    global _agreements
    if initialized() or _store is None:
        barrier()
        return
    _agreements += 1
    _store_barrier(_store, f"barrier/{_agreements}", _timeout_s(_store))

