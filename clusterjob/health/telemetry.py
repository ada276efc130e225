"""``<run>/telemetry.jsonl``: each rank's GPU samples (docs/design.md, "GPU efficiency"),
and what every reader makes of them: the report's efficiency columns, ``status``'s
last minute and the low-utilisation warning. Stdlib only.

One JSON record per GPU and sample, appended by the rank that uses the GPU:
``{"time": <unix s>, "rank": 0, "host": "node1", "gpu": "GPU-<uuid>", "util_pct": 87.0,
"mem_used_mib": 30512.0, "power_w": 301.5}`` (``power_w`` null where NVML has no
reading). Each rank writes its lines in one ``write`` on a descriptor opened with
O_APPEND, so the lines of ranks that append at once never mix. Kept apart from
metrics.jsonl: a sample is no metric and never moves a metric's steps.

Readers take what parses: a line cut off by a kill, garbage, a record with a field
missing or of the wrong type, a non-finite number are skipped (and counted), never
raised. Reads are bounded whatever a crash left in the file (clusterjob.core.files'
``Head`` and ``Tail``): a line over MAX_LINE_BYTES is skipped unread, NUL bytes end what
came before them on their line, the holes of a sparse file are never read.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

from clusterjob.core.files import Head, Tail, is_number, loads
from clusterjob.core.rundir import TELEMETRY_FILE, RunDir
from clusterjob.health import rankhealth

RECENT_S = 60.0  # status's window: the last minute
LOW_UTIL_S = 600.0  # a run under health.low_util_pct this long is warned about
BIN_S = 60.0  # the low-utilisation stretch is measured in minutes: the mean of every GPU's samples in each
INPUT_BOUND_PCT = 30.0  # the built-in trainer waits for its next batch at least this share of its time: input-bound
MAX_LINE_BYTES = 4096  # no record is longer; a longer line is garbage, skipped unread
MAX_READ_BYTES = 1 << 30  # the report reads at most this much of one file (years of 8 GPUs at 10 s)


@dataclass(frozen=True)
class Sample:
    """One GPU's reading at one time."""

    time: float
    rank: int
    host: str
    gpu: str
    util_pct: float
    mem_used_mib: float
    power_w: Optional[float] = None

    @property
    def key(self) -> tuple:
        """The GPU: its host and UUID (a UUID names one GPU, the host keeps two test fakes apart)."""
        return (self.host, self.gpu)

    def line(self) -> str:
        return json.dumps(asdict(self), separators=(", ", ": ")) + "\n"


def append(path: Path, samples: Iterable[Sample]) -> None:
    """The samples at the end of ``path``, in one write (O_APPEND: the lines of ranks that
    append at once never mix). Raises OSError (a full disk): the caller decides."""
    data = "".join(sample.line() for sample in samples).encode()
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def parse(line: "bytes | str") -> Optional[Sample]:
    """A record, or None for a line that is not one (cut off, garbage, a wrong field)."""
    if len(line) > MAX_LINE_BYTES:
        return None
    raw = loads(line.decode("utf-8", "replace") if isinstance(line, bytes) else line)
    if not isinstance(raw, dict):
        return None
    time_, util, mem = (_finite(raw.get(name)) for name in ("time", "util_pct", "mem_used_mib"))
    rank, host, gpu, power = raw.get("rank"), raw.get("host"), raw.get("gpu"), raw.get("power_w")
    power_w = _finite(power)
    if (time_ is None or util is None or mem is None or (power is not None and power_w is None)
            or not (isinstance(rank, int) and not isinstance(rank, bool) and isinstance(host, str)
                    and isinstance(gpu, str) and 0 <= util <= 100 and mem >= 0)):
        return None
    return Sample(time_, rank, host, gpu, util, mem, power_w)


def _finite(value: object) -> Optional[float]:
    """A finite JSON number as a float, else None."""
    return float(value) if is_number(value) and math.isfinite(value) else None  # type: ignore[arg-type]


@dataclass(frozen=True)
class Read:
    """What a file gave: its samples in file order, and how many lines were no record."""

    samples: list
    skipped: int = 0


