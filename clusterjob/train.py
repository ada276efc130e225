"""The built-in trainer: DDP + AMP training and exact distributed evaluation.

Optional features are null objects (``nullcontext`` autocast, a disabled GradScaler,
``NullEma``), so the step below has no feature branches. Side effects go through the
caller's callbacks, which act on rank 0 only.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from clusterjob import dist
from clusterjob.device import DevicePlan
from clusterjob.optim import build_optimizer, build_scheduler
from clusterjob.spec import Spec


class NullEma:
    """Stands in for the EMA model when ``train.ema_decay`` is null."""

    def update_parameters(self, model: torch.nn.Module) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_ema(model: torch.nn.Module, decay: Optional[float]) -> Any:
    if decay is None:
        return NullEma()
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def autocast_for(plan: DevicePlan) -> Callable[[], Any]:
    """A context factory: autocast in the plan's dtype, or a null context with AMP off."""
    if plan.amp_dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=plan.device_type, dtype=getattr(torch, plan.amp_dtype))


@dataclass
class Trainer:
    """Everything one training process holds; ``state_dict`` is what a checkpoint stores."""

    spec: Spec
    plan: DevicePlan
    model: torch.nn.Module        # the module trained (DDP-wrapped with several ranks)
    raw_model: torch.nn.Module    # the plain module: evaluation, checkpoints
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: Any
    steps_per_epoch: int
    step: int = 0

    def state_dict(self) -> dict:
        return {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "ema": self.ema.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.ema.load_state_dict(state["ema"])
        self.step = state["step"]


def steps_per_epoch(num_batches: int, grad_accum: int) -> int:
    """Optimizer steps per epoch: a last partial accumulation still steps."""
    return -(-num_batches // grad_accum)


def build_trainer(spec: Spec, plan: DevicePlan, model: torch.nn.Module, num_batches: int,
                  world_size: int) -> Trainer:
    """Move, convert and wrap the model; make optimizer, schedule, scaler and EMA."""
    model = model.to(plan.device)
    if plan.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    wrapped = _wrap_ddp(model, plan, world_size)
    optimizer = build_optimizer(model, spec.train, world_size)
    per_epoch = steps_per_epoch(num_batches, spec.train.grad_accum)
    return Trainer(spec=spec, plan=plan, model=wrapped, raw_model=model, optimizer=optimizer,
                   scheduler=build_scheduler(optimizer, spec.train, per_epoch),
                   scaler=torch.amp.GradScaler(plan.device_type, enabled=plan.use_scaler),
                   ema=build_ema(model, spec.train.ema_decay), steps_per_epoch=per_epoch)


def _wrap_ddp(model: torch.nn.Module, plan: DevicePlan, world_size: int) -> torch.nn.Module:
    if world_size == 1:
        return model
    device_ids = [torch.device(plan.device).index] if plan.device_type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _sync_context(model: torch.nn.Module, sync: bool) -> Any:
    """DDP's ``no_sync`` on micro-steps that do not end an accumulation (no all-reduce)."""
    no_sync = getattr(model, "no_sync", None)
    return contextlib.nullcontext() if sync or no_sync is None else no_sync()


Progress = Callable[[int, int, float, float], None]  # (step in epoch, steps, loss, images/s)


@dataclass(frozen=True)
class EpochState:
    """How far this rank got in an epoch: what a mid-epoch checkpoint stores."""

    batches: int = 0                      # micro-batches done
    totals: tuple = (0.0, 0.0, 0.0)       # this rank's loss sum, correct, samples
    seconds: float = 0.0
    finished: bool = False


def train_epoch(t: Trainer, loader: Any, progress: Progress, stop: Callable[[], bool],
                done: EpochState = EpochState()) -> EpochState:
    """Train over this rank's shard from ``done.batches`` on. At each progress line (the one
    host sync per ``train.log_every`` steps) ranks agree whether to stop; a stopped epoch
    returns unfinished, at an optimizer-step boundary."""
    t.model.train()
    device, accum = t.plan.device, t.spec.train.grad_accum
    autocast = autocast_for(t.plan)
    totals = torch.tensor(done.totals, device=device)
    window = torch.zeros(2, device=device)  # loss sum and samples since the last progress line
    n_batches, started, first_step = done.batches + len(loader), time.perf_counter(), t.step
    for i, (x, y) in enumerate(loader, start=done.batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ends_step = (i + 1) % accum == 0 or i + 1 == n_batches
        with _sync_context(t.model, ends_step):
            with autocast():
                out = t.model(x)
                loss = F.cross_entropy(out, y, label_smoothing=t.spec.train.label_smoothing)
            t.scaler.scale(loss / accum).backward()
        batch = torch.stack([loss.detach().float() * len(y), (out.argmax(1) == y).sum().float(),
                             torch.tensor(float(len(y)), device=device)])
        totals += batch
        window += batch[[0, 2]]
        if ends_step:
            _optimizer_step(t)
            if (t.step - first_step) % t.spec.train.log_every == 0:
                _report(progress, t, -(-(i + 1) // accum), first_step, window, started)
                if i + 1 < n_batches and stop():
                    return EpochState(i + 1, tuple(totals.tolist()), done.seconds + time.perf_counter() - started)
    return EpochState(n_batches, tuple(totals.tolist()), done.seconds + time.perf_counter() - started, True)


def _optimizer_step(t: Trainer) -> None:
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.optimizer.zero_grad(set_to_none=True)
    t.scheduler.step()
    t.ema.update_parameters(t.raw_model)
    t.step += 1


def _report(progress: Progress, t: Trainer, step_in_epoch: int, first_step: int, window: torch.Tensor,
            started: float) -> None:
    """This rank's mean loss since the last line, and the global images/s of this session."""
    loss_sum, samples = window.tolist()
    window.zero_()
    elapsed = time.perf_counter() - started
    seen = (t.step - first_step) * t.spec.train.batch_size * t.spec.train.grad_accum * dist.world_size()
    progress(step_in_epoch, t.steps_per_epoch, loss_sum / max(samples, 1.0), seen / max(elapsed, 1e-9))


def epoch_metrics(state: EpochState, device: str) -> dict:
    """The epoch's train metrics over all ranks. All ranks must call this."""
    loss_sum, correct, count = dist.all_reduce_sum(torch.tensor(state.totals, device=device)).tolist()
    return {"train_loss": loss_sum / count, "train_acc": correct / count,
            "epoch_time_s": state.seconds, "samples_per_s": count / state.seconds}


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Any, n_valid: int, plan: DevicePlan, tta: bool = False) -> dict:
    """Loss and accuracy over the whole validation set, exactly as one process would get.

    Only the first ``n_valid`` samples of this rank's shard count: the sampler pads the
    shards with repeated samples so every rank has the same number of batches.
    All ranks must call this.
    """
    model.eval()
    autocast = autocast_for(plan)
    totals = torch.zeros(4, device=plan.device)  # loss sum, correct, samples, correct with flip TTA
    seen = 0
    for x, y in loader:
        keep = max(0, min(len(y), n_valid - seen))
        seen += len(y)
        x, y = x[:keep].to(plan.device, non_blocking=True), y[:keep].to(plan.device, non_blocking=True)
        with autocast():
            logits = model(x).float()
            flipped = model(x.flip(3)).float() if tta else logits
        probs = logits.softmax(1) + flipped.softmax(1)
        totals += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum(),
                               torch.tensor(float(keep), device=plan.device), (probs.argmax(1) == y).sum()])
    loss_sum, correct, count, correct_tta = dist.all_reduce_sum(totals).tolist()
    result = {"val_loss": loss_sum / count, "val_acc": correct / count}
    return {**result, "val_acc_tta": correct_tta / count} if tta else result
