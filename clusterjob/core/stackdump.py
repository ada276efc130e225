"""A rank's Python stacks, all threads, taken from outside
(docs/design.md, "Hung and slow ranks"): the rank registered a C-level handler (``faulthandler.register``) that writes
them to its stacks file on a signal, so they come while the rank is blocked in a C call
(a collective, a socket read) and while it spins in Python holding the GIL, and nothing
in the rank has to run Python for it. The signal goes only to the very process the
rank's health file names (clusterjob.core.procs verifies it), and only when that process
said it takes the signal; an unregistered real-time signal would end it. Used by the
watchdog on the rank's node and by ``clusterjob stack``. Stdlib only.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from clusterjob.core import procs
from clusterjob.core.rankhealth import RankHealth

WAIT_S = 5.0  # the most a dump may take to be written
_SETTLED_S = 0.2  # a dump is complete once the file stopped growing for this long
_POLL_S = 0.02
MAX_DUMP_BYTES = 4 * 2**20  # faulthandler writes at most 100 threads x 100 frames
MAX_CHILDREN = 8  # the most child processes (DataLoader workers) dumped beside their rank
CHILD_MARK = "\n# child process "  # begins each child's part of a rank's stall file, after the rank's own dump


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def take(health: RankHealth, stacks: Path, wait_s: float = WAIT_S) -> tuple[Optional[str], str]:
    """(the stacks the rank wrote, "") or (None, why there are none)."""
    if health.ref is None or health.stack_signal is None:
        return None, f"rank {health.rank} takes no stack requests (its health file names no signal)"
    before = _size(stacks)
    why = procs.terminate(health.ref, health.stack_signal)
    if why is not None:
        return None, f"rank {health.rank}: {why.message}"
    grown = _settled(stacks, before, wait_s)
    if grown is None:
        return None, f"rank {health.rank} (pid {health.ref.pid}) wrote no stacks within {wait_s:g} s"
    with open(stacks, "rb") as f:
        f.seek(before)
        return f.read(min(grown - before, MAX_DUMP_BYTES)).decode(errors="replace"), ""


def _settled(path: Path, before: int, wait_s: float) -> Optional[int]:
    """The file's size once it grew past ``before`` and then stayed, or None after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    last, since = before, time.monotonic()
    while time.monotonic() < deadline:
        size = _size(path)
        if size != last:
            last, since = size, time.monotonic()
        elif size > before and time.monotonic() - since >= _SETTLED_S:
            return size
        time.sleep(_POLL_S)
    return last if last > before else None


def children(health: RankHealth) -> list[procs.ProcessRef]:
    """The rank's child processes that take its stack signal: forked ones (DataLoader
    workers) keep the handler and the stacks file; a child without the handler (spawned,
    or any other program) is never signalled, as the signal would end it."""
    if health.ref is None or health.stack_signal is None or procs.check(health.ref) is not None:
        return []
    try:
        listed = Path(f"/proc/{health.ref.pid}/task/{health.ref.pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for pid in (int(p) for p in listed[:MAX_CHILDREN] if p.isdigit()):
        if _parent_and_caught(pid, health.stack_signal) == (health.ref.pid, True):
            ref = procs.current(pid)
            found += [ref] if ref is not None else []
    return found


def take_children(health: RankHealth, stacks: Path, wait_s: float = WAIT_S) -> str:
    """The stacks of the rank's children that take its signal (``children``), each under
    a line naming it; "" without any."""
    parts = []
    for ref in children(health):
        text, why = take(replace(health, ref=ref), stacks, wait_s)
        parts.append(f"{CHILD_MARK}{ref.pid} of rank {health.rank} (a DataLoader worker, say)\n"
                     f"{text if text is not None else f'# no stacks: {why}'}\n")
    return "".join(parts)


def _parent_and_caught(pid: int, sig: int) -> tuple[int, bool]:
    """(its parent pid, whether it catches ``sig``) from /proc/PID/status; (0, False) unread."""
    try:
        lines = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        return int(lines["PPid"]), bool(int(lines["SigCgt"], 16) >> (sig - 1) & 1)
    except (OSError, KeyError, ValueError):
        return 0, False
