"""The built-in trainer's step costs what a bare hand-written loop costs, op for op.

Every aten op the step dispatches is a kernel launch on a GPU (or a view, a few
microseconds of CPU), so the step's ops are counted on CPU (TorchDispatchMode, as the
host-sync test counts syncs) and compared with a bare loop on the same model, batch and
optimizer: zero_grad(set_to_none) / autocast forward / loss / backward / step. A failure
names the ops that differ, so a regression says where the overhead came back.
"""

from __future__ import annotations

import collections
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from clusterjob.spec.catalog import DATASETS
from clusterjob.spec.schema import spec_from_dict
from clusterjob.trainer import pipeline, train
from clusterjob.trainer.device import plan_device
from clusterjob.trainer.models import build_model

# Ops a training step may dispatch beyond the bare loop's. What is left: the trainer reads
# the batch's logits and loss for its metrics (two detach views, no kernel); the metric
# sums are folded on the device once per progress line, not per step.
STEP_OP_OVERHEAD = 2
# Ops the tensor pipeline's batch may dispatch beyond a bare GPU-style crop + flip +
# normalize of a uint8 batch. It does fewer: the split is padded once, not per batch.
BATCH_OP_OVERHEAD = 0
BATCH = 4
DECAY = 0.9
# made once, as a bare loop would
MEAN, STD = (torch.tensor(s).view(-1, 1, 1) for s in (DATASETS["synthetic"].mean, DATASETS["synthetic"].std))


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, by name (``convolution``, ``_to_copy``)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> collections.Counter:
    with OpCounter() as counter:
        fn()
    return counter.counts


def differences(ours: collections.Counter, bare: collections.Counter) -> str:
    """The ops whose counts differ, as ``name: ours vs bare`` lines, most different first."""
    names = sorted(set(ours) | set(bare), key=lambda n: (-abs(ours[n] - bare[n]), n))
    return "\n".join(f"  {n}: {ours[n]} vs {bare[n]}" for n in names if ours[n] != bare[n]) or "  none"


def assert_within(ours: collections.Counter, bare: collections.Counter, overhead: int, what: str) -> None:
    extra = sum(ours.values()) - sum(bare.values())
    if extra > overhead:  # raised, not asserted: pytest would indent the per-op lines
        raise AssertionError(f"{what}: {sum(ours.values())} ops against the bare loop's {sum(bare.values())} "
                             f"({extra} more, at most {overhead} allowed); per op, ours vs bare:\n"
                             f"{differences(ours, bare)}")


# ----------------------------------------------------------------------------- set-up


def _spec(arch: str, channels_last: bool, ema: bool, batches: int):
    return spec_from_dict({
        "name": "ops", "model": {"arch": arch, "channels_last": channels_last},
        "data": {"dataset": "synthetic", "limit_train": BATCH * batches, "limit_val": BATCH, "augment": True},
        "train": {"amp": "bf16", "optimizer": "sgd", "momentum": 0.9, "ema_decay": DECAY if ema else None,
                  "batch_size": BATCH, "log_every": 1000, "epochs": 2}})


def _trainer_and_loader(arch: str, channels_last: bool = False, ema: bool = False, batches: int = 4):
    """The trainer and tensor-pipeline loader the runner would build (CPU, bf16, fused SGD),
    and the loader's uint8 split."""
    spec = _spec(arch, channels_last, ema, batches)
    plan = plan_device(spec, 0, 1, 1, cuda_count=0)
    fmt = train.memory_format_for(spec, plan)
    data = pipeline.load_splits(spec.data, 0)
    loaders = pipeline.build_tensor_loaders(data, spec.data, BATCH, 0, 1, 0, "cpu", memory_format=fmt)
    torch.manual_seed(0)
    trainer = train.build_trainer(spec, plan, build_model(arch, 10, (3, 32, 32)), len(loaders.train_loader), 1)
    return trainer, loaders.train_loader, data.train


def _epoch_ops(trainer, loader, skip: int) -> collections.Counter:
    loader.set_epoch(1, skip)
    return count_ops(lambda: train.train_epoch(trainer, loader, 1, lambda *a: None, lambda: False))


def trainer_step_ops(trainer, loader) -> collections.Counter:
    """The ops of one step of train_epoch, its batch included: an epoch of two steps less
    an epoch of one (the epoch's set-up and end cancel out)."""
    loader.set_epoch(1)
    n = len(loader)
    _epoch_ops(trainer, loader, n - 1)  # warm: the optimizer's momentum buffers exist from here on
    counts = _epoch_ops(trainer, loader, n - 2)
    counts.subtract(_epoch_ops(trainer, loader, n - 1))
    return +counts


# ----------------------------------------------------------------------------- the bare loop


