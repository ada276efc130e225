"""The trainer's metric sums: kept per step as views, summed on the device in groups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_gpu_path import SyncCounter

from clusterjob.trainer import train


def _steps(n: int, last_size: int):
    """(loss, logits, targets) per step: loss i is i / 10, inf every 7th step; the logits
    pick class 0, and step i's targets have i % 3 zeros."""
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        size = last_size if i == n - 1 else 4
        loss = torch.tensor(float("inf") if i % 7 == 3 else i / 10)
        logits = torch.zeros(size, 10).index_fill_(1, torch.tensor([0]), 1.0) + torch.rand(size, 10, generator=g) / 10
        targets = torch.tensor([0] * (i % 3) + [5] * (size - i % 3))
        yield loss, logits, targets


def _expected(n: int, last_size: int) -> tuple:
    sizes = [last_size if i == n - 1 else 4 for i in range(n)]
    finite = [i for i in range(n) if i % 7 != 3]
    return (sum(i / 10 * sizes[i] for i in finite), sum(i % 3 for i in range(n)), sum(sizes[i] for i in finite),
            sum(sizes))


@pytest.mark.parametrize("n", [5, train.PENDING_STEPS, 2 * train.PENDING_STEPS + 9])
def test_the_sums_are_the_per_step_sums_across_folds_and_a_partial_last_batch(n):
    meter = train.Meter(train.EpochState(), "cpu", 0)
    counter, steps = SyncCounter(), list(_steps(n, last_size=3))
    with counter:
        for step in steps:
            meter.add(*step)
    assert counter.seen == []  # the folds every PENDING_STEPS steps wait on nothing
    assert len(meter.pending) == n % train.PENDING_STEPS
    loss_sum, correct, finite_samples, samples = meter.state(n, 1.0).totals
    expected = _expected(n, 3)
    assert loss_sum == pytest.approx(expected[0], rel=1e-6)
    assert (correct, finite_samples, samples) == expected[1:]


def fake_trainer(amp: str, lr: float, peak: float, capability=None, scaling: str = "linear") -> SimpleNamespace:
    """What a progress window and the divergence hint read of a Trainer."""
    return SimpleNamespace(step=4, spec=SimpleNamespace(train=SimpleNamespace(lr=lr, lr_scaling=scaling)),
                           scheduler=SimpleNamespace(base_lrs=[peak]),
                           plan=SimpleNamespace(amp_name=amp, capability=capability))


@pytest.mark.parametrize("amp, capability, peak, hint", [
    ("bf16", None, 0.1, "lower train.lr (now 0.1)"),  # bf16 on CPU: no AMP hint
    ("off", 80, 0.1, "lower train.lr (now 0.1)"),
    ("bf16", 80, 0.2, "lower train.lr (now 0.1, 0.2 after lr_scaling: linear)"),
    ("fp16", 80, 0.1, "lower train.lr (now 0.1), or use train.amp: bf16 rather than fp16"),
    ("fp16", 70, 0.1, "lower train.lr (now 0.1), or use train.amp: off (fp16 overflows; these GPUs have no "
                      "native bf16)"),
])
def test_the_divergence_hint_gives_only_what_applies(amp, capability, peak, hint):
    assert train.divergence_hint(fake_trainer(amp, 0.1, peak, capability)) == hint


def test_a_window_takes_its_steps_only_and_a_window_without_a_finite_loss_diverged():
    meter = train.Meter(train.EpochState(2, (10.0, 3.0, 8.0, 8), 1.0, False), "cpu", 0)
    t = fake_trainer("bf16", lr=0.1, peak=0.1)
    steps = list(_steps(5, last_size=4))
    for step in steps[:3]:
        meter.add(*step)
    assert meter.take_window(t, 1) == pytest.approx((0.0 + 0.4 + 0.8, 12.0))
    meter.add(*steps[3])  # inf only
    with pytest.raises(train.DivergedError, match="epoch 1 from step 4 to 4"):
        meter.take_window(t, 1)
    loss_sum, correct, finite_samples, samples = meter.state(6, 2.0).totals
    assert (loss_sum, correct, finite_samples, samples) == (pytest.approx(11.2), 3.0 + 3, 20.0, 24)
