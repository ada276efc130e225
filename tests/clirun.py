"""The one way the tests run the ``clusterjob`` command line: this checkout's, always.

    done = cli(tmp_path, "status", "results")              # a CompletedProcess: returncode, stdout, stderr
    done = cli(tmp_path, "submit", "t.yaml", "--executor", "local", "--wait", timeout=240)
    proc = start(tmp_path, "submit", "t.yaml", "--executor", "local")   # a Popen, in the background
    wait_for(lambda: (run / "run.json").exists(), "the run folder")   # a state, never a fixed sleep

``cli`` runs the command in this process where it can (``clusterjob.cli.main(argv)``
with its own stdout and stderr, file descriptors 1 and 2 too, in ``cwd`` with ``env`` as
the whole environment, all restored after): status, report, logs, validate, sbatch, env,
``--help``, ``submit --dry-run``. That is most calls, and each saves a Python start-up and
the imports (pandas for a report). It runs a real ``python -m clusterjob`` where the
command starts processes, imports torch or handles signals (submit, resume, data, cancel,
``--wait``, ``--follow``, ``report --watch``), where ``prefix`` wraps it (another user),
and where ``env`` asks for a fresh interpreter (PYTHON* variables, a PYTHONPATH with more
than this checkout, another locale); ``process`` says it where a test knows better (a
cancel of a run that ended runs here). A call here that leaves state in this process
(a claim held, a signal handler, a thread, an executor of another package loaded, torch
imported) fails the test: that command belongs in a process.

Both ways the environment is ``base_env()`` unless given, and PYTHONPATH starts with this
checkout: the ``clusterjob`` that runs is the one under test, never the one the venv's
editable install points at.

Tests wait for states, never for a number of seconds: ``wait_for`` (and the timeouts of
``cli``) give up only after ``WAIT_S``, a guard against a hang that a loaded machine
never reaches. A bound that is the feature itself ("stops within N s") is measured from
the event, not from a process's start, and generous.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

from clusterjob.core.ranks import clean_environ

REPO = Path(__file__).resolve().parents[1]

# Commands that start processes (a supervisor, ranks, sbatch's job), import torch (data
# fetch) or signal processes (cancel): a real process each, unless said otherwise.
_PROCESS_COMMANDS = ("submit", "resume", "data", "cancel", "stack", "attach")
_PROCESS_FLAGS = ("--wait", "--follow", "-f", "--watch")
# Variables an interpreter reads once, at its start: a call that sets them other than this
# process has them needs a fresh one.
_AT_START = ("PYTHON", "LC_", "LANG")
_STATE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
                  signal.SIGPIPE, signal.SIGALRM)
# How long a test waits for a state (a run to start, a process to end, a line to appear):
# a guard against a hang only, never the bound a test asserts, so it is generous enough for
# a machine loaded several times over; on a quiet one the state comes long before.
WAIT_S = 600


def wait_for(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> object:
    """``predicate()``'s first true value, asked every 0.1 s; the test fails naming
    ``what`` when ``timeout`` seconds pass without one."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone, or a zombie its parent has not reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def base_env() -> dict:
    """The environment of a launch by hand: this one without any job layout, on CPU even
    on a machine with GPUs (a test that means a GPU sets CUDA_VISIBLE_DEVICES itself)."""
    env = clean_environ(os.environ)
    env.pop("CLUSTERJOB_CLUSTER", None)  # the commands run here, never on a cluster of the developer's
    env["PYTHONPATH"] = str(REPO)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def command(*argv: str) -> list[str]:
    """``python -m clusterjob ARGV``, this interpreter."""
    return [sys.executable, "-m", "clusterjob", *argv]


def checkout_env(env: Optional[Mapping[str, str]] = None) -> dict:
    """``env`` (``base_env()`` when None) with this checkout first on PYTHONPATH (what the
    caller put there stays after it)."""
    full = dict(base_env() if env is None else env)
    rest = [part for part in full.get("PYTHONPATH", "").split(os.pathsep) if part and part != str(REPO)]
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), *rest])
    return full


def cli(cwd: "str | os.PathLike", *argv: str, env: Optional[Mapping[str, str]] = None, timeout: float = WAIT_S,
        process: Optional[bool] = None, prefix: Sequence[str] = (), errors: str = "strict",
        **popen) -> subprocess.CompletedProcess:
    """``clusterjob ARGV`` in ``cwd``: exit status, stdout and stderr (decoded as UTF-8 with
    ``errors``, line ends as ``text=True`` gives them). In this process or a real one, as
    the module docstring says; ``process`` True or False decides it instead. ``prefix`` (a
    command that runs it) and ``popen`` (more subprocess.run arguments) mean a process."""
    full = checkout_env(env)
    if process is None:
        process = bool(prefix or popen) or needs_process(argv, full)
    if process:
        done = subprocess.run([*prefix, *command(*argv)], cwd=cwd, env=full, capture_output=True, timeout=timeout,
                              **popen)
        return subprocess.CompletedProcess(done.args, done.returncode, _text(done.stdout, errors),
                                           _text(done.stderr, errors))
    assert not (prefix or popen), "a prefix or subprocess arguments need a process"
    return _in_this_process(Path(cwd), list(argv), full, timeout, errors)


