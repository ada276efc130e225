"""A command driven through a pseudo-terminal by a script of keystrokes, for the tests of
what is interactive (``clusterjob attach``, ``submit --debug``): the command gets a new
session whose controlling terminal is the pty, as in a terminal; each step waits for a
text on the screen, then types its keys. Stdlib only (``os.openpty``)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import termios
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from clirun import WAIT_S


@dataclass
class Screen:
    """What the command showed (the terminal's bytes as text: the echo of what was typed
    too) and its exit status."""

    text: str
    returncode: int

    def lines(self) -> list[str]:
        return [line.rstrip("\r") for line in self.text.split("\n")]


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def drive(argv: Sequence[str], cwd: "str | os.PathLike", env: Mapping[str, str],
          steps: Sequence[tuple[str, str]], timeout: float = WAIT_S) -> Screen:
    """Run ``argv`` on a pty; for each (``wait_for``, ``keys``) wait until ``wait_for``
    shows after what the last step matched, then type ``keys``; then read until the command
    ends. An AssertionError with the screen when a text never shows."""
    master, slave = os.openpty()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=_controlling_terminal)
    os.close(slave)
    seen, at = bytearray(), 0
    deadline = time.monotonic() + timeout
    try:
        for wanted, keys in steps:
            found = _read_until(master, seen, wanted.encode(), at, deadline, proc)
            assert found >= 0, f"{wanted!r} never showed; the screen:\n{seen.decode(errors='replace')}"
            at = found + len(wanted)
            os.write(master, keys.encode())
        _read_until(master, seen, None, at, deadline, proc)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return Screen(seen.decode(errors="replace"), proc.returncode)


def _read_until(master: int, seen: bytearray, wanted, at: int, deadline: float, proc) -> int:
    """Read into ``seen`` until ``wanted`` shows at or after ``at`` (its offset), or, with
    ``wanted`` None, until the terminal closes; -1 when it never showed."""
    while time.monotonic() < deadline:
        if wanted is not None and (found := seen.find(wanted, at)) >= 0:
            return found
        ready, _, _ = select.select([master], [], [], 0.5)
        if not ready:
            if proc.poll() is not None and wanted is None:
                return -1
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every process holding the terminal ended
            chunk = b""
        if not chunk:
            break
        seen += chunk
    return seen.find(wanted, at) if wanted is not None else -1