def bare_step(model, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


def bare_ema(average: list, model) -> None:
    """A hand-kept EMA: one lerp of the floating tensors, a copy of the integer buffers."""
    with torch.no_grad():
        tensors = [t.detach() for t in [*model.parameters(), *model.buffers()]]
        torch._foreach_lerp_([a for a in average if a.is_floating_point()],
                             [t for t in tensors if t.is_floating_point()], 1 - DECAY)
        torch._foreach_copy_([a for a in average if not a.is_floating_point()],
                             [t for t in tensors if not t.is_floating_point()])


def bare_batch(images, targets, index, top_left, flip, fmt=torch.contiguous_format):
    """A bare GPU-style batch: gather, pad, per-sample crop by advanced indexing, flip,
    normalize in float32, then the model's memory format."""
    (b,), (c, h, w) = index.shape, images.shape[1:]
    x = F.pad(images[index], (pipeline.PAD,) * 4)
    rows = (top_left[:, 0:1] + torch.arange(h))[:, None, :, None]
    cols = (top_left[:, 1:2] + torch.arange(w))[:, None, None, :]
    x = x[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    x = x.float().div(255).sub(MEAN).div(STD).contiguous(memory_format=fmt)
    return x, targets[index]


def bare_step_ops(trainer, batches, ema: bool) -> collections.Counter:
    average = [t.detach().clone() for t in [*trainer.raw_model.parameters(), *trainer.raw_model.buffers()]]

    def steps():
        for x, y in batches:
            bare_step(trainer.raw_model, trainer.optimizer, x, y)
            if ema:
                bare_ema(average, trainer.raw_model)
    steps()  # warm, as the trainer is
    return count_ops(steps)


def _part(i: int) -> slice:
    return slice(i * BATCH, (i + 1) * BATCH)


def _bare_args(loader, split, part: slice, fmt) -> tuple:
    """``bare_batch``'s arguments for the loader's own samples, crops and flips of ``part``."""
    return split.images, split.targets, loader.indices[part], loader.offsets[part], loader.flips[part], fmt


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("arch, channels_last, ema", [
    ("convnet", False, False), ("resnet18", False, False), ("resnet18", True, False), ("resnet18", True, True)])
def test_a_training_step_dispatches_the_bare_loops_ops_and_its_batchs(arch, channels_last, ema):
    trainer, loader, _ = _trainer_and_loader(arch, channels_last, ema)
    ours = trainer_step_ops(trainer, loader)
    batch = loader.batch(_part(0))
    bare = bare_step_ops(trainer, [batch], ema)
    bare.update(count_ops(lambda: loader.batch(_part(0))))  # the batch is compared with a bare one below
    assert ours["convolution"] == bare["convolution"] > 0  # the same model ran, as often
    assert_within(ours, bare, STEP_OP_OVERHEAD, f"a step of {arch}, channels_last {channels_last}, ema {ema}")


def test_a_step_on_ready_batches_is_the_bare_step():
    """Batches from elsewhere (the torchvision loader's, already on the device)."""
    trainer, loader, _ = _trainer_and_loader("resnet18")
    loader.set_epoch(1)
    batches = [loader.batch(_part(i)) for i in range(2)]

    def epoch(part):
        return lambda: train.train_epoch(trainer, part, 1, lambda *a: None, lambda: False)
    epoch(batches[:1])()  # warm
    ours = count_ops(epoch(batches))
    ours.subtract(count_ops(epoch(batches[:1])))
    bare = bare_step_ops(trainer, batches[1:], ema=False)
    assert_within(+ours, bare, STEP_OP_OVERHEAD, "a step of resnet18 on a ready batch")


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pipeline_batch_dispatches_no_more_than_a_bare_crop_flip(channels_last):
    trainer, loader, split = _trainer_and_loader("convnet", channels_last)
    loader.set_epoch(1)
    args = _bare_args(loader, split, _part(0), trainer.memory_format)
    ours, bare = count_ops(lambda: loader.batch(_part(0))), count_ops(lambda: bare_batch(*args))
    assert_within(ours, bare, BATCH_OP_OVERHEAD, "one batch")
    (x, y), (expected_x, expected_y) = loader.batch(_part(0)), bare_batch(*args)
    assert torch.equal(x, expected_x) and torch.equal(y, expected_y)  # the same pixels, bit for bit
    assert x.is_contiguous(memory_format=trainer.memory_format)
    assert set(loader.flips[_part(0)].tolist()) == {True, False}  # flipped and straight samples compared


def test_the_message_names_the_ops_that_came_back():
    trainer, loader, _ = _trainer_and_loader("convnet", batches=2)
    loader.set_epoch(1)
    x, y = loader.batch(_part(0))
    bare_step(trainer.raw_model, trainer.optimizer, x, y)  # warm: the momentum buffers exist
    bare = count_ops(lambda: bare_step(trainer.raw_model, trainer.optimizer, x, y))
    extra = count_ops(lambda: (bare_step(trainer.raw_model, trainer.optimizer, x, y), x.mul(2).add(1)))
    with pytest.raises(AssertionError, match=r"\(2 more, at most 1 allowed\); per op, ours vs bare:\n  add: 1 vs 0\n"
                                             r"  mul: 5 vs 4$"):  # the convnet's dropout multiplies too
        assert_within(extra, bare, 1, "a step")
