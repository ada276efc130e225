"""Files of a results folder, read and written safely: atomic writes (readers see a file
whole or not at all), reads that never block or raise, reads of a file's lines bounded
whatever a crash left in it (``Tail``, ``Head``, ``read_lines_text``), JSON that never
raises, and values shortened for one-line messages. Stdlib only; used by the run record
and the run folder alike.
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
import sys
import tempfile
from datetime import datetime, timezone
from itertools import repeat
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


def read_lines_text(path: "str | os.PathLike", limit: int) -> tuple:
    """(text, problem) of a file of lines, bounded: at most ``limit`` bytes of its data,
    the holes of a sparse file (a crash leaves hundreds of MiB of them) unread, each a
    line end. text None with the reason, as ``read_text`` gives it; problem None, or
    what was left unread."""
    fd, st, why = open_regular(path)
    if fd is None:
        return None, why
    try:
        blocks = Blocks(fd, st, limit, max(1, min(st.st_size, limit)), b"\n")  # one read of a plain file
        text = b"".join(blocks).decode("utf-8", errors="replace")
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    finally:
        os.close(fd)
    return text, f"is larger than {limit / 2**20:g} MiB; read its first {limit / 2**20:g} MiB" if blocks.cut else None


class Blocks:
    """A regular file's data from its start, ``chunk`` bytes at a time and ``limit`` in
    all (``cut``: more was left), each hole of a sparse file (NUL bytes on no disk) as
    the one byte ``hole``, unread. A file without holes costs no system call more."""

    def __init__(self, fd: int, st: os.stat_result, limit: int, chunk: int, hole: bytes):
        self.fd, self.size, self.limit, self.chunk, self.hole = fd, st.st_size, limit, chunk, hole
        self.sparse = st.st_blocks * 512 < st.st_size
        self.cut = False

    def __iter__(self) -> Iterator[bytes]:
        pos, done, hole = 0, 0, 0 if self.sparse else self.size  # hole: where the data being read ends
        while True:
            if self.sparse and pos >= hole:
                start, hole = self._data_from(pos)
                if start > pos:
                    yield self.hole
                    pos = start
            want = min(self.chunk, self.limit - done, max(hole - pos, 1))
            block = os.pread(self.fd, want, pos) if done < self.limit else b""
            if not block:
                self.cut = done >= self.limit and bool(os.pread(self.fd, 1, pos))
                return
            pos, done = pos + len(block), done + len(block)
            yield block

    def _data_from(self, pos: int) -> tuple[int, int]:
        """(where the data at or after ``pos`` starts, where it ends); the file's size for
        both where none is left."""
        try:
            start = os.lseek(self.fd, pos, os.SEEK_DATA)
            return start, os.lseek(self.fd, start, os.SEEK_HOLE)
        except OSError as err:  # ENXIO: a hole to the end; else no SEEK_DATA here: every byte is read
            self.sparse = False
            return (self.size, self.size) if err.errno == errno.ENXIO else (pos, self.size)


MAX_LINE_BYTES = 1 << 20  # no line a run writes is longer; a longer one is skipped unread


class Tail:
    """The lines of a regular file from the last one back, within its last ``limit``
    bytes of data (a line cut by that limit is not given, unless a NUL byte ended it);
    nothing when it cannot be read.

    Bounded whatever the file holds (a crash can leave hundreds of MiB of NUL bytes
    without a line end): a line longer than ``max_line`` is skipped as it is met, never
    held whole, and a line with a NUL byte (no text line holds one) keeps only what
    follows its last NUL, the record appended after the crash. Each is counted in
    ``skipped``; ``cut`` says the limit ended the reading before the file's start. Each
    step costs at most ``chunk + max_line`` bytes; the holes of a sparse file (NUL bytes
    on no disk) are stepped over unread."""

    def __init__(self, path: "str | os.PathLike", limit: int, max_line: int = MAX_LINE_BYTES,
                 chunk: int = 1 << 16):
        self.path, self.limit, self.max_line, self.chunk = path, limit, max_line, chunk
        self.skipped = 0
        self.cut = False

    def __iter__(self) -> Iterator[bytes]:
        return (line for line, _ in self.pairs())

    def pairs(self) -> Iterator[tuple[bytes, bool]]:
        """Each line with whether some of it was dropped (and counted in ``skipped``)."""
        fd, st, _ = open_regular(self.path)
        if fd is None:
            return
        try:
            yield from self._lines(fd, st)
        except OSError:
            return
        finally:
            os.close(fd)

    def _lines(self, fd: int, st: os.stat_result) -> Iterator[tuple[bytes, bool]]:
        sparse = st.st_blocks * 512 < st.st_size
        pos, done, rest, dropped = st.st_size, 0, b"", False  # rest: what is kept of a line whose start is further back
        while pos > 0 and done < self.limit:
            below = _data_end_below(fd, pos, self.chunk) if sparse else pos
            if below < pos:  # a hole: NUL bytes on no disk, stepped over as one
                rest, dropped, pos = *self._joined(b"\0", rest, dropped), below
                continue
            step = min(self.chunk, pos)
            pos, done = pos - step, done + step
            block = os.pread(fd, step, pos)
            pieces = block.split(b"\n")
            rest, dropped = self._joined(pieces[-1], rest, dropped)
            if len(pieces) == 1:  # no line ends here: the line goes on further back
                continue
            yield from self._given(rest, dropped)
            yield from self._whole(pieces[-2:0:-1], block)
            rest, dropped = self._joined(pieces[0], b"", False)
        self.cut = pos > 0
        if dropped or (pos == 0 and rest):  # a line cut by a NUL byte ends there, wherever its start lies
            yield from self._given(rest, dropped)

    def _joined(self, before: bytes, rest: bytes, dropped: bool) -> tuple[bytes, bool]:
        """The end ``rest`` of a line with the bytes ``before`` it: (what is kept, whether
        some of the line was dropped: once it was, nothing further back belongs to it)."""
        return (rest, True) if dropped else _kept(before + rest, self.max_line)

    def _given(self, line: bytes, dropped: bool) -> Iterator[tuple[bytes, bool]]:
        self.skipped += dropped
        if line or not dropped:
            yield line, dropped

    def _whole(self, lines: list, block: bytes) -> Iterator[tuple[bytes, bool]]:
        """Lines read whole from ``block``, each as ``_kept`` keeps it: at C level where the
        block holds no NUL byte and no line is too long (every line a run writes)."""
        if b"\0" not in block and max(map(len, lines), default=0) <= self.max_line:
            yield from zip(lines, repeat(False))
            return
        for line in lines:
            yield from self._given(*_kept(line, self.max_line))


class Head(Tail):
    """The lines of a regular file from its first on, within its first ``limit`` bytes of
    data (a last line without its newline too: a reader of a file being written may meet
    half a record), with ``Tail``'s bounds: over-long lines skipped unread, a line keeps
    what follows its last NUL byte, each counted in ``skipped``. Of a line it holds at
    most its last ``max_line + 1`` bytes, all a kept line can be; the holes of a sparse
    file (NUL bytes on no disk) are stepped over unread."""

    def _lines(self, fd: int, st: os.stat_result) -> Iterator[tuple[bytes, bool]]:
        keep, rest = self.max_line + 1, b""
        blocks = Blocks(fd, st, self.limit, self.chunk, b"\0")
        for block in blocks:
            if b"\n" not in block:  # the line goes on: its end is all that may be kept
                rest = (rest + block[-keep:])[-keep:]
                continue
            first, *whole, last = block.split(b"\n")
            yield from self._given(*_kept(rest + first, self.max_line))
            yield from self._whole(whole, block)
            rest = last[-keep:]
        self.cut = blocks.cut
        if rest:
            yield from self._given(*_kept(rest, self.max_line))


def _kept(line: bytes, max_line: int) -> tuple[bytes, bool]:
    """(what a reader keeps of ``line``, whether it dropped some): what follows its last NUL
    byte (the bytes before are what a crash left), nothing of a line over ``max_line``."""
    nul = line.rfind(b"\0")
    dropped = nul >= 0
    if dropped:
        line = line[nul + 1:]
    return (b"", True) if len(line) > max_line else (line, dropped)


def _data_at(fd: int, pos: int) -> int:
    """Where the data at or after ``pos`` starts (SEEK_DATA); past the end: the largest
    offset; where the file system cannot say, ``pos``: every byte is data."""
    try:
        return os.lseek(fd, pos, os.SEEK_DATA)
    except OSError as err:
        return sys.maxsize if err.errno == errno.ENXIO else pos


def _data_end_below(fd: int, pos: int, step: int) -> int:
    """Where the data nearest below ``pos`` ends: ``pos`` where the byte before it is data,
    0 where there is none below; a hole lies between. Found in steps that double."""
    if _data_at(fd, pos - 1) == pos - 1:
        return pos
    low = pos
    while low > 0:
        low, step = max(0, low - step), step * 2
        start = _data_at(fd, low)
        if start < pos:
            return _last_data_end(fd, start, pos)
    return 0


def _last_data_end(fd: int, start: int, pos: int) -> int:
    """The end of the last stretch of data from ``start`` up to ``pos``; ``pos`` where a file
    of very many holes takes more than 64 steps (its bytes are then read, holes too)."""
    for _ in range(64):
        end = os.lseek(fd, start, os.SEEK_HOLE)
        start = _data_at(fd, end)
        if start >= pos:
            return min(end, pos)
    return pos


def lines_from_end(path: "str | os.PathLike", limit: int, chunk: int = 1 << 16,
                   max_line: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """``Tail``'s lines, for a reader that needs no count of those skipped."""
    return iter(Tail(path, limit, max_line, chunk))


def is_number(value: Any) -> bool:
    """A JSON number: int or float, not bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A value for a one-line message: short, whatever its size or depth."""
    return _show.repr(value)
