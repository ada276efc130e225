"""A process's Python stacks read from outside by py-spy (the ``[health]`` extra), for a
rank that cannot run its own stack handler: one stopped by SIGSTOP (a debugger, a sick
node), one that has not installed the handler yet, one whose handler does not answer
(docs/design.md, "Hung and slow ranks"). ``py-spy dump --nonblocking`` reads the
process's memory without pausing it, so it works on a stopped process too (the pausing
mode does not), and it sends no signal. Its stacks come in faulthandler's format, so that
the stall's reading (clusterjob.runner.stacks) takes them as it takes a rank's own dump.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

WAIT_S = 10.0  # the most one read may take (it takes milliseconds)
COMMAND = "py-spy dump --nonblocking"  # what the stacks files and ``clusterjob stack`` say read them
ABSENT = "py-spy is not installed to read them from outside (pip install py-spy)"


def executable() -> Optional[str]:
    """py-spy on the PATH, else beside this Python (a virtual environment's bin that is
    not on the PATH); None where there is none."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) and beside.is_file() else None


def dump(pid: int) -> tuple[Optional[str], str]:
    """(the stacks of ``pid``'s threads in faulthandler's format, "") or (None, why not),
    the reason a clause that reads after "no stacks: ..."."""
    exe = executable()
    if exe is None:
        return None, ABSENT
    try:
        done = subprocess.run([exe, "dump", "--nonblocking", "--json", "--pid", str(pid)], capture_output=True,
                              text=True, errors="replace", timeout=WAIT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{COMMAND} could not run ({err})"
    text = render(done.stdout) if done.returncode == 0 else None
    if text is None:
        said = next((line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()),
                    f"it exited {done.returncode}")
        return None, f"{COMMAND} could not read them ({said.removeprefix('Error: ')[:200]})"
    return text, ""


def render(raw: str) -> Optional[str]:
    """py-spy's JSON threads as faulthandler writes them (thread ids as Python's
    ``threading.get_ident``, innermost frame first); None for anything else, or no thread."""
    try:
        threads = json.loads(raw)
        parts = [_thread(thread) for thread in threads]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return "\n".join(parts) if parts else None


def _thread(thread: dict) -> str:
    """One thread; raises KeyError, TypeError or ValueError when it is not py-spy's."""
    lines = [f"Thread 0x{int(thread['thread_id']):016x} (most recent call first):\n"]
    for frame in thread["frames"]:
        # faulthandler names a frame by its code's name, py-spy by its qualified name
        name = str(frame["name"]).rsplit(".", 1)[-1] or str(frame["name"])
        lines.append(f'  File "{frame["filename"]}", line {int(frame["line"])} in {name}\n')
    return "".join(lines)
