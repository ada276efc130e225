"""Who starts and runs a run: the claim on its folder (docs/design.md, "Results layout").

One process at a time owns a run's execution, and it holds an exclusive flock on
``<run>/claim.lock`` while it does: ``submit`` and ``resume`` from their check of the
run's state until the run is handed over (its Slurm job id recorded, or its local
supervisor started), and the local supervisor for the whole time it runs the run. A
lock dies with its holder (kill -9, the OOM killer, a reboot), so a claim never
outlives the process that took it, and a second ``resume`` is refused while one runs.

A claim handed to a child process (``pass_fds``) is the same lock: the supervisor that a
detached submit starts holds it from its first instant, with no gap in which another
resume could start the run. The file's text names the holder, for the one line that
says who has the run. Read-only commands (status, report, logs) never take a claim nor
make the file. Stdlib only (``cancel`` runs on login nodes).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from clusterjob.core import procs
from clusterjob.core.errors import BadInput
from clusterjob.core.files import NO_LOCKS, loads, now_iso, open_lock, read_text

CLAIM_FILE = "claim.lock"
SUPERVISOR = "local supervisor"  # the holder that runs the run (the others hand it over)
NAME_WAIT_S = 2.0  # how long a claim that names no live holder is looked at again
_TEXT_BYTES = 511  # the holder's words, padded: one write of the same size each time


@dataclass(frozen=True)
class Claim:
    """A claim this process holds: the open lock file (``locked`` False where the file
    system has no locks, so the claim excludes no one)."""

    fd: int
    folder: str
    locked: bool = True

    def describe(self, doing: str) -> None:
        """Write who holds the claim into the lock file: in place, as a lock lives on its
        inode, and in one write of a fixed size, so a reader never sees it half done."""
        me = procs.current()
        text = json.dumps({"doing": doing, "since": now_iso(), **(me.to_dict() if me else {"pid": os.getpid()})})
        with contextlib.suppress(OSError):  # the words are for messages; the lock is what counts
            os.pwrite(self.fd, text.encode().ljust(_TEXT_BYTES) + b"\n", 0)


class Claimed(BadInput):
    """Another live process holds the run's claim; ``doing`` is what it said it does."""

    def __init__(self, folder: str, doing: str, holder: str):
        self.doing, self.holder = doing, holder
        super().__init__(f"{folder} is claimed by {holder}: it is being started or runs; "
                         f"wait for it, or see `clusterjob status {folder}`")


_HELD: dict[str, Claim] = {}  # the claims this process holds, by run folder


def _key(folder: "str | os.PathLike") -> str:
    return os.path.realpath(folder)


def lock_path(folder: "str | os.PathLike") -> Path:
    return Path(folder) / CLAIM_FILE


def holder(folder: "str | os.PathLike") -> Optional[tuple[str, str]]:
    """(what the holder does, who it is in words) as the lock file says, None when the
    file names no process that may hold it: none at all, or one that ended (the text
    of an earlier holder, which the new one has not replaced yet). Reads only."""
    text, _ = read_text(lock_path(folder), limit=4096)
    said = loads(text or "")
    ref = procs.ProcessRef.from_dict(said) if isinstance(said, dict) else None
    if ref is None or not isinstance(said.get("doing"), str):
        return None
    why = procs.check(ref)
    if why is not None and why.kind != "elsewhere":
        return None
    return said["doing"], f"{said['doing']} (pid {ref.pid} on {ref.host}, since {said.get('since')})"


def take(folder: "str | os.PathLike", doing: str, create: bool = True) -> Optional[Claim]:
    """Claim the run in ``folder`` for this process, saying what it does; a claim this
    process holds already is kept (and said anew). None when there is no lock file and
    ``create`` is False. Raises Claimed (exit 2, naming the holder) when another process
    holds it, BadInput when the lock file cannot be made."""
    held = _HELD.get(_key(folder))
    if held is None:
        held = _lock(folder, create)
        if held is None:
            return None
        _HELD[_key(folder)] = held
    held.describe(doing)
    return held


def _lock(folder: "str | os.PathLike", create: bool) -> Optional[Claim]:
    try:
        fd = open_lock(lock_path(folder), create)
    except FileNotFoundError:
        if not create:
            return None
        raise BadInput(f"{folder} is no run folder (it has gone); check the path") from None
    except OSError as err:
        raise BadInput(f"{lock_path(folder)} cannot be opened ({err.strerror}); claiming the run needs "
                       "a writable run folder") from None
    try:
        return _flock(fd, folder)
    except BaseException:
        os.close(fd)
        raise


def _flock(fd: int, folder: "str | os.PathLike") -> Claim:
    """Lock ``fd`` or raise Claimed naming the holder. A holder writes its name just
    after it locked, so a name missing or stale for a moment is looked at again
    (NAME_WAIT_S), and so is the lock, which may have been released meanwhile."""
    deadline = time.monotonic() + NAME_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Claim(fd, str(folder))
        except BlockingIOError:
            said = holder(folder)
            if said is not None or time.monotonic() > deadline:
                raise Claimed(str(folder), *(said or ("", "another process"))) from None
            time.sleep(0.05)
        except OSError as err:
            if err.errno not in NO_LOCKS:
                raise
            return Claim(fd, str(folder), locked=False)


def adopt(fd: int, folder: "str | os.PathLike", doing: str) -> Claim:
    """The claim a parent process handed over as descriptor ``fd`` (the same lock), now
    this process's, saying what it does."""
    claim = Claim(fd, str(folder))
    _HELD[_key(folder)] = claim
    claim.describe(doing)
    return claim


def held(folder: "str | os.PathLike") -> Optional[Claim]:
    """This process's claim on ``folder``, if it holds one."""
    return _HELD.get(_key(folder))


def release(*folders: "str | os.PathLike") -> None:
    """Give up this process's claims on ``folders`` (those it does not hold are skipped)."""
    for folder in folders:
        claim = _HELD.pop(_key(folder), None)
        if claim is not None:
            os.close(claim.fd)  # the lock goes with the last descriptor of it


@contextlib.contextmanager
def claimed(folder: "str | os.PathLike", doing: str) -> Iterator[Optional[Claim]]:
    """The block with the run claimed (see ``take``), released at its end, also when the
    claim was held already: the block is the last use of it."""
    claim = take(folder, doing)
    try:
        yield claim
    finally:
        release(folder)
