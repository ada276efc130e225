"""What `submit --wait` shows while a local run trains: each epoch's summary stays on the
screen (as tqdm and Lightning leave one line per epoch), the step line is rewritten in
place on a terminal, and a pipe gets every progress line (one every train.log_every
steps). Real runs, on a pseudo-terminal and on a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

from clirun import WAIT_S, base_env, cli, start
from trainutil import write_spec

EPOCHS = 3


def spec(tmp_path: Path) -> Path:
    # 256 samples, batch 16, one process: 16 steps per epoch, a progress line every 4
    return write_spec(tmp_path, "live", train={"epochs": EPOCHS, "log_every": 4}, resources={"tasks_per_node": 1})


def logged(tmp_path: Path) -> list[str]:
    """Rank 0's progress and epoch lines, as it wrote them."""
    (run,) = [p for p in (tmp_path / "results" / "live").iterdir() if not p.name.startswith(".")]
    lines = (run / "logs" / "rank0.out").read_text().splitlines()
    return [line.removeprefix("[progress] ") for line in lines if line.startswith(("[progress] ", "epoch "))]


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after ``raw``: CR goes back to the line's start, ESC[K
    erases to its end, a character overwrites what is under the cursor."""
    lines, line, col, i = [], [], 0, 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        char = raw[i]
        if char == "\r":
            col = 0
        elif char == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        else:
            line[col:col + 1] = [char]
            col += 1
        i += 1
    return lines + (["".join(line).rstrip()] if line else [])


def test_in_a_pipe_every_progress_line_and_every_epoch_line_is_printed(tmp_path):
    done = cli(tmp_path, "submit", str(spec(tmp_path)), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout.splitlines()
    summary = next(i for i, line in enumerate(shown) if "  completed  " in line)
    expected = logged(tmp_path)
    assert shown[:summary] == expected  # all of them, in order, nothing else
    assert sum(" step " in line for line in expected) == EPOCHS * 4
    assert [line.split()[1] for line in expected if " step " not in line] == ["1/3", "2/3", "3/3"]


def test_on_a_terminal_each_epoch_stays_on_screen_and_the_step_line_is_rewritten(tmp_path):
    parent, child = pty.openpty()
    env = {**base_env(), "COLUMNS": "200", "TERM": "xterm"}
    proc = start(tmp_path, "submit", str(spec(tmp_path)), "--executor", "local", "--wait", env=env, stdout=child,
                 stdin=subprocess.DEVNULL, text=False)
    os.close(child)
    raw = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        raw += chunk
    os.close(parent)
    assert proc.wait(timeout=WAIT_S) == 0, proc.stderr.read().decode() if proc.stderr else ""
    text = raw.decode()
    lines = screen(text)
    epochs = [line for line in logged(tmp_path) if " step " not in line]
    summary = next(i for i, line in enumerate(lines) if "  completed  " in line)
    assert lines[:summary] == epochs  # one line per epoch; no step line is left behind
    steps = [line for line in logged(tmp_path) if " step " in line]
    assert all(f"\r\x1b[K{step}" in text for step in steps)  # each was shown, in place
