"""The one owner of this process's signal wakeup fd (``signal.set_wakeup_fd``): a thread
woken by every signal that has a Python handler, whichever thread the kernel handed it to
and while the main thread is stuck in C code (a collective waiting for a dead peer) and
never gets to run that handler. The stop signals (clusterjob.runner.preempt) arm the kill
of a plain script from it; a stack request (clusterjob.runner.stackhandler) is answered
from it. There is one wakeup fd per process, hence one owner.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

_callbacks: dict[int, list[Callable[[int], None]]] = {}
_lock = threading.Lock()
_installed: list[int] = []  # the pipe's read end once installed


def on(signals: "tuple[int, ...] | list[int]", callback: Callable[[int], None]) -> None:
    """Call ``callback(signum)`` from the wakeup thread when any of ``signals`` arrives (the
    signals' Python handlers are the caller's; installed from the main thread)."""
    with _lock:
        if not _installed:
            read, write = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(write, False)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)  # ValueError off the main thread
            _installed.append(read)
            threading.Thread(target=_wake, args=(read,), daemon=True, name="clusterjob-signals").start()
        for sig in signals:
            _callbacks.setdefault(int(sig), []).append(callback)


def forget_in_child() -> None:
    """A forked child keeps no wakeup fd: nothing reads it there (the thread stayed behind)."""
    _installed.clear()
    _callbacks.clear()
    signal.set_wakeup_fd(-1)


def _wake(read: int) -> None:
    while True:
        try:
            got = os.read(read, 512)
        except OSError:
            return
        if not got:
            return
        called: set = set()
        for sig in dict.fromkeys(got):  # several of one signal at once: one call
            for callback in _callbacks.get(sig, []):
                if callback not in called:
                    called.add(callback)
                    callback(sig)