def read(path: "str | os.PathLike", limit: int = MAX_READ_BYTES) -> Read:
    """Every record of the file (its first ``limit`` bytes); an absent file has none. A
    last line without its newline is read too (a reader of a file being written may meet
    half a record: it does not parse)."""
    samples, skipped = [], 0
    head = Head(path, limit, MAX_LINE_BYTES, chunk=1 << 20)
    for line, dropped in head.pairs():
        sample = parse(line)
        if sample is not None:
            samples.append(sample)
        elif line.strip() and not dropped:  # a line cut by a NUL byte is counted once, by the reader
            skipped += 1
    return Read(samples, skipped + head.skipped)


RECENT_MAX_BYTES = 64 << 20  # status reads at most this much of a file's end (11 min of 64 nodes of 8 GPUs at 1 s)


def recent(path: "str | os.PathLike", since: float, limit: int = RECENT_MAX_BYTES) -> Read:
    """The records of ``path`` from time ``since`` on, read from its end (a minute back:
    what ``status`` reads), oldest first, and how many lines on the way were no record
    (cut off, garbage, longer than MAX_LINE_BYTES: skipped unread). Ranks append in about
    time order: a record a minute older than ``since`` ends the reading; so do ``limit`` bytes."""
    found, skipped = [], 0
    tail = Tail(path, limit, MAX_LINE_BYTES)
    for line, dropped in tail.pairs():
        sample = parse(line)
        if sample is None:
            skipped += bool(line.strip()) and not dropped  # a line cut by a NUL byte: counted by the reader
            continue
        if sample.time < since - RECENT_S:
            break
        if sample.time >= since:
            found.append(sample)
    return Read(sorted(found, key=lambda s: s.time), skipped + tail.skipped)


def skipped_warning(read: Read) -> Optional[str]:
    """The warning for the lines a reading skipped; None when it skipped none."""
    if not read.skipped:
        return None
    return (f"{TELEMETRY_FILE}: {read.skipped} line(s) that are no sample (cut off, damaged, or longer than "
            f"{MAX_LINE_BYTES} bytes) were skipped")


# ----------------------------------------------------------------------------- what the samples say


@dataclass(frozen=True)
class Usage:
    """A run's GPUs over the samples: the time-weighted mean utilisation (%) over all its
    GPUs, the highest memory any used (GiB), the GPU-hours sampled and how many of them
    idle (GPU-hours times (1 - utilisation)), and the GPUs seen."""

    util_pct: float
    mem_peak_gib: float
    gpu_hours: float
    idle_gpu_hours: float
    gpus: int


def per_gpu(samples: Iterable[Sample]) -> dict:
    """{(host, gpu): its samples by time}, in the order the GPUs were first seen."""
    found: dict = {}
    for sample in samples:
        found.setdefault(sample.key, []).append(sample)
    return {key: sorted(listed, key=lambda s: s.time) for key, listed in found.items()}


