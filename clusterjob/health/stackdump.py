"""A rank's Python stacks, all threads, taken from outside
(docs/design.md, "Hung and slow ranks"): the rank registered a C-level handler (``faulthandler.register``) that writes
them to its stacks file on a signal, so they come while the rank is blocked in a C call
(a collective, a socket read) and while it spins in Python holding the GIL, and nothing
in the rank has to run Python for it. The signal goes only to the very process the
rank's health file names (clusterjob.core.procs verifies it), only when that process
said it takes the signal and only when /proc/PID/status says it catches it (SigCgt): an
uncaught real-time signal would end it. A rank that cannot run its handler (stopped by
SIGSTOP, not caught, no answer) has its stacks read by py-spy (clusterjob.health.pyspy),
its process state named (``stopped (T)``). Used by the watchdog on the rank's node and
by ``clusterjob stack``. Stdlib only.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from clusterjob.core import procs
from clusterjob.health import pyspy
from clusterjob.health.rankhealth import RankHealth

WAIT_S = 5.0  # the most a dump may take to be written
_SETTLED_S = 0.2  # a dump is complete once the file stopped growing for this long
_POLL_S = 0.02
MAX_DUMP_BYTES = 4 * 2**20  # faulthandler writes at most 100 threads x 100 frames
MAX_CHILDREN = 8  # the most child processes (DataLoader workers) dumped beside their rank
CHILD_MARK = "\n# child process "  # begins each child's part of a rank's stall file, after the rank's own dump
STATE_MARK = "# process state: "  # a line of a rank's stacks: the state of a process that could not answer
THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
STACK_HEADER = re.compile(r"^Stack \(most recent call first\):\s*$")  # faulthandler's one thread, no id
_STOPPED = frozenset("Tt")  # stopped (SIGSTOP, a terminal), or by a debugger: no handler runs until it goes on
_ANSWERING = frozenset("RS")  # running or asleep: its state says nothing more


@dataclass(frozen=True)
class Status:
    """What /proc/PID/status says of a process: its parent, its state (``T``, and in
    words ``stopped (T)``) and the signals it catches (a bit mask, bit N-1 for signal N)."""

    ppid: int
    state: str
    words: str
    caught: int

    def catches(self, sig: int) -> bool:
        return bool(self.caught >> (sig - 1) & 1)


def status(pid: int) -> Optional[Status]:
    """The process's status, or None where it cannot be read (gone, another kernel)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
        state = fields["State"].split(None, 1)  # "T (stopped)"
        words = state[1].strip().strip("()") if len(state) > 1 else state[0]
        return Status(int(fields["PPid"]), state[0], f"{words} ({state[0]})", int(fields["SigCgt"], 16))
    except (OSError, KeyError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Stacks:
    """A rank's stacks as ``ask`` got them: ``text`` in faulthandler's format (None: none
    came, ``why`` says why), read by py-spy from outside (``outside``, ``why`` then says
    why its handler did not give them), and the state of a process that could not answer
    (``stopped (T)``; "" for one running or asleep)."""

    text: Optional[str]
    why: str = ""
    outside: bool = False
    state: str = ""

    def written(self) -> str:
        """As a stall's stacks file and ``clusterjob stack`` show them: the state, how
        they were read, then the stacks (or why there are none)."""
        lines = [f"{STATE_MARK}{self.state}\n"] if self.state else []
        if self.text is None:
            return "".join([*lines, f"# no stacks: {self.why}\n"])
        if self.outside:
            lines.append(f"# read from outside by {pyspy.COMMAND}: {self.why}\n")
        return "".join(lines) + self.text


def state_in(text: str) -> str:
    """The process state a rank's stacks name (``stopped (T)``), "" where none (its
    children's parts, after CHILD_MARK, are theirs)."""
    own = text.split(CHILD_MARK, 1)[0]
    return next((line[len(STATE_MARK):].strip() for line in own.splitlines() if line.startswith(STATE_MARK)), "")


def main_first(text: str, ident: Optional[int]) -> str:
    """A dump with its main thread first (the thread ``ident``, else the dump's current
    one), the others after it in their order; the lines before the first thread (how the
    stacks were read) stay first."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if THREAD_HEADER.match(line) or STACK_HEADER.match(line)]
    if len(starts) < 2:
        return text
    blocks = ["".join(lines[a:b]).rstrip("\n") + "\n" for a, b in zip(starts, [*starts[1:], len(lines)])]
    headers = [THREAD_HEADER.match(lines[i]) for i in starts]
    chosen = next((n for n, h in enumerate(headers) if h and ident is not None and int(h.group(2), 16) == ident),
                  next((n for n, h in enumerate(headers) if h and h.group(1) == "Current thread"), 0))
    blocks.insert(0, blocks.pop(chosen))
    return "".join(lines[:starts[0]]) + "\n".join(blocks)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def ask(health: RankHealth, stacks: Path, wait_s: float = WAIT_S) -> Stacks:
    """The rank's stacks: from its own handler (``take``) where it can run it, else read
    from outside by py-spy, with its state when it is not running or asleep."""
    if health.ref is None:
        return Stacks(None, f"rank {health.rank}'s health file names no process")
    mismatch = procs.check(health.ref)
    if mismatch is not None:
        return Stacks(None, f"rank {health.rank}: {mismatch.message}")
    text, why = take(health, stacks, wait_s)
    if text is not None:
        return Stacks(text)
    found = status(health.ref.pid)
    state = found.words if found is not None and found.state not in _ANSWERING else ""
    text, failed = pyspy.dump(health.ref.pid)
    mismatch = procs.check(health.ref)  # the pid still that process: what py-spy read was its
    if mismatch is not None:
        return Stacks(None, f"rank {health.rank}: {mismatch.message}")
    return Stacks(text, why, True, state) if text is not None else Stacks(None, f"{why}; {failed}", False, state)


def take(health: RankHealth, stacks: Path, wait_s: float = WAIT_S) -> tuple[Optional[str], str]:
    """(the stacks the rank wrote, "") or (None, why there are none). A process that
    does not catch the signal, or is stopped, is not signalled."""
    if health.ref is None or health.stack_signal is None:
        return None, f"rank {health.rank} takes no stack requests (its health file names no signal)"
    who = f"rank {health.rank} (pid {health.ref.pid})"
    mismatch = procs.check(health.ref)  # before its status is read: the status is then that process's
    if mismatch is not None:
        return None, f"rank {health.rank}: {mismatch.message}"
    found = status(health.ref.pid)
    if found is None or not found.catches(health.stack_signal):
        return None, f"{who} does not catch signal {health.stack_signal} (it has not installed the stack handler), " \
                     "so it was not sent"
    if found.state in _STOPPED:
        return None, f"{who} is {found.words}: it cannot run its stack handler until it is continued (SIGCONT)"
    before = _size(stacks)
    why = procs.terminate(health.ref, health.stack_signal)  # checks the identity again, the pid pinned
    if why is not None:
        return None, f"rank {health.rank}: {why.message}"
    grown = _settled(stacks, before, wait_s)
    if grown is None:
        return None, f"{who} wrote no stacks within {wait_s:g} s"
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
        child = status(pid)
        if child is not None and child.ppid == health.ref.pid and child.catches(health.stack_signal):
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
