"""Files of a results folder, read and written safely: atomic writes (readers see a file
whole or not at all), reads that never block or raise, JSON that never raises, and
values shortened for one-line messages. Stdlib only; used by the run record and the
run folder alike.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import os
import reprlib
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator, Optional

NOT_JSON = object()  # what ``loads`` gives for text that does not parse
_show = reprlib.Repr()
_show.maxstring, _show.maxother, _show.maxlevel = 40, 40, 3


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import (umask can only be read by setting it). mkstemp makes its files
# private (0600); results folders are shared, so the final file gets the usual mode.
_FILE_MODE = 0o666 & ~_umask()


class WriteError(OSError):
    """A file of the run could not be written: one message, the cause and the path, for
    every writer (checkpoints, metrics, run.json), whatever layer reported it."""

    def __str__(self) -> str:
        return f"could not write {self.filename}: {self.strerror}"


@contextlib.contextmanager
def named_write_errors(path: Path) -> Iterator[None]:
    """Writes to ``path``: an OSError, or torch.save's RuntimeError about a short write
    ("unexpected pos") on a full disk, becomes a WriteError naming the cause and ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(err.errno, err.strerror or str(err), str(path)) from err
    except RuntimeError as err:
        if not _disk_full(path.parent):
            raise
        raise WriteError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err


