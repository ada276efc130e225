"""Learning-rate scaling, schedules per parameter group, and what an epoch record holds."""

from __future__ import annotations

import math

import pytest
import torch
from trainutil import epochs_of, run_hand_set, write_spec

from clusterjob.spec.schema import spec_from_dict
from clusterjob.trainer.optim import build_optimizer, build_scheduler, current_lrs, lr_factor, scaled_lr


def train_spec(**train):
    return spec_from_dict({"name": "t", "train": train}).train


def test_lr_scaling_is_relative_to_world_size_times_grad_accum():
    assert scaled_lr(train_spec(lr=0.1, lr_scaling="none", grad_accum=2), 8) == 0.1
    assert scaled_lr(train_spec(lr=0.1, lr_scaling="linear", grad_accum=2), 8) == pytest.approx(1.6)
    assert scaled_lr(train_spec(lr=0.1, lr_scaling="sqrt", grad_accum=2), 8) == pytest.approx(0.4)


def test_schedules_warm_up_then_decay():
    assert [lr_factor("cosine", s, 4, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor("cosine", 4, 4, 20) == 1.0
    assert lr_factor("cosine", 12, 4, 20) == pytest.approx(0.5)
    assert lr_factor("cosine", 20, 4, 20) == pytest.approx(0.0)
    assert [lr_factor("step", s, 0, 100) for s in (0, 49, 50, 74, 75, 99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    assert lr_factor("constant", 90, 4, 100) == 1.0


def test_each_parameter_group_follows_its_own_schedule():
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(4, 4))
    model.add_module("fc2", torch.nn.Linear(4, 2))
    train = train_spec(lr=0.1, lr_scaling="none", weight_decay=1e-4, warmup_epochs=1, epochs=3, schedule="cosine",
                       param_groups=[{"match": "fc2.", "lr_mult": 10, "weight_decay": 0, "schedule": "constant"}])
    opt = build_optimizer(model, train, world_size=1)
    sched = build_scheduler(opt, train, steps_per_epoch=10)
    default, head = opt.param_groups
    assert [len(default["params"]), len(head["params"])] == [2, 2]
    assert (default["weight_decay"], head["weight_decay"]) == (1e-4, 0)
    seen = []
    for _ in range(30):
        seen.append(current_lrs(opt))
        opt.step()
        sched.step()
    assert seen[0] == pytest.approx({"lr": 0.01, "lr_fc2.": 0.1})  # warmup: step 1 of 10
    assert seen[9] == pytest.approx({"lr": 0.1, "lr_fc2.": 1.0})
    assert seen[29]["lr"] < 0.001 and seen[29]["lr_fc2."] == pytest.approx(1.0)
    assert seen[19]["lr"] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 9 / 20)))


def test_a_group_that_matches_nothing_is_an_error():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="match 'head.' selects no parameter; parameter names start like 0.weight"):
        build_optimizer(model, train_spec(param_groups=[{"match": "head."}]), 1)


@pytest.mark.slow
def test_epoch_record_has_group_lrs_ema_and_tta(tmp_path):
    spec = write_spec(tmp_path, "rec", data={"tta": "flip"}, train={
        "epochs": 2, "ema_decay": 0.9, "label_smoothing": 0.1, "optimizer": "adamw", "lr": 1e-3,
        "param_groups": [{"match": "fc2.", "lr_mult": 10, "schedule": "constant"}]})
    run_hand_set(spec, tmp_path / "rec", world=1)
    first, last = epochs_of(tmp_path / "rec")
    assert {"epoch", "step", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "lr_fc2.", "epoch_time_s",
            "samples_per_s", "val_acc_ema", "val_acc_tta"} <= last.keys()
    assert last["lr_fc2."] == pytest.approx(0.01) and last["lr"] == pytest.approx(0.0)
    assert (first["epoch"], last["epoch"], last["step"]) == (1, 2, 32)
    assert 0 <= last["val_acc_ema"] <= 1 and 0 <= last["val_acc_tta"] <= 1 and last["samples_per_s"] > 0
