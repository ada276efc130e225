"""The window of a submit (or resume) between making its run folders and an executor
taking them (docs/design.md, "Failures"): whatever ends the command in it, nothing is
left ``pending`` without a job or a process.

Inside the window a stop signal (SIGINT, SIGTERM, SIGHUP) raises, so a Ctrl-C during a
long snapshot ends it at once; while the executor is called (sbatch, the detached
supervisor's start) it waits until the call returned, so a job that sbatch made always
reaches its run.json. When the window ends in an error or a signal:

- a submission none of whose runs was taken leaves nothing behind: its run folders, and
  the folders above them that it made, are removed (a run folder that cannot be removed
  is marked failed instead);
- runs not taken beside runs that were (a sweep split into several arrays, one refused)
  and a resumed run are marked ``failed`` with the reason, so ``resume`` starts them;

and the user gets one line: exit 2 for bad input (sbatch refusing the account or the
partition), 128 + N for signal N, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType, TracebackType
from typing import Iterator, Optional

from clusterjob.core import runstate, sweep, unmade
from clusterjob.core.errors import BadInput, Failure, escape
from clusterjob.core.files import now_iso
from clusterjob.core.record import RunError
from clusterjob.core.rundir import RunDir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal other than SIGINT (that one is KeyboardInterrupt) inside the window."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Window:
    """``with Window(...) as window``: ``hold`` the runs once made, ``close`` once an
    executor has them (``handing_over`` around the executor's call does both)."""

    def __init__(self, runs: Optional[list[RunDir]] = None, parent: Optional[Path] = None) -> None:
        """A resume passes the reopened run (``runs``); a submit the folder its runs go
        into (``parent``: ``<output.root>/<name>``), whose missing folders it will make."""
        self.fresh = runs is None
        self.runs: list[RunDir] = list(runs or [])
        # made by this submit, removed again when it leaves nothing (innermost first)
        self.made = [p for p in (parent / ".slurm", parent / sweep.FOLDER, parent, parent.parent)
                     if not p.exists()] if parent else []
        self.closed, self.deferring = False, False
        self.deferred: list[int] = []
        self.handlers: dict = {}

    def __enter__(self) -> "Window":
        # a signal ignored on purpose (nohup, a shell's background job) stays ignored
        caught = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]
        self.handlers = {sig: signal.signal(sig, self._on_signal) for sig in caught}
        return self

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.deferring:
            self.deferred.append(signum)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise Stopped(signum)

    def hold(self, runs: list[RunDir]) -> list[RunDir]:
        """The runs this window answers for; returns them."""
        self.runs = list(runs)
        return self.runs

    def close(self) -> None:
        """An executor has the runs: from here what happens to them is its business."""
        self.closed = True
        self._restore()

    @contextlib.contextmanager
    def handing_over(self) -> Iterator[None]:
        """Around the executor's call: a stop signal waits for it; when it returned, the
        window closes and the signal takes effect (the runs are the executor's now)."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        self.close()
        if self.deferred:
            name = signal.Signals(self.deferred[0]).name
            print(f"clusterjob: {name} came while the runs were handed over; they are submitted: "
                  f"clusterjob status {_escaped(self.runs[0].path.parent)}", file=sys.stderr)
            signal.raise_signal(self.deferred[0])

    def _restore(self) -> None:
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        self.handlers = {}

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self.closed:
            return
        self._restore()
        if exc is None:
            return
        with _held_signals():
            outcome = _abandon(self, _reason(exc))
        _raise_instead(exc, outcome)


# ----------------------------------------------------------------------------- abandoning


def _reason(exc: BaseException) -> str:
    """The one-line reason a run failed, as its error record and the user's line say it."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by SIGINT (Ctrl-C) before the runs were handed over"
    if isinstance(exc, Stopped):
        return f"stopped by {exc} before the runs were handed over"
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def _abandon(window: Window, reason: str) -> str:
    """Remove or fail the runs no executor took; what became of them, in words."""
    records = sweep.Records()  # read once for all its runs: a sweep of 10,000 shares one
    left = [run for run in window.runs if not _has_job(run, records)]
    if window.fresh and len(left) == len(window.runs) and _removed(left, window.made):
        return "no run was left behind"
    if not left:
        return "the runs were handed over"
    for run in left:
        _mark_failed(run, f"{'submit' if window.fresh else 'resume'} failed: {reason}")
    names = " ".join(_escaped(run.path) for run in left[:3]) + (" ..." if len(left) > 3 else "")
    return f"{len(left)} run(s) marked failed, `clusterjob resume RUN` starts one: {names}"


def _has_job(run: RunDir, records: sweep.Records) -> bool:
    """Whether an executor has a job for the run (its run.json or its sweep's record
    names one: a Slurm job)."""
    try:
        return sweep.job_of(run.path, run.read(), records) is not None
    except OSError:
        return False


def _removed(runs: list[RunDir], made: list[Path]) -> bool:
    """Remove the run folders and their sweep's record, then the folders above them
    that this submit made (each only when empty: the executor's files of this
    submission are gone already); False if a run folder stays."""
    for run in runs:
        shutil.rmtree(run.path, ignore_errors=True)
    if any(run.path.exists() for run in runs):
        return False
    for where in {(w.parent, w.stamp) for run in runs if (w := sweep.member(run.path)) is not None}:
        record = sweep.record_file(*where)
        for path in (record, record.with_name(record.name + ".lock"), sweep.lock_file(*where),
                     unmade.store_file(*where)):
            path.unlink(missing_ok=True)
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()
    return True


def _mark_failed(run: RunDir, message: str) -> None:
    error = RunError(None, message, "", now_iso())
    with contextlib.suppress(OSError):  # a run.json that cannot be written (a full disk) stays as it was
        run.update(runstate.fail(error))


@contextlib.contextmanager
def _held_signals() -> Iterator[None]:
    """Stop signals wait while the runs are cleaned up (a second Ctrl-C cannot leave half)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _raise_instead(exc: BaseException, outcome: str) -> None:
    """End the command with one line: the error and what became of the runs."""
    if isinstance(exc, BadInput):
        raise BadInput(f"{exc}; {outcome}") from None
    if isinstance(exc, (Failure, OSError)):
        raise Failure(f"{_reason(exc)}; {outcome}") from None
    print(f"clusterjob: {escape(_reason(exc))}; {outcome}", file=sys.stderr)
    if isinstance(exc, Stopped):
        raise SystemExit(128 + exc.signum) from None
    # KeyboardInterrupt (exit 130) and anything unforeseen (its traceback follows) go on


def _escaped(path: Path) -> str:
    return escape(str(path))
