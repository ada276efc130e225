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
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, TextIO

from clusterjob.core import metrics
from clusterjob.core.errors import escape
from clusterjob.core.rundir import RunDir

STEP_MARK = "[progress] "  # the trainer's step lines (trainer/worker.py); its epoch lines start with "epoch "
MAX_READ = 1 << 20  # bytes of new log read per look: a flood is skipped to its end, not buffered
PIPE_EVERY_S = 10.0  # in a pipe, your code's latest metric at most this often
QUIET_S = 60.0  # a run with no progress line this long gets a status line, and one more each QUIET_S


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

    def __init__(self, runs: list[RunDir], own_code: bool, stall_s: Optional[float] = None):
        self.own_code, self.stall_s, self.clock = own_code, stall_s, time.monotonic
        self.offsets = {run.path: _size(_log(run)) for run in runs}
        self.partial: dict[Path, bytes] = {}
        self.printed: dict[Path, str] = {}  # your code's metric, as last printed
        self.entrypoints: dict[Path, dict] = {}  # as rank 0 recorded it once it started
        self.quiet: dict[Path, Quiet] = {}  # since when each run has shown no progress

    def new_lines(self, run: RunDir) -> list[Line]:
        """The run's progress since the last look; after QUIET_S without any, one status
        line (``still at epoch 2 step 15, no progress for 3 min; stall after 30 min``) and
        another every QUIET_S, so that a hang is never silent until the stall."""
        lines = self._progress(run)
        return lines + self._status(run, lines)  # none when there were lines: they reset the clock

    def quiet_lines(self, run: RunDir) -> list[Line]:
        """Only the status lines of ``new_lines`` (the progress it reads is taken in
        silence): a wait that shows no progress (Slurm's) still says when there is none."""
        return self._status(run, self._progress(run))

    def _status(self, run: RunDir, lines: list[Line]) -> list[Line]:
        """The status line due after ``lines`` (the run's progress just read), if any."""
        quiet = self.quiet.setdefault(run.path, Quiet(self.clock()))
        if lines:
            self.quiet[run.path] = Quiet(self.clock(), _position(lines[-1].text) or quiet.at)
            return []
        said = quiet.due(self.clock(), self.stall_s)
        if said is None:
            return []
        self.quiet[run.path] = replace(quiet, said=self.clock())
        return [Line(said, kept=True)]

    def _progress(self, run: RunDir) -> list[Line]:
        if not self.own_code:
            return [_trainer_line(text) for text in self._read(run) if text.startswith((STEP_MARK, "epoch "))]
        entrypoint = self.entrypoints.get(run.path) or run.read().entrypoint
        latest = metrics.own_latest(run.path, entrypoint) if entrypoint is not None else None
        if entrypoint is None or latest is None:
            return []
        self.entrypoints[run.path] = entrypoint
        text = escape(str(latest))  # names from the code's own file: safe for a terminal
        if text == self.printed.get(run.path):
            return []
        self.printed[run.path] = text
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


class OutputTail(ProgressTail):
    """The new whole lines of the runs' rank 0 output since the last look, each kept: a
    task per allocation (a search's slot) prints the lines its own watch shows (its
    trials' progress, prunes and ends), which the watch of its runs passes on as they are."""

    def __init__(self, runs: list[RunDir]):
        super().__init__(runs, own_code=False)

    def new_lines(self, run: RunDir) -> list[Line]:
        return [Line(escape(text), kept=True) for text in self._read(run) if text.strip()]


@dataclass(frozen=True)
class Quiet:
    """A run's last progress: when (monotonic), where (``epoch 2 step 15``, "" before the
    first line), and when a status line last said so."""

    since: float
    at: str = ""
    said: Optional[float] = None

    def due(self, now: float, stall_s: Optional[float]) -> Optional[str]:
        """The status line, when QUIET_S passed since the last progress and since the
        last status line; else None."""
        if now - self.since < QUIET_S or (self.said is not None and now - self.said < QUIET_S):
            return None
        where = f"still at {self.at}" if self.at else "still running"
        watch = f"stall after {_minutes(stall_s)}" if stall_s is not None else "no stall watch"
        return f"{where}, no progress for {_minutes(now - self.since)}; {watch}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min" if seconds >= 60 else f"{int(seconds)} s"


_POSITION = re.compile(r"^epoch (\d+)/\d+(?: step (\d+)/\d+)?")


def _position(text: str) -> str:
    """``epoch 2 step 15`` of a trainer's line (``epoch 2/4 step 15/32 loss ...``), the
    end of an epoch (``epoch 2/4 train_loss ...``: ``the end of epoch 2``), or "" for any
    other line (your code's metric)."""
    found = _POSITION.match(text)
    if found is None:
        return ""
    epoch, step = found.groups()
    return f"epoch {epoch} step {step}" if step else f"the end of epoch {epoch}"


def started_line(run: RunDir, number: int, count: int) -> str:
    """``run 002 of 6 started (train.lr=0.07, train.seed=1)``: a sweep's run as its ranks
    start, numbered as the sweep names its runs."""
    params = run.read().params or {}
    pairs = ", ".join(f"{key}={value}" for key, value in params.items())
    return escape(f"run {number:03d} of {count} started" + (f" ({pairs})" if pairs else ""))


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


def prune_line(run: RunDir, alive: int) -> str:
    """``<trial> pruned at rung 0 (epoch 1): val_acc 16.83% < cut 82.18%; stopping 1 rank``:
    what ``submit --wait`` says as a trial's search prunes it (the metric from the
    search's search.json; epochs for the trainer, steps for your code)."""
    from clusterjob.search import asha
    from clusterjob.search import record as searchmod

    info = run.read()
    metric = searchmod.read(run.path.parent)[0].metric or "value"  # never raises: a damaged file says "value"
    where = "step" if info.entrypoint else "epoch"
    said = asha.pruned_text(info.pruned, metric, where)
    return f"{escape(run.run_id)}  {said}; stopping {alive} {'rank' if alive == 1 else 'ranks'}"


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
