"""runner.preempt's StopSignal in a plain script's process, without a run: the stop is
raised in the main thread, the kill comes after the grace period even while the main
thread is stuck in C code, a forked child's SIGTERM is not this process's stop, and a stop
raised where Python drops it (a finalizer) comes again at the script's next line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from clirun import REPO, WAIT_S, base_env

PRELUDE = """
import os, signal, sys, time
from clusterjob.runner.preempt import StopSignal, StopRequested
s = StopSignal().install()
s.is_plain_script = lambda: True
s.grace_s = 1.5
s.before_kill = lambda: print("recording the stop of", s.signal, flush=True)
print("ready at", time.monotonic(), flush=True)
"""


def run(body: str) -> tuple[subprocess.CompletedProcess, float]:
    """The script's outcome, and the seconds from its stop being armed (after the
    interpreter's start and the imports, which a loaded machine slows) to its end."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + body], cwd=REPO, env=base_env(), capture_output=True,
                          text=True, timeout=WAIT_S)
    ended = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    ready = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("ready at ")]
    assert ready, (done.stdout, done.stderr)
    return done, ended - ready[0]


def test_sigterm_raises_stop_requested_in_the_main_thread():
    done, _ = run("try:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
                  "except StopRequested as e:\n    print('stopped by', e.signal)\n")
    assert done.returncode == 0 and "stopped by SIGTERM" in done.stdout, done.stderr


def test_a_script_that_swallows_the_stop_is_killed_after_the_grace_period():
    done, took = run("sent = False\nwhile True:\n    try:\n        sent = sent or not os.kill(os.getpid(), signal.SIGTERM)\n"
                     "        time.sleep(0.1)\n    except BaseException:\n        pass\n")
    assert done.returncode == -9 and 1.4 < took < 60  # the grace period, then the kill (not the loop's end: none)
    assert "recording the stop" in done.stdout and "stop_grace_s=1.5 s" in done.stderr


def test_the_kill_comes_while_the_main_thread_is_stuck_in_c_code():
    # the main thread blocks the signal and sleeps in C: another thread takes it, and the
    # Python handler (main thread only) cannot run before the sleep returns
    done, took = run("import threading\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
                     "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()\ntime.sleep(300)\n")
    assert done.returncode == -9 and took < 60  # not at the sleep's end
    assert "recording the stop of SIGTERM" in done.stdout  # the record names the stop the handler never saw


@pytest.mark.parametrize("sig, caught", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "StopRequested")])
def test_a_stop_another_thread_took_reaches_a_main_thread_waiting_in_a_system_call(sig, caught):
    # pdb's prompt waits in select() on the terminal; the kernel may hand the terminal's
    # SIGINT to any other thread of the process, which does not end that wait: the main
    # thread is sent the signal itself, and the script gets its stop well before the kill
    done, took = run("import select, threading\nr, w = os.pipe()\n"
                     f"threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), signal.{sig})).start()\n"
                     f"try:\n    select.select([r], [], [])\nexcept {caught}:\n    print('stopped by {caught}', flush=True)\n")
    assert done.returncode == 0 and f"stopped by {caught}" in done.stdout, (done.stdout, done.stderr)
    assert done.stdout.count(f"received {sig}") == 1 and "recording the stop" not in done.stdout


def test_a_forked_childs_sigterm_is_not_this_process_stop():
    done, _ = run("pid = os.fork()\nif pid == 0:\n    time.sleep(5); os._exit(0)\ntime.sleep(0.2)\n"
                  "os.kill(pid, signal.SIGTERM)\nprint('child', os.waitpid(pid, 0)[1])\ntime.sleep(2.5)\n"
                  "print('alive')\n")
    assert done.returncode == 0 and "child 15" in done.stdout and "alive" in done.stdout, done.stderr


SWALLOWED = """
class Finalized:
    def __del__(self):  # Python runs a pending signal's handler here: what it raises is only printed
        os.kill(os.getpid(), signal.{sig})
        for _ in range(1000):
            pass
try:
    Finalized()
    for _ in range(50):
        time.sleep(0.01)
    print("not stopped", flush=True)
except {caught} as e:
    print("stopped by", type(e).__name__, flush=True)
"""


@pytest.mark.parametrize("sig, caught", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "StopRequested")])
def test_a_stop_raised_inside_a_finalizer_is_raised_again_in_the_script(sig, caught):
    # A handler that runs while the main thread is in a __del__ (or a weakref callback, or
    # the garbage collector's) raises where Python only prints the error: the script would
    # train on to the kill. The stop comes again at the script's next line.
    done, took = run(SWALLOWED.format(sig=sig, caught=caught))
    assert done.returncode == 0 and f"stopped by {caught}" in done.stdout, (done.stdout, done.stderr)
    assert done.stdout.count(f"received {sig}") == 1 and took < 60
    assert "the stop was raised inside a finalizer, where Python drops it; raising it again" in done.stderr
