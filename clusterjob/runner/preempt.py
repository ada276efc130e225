"""The one owner of the stop signals: SIGUSR2, SIGTERM and SIGINT.

SIGUSR2 is Slurm's warning before the time limit (``--signal=USR2@delay``, as submitit and
the sbatch templates ask) or a preemption notice: the run checkpoints and requeues itself.
SIGTERM is Slurm ending the job (preemption, ``scontrol requeue``, ``scancel``), the local
supervisor stopping its ranks (``clusterjob cancel``, SIGTERM or SIGHUP to it, its own
death): the run checkpoints if it can before the SIGKILL that follows, and leaves the
requeue to Slurm. SIGINT is Ctrl-C, which the local supervisor passes on to its ranks as
SIGINT, as torchrun does: the user's stop, never requeued (the run ends cancelled). A
trial of a search that its search prunes (clusterjob.search.asha) stops as on a cancel:
rank 0 asks ``prune()``, the other ranks learn it as they learn any stop.

Code that cooperates (the built-in trainer; your code once it asked
``clusterjob.should_stop()``) only sees a flag: it asks ``agreed()`` at its step
boundaries (a collective, so all ranks stop at the same step) and checkpoints. A plain
script never asks, so it is stopped as torchrun would stop it: SIGINT raises
``KeyboardInterrupt`` in its main thread, as in any Python program (a script that
catches it to test its best model, as pytorch/examples' word_language_model does, goes
on to its own end), and the other stops raise ``StopRequested`` (its ``finally`` blocks
run; ``except Exception`` does not swallow it); if it is still alive ``grace_s`` later
the process is killed. The kill is armed by a thread woken through the signal wakeup
fd (clusterjob.runner.wakeups), so it comes even while the main thread is stuck in C code (a collective waiting for
a dead peer) and never gets to run the Python handler. NCCL takes SIGUSR1 for itself,
so USR1 is never used.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

from clusterjob.core import runstate
from clusterjob.core.rundir import RunDir
from clusterjob.runner import dist, wakeups

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
CTRL_C = "SIGINT"  # the stop that a plain script sees as KeyboardInterrupt
REDELIVER_S = 0.01  # a stop whose raise Python swallowed comes again this much later
NUDGE_S = 0.05  # how long the main thread has to run a stop's handler before it is sent the signal itself
CANCEL_POLL_S = 1.0  # how often rank 0 of a plain script reads run.json for a cancel
PRUNE = "prune"  # the stop of a trial its search pruned
_STICKY = ("cancel", PRUNE)  # stops that a signal arriving after them does not rename


class StopRequested(BaseException):
    """A plain script was asked to stop (a BaseException: ``except Exception`` in the
    script does not swallow it). ``signal`` is SIGTERM, SIGUSR2, "cancel" or "prune"."""

    def __init__(self, signal_name: Optional[str]):
        super().__init__(f"stopped by {signal_name}")
        self.signal = signal_name


class StopSignal:
    """The stop flag of this process: set by SIGUSR2/SIGTERM/SIGINT, or on rank 0 when
    ``clusterjob cancel`` asked the run to stop (a run started by hand, or ranks on
    other hosts, have no process that cancel could signal; they read run.json)."""

    def __init__(self) -> None:
        self.received_at: Optional[float] = None
        self.signal: Optional[str] = None  # "SIGUSR2", "SIGTERM", "SIGINT", "cancel" or "prune"
        self._run: Optional[RunDir] = None
        # Called on SIGTERM (rank 0 of the user's own code): records the stop at once,
        # as the code may never get back to the runner before Slurm's SIGKILL.
        self.on_term: Optional[Callable[[], None]] = None
        # True while a plain script runs (your code that never asked should_stop()).
        self.is_plain_script: Callable[[], bool] = lambda: False
        self.grace_s = 10.0
        self.before_kill: Callable[[], object] = lambda: None  # rank 0 records the stop
        self._raised = False
        self._raised_exc: Optional[BaseException] = None  # what was raised, until the script has it
        self._signum: int = signal.SIGTERM  # the last stop signal, to deliver again when a raise was lost
        self._said: Optional[str] = None  # the last stop signal this process said it received
        self._armed = False
        self._arm_lock = threading.RLock()  # the handler may run while the main thread holds it

    def install(self) -> "StopSignal":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        wakeups.on(STOP_SIGNALS, self._woken)
        os.register_at_fork(after_in_child=_forget_in_child)
        chained = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            self._lost(unraisable)
            chained(unraisable)

        sys.unraisablehook = hook
        return self

    def _lost(self, unraisable: Any) -> None:
        """A raise of the stop that Python only printed: the handler ran while the main
        thread was in a finalizer (``__del__``, a weakref callback, the garbage
        collector's), where an exception goes nowhere. The script never saw its stop and
        would run on to the kill: deliver the signal again, from a thread a moment later
        (from here its handler would run inside this hook, which swallows too), so that it
        is raised at the script's next line (once more where that is a finalizer again)."""
        if self._raised_exc is not None and unraisable.exc_value is self._raised_exc:
            self._raised, self._raised_exc = False, None
            os.write(2, b"clusterjob: the stop was raised inside a finalizer, where Python drops it; "
                        b"raising it again\n")
            timer = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), self._signum))
            timer.daemon = True
            timer.start()

    def watch(self, run: RunDir) -> None:
        """Rank 0: also stop when ``clusterjob cancel`` asked for it in run.json."""
        self._run = run
        threading.Thread(target=self._watch_cancel, daemon=True, name="clusterjob-cancel").start()

    def _on_signal(self, signum: int, frame: object) -> None:
        first = self.received_at is None
        self._signum = signum
        self.received_at = self.received_at or time.time()
        name = signal.Signals(signum).name
        self.signal = self.signal if self.signal in _STICKY else name
        # a pruned trial's ranks are stopped by SIGTERM too (the supervisor, srun, this
        # process for a plain script): its log says the prune, not a signal from outside
        told = "pruned by its search" if self.signal == PRUNE else f"received {name}"
        said = self._said == told  # the same stop twice (cancel and the supervisor both send SIGTERM): one line
        self._said = told
        # os.write, not print: a handler that prints while the main thread prints raises
        what = "stopping the script" if self.is_plain_script() else "checkpointing at the next step boundary"
        what = "stopping at the next step boundary" if self.signal == PRUNE and not self.is_plain_script() else what
        if not said:
            os.write(1, f"{told}: {what}\n".encode())
        if first and signum == signal.SIGTERM and self.on_term is not None:
            self.on_term()
        self.raise_if_plain()

    def raise_if_plain(self) -> None:
        """In a plain script's main thread, once a stop was asked: raise KeyboardInterrupt
        after Ctrl-C, else StopRequested (once: a second signal must not cut the script's
        clean-up short)."""
        if self.requested and self.is_plain_script() and not self._raised:
            self._raised = True
            self._arm_kill()
            self._raised_exc = KeyboardInterrupt() if self.signal == CTRL_C else StopRequested(self.signal)
            raise self._raised_exc

    def _woken(self, signum: int) -> None:
        """A stop signal, seen whichever thread the kernel handed it to and even while the
        main thread is stuck in C code: name the stop (the record made before the kill
        says which, even if the handler never ran), wake the main thread, arm the kill of
        a plain script."""
        if self.signal is None:
            self.signal = signal.Signals(signum).name
        timer = threading.Timer(NUDGE_S, self._nudge, (signum,))
        timer.daemon = True
        timer.start()
        if self.is_plain_script():
            self._arm_kill()

    def _nudge(self, signum: int) -> None:
        """The kernel hands a process's signal to any thread: given to another one, it
        leaves the main thread waiting in its system call (pdb's prompt reading the
        terminal, a sleep, a socket read), and the handler (main thread only) waits with
        it. If the handler has not run yet, send the signal to the main thread itself:
        its call returns and the handler runs (a signal still pending there runs the
        handler once, not twice). Never where the script put its own handler."""
        if self.received_at is None and signal.getsignal(signum) == self._on_signal:
            ident = threading.main_thread().ident
            if ident is not None:
                signal.pthread_kill(ident, signum)

    def _arm_kill(self) -> None:
        """Start the grace period of a plain script, once."""
        with self._arm_lock:
            if self._armed:
                return
            self._armed = True
        threading.Thread(target=self._kill_after_grace, daemon=True, name="clusterjob-grace").start()

    def _kill_after_grace(self) -> None:
        time.sleep(self.grace_s)
        os.write(2, f"clusterjob: the code did not stop within entrypoint.stop_grace_s={self.grace_s:g} s "
                    "of the stop signal; killing it\n".encode())
        try:
            self.before_kill()
        finally:
            _kill_self()

    def prune(self) -> None:
        """Rank 0 of a trial its search pruned: stop as on a cancel. Code that asks
        ``should_stop()`` (the built-in trainer) sees the flag at its next step boundary; a
        plain script gets StopRequested in its main thread (through SIGTERM to this
        process, as the cancel watcher does) and is killed after its grace period."""
        if self.signal in _STICKY:
            return
        self.signal = PRUNE
        if self.is_plain_script() and self.received_at is None:
            os.kill(os.getpid(), signal.SIGTERM)

    def _watch_cancel(self) -> None:
        """Rank 0: a cancel written to run.json stops a plain script too (it never asks)."""
        while not self._cancelled():
            time.sleep(CANCEL_POLL_S)
        if self.is_plain_script() and self.received_at is None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in the main thread; the kill is armed

    def _cancelled(self) -> bool:
        if self._run is None:
            return False
        info = self._run.read()
        if info.status != runstate.CANCELLED and info.cancel_requested_at is None:
            return False
        self.signal = "cancel"
        return True

    @property
    def requested(self) -> bool:
        """This process got a stop signal, or (rank 0) the run was cancelled."""
        return self.received_at is not None or self.signal in _STICKY or self._cancelled()

    def agreed(self) -> bool:
        """True on every rank when any rank was asked to stop. All ranks must call this."""
        return dist.any_rank(self.requested)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) keeps neither the handler nor the wakeup fd:
    a SIGTERM that ends the worker must not read as this rank's stop, and the worker
    dies of it (or gets its KeyboardInterrupt) as it would without clusterjob."""
    try:
        wakeups.forget_in_child()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    except ValueError:  # forked from a thread other than the main one: nothing was set there
        pass


def _kill_self() -> None:
    """SIGKILL this process, and the processes it started when it leads their group
    (a local rank does: its DataLoader workers and subprocesses go with it)."""
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
