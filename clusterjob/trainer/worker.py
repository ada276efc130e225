"""The built-in trainer's task: data, model, then DDP + AMP epochs with checkpoints.

``clusterjob.run`` (what every task runs) calls ``train`` when the spec names no
entrypoint of the user's own. Running again on the same run folder resumes from its
latest checkpoint, mid-epoch included, with the weights an uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Any, Callable, Optional

import torch

from clusterjob.core import metrics, units
from clusterjob.core.ranks import DistEnv
from clusterjob.core.rundir import RunDir
from clusterjob.runner import checkpoint, dist, runrecord, sinks
from clusterjob.runner.preempt import StopSignal
from clusterjob.spec.schema import Spec
from clusterjob.trainer import device, pipeline
from clusterjob.trainer.data import build_datasets, build_torchvision_loaders, downloads, val_valid_count
from clusterjob.trainer.device import DevicePlan
from clusterjob.trainer.models import build_model
from clusterjob.trainer.optim import current_lrs
from clusterjob.trainer.train import (
    EpochState,
    Trainer,
    build_trainer,
    check_compile,
    epoch_metrics,
    evaluate,
    memory_format_for,
    train_epoch,
)


def prepare(spec: Spec, env: DistEnv) -> Callable[[RunDir, StopSignal], str]:
    """Everything that can be bad input on this rank, decided before any rendezvous (a
    LOCAL_RANK beyond the visible GPUs, torch.compile missing); then the trainer to run.
    ``train(run, stop)`` trains ``run`` to its last epoch ("completed"), or until a stop
    signal: every rank checkpoints where it is and the run is recorded stopped
    ("stopped"). All ranks must call it (after ``dist.rendezvous``)."""
    check_compile(spec)
    if spec.debug.deterministic:
        _deterministic()
    plan = device.detect_plan(spec, env)
    return functools.partial(train, spec, env, plan)


def train(spec: Spec, env: DistEnv, plan: DevicePlan, run: RunDir, stop: StopSignal) -> str:
    plan = device.plan_for_job(plan, spec)  # through the store: NCCL's first call would fail on a shared GPU
    if env.rank == 0:
        for note in ([plan.amp_line] if plan.amp_why else []) + list(plan.notes):  # what auto chose comes first
            print(note, flush=True)
    with dist.rank0_first(env) if downloads(spec.data) else contextlib.nullcontext():
        data = load_data(spec)  # before the process group: no timeout
    dist.init(env, plan.backend, plan.device, spec.dist.timeout_s)
    return run_training(spec, env, plan, run, stop, data)


def _deterministic() -> None:
    """debug.deterministic: the same weights from the same inputs on a GPU too (exact
    resume checks, scripts/gpu-check). cuBLAS reads its workspace setting when the first
    handle is made, so before any CUDA work; kernels without a deterministic version warn."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def load_data(spec: Spec) -> Any:
    """The splits for ``data.loader``: uint8 tensors for the tensor pipeline (datasets held
    in memory), else torchvision datasets."""
    if spec.data.loader_kind == "tensor":
        return pipeline.load_splits(spec.data, spec.train.seed)
    return build_datasets(spec.data, spec.train.seed)


def make_loaders(spec: Spec, env: DistEnv, plan: DevicePlan, data: Any) -> Any:
    """This rank's loaders for ``data`` (from ``load_data``); both kinds have
    ``train_loader``, ``val_loader`` and ``set_epoch(epoch, skip_batches)``."""
    if isinstance(data, pipeline.TensorData):
        return pipeline.build_tensor_loaders(data, spec.data, spec.train.batch_size, env.rank, env.world_size,
                                      spec.train.seed, plan.device, memory_format_for(spec, plan))
    return build_torchvision_loaders(data, spec.data, spec.train.batch_size, env.rank, env.world_size, spec.train.seed,
                         plan.pin_memory, spec.resources.cpus_per_task)


def run_training(spec: Spec, env: DistEnv, plan: DevicePlan, run: RunDir, stop: StopSignal, data) -> str:
    """The epoch loop, from the run's latest checkpoint (or from scratch)."""
    loaders = make_loaders(spec, env, plan, data)
    torch.manual_seed(spec.train.seed)  # identical initial weights on every rank
    model = build_model(spec.model.arch, data.num_classes, data.in_shape)
    trainer = build_trainer(spec, plan, model, len(loaders.train_loader), env.world_size)
    torch.manual_seed(spec.train.seed * 1000 + env.rank + 1)  # dropout differs across ranks
    start, partial, fresh = _resume(trainer, run, env)
    if dist.is_main():
        runrecord.mark_running(run, env, {"backend": plan.backend, "amp": plan.amp_name, "device": plan.device_type})
    n_valid = val_valid_count(len(data.val), env.rank, env.world_size)
    with sinks.for_trainer(spec, run, fresh, stop) if dist.is_main() else sinks.NoSinks() as metric_sinks:
        for epoch in range(start, spec.train.epochs + 1):
            _debug_fail(spec, env, epoch)
            loaders.set_epoch(epoch, partial.batches)
            progress = _progress_printer(epoch, spec.train.epochs) if dist.is_main() else _quiet
            state = train_epoch(trainer, _debug_slow(spec, env, loaders.train_loader), epoch, progress, stop.agreed,
                                partial)
            partial = EpochState()
            if not state.finished:
                _save(trainer, run, epoch - 1, env, state)
                return _stopped(run, spec, stop, metric_sinks)
            record = _epoch_record(trainer, loaders, n_valid, epoch, state)
            metric_sinks.log(epoch, record)  # rank 0: metrics.jsonl, the console line, the loggers, a prune
            # after the record: a trial its search prunes at this epoch's rung stops here
            stopping = epoch < spec.train.epochs and (spec.debug.exit_after_epoch == epoch or stop.agreed())
            _save(trainer, run, epoch, env, force=stopping or epoch == spec.train.epochs)
            if stopping:
                return _stopped(run, spec, stop, metric_sinks)
        metric_sinks.close("completed")  # the loggers hold every epoch before the run says completed
        if dist.is_main():
            runrecord.finish(run)
    return "completed"


