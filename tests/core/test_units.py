"""One unit per quantity: what the report, status, the --wait summary and the trainer's
log lines write for a number."""

import math

import pytest

from clusterjob.core import units


@pytest.mark.parametrize("name, value, text", [
    ("val_acc", 0.9746, "97.46%"),
    ("best_val_acc", 1.0, "100.00%"),
    ("train_acc", 0.5964, "59.64%"),
    ("val_loss", 0.06687, "0.067"),
    ("train_loss", 32613.2892, "32613.289"),
    ("wall_time_s", 11.54, "11.5 s"),
    ("wall_time_s", 95, "1.6 min"),
    ("epoch_time_s", 4500, "1.25 h"),
    ("samples_per_s", 381.4, "381 samples/s"),
    ("epoch", 3, "3"),
    ("accuracy", 0.91234, "0.9123"),  # a user's own: four significant digits, no unit guessed
    ("val_acc", None, "-"),
    ("val_acc", math.nan, "-"),
    ("val_loss", math.inf, "-"),
])
def test_quantity(name, value, text):
    assert units.quantity(name, value) == text


def test_number_and_unit_go_together():
    assert (units.number("val_acc", 0.9746), units.unit("val_acc")) == ("97.46", "%")
    assert (units.number("samples_per_s", 381.4), units.unit("samples_per_s")) == ("381", "samples/s")
    assert units.unit("val_loss") == units.unit("accuracy") == ""


def test_a_duration_with_its_std_is_in_the_mean_unit():
    assert units.duration(36.3, 5.9) == "36.3 ± 5.9 s"
    assert units.duration(108, 12) == "1.8 ± 0.2 min"
    assert units.duration(108, 12, compact=True) == "1.8±0.2min"
    assert units.duration(30.0, math.nan) == "30.0 s"


@pytest.mark.parametrize("gpu, cpu, text", [
    (0.0, 0.00417, "0.00417 CPU-h"), (2.0, 8.0, "2.00 GPU-h"), (0.0, 0.0004, "<0.001 CPU-h"), (0.0, 0.0, "0 CPU-h"),
    (99.96, 400.0, "100 GPU-h"), (4170.4, 1.0, "4170 GPU-h"), (float("nan"), float("nan"), "-"), (0.0, None, "-"),
])
def test_compute_hours_say_gpu_or_cpu_with_three_digits_never_in_e_notation(gpu, cpu, text):
    assert units.compute_hours(gpu, cpu) == text
