"""What ``submit --wait`` shows while local runs run (docs/design.md, "Command line").

``ProgressTail`` reads each run's new progress as it comes: the built-in trainer's lines
from rank 0's log (``[progress] ...`` every ``train.log_every`` steps, ``epoch N/M ...``
after each epoch), or your own code's first metric from metrics.jsonl. ``LiveLine``
prints them: on a terminal the step line is rewritten in place and each epoch's summary
stays on its own line (as tqdm and Lightning leave one bar per epoch); in a pipe every
line of the trainer is printed as it comes, your code's metric at most every
PIPE_EVERY_S. Reads only; no torch.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from clusterjob.core import metrics
from clusterjob.core.errors import escape
from clusterjob.core.rundir import RunDir

STEP_MARK = "[progress] "  # the trainer's step lines (trainer/worker.py); its epoch lines start with "epoch "
MAX_READ = 1 << 20  # bytes of new log read per look: a flood is skipped to its end, not buffered
PIPE_EVERY_S = 10.0  # in a pipe, your code's latest metric at most this often


@dataclass(frozen=True)
class Line:
    """One line of progress: ``kept`` stays on the terminal (an epoch's summary), else it
    is the live line, replaced by the next; ``every``: a pipe gets each one (the trainer's
    step lines), else at most one every PIPE_EVERY_S."""

    text: str
    kept: bool = False
    every: bool = False


class ProgressTail:
    """The runs' new progress lines since the last look, run by run: ``own_code`` (the spec
    names an entrypoint) reads your code's first metric, else the trainer's lines. Rank 0's
    log is read from where it ended when the tail was made, so a resumed run's earlier
    sessions are not shown again."""

    def __init__(self, runs: list[RunDir], own_code: bool):
        self.own_code = own_code
        self.offsets = {run.path: _size(_log(run)) for run in runs}
        self.partial: dict[Path, bytes] = {}
        self.shown: dict[Path, str] = {}  # your code's metric, as last shown
        self.entrypoints: dict[Path, dict] = {}  # as rank 0 recorded it once it started

    def new_lines(self, run: RunDir) -> list[Line]:
        if not self.own_code:
            return [_trainer_line(text) for text in self._read(run) if text.startswith((STEP_MARK, "epoch "))]
        entrypoint = self.entrypoints.get(run.path) or run.read().entrypoint
        latest = metrics.own_latest(run.path, entrypoint) if entrypoint is not None else None
        if entrypoint is None or latest is None:
            return []
        self.entrypoints[run.path] = entrypoint
        text = escape(str(latest))  # names from the code's own file: safe for a terminal
        if text == self.shown.get(run.path):
            return []
        self.shown[run.path] = text
        return [Line(text)]

    def _read(self, run: RunDir) -> list[str]:
        """The whole lines rank 0 logged since the last look."""
        path, offset = _log(run), self.offsets.get(run.path, 0)
        try:
            with open(path, "rb") as f:
                end = f.seek(0, 2)
                if end < offset:  # the log was replaced: read it from its start
                    offset = 0
                if end - offset > MAX_READ:
                    offset, self.partial[run.path] = end - MAX_READ, b""
                f.seek(offset)
                data = f.read(end - offset)
        except OSError:
            return []
        self.offsets[run.path] = offset + len(data)
        *lines, self.partial[run.path] = (self.partial.get(run.path, b"") + data).split(b"\n")
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]


def _trainer_line(text: str) -> Line:
    if text.startswith(STEP_MARK):
        return Line(escape(text[len(STEP_MARK):]), every=True)
    return Line(escape(text), kept=True)


def _log(run: RunDir) -> Path:
    return run.logs / "rank0.out"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class LiveLine:
    """Progress lines on ``stream``: rewritten in place on a terminal, with the kept ones
    left behind; in a pipe, one per line (see Line)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.tty, self.clock = stream, stream.isatty(), time.monotonic
        self.live = False  # a live line is on the terminal
        self.piped_at = -math.inf

    def show(self, lines: list[Line]) -> None:
        for line in lines:
            if self.tty:
                self._draw(line)
            elif line.kept or line.every or self.clock() - self.piped_at >= PIPE_EVERY_S:
                self.stream.write(line.text + "\n")
                self.piped_at = self.clock() if not (line.kept or line.every) else self.piped_at
        if lines:
            self.stream.flush()

    def _draw(self, line: Line) -> None:
        if line.kept:
            self.stream.write("\r\033[K" + line.text + "\n")
        else:
            self.stream.write("\r\033[K" + line.text[: shutil.get_terminal_size().columns - 1])
        self.live = not line.kept

    def clear(self) -> None:
        """Take the live line off the terminal (a summary line follows)."""
        if self.tty and self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.live = False
