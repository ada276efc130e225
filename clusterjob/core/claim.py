"""Who starts and runs a run: the claim on its folder (docs/design.md, "Results layout").

One process at a time owns a run's execution, and it holds an exclusive flock on
``<run>/claim.lock`` while it does: ``submit`` and ``resume`` from their check of the
run's state until the run is handed over (its Slurm job id recorded, or its local
supervisor started), and the local supervisor for the whole time it runs the run. A
lock dies with its holder (kill -9, the OOM killer, a reboot), so a claim never
outlives the process that took it, and a second ``resume`` is refused while one runs.

A claim handed to a child process (``pass_fds``) is the same lock: the supervisor that a
detached submit starts holds it from its first instant, with no gap in which another
resume could start the run.

A submission holds one claim for all its runs, its sweep's (``take_sweep``: the lock
``<name>/.sweeps/<stamp>.lock``, clusterjob.core.sweep), from before it makes the run
folders until they are handed over: a sweep of 10,000 runs takes one lock, not 10,000
(nor 10,000 open descriptors). Taking a run's claim checks its sweep's too, so no command
starts or cancels a run its submission is still handing over. The file's text names the holder, for the one line that
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

from clusterjob.core import procs, sweep
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
    return _holder_of(lock_path(folder))


def handing_over(folder: "str | os.PathLike") -> Optional[str]:
    """Who is handing the run in ``folder`` over, in words, as the lock files say (a
    submit of its sweep, a resume of it); None when no live process is. Reads only: no
    lock is taken, so status can ask on a read-only results folder. A claim this process
    holds is none: a resume that holds a sweep's claim is handing nothing over yet as it
    looks at the runs, and a run a dead submit left is its to start.
    """
    where = sweep.member(folder)
    mine = _key(folder) in _HELD
    said = [None if mine else holder(folder)]
    if where is not None and _key(sweep.lock_file(where.parent, where.stamp)) not in _HELD:
        said.append(_holder_of(sweep.lock_file(where.parent, where.stamp)))
    found = [who for doing, who in filter(None, said) if doing != SUPERVISOR]
    return found[0] if found else None


def _holder_of(path: Path) -> Optional[tuple[str, str]]:
    text, _ = read_text(path, limit=4096)
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
        held = _lock(lock_path(folder), str(folder), create)
        if held is None:
            return None
        try:
            _check_sweep(folder)
        except BaseException:
            os.close(held.fd)
            raise
        _HELD[_key(folder)] = held
    held.describe(doing)
    return held


def busy(folder: "str | os.PathLike") -> Optional[str]:
    """Who holds the run's own claim (a resume of it, its local supervisor), in words;
    None when no other process does. Tested, never kept: what a resume of its sweep,
    which holds the sweep's claim, asks of each run before it starts it."""
    if _key(folder) in _HELD:
        return None
    try:
        fd = os.open(lock_path(folder), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # never claimed
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        said = holder(folder)
        return said[1] if said else "another process"
    except OSError:  # no locks on this file system
        return None
    finally:
        os.close(fd)
    return None


def take_sweep(parent: "str | os.PathLike", stamp: str, doing: str) -> Claim:
    """Claim every run of the sweep ``stamp`` under ``parent`` (its runs may not exist
    yet): what a submit holds while it makes and hands over a sweep's run folders.
    Raises Claimed when another process holds it."""
    path = sweep.lock_file(parent, stamp)
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = _lock(path, sweep.sweep_id(os.path.basename(os.path.abspath(parent)), stamp), True)
    assert claim is not None  # made when missing
    _HELD[_key(path)] = claim
    claim.describe(doing)
    return claim


def release_sweep(parent: "str | os.PathLike", stamp: str) -> None:
    """Give up this process's claim on the sweep (the runs are handed over)."""
    release(sweep.lock_file(parent, stamp))


def _check_sweep(folder: "str | os.PathLike") -> None:
    """Claimed when another process holds the claim of the run's sweep (a submit that is
    handing it over); the sweep's lock is only tested, never kept."""
    where = sweep.member(folder)
    if where is None:
        return
    path = sweep.lock_file(where.parent, where.stamp)
    if _key(path) in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no sweep lock (a run of an earlier version, one made by hand), or none we may read
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        said = _holder_of(path)
        raise Claimed(str(folder), *(said or ("", "another process (the submission of its sweep)"))) from None
    except OSError:  # no locks on this file system: as everywhere, go on unlocked
        pass
    finally:
        os.close(fd)


def _lock(path: Path, name: str, create: bool) -> Optional[Claim]:
    try:
        fd = open_lock(path, create)
    except FileNotFoundError:
        if not create:
            return None
        raise BadInput(f"{name} is no run folder (it has gone); check the path") from None
    except OSError as err:
        raise BadInput(f"{path} cannot be opened ({err.strerror}); claiming the run needs "
                       "a writable run folder") from None
    try:
        return _flock(fd, path, name)
    except BaseException:
        os.close(fd)
        raise


def _flock(fd: int, path: Path, name: str) -> Claim:
    """Lock ``fd`` or raise Claimed naming the holder. A holder writes its name just
    after it locked, so a name missing or stale for a moment is looked at again
    (NAME_WAIT_S), and so is the lock, which may have been released meanwhile."""
    deadline = time.monotonic() + NAME_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Claim(fd, name)
        except BlockingIOError:
            said = _holder_of(path)
            if said is not None or time.monotonic() > deadline:
                raise Claimed(name, *(said or ("", "another process"))) from None
            time.sleep(0.05)
        except OSError as err:
            if err.errno not in NO_LOCKS:
                raise
            return Claim(fd, name, locked=False)


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
    """Give up this process's claims on ``folders`` (those it does not hold are skipped).
    Its words go too, so that a released claim names no holder (``handing_over`` reads
    them without a lock); a process it handed the lock to says its own, which stay."""
    for folder in folders:
        claim = _HELD.pop(_key(folder), None)
        if claim is None:
            continue
        with contextlib.suppress(OSError):
            said = loads(os.pread(claim.fd, _TEXT_BYTES + 1, 0).decode(errors="replace"))
            if isinstance(said, dict) and said.get("pid") == os.getpid():
                os.pwrite(claim.fd, b" " * _TEXT_BYTES + b"\n", 0)
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