def _disk_full(folder: Path) -> bool:
    try:
        fs = os.statvfs(folder)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < 1 << 20  # less than a MiB left: what a short write means


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file that readers see whole or not at all: temp file beside it, fsync, rename.
    Inside ``batched`` the fsync waits for the batch's one sync."""
    with named_write_errors(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, _FILE_MODE)
            with named_write_errors(path), os.fdopen(fd, mode) as f:  # the disk is judged before the cleanup frees it
                yield f
                f.flush()
                if not _deferred(path):
                    flush_to_disk(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_atomic(path: Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_new(path: Path, text: str) -> None:
    """A file that does not exist yet, in a folder no reader looks into before this
    process has written it (a run folder being made: a run is found by its run.json,
    written last): one create and one write, no temp file, no rename. Synced at once,
    or by the batch it is written in (``batched``)."""
    data = text.encode()
    with named_write_errors(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if not _deferred(path):
                flush_to_disk(fd)
        finally:
            os.close(fd)


def publish(path: Path, text: str) -> None:
    """A new file in a folder only this process writes to yet (a run folder being made),
    made visible whole: written beside it under a fixed temporary name, then renamed
    (no random name to make, no fchmod: cheaper than ``atomic_open`` for 10,000 runs).
    Synced at once, or by the batch it is written in."""
    tmp = path.with_name(f".{path.name}.tmp")
    with named_write_errors(path):
        write_new(tmp, text)
        os.replace(tmp, path)


# ----------------------------------------------------------------------------- durability
#
# An fsync costs about a millisecond on a local disk and 1 to 20 ms on the shared file
# systems results folders live on (NFS, Lustre, GPFS), so a submission of N runs must not
# pay N of them: its writes go into one batch, and the batch syncs each file system it
# wrote to once (syncfs). What a sync protects against is a crash of the machine; a
# killed process loses nothing the kernel already has (docs/design.md, "Results layout").


def flush_to_disk(fd: int) -> None:
    """fsync: the one call of this package that waits for one file to reach the disk."""
    os.fsync(fd)


class Batch:
    """The writes of one ``batched`` block: the folders written to since the last sync."""

    def __init__(self) -> None:
        self.folders: set[str] = set()

    def sync(self) -> None:
        """Every file written in the batch so far on disk: one sync per file system."""
        folders, self.folders = self.folders, set()
        devices: dict[int, str] = {}
        for folder in sorted(folders):
            with contextlib.suppress(OSError):  # a folder gone since: nothing of it to keep
                devices.setdefault(os.stat(folder).st_dev, folder)
        for folder in devices.values():
            sync_filesystem(folder)


_BATCHES: list[Batch] = []


@contextlib.contextmanager
def batched() -> Iterator[Batch]:
    """A block whose writes (``atomic_open``, ``write_new``) skip their own fsync: the
    batch syncs the file systems they went to once, at ``sync`` (before anything that
    must find them on disk, such as a job that reads them) and at the end. Nested
    blocks join the outer one."""
    if _BATCHES:
        yield _BATCHES[-1]
        return
    batch = Batch()
    _BATCHES.append(batch)
    try:
        yield batch
    finally:
        _BATCHES.pop()
        batch.sync()


def _deferred(path: Path) -> bool:
    """Whether a write to ``path`` leaves its sync to the open batch (which notes the folder)."""
    if not _BATCHES:
        return False
    _BATCHES[-1].folders.add(os.path.abspath(os.path.dirname(path)))
    return True


_SYNCFS: list = []  # libc's syncfs, once looked up ([None] where there is none)


def sync_filesystem(folder: "str | os.PathLike") -> None:
    """Flush every file of the file system that holds ``folder`` to disk: one syncfs
    (Linux), else one sync of all of them."""
    if not _SYNCFS:
        try:
            import ctypes

            _SYNCFS.append(ctypes.CDLL(None, use_errno=True).syncfs)
        except (OSError, AttributeError):
            _SYNCFS.append(None)
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _SYNCFS[0] is None or _SYNCFS[0](fd) != 0:
            os.sync()
    finally:
        os.close(fd)


# flock() where the file system has no locks (Lustre without -o flock, some NFS setups):
# the callers go on unlocked, as before locks existed, rather than refuse to work.
NO_LOCKS = frozenset((errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL))


def open_lock(path: Path, create: bool = True) -> int:
    """A descriptor of the lock file ``path`` for flock(), made (empty, the usual mode) when
    missing and ``create``. Never replaced once made: a lock lives on its inode."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    return os.open(path, flags, _FILE_MODE)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """The block under an exclusive flock of ``path`` (made if missing): writers of one
    file take turns. Where the lock file cannot be made (a read-only folder) or locked
    (no locks on this file system) the block runs unlocked, and its write reports the
    real problem."""
    try:
        fd = open_lock(path)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):  # the errors of NO_LOCKS, and nothing else flock raises blocking
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock



@contextlib.contextmanager
def many_reads() -> Iterator[None]:
    """The block with the cyclic garbage collector paused: reading 10,000 run.json files
    makes objects by the hundred thousand, none in a cycle, and each collection that
    they trigger walks all those kept so far (0.1 to 0.2 s of a status of 10,000 runs)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def loads(text: str) -> Any:
    """json.loads, or NOT_JSON for anything that does not parse (also nesting too deep
    for the parser, which raises RecursionError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return NOT_JSON


def open_regular(path: "str | os.PathLike") -> tuple:
    """(descriptor, stat, None) of a regular file opened for reading, or (None, None, why)
    when it is absent or no regular file (a FIFO would block its reader). The caller
    closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None, None, "is missing"
    except OSError as err:
        return None, None, f"cannot be read ({err.strerror})"
    try:
        st = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        return None, None, f"cannot be read ({err.strerror})"
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None, None, "is not a regular file"
    return fd, st, None


def read_text(path: "str | os.PathLike", limit: Optional[int] = None) -> tuple:
    """(text, problem): a regular file's text with bad bytes replaced; text None with the
    reason when it is absent, not a regular file (a FIFO would block), or over ``limit``."""
    fd, st, why = open_regular(path)
    if fd is None:
        return None, why
    try:
        if limit is not None and st.st_size > limit:
            return None, f"is {st.st_size / 2**20:.0f} MiB, larger than any run writes"
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 2**16)):  # one read for a file that does not grow
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace"), None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    finally:
        os.close(fd)


def lines_from_end(path: "str | os.PathLike", limit: int, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The lines of a regular file from the last one back, within its last ``limit``
    bytes (a line cut by that limit is not given); nothing when it cannot be read."""
    fd, st, _ = open_regular(path)
    if fd is None:
        return
    try:
        pos, rest = st.st_size, b""
        while pos > 0 and st.st_size - pos < limit:
            size = min(chunk, pos)
            pos -= size
            first, *whole = (os.pread(fd, size, pos) + rest).split(b"\n")
            yield from reversed(whole)
            rest = first  # the start of this line is in the chunk before
        if pos == 0 and rest:
            yield rest
    except OSError:
        return
    finally:
        os.close(fd)


def is_number(value: Any) -> bool:
    """A JSON number: int or float, not bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A value for a one-line message: short, whatever its size or depth."""
    return _show.repr(value)