def _epoch_record(t: Trainer, loaders, n_valid: int, epoch: int, state: EpochState) -> dict:
    record = {"epoch": epoch, **epoch_metrics(state)}
    fmt = t.memory_format
    record.update(evaluate(t.raw_model, loaders.val_loader, n_valid, t.plan, tta=t.spec.data.tta == "flip",
                           memory_format=fmt))
    if t.spec.train.ema_decay is not None:
        ema = evaluate(t.ema.module, loaders.val_loader, n_valid, t.plan, memory_format=fmt)
        record.update(val_acc_ema=ema["val_acc"], val_loss_ema=ema["val_loss"])
    return {**record, "step": t.step, **current_lrs(t.optimizer)}


def _quiet(*_: object) -> None:
    pass


def _progress_printer(epoch: int, epochs: int):
    def show(step: int, steps: int, loss: float, samples_per_s: float) -> None:
        print(f"[progress] epoch {epoch}/{epochs} step {step}/{steps} loss {loss:.4f} "
              f"{units.quantity(units.THROUGHPUT, samples_per_s)}", flush=True)
    return show


def _save(t: Trainer, run: RunDir, epoch: int, env: DistEnv, partial: Optional[EpochState] = None,
          force: bool = False) -> None:
    """Checkpoint after ``epoch`` complete epochs (plus ``partial`` progress into the next)
    on the spec's cadence or when forced. All ranks must call this: the RNG states and the
    ranks' partial sums are gathered."""
    if not (force or partial is not None or epoch % t.spec.checkpoint.every_epochs == 0):
        return
    per_rank = dist.all_gather_object((checkpoint.rng_state(t.plan.device), partial and list(partial.totals)))
    if dist.is_main():
        extra = {"batches": partial.batches, "seconds": partial.seconds,
                 "totals": [totals for _, totals in per_rank]} if partial else None
        checkpoint.save(run.checkpoints, epoch, {**t.state_dict(), "epoch": epoch, "partial": extra,
                                                 "rng": [rng for rng, _ in per_rank]},
                        t.spec.checkpoint.keep_last, batches=partial.batches if partial else 0)
    dist.barrier()  # the file is complete before any rank moves on (or exits)


def _resume(t: Trainer, run: RunDir, env: DistEnv) -> tuple[int, EpochState, bool]:
    """Load the latest checkpoint if any: the epoch to train next, how far into it, and
    whether the run starts afresh: without a checkpoint so do its metrics (a run whose
    every checkpoint is unreadable must not log its epochs twice) and its logger runs."""
    state = checkpoint.load_latest(run.checkpoints)
    if state is None:
        if dist.is_main():
            metrics.keep_until(run.metrics_file, 0)
        return 1, EpochState(), True
    t.load_state_dict(state)
    same_world = len(state["rng"]) == env.world_size
    if same_world:
        checkpoint.set_rng_state(state["rng"][env.rank], t.plan.device)
    partial = state.get("partial")
    if dist.is_main():
        metrics.keep_until(run.metrics_file, state["epoch"])
        where = f" and {partial['batches']} batches" if partial else ""
        print(f"resuming {run.path} after epoch {state['epoch']}{where}", flush=True)
    if not partial or not same_world or len(partial["totals"][0]) != len(EpochState().totals):
        return state["epoch"] + 1, EpochState(), False  # another world size cannot continue another's shards
    done = EpochState(partial["batches"], tuple(partial["totals"][env.rank]), partial["seconds"])
    return state["epoch"] + 1, done, False


def _stopped(run: RunDir, spec: Spec, stop: StopSignal, metric_sinks: "sinks.Sinks | sinks.NoSinks") -> str:
    """Every rank has checkpointed: rank 0 lets its loggers finish (Slurm ends a requeued
    job soon), records why and requeues the Slurm job (or task)."""
    metric_sinks.close("stopped")
    if dist.is_main():
        runrecord.record_stop(run, spec, stop.signal)
    dist.barrier()  # no rank exits before the requeue is on record
    return "stopped"


class _Slowed:
    """debug.slow_rank's loader: each batch comes ``seconds`` late, as from a slow disk."""

    def __init__(self, loader: Any, seconds: float):
        self.loader, self.seconds = loader, seconds

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            time.sleep(self.seconds)
            yield batch


def _debug_slow(spec: Spec, env: DistEnv, loader: Any) -> Any:
    return _Slowed(loader, spec.debug.slow_ms / 1000) if spec.debug.slow_rank == env.rank else loader


def _debug_fail(spec: Spec, env: DistEnv, epoch: int) -> None:
    if spec.debug.fail_at_epoch == epoch and env.rank == spec.debug.fail_rank:
        raise RuntimeError(f"debug.fail_at_epoch: rank {env.rank} fails at epoch {epoch} on purpose")
