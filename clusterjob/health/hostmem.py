"""The most host memory each rank used (docs/design.md,
"Resubmit with more memory or time"): the rank's watcher (clusterjob.runner.watchdog) samples, every SAMPLE_S, the
proportional set size of the rank and of every process under it (its DataLoader workers,
its subprocesses), and keeps the highest in ``logs/rank<R>.mem.json``, over every session
of the run. PSS splits a page that processes share (torch's libraries, a forked worker's
copy-on-write pages) between them, as Slurm counts a step with ``UsePss``: the sum is what
the rank's tree holds, not its pages counted once per worker. The report's
``mem_peak_gib`` is the highest of a run's ranks (clusterjob.report.memory), local and
Slurm runs alike, also for a rank killed out of memory (its last sample).

Linux /proc only (elsewhere nothing is sampled); a process that ended between the
listing and the read is left out. Stdlib only: the watcher imports no torch.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Optional

from clusterjob.core.files import loads, now_iso, read_text, write_atomic

SAMPLE_S = 5.0  # how often a watcher samples its rank's tree (Slurm's default accounting: 30 s)
WRITE_GROWTH = 1.05  # the file is rewritten once the peak grew this much, at most every WRITE_EVERY_S
WRITE_EVERY_S = 10.0
MAX_PROCESSES = 4096  # a tree larger than this is sampled in part
MAX_FILE_BYTES = 4096  # a rank's file is one short line
_KIB = 1024


def path_of(logs: Path, rank: int) -> Path:
    return logs / f"rank{rank}.mem.json"


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it (its children's children too), from /proc."""
    found: list[int] = []
    todo, seen = [pid], set()
    while todo and len(found) < MAX_PROCESSES:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except (OSError, ValueError):
                continue
    return found


def pss_bytes(pid: int) -> Optional[int]:
    """The process's PSS (its RSS where the kernel has no smaps_rollup); None once it is gone."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as lines:
                for line in lines:
                    if line.startswith(key.encode()):
                        return int(line.split()[1]) * _KIB
        except (OSError, ValueError, IndexError):
            continue
    return None


def tree_bytes(pid: int) -> Optional[int]:
    """What ``pid`` and the processes under it hold now; None when ``pid`` is gone."""
    values = [pss_bytes(each) for each in tree(pid)]
    return sum(value for value in values if value is not None) if values and values[0] is not None else None


def recorded(path: Path) -> int:
    """The peak a rank's file holds (0: none, or unreadable)."""
    raw = loads(read_text(path, MAX_FILE_BYTES)[0] or "")  # a FIFO or a huge file in its place: none
    value = raw.get("peak_bytes") if isinstance(raw, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def run_peak(run_path: "str | Path") -> float:
    """The highest peak of a run's ranks in bytes; NaN when no rank recorded one."""
    try:
        files = sorted((Path(run_path) / "logs").glob("rank*.mem.json"))
    except OSError:
        return math.nan
    peaks = [recorded(path) for path in files]
    return float(max(peaks)) if any(peaks) else math.nan


class Peak:
    """One rank's sampler: ``sample`` each tick (it samples every SAMPLE_S), ``save`` at the
    end. It starts from what the file holds (an earlier session's peak stays)."""

    def __init__(self, logs: Path, rank: int, pid: int):
        self.path, self.pid = path_of(logs, rank), pid
        self.written = self.peak = recorded(self.path)
        self.next_sample = 0.0
        self.last_write = -math.inf

    def sample(self) -> None:
        now = time.monotonic()
        if now < self.next_sample:
            return
        self.next_sample = now + SAMPLE_S
        held = tree_bytes(self.pid)
        if held is not None and held > self.peak:
            self.peak = held
        if self.peak >= self.written * WRITE_GROWTH and now - self.last_write >= WRITE_EVERY_S:
            self.save()

    def save(self) -> None:
        """The peak into the rank's file, when it grew since the last write."""
        if self.peak > self.written:
            write_atomic(self.path, json.dumps({"peak_bytes": self.peak, "at": now_iso()}) + "\n")
            self.written, self.last_write = self.peak, time.monotonic()
