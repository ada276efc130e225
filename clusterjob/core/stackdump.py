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
from pathlib import Path
from typing import Optional

from clusterjob.core import procs
from clusterjob.core.rankhealth import RankHealth

WAIT_S = 5.0  # the most a dump may take to be written
_SETTLED_S = 0.2  # a dump is complete once the file stopped growing for this long
_POLL_S = 0.02
MAX_DUMP_BYTES = 4 * 2**20  # faulthandler writes at most 100 threads x 100 frames


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
