"""The built-in trainer: DDP + AMP training and exact distributed evaluation.

Optional features are null objects (``nullcontext`` autocast, a disabled GradScaler,
``NullEma``), so the step below has no feature branches. Side effects go through the
caller's callbacks, which act on rank 0 only.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from clusterjob.core.errors import BadInput
from clusterjob.core.precision import BF16_CAPABILITY
from clusterjob.runner import dist, health
from clusterjob.spec.schema import Spec
from clusterjob.trainer.device import DevicePlan
from clusterjob.trainer.models import CONV_ARCHS
from clusterjob.trainer.optim import build_optimizer, build_scheduler


class NullEma:
    """Stands in for the EMA model when ``train.ema_decay`` is null."""

    def update_parameters(self, model: torch.nn.Module) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Ema:
    """An exponential moving average of the weights and buffers, for evaluation.

    One fused ``_foreach_lerp_`` per step; the update count is a host int. (torch's
    AveragedModel keeps its count on the device and copies it there every step: a host
    sync per step.) The first update copies the weights, as AveragedModel does. The
    state_dict has AveragedModel's layout ("module.<name>", "n_averaged")."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay, self.updates = decay, 0
        self._floats, self._others = _split_floating(self.module)
        # The trained model's tensor lists, made on its first update and kept: made per
        # step they cost a module walk and a view per tensor (122 for ResNet-18). The
        # tensors are updated in place (optimizer, BatchNorm, load_state_dict), so the
        # lists stay valid; the Parameters, not detached views, so a ``.data`` swap does too.
        self._source: Optional[tuple] = None

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        floats, others = self._tensors_of(model)
        if self.updates == 0:
            torch._foreach_copy_(self._floats, floats)
        else:
            torch._foreach_lerp_(self._floats, floats, 1.0 - self.decay)
        if others:
            torch._foreach_copy_(self._others, others)  # integer buffers (BN's batch count)
        self.updates += 1

    def _tensors_of(self, model: torch.nn.Module) -> tuple[list, list]:
        if self._source is None or self._source[0] is not model:
            self._source = (model, *_split_floating(model))
        return self._source[1], self._source[2]

    def state_dict(self) -> dict:
        return {**{f"module.{k}": v for k, v in self.module.state_dict().items()},
                "n_averaged": torch.tensor(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict({k[len("module."):]: v for k, v in state.items() if k.startswith("module.")})
        self.updates = int(state["n_averaged"])


def _split_floating(model: torch.nn.Module) -> tuple[list, list]:
    """(floating-point parameters and buffers, the other buffers), in a fixed order; not
    detached (a view per tensor per call): the EMA reads and writes them under no_grad."""
    tensors = list(itertools.chain(model.parameters(), model.buffers()))
    return [t for t in tensors if t.is_floating_point()], [t for t in tensors if not t.is_floating_point()]


class NullWaits:
    """Stands in for ``Waits`` with health off or a single rank."""

    def after_backward(self) -> None:
        pass


class Waits:
    """How long this rank waits for the slowest rank in each step (stragglers, docs/design.md,
    "Hung and slow ranks"): from the moment the backward computed its last gradient (DDP
    launches its last all-reduce then) to the moment ``backward()`` returned (DDP waits
    there until every all-reduce completed). The slowest rank computes its last gradient
    last and hardly waits. One tensor hook and one clock read a step, no host sync: on
    CUDA two events around it, added once they completed (``clock.settle``)."""

    def __init__(self, model: torch.nn.Module, clock: Any, cuda: bool):
        self.clock, self.cuda = clock, cuda
        self.ready: Any = None  # when the last gradient was ready: a time, or a CUDA event
        self.pending: list = []
        # The first parameter's gradient comes last in the backward of a network applied in order
        first = next(p for p in model.parameters() if p.requires_grad)
        first.register_post_accumulate_grad_hook(self._ready)
        if cuda:
            clock.settle = self.settle

    def _ready(self, param: torch.Tensor) -> None:
        if self.cuda:
            self.ready = torch.cuda.Event(enable_timing=True)
            self.ready.record()
        else:
            self.ready = time.perf_counter()

    def after_backward(self) -> None:
        if self.ready is None:
            return
        if self.cuda:
            done = torch.cuda.Event(enable_timing=True)
            done.record()  # on the stream DDP made wait for its all-reduce
            self.pending.append((self.ready, done))
        else:
            self.clock.add(time.perf_counter() - self.ready)
        self.ready = None

    def settle(self) -> None:
        """The waits whose events completed (a query, never a sync), from the monitor thread."""
        while self.pending and self.pending[0][1].query():
            start, end = self.pending.pop(0)
            self.clock.add(start.elapsed_time(end) / 1000.0)


def build_waits(model: torch.nn.Module, plan: DevicePlan, world_size: int) -> Any:
    """The wait timer of a DDP model when health is on, else a null object."""
    clock = health.clock()
    if clock is None or world_size == 1:
        return NullWaits()
    return Waits(model, clock, plan.device_type == "cuda")


def build_ema(model: torch.nn.Module, decay: Optional[float]) -> Any:
    return NullEma() if decay is None else Ema(model, decay)


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
    memory_format: torch.memory_format = torch.contiguous_format  # of the model's weights and inputs
    waits: Any = field(default_factory=NullWaits)  # the wait for the slowest rank (health on, several ranks)

    def state_dict(self) -> dict:
        return {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "ema": self.ema.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:  # fp16 saved it; a run saved with bf16 or AMP off has none
            self.scaler.load_state_dict(state["scaler"])
        self.ema.load_state_dict(state["ema"])
        self.step = state["step"]


def steps_per_epoch(num_batches: int, grad_accum: int) -> int:
    """Optimizer steps per epoch: a last partial accumulation still steps."""
    return -(-num_batches // grad_accum)


def build_trainer(spec: Spec, plan: DevicePlan, model: torch.nn.Module, num_batches: int,
                  world_size: int) -> Trainer:
    """Move, convert and wrap the model; make optimizer, schedule, scaler and EMA.
    ``train.compile`` was checked already (worker.prepare, before any download)."""
    fmt = memory_format_for(spec, plan)
    # ignore: Module.to takes memory_format beside a device (one pass); its overloads do not say so
    model = model.to(plan.device, memory_format=fmt)  # type: ignore[call-overload]
    if plan.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if plan.device_type == "cuda":
        # Let cuDNN time its algorithms per input shape and keep the fastest. The built-in
        # datasets have one image size, and batches take at most four shapes (train and
        # validation, each full and the last partial one; drop_last leaves one for train),
        # so the timing runs a few times in a run and every later step gains. It also
        # makes GPU runs not bit-reproducible, which cuDNN's backward already is not.
        torch.backends.cudnn.benchmark = not spec.debug.deterministic
    ema = build_ema(model, spec.train.ema_decay)  # before compile: the EMA copy runs eagerly
    wrapped = _wrap_ddp(model, plan, world_size)
    if spec.train.compile:
        # In place: the state_dict keeps its keys (torch.compile's wrapper would prefix
        # them), so checkpoints load into compiled and eager models alike. The DDP module
        # is the one compiled, so that torch splits the graph at DDP's gradient buckets and
        # the all-reduces still overlap the backward.
        wrapped.compile()
    optimizer = build_optimizer(model, spec.train, world_size)
    per_epoch = steps_per_epoch(num_batches, spec.train.grad_accum)
    return Trainer(spec=spec, plan=plan, model=wrapped, raw_model=model, optimizer=optimizer,
                   scheduler=build_scheduler(optimizer, spec.train, per_epoch),
                   scaler=torch.amp.GradScaler(plan.device_type, enabled=plan.use_scaler),
                   ema=ema, steps_per_epoch=per_epoch, memory_format=fmt,
                   waits=build_waits(model, plan, world_size))


def memory_format_for(spec: Spec, plan: DevicePlan) -> torch.memory_format:
    """``model.channels_last`` resolved: auto is channels_last for conv nets on CUDA, where
    cuDNN's NHWC kernels (tensor cores) are faster and every layer keeps the format; on
    CPU the gain is not reliable, so auto leaves the default there."""
    wanted = spec.model.channels_last
    if wanted == "auto":
        wanted = spec.model.arch in CONV_ARCHS and plan.device_type == "cuda"
    return torch.channels_last if wanted else torch.contiguous_format


def check_compile(spec: Spec) -> None:
    """BadInput when ``train.compile`` is on and this torch cannot compile a module in place."""
    if not spec.train.compile:
        return
    if not hasattr(torch.nn.Module, "compile"):
        raise BadInput(f"train.compile: true needs torch.compile with Module.compile (torch >= 2.2), but this "
                       f"is torch {torch.__version__}; set train.compile: false or install a newer torch")
    from torch import _dynamo

    if not _dynamo.is_dynamo_supported():
        raise BadInput(f"train.compile: true, but torch {torch.__version__} cannot compile on this Python "
                       "(torch._dynamo is not supported here); set train.compile: false or use a newer torch")


def _wrap_ddp(model: torch.nn.Module, plan: DevicePlan, world_size: int) -> torch.nn.Module:
    if world_size == 1:
        return model
    device_ids = [torch.device(plan.device).index] if plan.device_type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _sync_context(no_sync: Optional[Callable[[], Any]], sync: bool) -> Any:
    """DDP's ``no_sync`` (None for a plain module) on micro-steps that do not end an
    accumulation (no all-reduce)."""
    return contextlib.nullcontext() if sync or no_sync is None else no_sync()


Progress = Callable[[int, int, float, float], None]  # (step in epoch, steps, loss, samples/s)


class DivergedError(RuntimeError):
    """The loss was not finite in any step of a whole progress window."""


@dataclass(frozen=True)
class EpochState:
    """How far this rank got in an epoch: what a mid-epoch checkpoint stores."""

    batches: int = 0                          # micro-batches done
    totals: tuple = (0.0, 0.0, 0.0, 0.0)      # this rank's finite-loss sum, correct, finite-loss samples, samples
    seconds: float = 0.0
    finished: bool = False


# Steps whose metrics wait on the device before they are summed (at the latest): bounds
# what they hold, a batch's logits and targets each.
PENDING_STEPS = 64


class Meter:
    """One rank's running sums of an epoch, kept on the device so that a step needs no
    host sync; sample counts are host ints (the batch sizes are known there).

    A step only keeps its loss, logits and targets (two detached views, no kernel); the
    pending steps are summed together, a dozen kernels at a progress line or every
    ``PENDING_STEPS`` steps, so that a step launches what a bare loop does. (The logits
    are held until then: a compile mode whose outputs the next step overwrites, CUDA
    graphs, would need them summed per step.)

    The loss sums skip non-finite steps (fp16 overflows now and then; the GradScaler skips
    those steps too), and a progress window in which no step was finite is divergence."""

    def __init__(self, done: EpochState, device: str, step: int):
        loss_sum, correct, loss_samples, self.samples = done.totals
        self.sums = torch.tensor([loss_sum, correct, loss_samples], device=device)
        self.window = torch.zeros(2, device=device)  # finite-loss sum and samples since the last line
        self.window_samples, self.window_step = 0, step
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        self.pending.append((loss.detach(), out.detach(), y))
        self.samples += y.shape[0]
        self.window_samples += y.shape[0]
        if len(self.pending) == PENDING_STEPS:
            self.fold()

    def fold(self) -> None:
        """Add the pending steps to the sums, on the device (no host sync)."""
        if not self.pending:
            return
        losses, outs, ys = zip(*self.pending)
        self.pending = []
        loss_sum, finite_samples = _finite_loss_sums(losses, [y.shape[0] for y in ys])
        correct = (torch.cat(outs).argmax(1) == torch.cat(ys)).sum()
        step = torch.stack([loss_sum, correct.float(), finite_samples])
        self.sums += step
        self.window += step[::2]  # a strided view: an index list would be copied from the host

    def take_window(self, t: "Trainer", epoch: int) -> tuple[float, float]:
        """(finite-loss sum, finite samples) since the last call, one host sync;
        DivergedError when no step of the window had a finite loss."""
        self.fold()
        loss_sum, finite = self.window.tolist()
        samples, since = self.window_samples, self.window_step
        self.window.zero_()
        self.window_samples, self.window_step = 0, t.step
        if samples and not finite:
            raise DivergedError(
                f"the loss is not finite (nan or inf) in any step of epoch {epoch} from step {since} to {t.step}: "
                f"training diverged; {divergence_hint(t)}")
        return loss_sum, finite

    def state(self, batches: int, seconds: float, finished: bool = False) -> EpochState:
        self.fold()
        loss_sum, correct, loss_samples = self.sums.tolist()
        return EpochState(batches, (loss_sum, correct, loss_samples, self.samples), seconds, finished)


def divergence_hint(t: "Trainer") -> str:
    """What to change after a divergence, only what applies to this run: a lower lr (the
    peak lr too, when lr_scaling changed it), and under fp16 the AMP mode that does not
    overflow (bf16 where the GPUs run it natively, else off)."""
    train = t.spec.train
    peak = t.scheduler.base_lrs[0]  # the default group's lr after lr_scaling, before the schedule
    scaled = f", {peak:g} after lr_scaling: {train.lr_scaling}" if not math.isclose(peak, train.lr) else ""
    hint = f"lower train.lr (now {train.lr:g}{scaled})"
    if t.plan.amp_name != "fp16":
        return hint
    native_bf16 = t.plan.capability is None or t.plan.capability >= BF16_CAPABILITY
    return hint + (", or use train.amp: bf16 rather than fp16" if native_bf16
                   else ", or use train.amp: off (fp16 overflows; these GPUs have no native bf16)")


def _finite_loss_sums(losses: tuple, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of loss x batch size, sum of batch size) over the steps whose loss is finite.
    The steps are taken in groups of one batch size, a host int: no size list is copied
    to the device. (A run has two sizes at most: full batches and the last partial one.)"""
    sums = torch.zeros(2, device=losses[0].device)
    for size in sorted(set(sizes)):
        group = torch.stack([loss for loss, n in zip(losses, sizes) if n == size]).float()
        finite = torch.isfinite(group)
        sums += torch.stack([torch.where(finite, group, 0.0).sum(), finite.sum().float()]) * size
    return sums[0], sums[1]


def train_epoch(t: Trainer, loader: Any, epoch: int, progress: Progress, stop: Callable[[], bool],
                done: EpochState = EpochState()) -> EpochState:
    """Train over this rank's shard from ``done.batches`` on. The step has no host sync:
    the only ones are at each progress line (every ``train.log_every`` steps), where the
    ranks also agree whether to stop; a stopped epoch returns unfinished, at an
    optimizer-step boundary."""
    t.model.train()
    device, accum = t.plan.device, t.spec.train.grad_accum
    autocast = autocast_for(t.plan)
    meter = Meter(done, device, t.step)
    no_sync = getattr(t.model, "no_sync", None)  # once: a module misses an attribute slowly
    n_batches, clock, first_step = done.batches + len(loader), Clock(done.seconds), t.step
    for i, (x, y) in enumerate(health.timed_input(loader), start=done.batches):
        # non_blocking: a copy from pinned memory overlaps the GPU's work. A batch of the
        # tensor pipeline is on the device in the model's memory format: returned as it is
        x = x.to(device, non_blocking=True, memory_format=t.memory_format)
        y = y.to(device, non_blocking=True)
        ends_step = (i + 1) % accum == 0 or i + 1 == n_batches
        with _sync_context(no_sync, ends_step):
            with autocast():
                out = t.model(x)
                loss = F.cross_entropy(out, y, label_smoothing=t.spec.train.label_smoothing)
            # no division when nothing is accumulated: a division and its gradient per step
            t.scaler.scale(loss / accum if accum > 1 else loss).backward()
            t.waits.after_backward()
        meter.add(loss, out, y)
        if ends_step:
            _optimizer_step(t)
            health.beat()  # a clock read and a compare: the watchdog sees the step
            if (t.step - first_step) % t.spec.train.log_every == 0:
                progress_line(t, meter, ProgressLine(epoch, -(-(i + 1) // accum), first_step, clock), progress)
                if i + 1 < n_batches and stop():
                    return meter.state(i + 1, clock.seconds())
    meter.take_window(t, epoch)  # the steps after the last progress line
    return meter.state(n_batches, clock.seconds(), finished=True)


class Clock:
    """Seconds spent in an epoch, across a mid-epoch resume."""

    def __init__(self, before: float):
        self.before, self.started = before, time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.started

    def session(self) -> float:
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class ProgressLine:
    epoch: int
    step_in_epoch: int
    first_step: int  # the trainer's step when this session of the epoch began
    clock: Clock


def _optimizer_step(t: Trainer) -> None:
    t.scaler.step(t.optimizer)  # fused optimizers take the inf check on the device: no .item()
    t.scaler.update()
    t.optimizer.zero_grad(set_to_none=True)
    t.scheduler.step()
    t.ema.update_parameters(t.raw_model)
    t.step += 1


def progress_line(t: Trainer, meter: Meter, line: ProgressLine, progress: Progress) -> None:
    """The host sync of a progress line: this rank's mean loss since the last line and the
    global samples/s of this session; DivergedError on divergence."""
    loss_sum, finite = meter.take_window(t, line.epoch)
    seen = (t.step - line.first_step) * t.spec.train.batch_size * t.spec.train.grad_accum * dist.world_size()
    progress(line.step_in_epoch, t.steps_per_epoch, loss_sum / max(finite, 1.0), seen / max(line.clock.session(), 1e-9))


def epoch_metrics(state: EpochState) -> dict:
    """The epoch's train metrics over all ranks. All ranks must call this."""
    totals = torch.tensor(state.totals, dtype=torch.float64)
    loss_sum, correct, loss_samples, count = dist.all_reduce_sum(totals).tolist()
    return {"train_loss": loss_sum / max(loss_samples, 1.0), "train_acc": correct / count,
            "epoch_time_s": state.seconds, "samples_per_s": count / state.seconds}


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Any, n_valid: int, plan: DevicePlan, tta: bool = False,
             memory_format: torch.memory_format = torch.contiguous_format) -> dict:
    """Loss and accuracy over the whole validation set, exactly as one process would get.

    Only the first ``n_valid`` samples of this rank's shard count: the sampler pads the
    shards with repeated samples so every rank has the same number of batches.
    ``memory_format``: the model's (``Trainer.memory_format``), given to the inputs too.
    All ranks must call this.
    """
    model.eval()
    autocast = autocast_for(plan)
    totals = torch.zeros(3, dtype=torch.float64, device=plan.device)  # loss sum, correct, correct with flip TTA
    seen = count = 0
    for x, y in loader:
        keep = max(0, min(len(y), n_valid - seen))
        seen, count = seen + len(y), count + keep
        health.beat()
        x = x[:keep].to(plan.device, non_blocking=True, memory_format=memory_format)
        y = y[:keep].to(plan.device, non_blocking=True)
        with autocast():
            logits = model(x).float()
            flipped = model(x.flip(3)).float() if tta else logits
        probs = logits.softmax(1) + flipped.softmax(1)
        totals += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum(),
                               (probs.argmax(1) == y).sum()]).double()
    loss_sum, correct, correct_tta, count = dist.all_reduce_sum(
        torch.cat([totals.cpu(), torch.tensor([float(count)], dtype=torch.float64)])).tolist()
    result = {"val_loss": loss_sum / count, "val_acc": correct / count}
    return {**result, "val_acc_tta": correct_tta / count} if tta else result
