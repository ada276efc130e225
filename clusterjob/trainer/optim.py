"""Optimizer with per-layer parameter groups, and one learning-rate schedule per group."""

from __future__ import annotations

import math
from typing import Callable

import torch

from clusterjob.spec.schema import TrainSpec


def scaled_lr(train: TrainSpec, world_size: int) -> float:
    """Base lr scaled to the global batch (relative to world_size x grad_accum)."""
    factor = world_size * train.grad_accum
    return train.lr * {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[train.lr_scaling]


def group_parameters(model: torch.nn.Module, train: TrainSpec) -> list[dict]:
    """Optimizer groups: the default group first (its lr is the logged ``lr``), then one per
    ``train.param_groups`` entry; a parameter joins the first entry whose prefix matches."""
    buckets: list[list] = [[] for _ in range(len(train.param_groups) + 1)]
    for name, param in model.named_parameters():
        if param.requires_grad:
            buckets[_group_index(name, train) + 1].append(param)
    groups = [{"params": buckets[0], "name": "default", "lr_mult": 1.0, "schedule": train.schedule,
               "weight_decay": train.weight_decay}]
    for spec, params in zip(train.param_groups, buckets[1:]):
        if not params:
            raise ValueError(f"train.param_groups: match {spec.match!r} selects no parameter; "
                             f"parameter names start like {_first_names(model)}")
        groups.append({"params": params, "name": spec.match, "lr_mult": spec.lr_mult,
                       "schedule": spec.schedule or train.schedule,
                       "weight_decay": train.weight_decay if spec.weight_decay is None else spec.weight_decay})
    return groups


def _group_index(name: str, train: TrainSpec) -> int:
    for i, group in enumerate(train.param_groups):
        if name.startswith(group.match):
            return i
    return -1


def _first_names(model: torch.nn.Module) -> str:
    return ", ".join(n for n, _ in list(model.named_parameters())[:4])


def build_optimizer(model: torch.nn.Module, train: TrainSpec, world_size: int) -> torch.optim.Optimizer:
    """SGD or AdamW over the parameter groups, fused: one kernel per step, and the fp16
    GradScaler hands it the inf check on the device instead of an ``.item()`` per step."""
    base = scaled_lr(train, world_size)
    groups = group_parameters(model, train)
    for group in groups:
        group["lr"] = base * group["lr_mult"]
    if train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=base, betas=(train.momentum, 0.999), fused=True)
    return torch.optim.SGD(groups, lr=base, momentum=train.momentum,
                           nesterov=train.nesterov and train.momentum > 0, fused=True)


def lr_factor(schedule: str, step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of a group's lr at optimizer ``step``: linear warmup, then the schedule.

    step decays 10x at 50 % and 75 % of training; cosine goes to 0 at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "step":
        return 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec,
                    steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepped once per optimizer step, one lambda per parameter group."""
    total = train.epochs * steps_per_epoch
    warmup = round(train.warmup_epochs * steps_per_epoch)

    def factor_for(schedule: str) -> Callable[[int], float]:
        return lambda step: lr_factor(schedule, step, warmup, total)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [factor_for(g["schedule"]) for g in optimizer.param_groups])


def current_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """``lr`` (the default group) and ``lr_<match>`` for each other group, for metrics."""
    lrs = {"lr": optimizer.param_groups[0]["lr"]}
    for group in optimizer.param_groups[1:]:
        lrs[f"lr_{group['name']}"] = group["lr"]
    return lrs
