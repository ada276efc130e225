"""One unit per quantity: how a number clusterjob shows is written, wherever it shows.

The report's tables, ``status``, the ``submit --wait`` summary and the trainer's log
lines all go through ``quantity`` (or ``number`` beside a header that names the
unit), so an accuracy is a percentage, a time is seconds (minutes, hours) and a
throughput is samples/s everywhere. metrics.jsonl and run.json keep the raw values
(accuracies as fractions, times in seconds).
"""

from __future__ import annotations

import math
from typing import Optional

# Metrics logged as fractions and shown in % (the built-in trainer's accuracies).
PERCENT = frozenset({"val_acc", "best_val_acc", "train_acc", "val_acc_ema", "val_acc_tta"})
# Metrics in seconds, shown in s, min or h by their size (the last two: the report's cost).
DURATIONS = frozenset({"wall_time_s", "epoch_time_s", "queue_wait_s", "lost_s"})
# The built-in trainer's losses, shown with three decimals.
LOSSES = frozenset({"train_loss", "val_loss", "val_loss_ema"})
THROUGHPUT = "samples_per_s"
THROUGHPUT_UNIT = "samples/s"


def default_mode(name: str) -> str:
    """Which way metric ``name`` is better unless asked: min for a loss or an error rate
    (the name says loss or err), max for anything else. The report's ranking and a
    search's metric go by it."""
    return "min" if "loss" in name or "err" in name else "max"


def unit(name: str) -> str:
    """The unit ``number`` writes ``name`` in: "%", "samples/s", "s" (durations pick
    s, min or h by size: see ``duration``) or "" (a plain number)."""
    if name in PERCENT:
        return "%"
    if name == THROUGHPUT:
        return THROUGHPUT_UNIT
    return "s" if name in DURATIONS else ""


def number(name: str, value: float) -> str:
    """``value`` of metric ``name`` in its unit, without the unit: 97.46 (val_acc 0.9746),
    0.067 (val_loss), 423 (samples/s), 12 (epoch); durations as ``duration`` writes them;
    a metric of unknown scale (a user's own) with four significant digits."""
    if name in PERCENT:
        return f"{100 * value:.2f}"
    if name in DURATIONS:
        return duration(value)
    if name == THROUGHPUT or name in ("epoch", "epochs", "step"):
        return f"{value:.0f}"
    if name in LOSSES:
        return f"{value:.3f}"
    return f"{value:.4g}"


def quantity(name: str, value: Optional[float]) -> str:
    """``value`` of metric ``name`` with its unit: "97.46%", "0.067", "11.5 s",
    "423 samples/s"; "-" for a missing or non-finite value. What ``status`` and the
    ``submit --wait`` summary show for a run's final metrics."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    text = number(name, value)
    if name in PERCENT:
        return text + "%"
    return f"{text} {THROUGHPUT_UNIT}" if name == THROUGHPUT else text


def _time_unit(seconds: float) -> tuple:
    """(unit, seconds per unit, decimals) for a time of this size."""
    if seconds >= 3600:
        return "h", 3600.0, 2  # 1.1 h would hide a 6-minute difference
    if seconds >= 60:
        return "min", 60.0, 1
    return "s", 1.0, 1


def duration(seconds: float, std: Optional[float] = None, compact: bool = False) -> str:
    """Seconds as "11.5 s", "1.8 min" or "1.25 h"; with ``std`` (NaN or None: left out)
    "11.5 ± 0.3 s" in the mean's unit. ``compact`` drops the spaces: "11.5±0.3s"."""
    name, scale, digits = _time_unit(seconds)
    space = "" if compact else " "
    text = f"{seconds / scale:.{digits}f}"
    if std is not None and math.isfinite(std):
        text += f"{space}±{space}{std / scale:.{digits}f}"
    return f"{text}{space}{name}"


def compute_hours(gpu_hours: Optional[float], cpu_hours: Optional[float]) -> str:
    """What a run (or a group) used: "1.25 GPU-h", or "0.042 CPU-h" when it held no GPU;
    "-" when unknown."""
    if gpu_hours is not None and math.isfinite(gpu_hours) and gpu_hours > 0:
        return unit_hours(gpu_hours, "GPU")
    if cpu_hours is not None and math.isfinite(cpu_hours):
        return unit_hours(cpu_hours, "CPU")
    return "-"


def unit_hours(hours: float, unit: str) -> str:
    """"1.25 GPU-h" of ``unit`` (GPU or CPU); "-" when unknown."""
    return f"{_hours(hours)} {unit}-h" if math.isfinite(hours) else "-"


def gpu_cell(name: str, value: Optional[float]) -> str:
    """A GPU efficiency value: utilisation "87%", memory "29.8 GiB", idle GPU-hours as
    hours are written ("0.417"); "-" when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if name == "gpu_util_pct":
        return f"{value:.0f}%"
    return f"{value:.1f} GiB" if name == "gpu_mem_peak_gib" else _hours(value)


def _hours(value: float) -> str:
    """Three significant digits, never in e-notation: 0.00417, 0.417, 2.00, 41.7, 417, 4170;
    "<0.001" below that (a few seconds of one CPU), "0" for none."""
    if value == 0:
        return "0"
    if value < 0.001:
        return "<0.001"
    return f"{value:.0f}" if value >= 99.95 else f"{value:#.3g}".rstrip(".")


# ----------------------------------------------------------------------------- Slurm's requests


def slurm_mem(gb: float) -> str:
    """A memory request as Slurm writes it: 16 -> "16G"; fractions in whole MB, rounded
    up: 1.5 -> "1536M" (sbatch's --mem, and ``status``'s line of a run given more)."""
    return f"{int(gb)}G" if float(gb).is_integer() else f"{math.ceil(gb * 1024)}M"


def slurm_time(minutes: float) -> str:
    """Minutes as Slurm's [days-]hours:minutes:seconds: 90 -> "01:30:00", 1500 ->
    "1-01:00:00", 1.5 -> "00:01:30" (a limit grown by a factor keeps its seconds, rounded up)."""
    days, rest = divmod(math.ceil(minutes * 60), 24 * 3600)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