def weights(times: list) -> list:
    """Seconds each sample stands for: until the next sample of its GPU, at most twice the
    GPU's usual period (a gap, the run stopped or queued, is no GPU time); the last
    stands for one period. One sample alone stands for none."""
    if len(times) < 2:
        return [0.0] * len(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    period = statistics.median(gaps)
    return [min(max(gap, 0.0), 2 * period) for gap in gaps] + [period]


def usage(samples: Iterable[Sample]) -> Optional[Usage]:
    """The run's Usage, None without a sample."""
    gpus = per_gpu(samples)
    if not gpus:
        return None
    seconds = busy = 0.0
    plain: list = []
    for listed in gpus.values():
        for sample, weight in zip(listed, weights([s.time for s in listed])):
            seconds += weight
            busy += weight * sample.util_pct / 100
            plain.append(sample.util_pct)
    util = 100 * busy / seconds if seconds > 0 else statistics.fmean(plain)
    peak = max(s.mem_used_mib for listed in gpus.values() for s in listed) / 1024
    return Usage(util, peak, seconds / 3600, (seconds - busy) / 3600, len(gpus))


def recent_line(samples: list) -> Optional[str]:
    """``GPUs: 87% busy, peak 29.8 GiB (2 GPUs, last minute)``: status's line for a
    running run; None without a sample."""
    if not samples:
        return None
    util = statistics.fmean(s.util_pct for s in samples)
    peak = max(s.mem_used_mib for s in samples) / 1024
    count = len(per_gpu(samples))
    return f"GPUs: {util:.0f}% busy, peak {peak:.1f} GiB ({count} GPU{'s' if count != 1 else ''}, last minute)"


# ----------------------------------------------------------------------------- low utilisation


@dataclass(frozen=True)
class LowStretch:
    """The longest stretch of whole minutes in which the run's GPUs were, on the mean,
    under the threshold: its first and last sample's time (unix s), mean, and the samples in it."""

    start: float
    end: float
    util_pct: float
    samples: list

    @property
    def seconds(self) -> float:
        return self.end - self.start


def low_stretch(samples: list, threshold: float) -> Optional[LowStretch]:
    """The longest run of consecutive minutes (from the first sample) whose mean over
    every GPU's samples is under ``threshold``; None when no minute is."""
    if not samples:
        return None
    first = min(s.time for s in samples)
    bins: dict = {}
    for sample in samples:
        bins.setdefault(int((sample.time - first) // BIN_S), []).append(sample)
    best: list = []
    current: list = []
    for index in sorted(bins):
        low = statistics.fmean(s.util_pct for s in bins[index]) < threshold
        current = (current if current and current[-1] == index - 1 else []) + [index] if low else []
        if len(current) > len(best):
            best = current
    if not best:
        return None
    inside = [s for index in best for s in bins[index]]
    return LowStretch(min(s.time for s in inside), max(s.time for s in inside),
                      statistics.fmean(s.util_pct for s in inside), inside)


def low_util_warning(samples: list, threshold: float, input_wait_pct: Optional[float]) -> Optional[str]:
    """The warning for a run whose GPUs stayed under ``threshold`` % for LOW_UTIL_S or
    longer, naming the likely cause; None otherwise. ``input_wait_pct``: the share of
    its time the built-in trainer waited for its next batch (None: not known)."""
    stretch = low_stretch(samples, threshold)
    if stretch is None or stretch.seconds < LOW_UTIL_S:
        return None
    return (f"GPU utilisation {stretch.util_pct:.0f}% for {stretch.seconds / 60:.0f} min, under "
            f"health.low_util_pct ({threshold:g}%): {_cause(stretch, threshold, input_wait_pct)}")


def _cause(stretch: LowStretch, threshold: float, input_wait_pct: Optional[float]) -> str:
    """What the runner knows of why: the trainer's input wait, one busy GPU of several,
    or low utilisation everywhere."""
    if input_wait_pct is not None and input_wait_pct >= INPUT_BOUND_PCT:
        return (f"likely the data loader: the trainer waited for its next batch {input_wait_pct:.0f}% of its time "
                "(more data.num_workers, or a dataset held in memory)")
    means = {key: statistics.fmean(s.util_pct for s in listed) for key, listed in per_gpu(stretch.samples).items()}
    busy = [key for key, mean in means.items() if mean >= threshold]
    if len(means) > 1 and len(busy) == 1:
        (host, gpu), others = busy[0], [mean for key, mean in means.items() if key != busy[0]]
        return (f"likely one busy GPU of {len(means)}: {gpu} on {host} at {means[busy[0]]:.0f}%, the others at "
                f"{statistics.fmean(others):.0f}% (is the work on one rank, or the others waiting for it?)")
    return "low utilisation on every GPU (a small model or batch, or a CPU-side bottleneck)"


INPUT_WAIT = "input_wait_pct"  # the health file's reading (``RankHealth.extra``) of the trainer's input wait


def input_wait_pct(run: RunDir, world: int) -> Optional[float]:
    """The largest share of its time a rank of the run's current start waited for its
    next batch (the built-in trainer times it: every rank waits for the slowest, so one
    rank starved of input holds them all); None when no rank says."""
    shares = [_finite(h.extra.get(INPUT_WAIT)) for h in rankhealth.of_session(run, max(world, 1))]
    numbers = [v for v in shares if v is not None]
    return max(numbers) if numbers else None
