"""A command that outlives its connection: ``submit --wait``, ``resume --wait`` and
``logs --follow`` run on the cluster detached from the SSH session (nohup, output to
files), and the laptop follows their output (``remote/follower.py``). A dropped
connection ends only the following: clusterjob says it lost the connection, logs in
again once the cluster answers, and goes on from the last byte it printed. The job and
the command there are never touched by it; Ctrl-C here stops following only.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable, Optional

from clusterjob.core.errors import Failure
from clusterjob.remote import follower
from clusterjob.remote.ssh import LOST, Connection, remote_path

RECONNECT_GIVE_UP_S = 6 * 3600  # a cluster down for longer: follow it again by hand


def start(conn: Connection, folder: str, command: str) -> str:
    """Start ``command`` (a quoted line) detached; the base path of its files in ``folder`` there."""
    base = f"{folder}/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    q = shlex.quote
    # the status written whole (a follower never reads a half-written one)
    script = (f"{{ {command}; }} >{q(base + '.out')} 2>{q(base + '.err')} </dev/null; "
              f"echo $? >{q(base + '.rc.part')} && mv {q(base + '.rc.part')} {q(base + '.rc')}")
    line = f"nohup sh -c {q(script)} >/dev/null 2>&1 </dev/null &"
    done = conn.run(line)
    if done.returncode != 0:
        raise Failure(f"could not start the command on {conn.host}: {_last_line(done.stderr)}")
    return base


def follow(conn: Connection, python: str, base: str, name: str) -> int:
    """Print the detached command's output as it comes; its exit status."""
    offsets = {b"O": 0, b"E": 0}
    source = Path(follower.__file__).read_text()
    while True:
        words = [base, str(offsets[b"O"]), str(offsets[b"E"])]
        line = f"{remote_path(python)} -c {shlex.quote(source)} " + " ".join(shlex.quote(w) for w in words)
        proc = subprocess.Popen(conn.ssh(line), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            status = _frames(proc.stdout, offsets)
        except KeyboardInterrupt:
            _say(f"stopped following; the command goes on on {name}")
            raise
        finally:
            proc.stdout.close()
            rc = proc.wait()
        if status is not None:
            return status
        if rc != LOST:
            why = _last_line(proc.stderr.read() if proc.stderr else b"")
            raise Failure(f"following the command on {name} failed (exit {rc}): {why}")
        _say(f"lost the connection to {name}; reconnecting (the job there goes on)")
        _reconnect(conn, name, time.monotonic())
        _say(f"reconnected to {name}")


def _frames(stream: IO[bytes], offsets: dict) -> Optional[int]:
    """Write each frame's bytes where they belong; the exit status at X, None at a cut."""
    outputs: dict[bytes, Callable[[bytes], object]] = {b"O": _writer(sys.stdout), b"E": _writer(sys.stderr)}
    while True:
        header = stream.readline()
        if not header.endswith(b"\n"):
            return None
        key, _, size = header.strip().partition(b" ")
        if key == b"X":
            return int(size)
        if key not in outputs:  # H: the follower is alive, the command quiet
            continue
        data = stream.read(int(size))
        if len(data) < int(size):
            return None  # cut in the middle: those bytes come again from the same offset
        outputs[key](data)
        offsets[key] += len(data)


def _writer(text_stream) -> Callable[[bytes], object]:
    def write(data: bytes) -> None:
        text_stream.flush()
        text_stream.buffer.write(data)
        text_stream.buffer.flush()
    return write


def _reconnect(conn: Connection, name: str, since: float) -> None:
    """Log in again, waiting longer between tries, until the cluster answers."""
    pause = 1.0
    while not _answers(conn):
        if time.monotonic() - since > RECONNECT_GIVE_UP_S:
            raise Failure(f"{name} did not answer for {RECONNECT_GIVE_UP_S // 3600} h; the command there goes on: "
                          f"follow it with `clusterjob status --cluster {name}`")
        time.sleep(pause)
        pause = min(pause * 2, 15.0)


def _answers(conn: Connection) -> bool:
    try:
        return conn.run("true", timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"clusterjob: {message}", file=sys.stderr, flush=True)


def _last_line(data: Optional[bytes]) -> str:
    lines = (data or b"").decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no message"