def start(cwd: "str | os.PathLike", *argv: str, env: Optional[Mapping[str, str]] = None, prefix: Sequence[str] = (),
          **popen) -> subprocess.Popen:
    """``clusterjob ARGV`` started in the background in ``cwd``: stdout and stderr are text
    pipes unless ``popen`` says otherwise (any Popen argument)."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen([*prefix, *command(*argv)], cwd=cwd, env=checkout_env(env), **options)


def needs_process(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``argv`` under ``env`` must run in a process of its own (module docstring)."""
    words = [arg for arg in argv if not arg.startswith("-")]
    name = words[0] if words else ""
    if name in _PROCESS_COMMANDS and not (name == "submit" and "--dry-run" in argv):
        return True
    if any(flag in argv for flag in _PROCESS_FLAGS):
        return True
    if env.get("PYTHONPATH") != str(REPO):
        return True
    return any(env.get(key) != os.environ.get(key) for key in {*env, *os.environ} if key.startswith(_AT_START)
               and key != "PYTHONPATH")


def _text(data: bytes, errors: str) -> str:
    """What ``subprocess.run(text=True)`` gives: UTF-8, universal line ends."""
    return data.decode("utf-8", errors).replace("\r\n", "\n").replace("\r", "\n")


class _Overran(BaseException):
    """The in-process command ran past its timeout (a BaseException: nothing catches it)."""


def _in_this_process(cwd: Path, argv: list, env: dict, timeout: float, errors: str) -> subprocess.CompletedProcess:
    from clusterjob import cli as clusterjob_cli

    assert Path(clusterjob_cli.__file__).is_relative_to(REPO), f"{clusterjob_cli.__file__} is not this checkout's"
    before = _process_state()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with _outputs_to(out, err), _as_a_process(cwd, env), _fresh_warnings(), _timeout(timeout, argv):
            code = _exit_status(clusterjob_cli.main, argv)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(command(*argv), code, _text(out.read(), errors), _text(err.read(), errors))
    left = _left_behind(before)
    assert not left, f"clusterjob {' '.join(argv)} left {'; '.join(left)} in the test process: run it with process=True"
    return done


def _exit_status(main, argv: list) -> int:
    """What the interpreter would exit with: main's return value, a SystemExit's code, 1
    with the traceback on stderr for any other exception."""
    try:
        return main(argv)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Overran):
        raise
    except BaseException:  # noqa: B036  (an interpreter prints any of them and exits 1)
        traceback.print_exc()
        return 1


def _process_state() -> dict:
    """What a command run here must leave as it found it."""
    claim, executor = sys.modules.get("clusterjob.core.claim"), sys.modules.get("clusterjob.launch.executor")
    return {"claims": set(claim._HELD) if claim else set(),
            "executors of other packages": set(getattr(executor, "_FOREIGN", ())) if executor else set(),
            "signal handlers": [signal.getsignal(sig) for sig in _STATE_SIGNALS],
            "threads": {thread.ident for thread in threading.enumerate()},
            "torch": "torch" in sys.modules}


def _left_behind(before: dict) -> list:
    """What the command added to this process's state (threads or claims of the test that
    end meanwhile are no concern)."""
    after = _process_state()
    left = [f"{what} {sorted(map(str, after[what] - before[what]))}"
            for what in ("claims", "executors of other packages", "threads") if after[what] - before[what]]
    if after["signal handlers"] != before["signal handlers"]:
        left.append("signal handlers changed")
    if after["torch"] and not before["torch"]:
        left.append("torch imported")
    return left


@contextlib.contextmanager
def _as_a_process(cwd: Path, env: dict) -> Iterator[None]:
    """This process in ``cwd`` with ``env`` as its whole environment, both restored after."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _fresh_warnings() -> Iterator[None]:
    """The warnings filters a fresh interpreter has, its warnings shown on stderr (at the
    end) instead of collected by pytest; pytest's filters restored after."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        try:
            yield
        finally:
            for shown in caught:
                sys.stderr.write(warnings.formatwarning(shown.message, shown.category, shown.filename, shown.lineno,
                                                        shown.line))


@contextlib.contextmanager
def _outputs_to(out, err) -> Iterator[None]:
    """stdout and stderr, the streams and file descriptors 1 and 2 (which child processes
    inherit), into the files ``out`` and ``err``, as a fresh interpreter sets them up."""
    saved_streams, saved_fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    errors = sys.__stdout__.errors if sys.__stdout__ else "strict"  # surrogateescape under a C.UTF-8 locale
    ours = (open(1, "w", encoding="utf-8", errors=errors, closefd=False),
            open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False))
    sys.stdout, sys.stderr = ours
    try:
        yield
    finally:
        for stream in ours:
            with contextlib.suppress(Exception):
                stream.close()  # flushed; the descriptor stays open
        sys.stdout, sys.stderr = saved_streams
        for fd, saved in zip((1, 2), saved_fds):
            os.dup2(saved, fd)
            os.close(saved)


@contextlib.contextmanager
def _timeout(seconds: float, argv: list) -> Iterator[None]:
    """subprocess.TimeoutExpired when the block runs past ``seconds``, as subprocess.run's
    (SIGALRM: in the main thread only; elsewhere the block runs unbounded)."""
    def overran(signum, frame):
        raise _Overran()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Overran:
        raise subprocess.TimeoutExpired(command(*argv), seconds) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
