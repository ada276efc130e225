"""Which process a pid is: enough to tell a run's own process from a later one that got
the same pid (pids are reused, and results folders are shared between users and hosts).

A ``ProcessRef`` holds the host, the boot, the pid and the process's start time from
/proc/PID/stat; ``check`` says whether that very process is still alive here. Nothing is
ever signalled without it. ``save`` and ``load`` keep one in a file (a rank's
``logs/rankN.proc.json``); ``started_before`` tells the ranks of an earlier start of a
run from those its current launcher started. Stdlib only (``status`` and ``cancel`` run
on login nodes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from clusterjob.core.files import loads, read_text, write_atomic


@dataclass(frozen=True)
class ProcessRef:
    host: str
    boot_id: str
    pid: int
    start_ticks: int  # field 22 of /proc/PID/stat: clock ticks after boot

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> Optional["ProcessRef"]:
        """The ref recorded in run.json, or None when it is missing or damaged."""
        try:
            ref = cls(str(raw["host"]), str(raw["boot_id"]), int(raw["pid"]), int(raw["start_ticks"]))
        except (TypeError, KeyError, ValueError):
            return None
        return ref if ref.pid > 0 else None


def save(path: Path, ref: ProcessRef) -> None:
    """Record ``ref`` in ``path`` (whole or not at all)."""
    write_atomic(path, json.dumps(ref.to_dict()) + "\n")


def load(path: Path) -> Optional[ProcessRef]:
    """The ref ``path`` records, or None when it is missing, damaged or not a ref."""
    text, _ = read_text(path, limit=4096)
    return ProcessRef.from_dict(loads(text or ""))


def started_before(ref: ProcessRef, other: ProcessRef) -> bool:
    """Whether ``ref``'s process started before ``other``'s, both on one host since one
    boot (start times compare only there); False where that cannot be told."""
    return (ref.host, ref.boot_id) == (other.host, other.boot_id) and ref.start_ticks < other.start_ticks


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _fields(pid: int) -> Optional[list[str]]:
    """The fields of /proc/PID/stat after the name (state, ppid, pgrp, ...), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()  # the name in parentheses may hold spaces


def _stat(pid: int) -> Optional[tuple[str, int]]:
    """(state letter, start ticks) of a live pid, or None."""
    fields = _fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def state(pid: int) -> Optional[str]:
    """The kernel's state letter of ``pid`` (R, S, D, T stopped, t traced, Z...), None when gone."""
    found = _stat(pid)
    return found[0] if found is not None else None


def current(pid: Optional[int] = None) -> Optional[ProcessRef]:
    """The ref of ``pid`` (default: this process), or None where /proc cannot tell."""
    pid = os.getpid() if pid is None else pid
    found = _stat(pid)
    if found is None:
        return None
    return ProcessRef(socket.gethostname(), _boot_id(), pid, found[1])


@dataclass(frozen=True)
class Mismatch:
    """Why a ref is not a live process of this host: ``kind`` is elsewhere, rebooted,
    exited or reused; ``message`` says it in words."""

    kind: str
    message: str


def check(ref: ProcessRef) -> Optional[Mismatch]:
    """None when ``ref`` is a live process of this host; else why it is not."""
    here = socket.gethostname()
    if ref.host != here:
        return Mismatch("elsewhere", f"it runs on {ref.host}, not on this host ({here})")
    if ref.boot_id != _boot_id():
        return Mismatch("rebooted", f"{ref.host} rebooted since pid {ref.pid} started")
    found = _stat(ref.pid)
    if found is None or found[0] in ("Z", "X"):
        return Mismatch("exited", f"pid {ref.pid} has exited")
    if found[1] != ref.start_ticks:
        return Mismatch("reused", f"pid {ref.pid} now belongs to another process (the recorded one exited)")
    return None


def terminate(ref: ProcessRef, sig: int = signal.SIGTERM) -> Optional[Mismatch]:
    """Send ``sig`` to the process ``ref`` names if, and only if, it is that process;
    None when sent, else why not. A pidfd pins the process between the check and the
    signal, so a pid reused in that instant is not hit either."""
    try:
        fd = os.pidfd_open(ref.pid)
    except ProcessLookupError:
        return Mismatch("exited", f"pid {ref.pid} has exited")
    except (OSError, AttributeError):  # no pidfd (old kernel): check, then signal
        fd = None
    try:
        why = check(ref)
        if why is None:
            _send(fd, ref.pid, sig)
        return why
    except ProcessLookupError:
        return Mismatch("exited", f"pid {ref.pid} has exited")
    except PermissionError:
        return Mismatch("reused", f"pid {ref.pid} belongs to another user")
    finally:
        if fd is not None:
            os.close(fd)


def ended(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it, as
    subprocess and torchrun give it): "exited with code 3", "was killed by SIGKILL"."""
    if code >= 0:
        return f"exited with code {code}"
    return f"was killed by {signal.Signals(-code).name if -code in signal.valid_signals() else f'signal {-code}'}"


def _send(fd: Optional[int], pid: int, sig: int) -> None:
    if fd is None:
        os.kill(pid, sig)
    else:
        signal.pidfd_send_signal(fd, sig)


def terminate_group(ref: ProcessRef, sig: int = signal.SIGKILL) -> Optional[Mismatch]:
    """``terminate``, and where the process leads a process group of its own (a local
    rank does), the processes of that group too (its DataLoader workers, what it
    started): checked as ``terminate`` checks, the group only while its leader is that
    very process."""
    why = check(ref)
    if why is not None:
        return why
    try:
        if os.getpgid(ref.pid) == ref.pid:
            os.killpg(ref.pid, sig)
            return None
    except (ProcessLookupError, PermissionError):  # gone meanwhile, or not ours to signal: as terminate says
        pass
    return terminate(ref, sig)


def group(ref: ProcessRef) -> list[ProcessRef]:
    """The other live processes of the process group ``ref`` leads (what a local rank
    started: its own group), each as a ref to signal later by ``terminate`` once the
    leader is gone; [] when ``ref`` is not that very process or leads no group. Read
    while the leader lives, the group's id is no other's."""
    if check(ref) is not None or (_fields(ref.pid) or ["", "", ""])[2] != str(ref.pid):
        return []
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == ref.pid:
            continue
        fields = _fields(int(entry.name))
        if fields is not None and fields[2] == str(ref.pid) and fields[0] not in ("Z", "X"):
            found.append(ProcessRef(ref.host, ref.boot_id, int(entry.name), int(fields[19])))
    return found if check(ref) is None else []  # the leader still lives: none of them was another's


def end_group(leader: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` to every process of the group ``leader`` led, for a caller that pins that
    group's id: ``leader`` is its own child that exited and is not reaped yet (a zombie
    keeps its pid, so no later process can have taken the id). Nothing when the group is
    empty already."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):  # empty: nothing left of it
        pass


_PR_SET_CHILD_SUBREAPER = 36
ENVIRON_LIMIT = 1 << 20  # the most of a process's environment read


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (PR_SET_CHILD_SUBREAPER): a
    process whose parent ends comes to it, not to init, so it can still tell that
    process is one of its own (``children``). False where the kernel refuses."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children() -> list[tuple[int, str]]:
    """(pid, state letter) of each child of this process, from /proc. A child keeps its
    pid until this process reaps it: its pid names no other process meanwhile."""
    me, found = str(os.getpid()), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _fields(int(entry.name))
            if fields is not None and fields[1] == me:
                found.append((int(entry.name), fields[0]))
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with (/proc/PID/environ), {} where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(ENVIRON_LIMIT)
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}
