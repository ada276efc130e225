"""A rank's answer to a stack request (docs/design.md, "Hung and slow ranks"): on
STACK_SIGNAL, every thread's Python stack appended to its stacks file, in faulthandler's
format, the main thread last as the current one.

faulthandler's own all-threads dump, run from the signal handler, reads every thread's
frames without the GIL: a thread that runs meanwhile (one that starts or ends, a logger's,
the output pumps) changes them under it, and the rank died of SIGSEGV within a few hundred
requests. So the signal only wakes a thread (clusterjob.runner.wakeups: the C-level part
of Python's handler writes to the wakeup fd whichever thread the kernel chose, while the
main thread is blocked in a C call too); that thread takes the GIL, as any Python thread
does (a collective releases it, a Python loop hands it over every few milliseconds), and
writes what ``sys._current_frames()`` gives, consistent under the GIL. A rank whose GIL
never comes (C code that holds it) is read from outside by py-spy where installed.

A forked child (a DataLoader worker) has no such thread: there faulthandler's C-level
handler writes its own dump to the stacks file; a worker runs one thread.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, Iterator, Optional

from clusterjob.runner import wakeups

MAX_FRAMES = 100  # per thread, as faulthandler
MAX_THREADS = 100

_state: dict[str, Any] = {"file": None, "sig": None}
_lock = threading.Lock()


def register(sig: int, path: "os.PathLike") -> None:
    """``sig`` appends every thread's stack to ``path`` (kept open to the end of the
    process); from the main thread (else faulthandler's own dump, as in a child)."""
    with _lock:
        if _state["file"] is not None:
            _state["file"].close()
        _state["file"] = open(path, "ab", buffering=0)
        first = _state["sig"] is None
        _state["sig"] = sig
    if threading.current_thread() is not threading.main_thread():
        faulthandler.register(sig, file=_state["file"], all_threads=True, chain=False)
        return
    signal.signal(sig, _noop)
    signal.siginterrupt(sig, False)  # SA_RESTART: an interrupted read or wait goes on
    if first:
        wakeups.on([sig], _answer)
        os.register_at_fork(after_in_child=_in_child)


def _noop(signum: int, frame: object) -> None:
    """The main thread's part: nothing (the wakeup thread answers)."""


def _in_child() -> None:
    """A forked child: no wakeup thread there, so faulthandler writes its own dump."""
    if _state["file"] is not None and _state["sig"] is not None:
        faulthandler.register(_state["sig"], file=_state["file"], all_threads=True, chain=False)


def _answer(signum: int) -> None:
    target = _state["file"]
    if target is None:
        return
    try:
        target.write(dump().encode(errors="replace"))
    except (OSError, ValueError):  # a full disk, the file closed by a new session's register
        pass


def dump() -> str:
    """Every thread's stack but this one's, faulthandler's format, the main thread last."""
    main, own = threading.main_thread().ident, threading.get_ident()
    frames = {ident: frame for ident, frame in sys._current_frames().items() if ident != own}
    order = [i for i in frames if i != main][:MAX_THREADS - 1] + ([main] if main in frames else [])
    parts = []
    for ident in order:
        head = "Current thread" if ident == main else "Thread"
        parts.append(f"{head} 0x{ident:016x} (most recent call first):\n")
        parts.extend(_frames(_interrupted(frames[ident])))
        parts.append("\n")
    return "".join(parts)


def _interrupted(frame: Optional[FrameType]) -> Optional[FrameType]:
    """The frame the request's own handler interrupted, when the main thread is caught
    running it (the handler and this answer start on the same signal): the code it runs
    is what a stall's culprit names, never ``_noop``."""
    while frame is not None and frame.f_code is _noop.__code__:
        frame = frame.f_back
    return frame


def _frames(frame: Optional[FrameType]) -> Iterator[str]:
    """A thread's frames, innermost first (no source lines read: a file system that hangs
    must not hang the answer)."""
    for _ in range(MAX_FRAMES):
        if frame is None:
            return
        line = frame.f_lineno if frame.f_lineno is not None else "???"
        yield f'  File "{frame.f_code.co_filename}", line {line} in {frame.f_code.co_name}\n'
        frame = frame.f_back
