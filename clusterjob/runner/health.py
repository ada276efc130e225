"""Inside each rank, what the health watchdog needs (docs/design.md, "Hung and slow ranks").

- **Beats.** ``beat()`` marks progress: the built-in trainer's steps, every metric record
  (rank 0), ``clusterjob.heartbeat()`` and ``clusterjob.should_stop()``. It touches
  ``logs/rank<R>.beat`` at most once a second; between touches it costs one clock read
  and a compare, no host sync, no collective.
- **Stacks on request.** A real-time signal, named in the rank's health file, appends
  every thread's Python stack to ``logs/rank<R>.stacks`` (clusterjob.runner.stackhandler:
  a C-level handler wakes a thread that dumps them under the GIL), so it answers while
  the rank is blocked in a C call and while it spins in Python. The signal restarts the
  system calls it interrupts (SA_RESTART), and the handler stays until the process
  ends, so a late request never meets the signal's default action (the end of the
  process).
- **The watcher.** A process of its own per rank (clusterjob.runner.watchdog, no torch),
  never a thread of the training: it watches the beats and the output, takes the
  stacks, and ends the rank on a stall verdict. It dies with the rank: its stdin is a
  pipe from the rank, and the kernel tells it when the rank is gone. The rank looks at
  it every ``WATCHER_CHECK_S``: one that ended while the rank runs (kill -9), or that
  is stopped (SIGSTOP: then killed), is started again (rank 0's leads again), and after
  ``WATCHER_STARTS`` starts the rank says in its log and in run.json's warnings
  (``status``) that it runs without.
- **Waits in collectives** (stragglers): the built-in trainer times its own (its
  ``Waits``: from its last gradient to the end of DDP's backward), any other code is
  sampled: a thread reads the main thread's innermost frame at most ``SAMPLE_HZ`` times
  a second and counts the samples inside ``torch.distributed`` or DDP's own syncs
  (there the collective released the GIL), and those inside a backward while the main
  thread sleeps (DDP's all-reduce waits in C++ at the end of the backward: a thread
  that computes runs, one that waits for the other ranks sleeps). A monitor thread
  writes them to the rank's health file every ``WRITE_EVERY_S``, with the share of its
  time the built-in trainer waited for its next batch (``timed_input``).
- **GPU telemetry.** The rank's GPU sampler (clusterjob.runner.gpusampler) starts and
  stops with the rest (``health.gpu_sample_s``).

Importing this module loads no torch (``clusterjob.heartbeat`` is part of the API).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from clusterjob.core import procs, provenance
from clusterjob.core.ranks import DistEnv
from clusterjob.core.rundir import RunDir
from clusterjob.health import rankhealth, telemetry
from clusterjob.runner import gpusampler, stackhandler, stacks
from clusterjob.runner.watchconfig import WatchConfig

if TYPE_CHECKING:  # the spec (and YAML) is not loaded by ``clusterjob.heartbeat()`` outside a run
    from clusterjob.spec.schema import Spec

BEAT_EVERY_S = 1.0
WRITE_EVERY_S = 5.0  # the health file's waits are this fresh
WATCHER_CHECK_S = 1.0  # how often the rank looks whether its watcher still runs
WATCHER_STARTS = 4  # a watcher that keeps ending is started this often in all, then the rank says it runs without
SAMPLE_HZ = 20  # the most the main thread is sampled a second (10 to 20, at random intervals)
RECENT_S = 60.0  # the window of the waits the straggler warning and status read
STACK_SIGNAL = signal.SIGRTMIN + 6  # NCCL owns SIGUSR1; USR2 and TERM are stop signals
NCCL_TRACE = "nccl-trace-rank"  # torch appends the rank: logs/nccl-trace-rank<R>
NCCL_PIPE = "nccl-pipe-rank"  # logs/nccl-pipe-rank<R>.pipe: a write there makes torch dump its trace
_PR_SET_PTRACER = 0x59616D61  # Yama: who may ptrace this process (py-spy under the watcher)

_beat_path: Optional[str] = None
_next_beat = 0.0


def beat() -> None:
    """Progress on this rank (a no-op outside a run, or with ``health: null``)."""
    global _next_beat
    if _beat_path is None:
        return
    now = time.monotonic()
    if now < _next_beat:
        return
    _next_beat = now + BEAT_EVERY_S
    try:
        os.utime(_beat_path)
    except OSError:  # a full or gone file system must not stop training; the watchdog sees no beat
        pass


class WaitClock:
    """Seconds this rank waited inside collectives, added by whoever measures them (the
    trainer's step, the sampler), from its first collective on (``first``: start-up and
    data loading are no time it could have waited); the monitor reads them."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.waited = 0.0
        self.first: Optional[float] = None  # time.monotonic() as the first wait began
        self.lock = threading.Lock()
        self.settle: Callable[[], None] = lambda: None  # timings still on a device are added here

    def begin(self) -> None:
        """The rank's distributed work starts now (its process group exists)."""
        with self.lock:
            self.first = self.first if self.first is not None else time.monotonic()

    def add(self, seconds: float) -> None:
        with self.lock:
            if self.first is None:
                self.first = time.monotonic() - seconds
            self.waited += seconds

    def read(self) -> float:
        with contextlib.suppress(Exception):  # a device error belongs to the training, which sees it
            self.settle()
        with self.lock:
            return self.waited


_current: Optional["Health"] = None


def clock() -> Optional[WaitClock]:
    """The wait clock of this rank's health, for code that times its own waits (the
    built-in trainer); None with health off."""
    return _current.clock if _current is not None else None


def timed_input(batches: Iterable) -> Iterable:
    """``batches`` as they come, the time each took to come added to this rank's input
    wait (the built-in trainer's loader; the low-utilisation warning names it); as they
    are with health off. Two clock reads a batch, no host sync."""
    return batches if _current is None else _timed(batches, _current.inputs)


def _timed(batches: Iterable, inputs: WaitClock) -> Iterator:
    found = iter(batches)
    while True:
        start = time.perf_counter()
        try:
            batch = next(found)
        except StopIteration:
            return
        inputs.add(time.perf_counter() - start)
        yield batch


class Health:
    """This rank's part of the watchdog, from ``start`` to ``stop``."""

    def __init__(self, run: RunDir, env: DistEnv, spec: Spec, session: str):
        assert spec.health is not None  # started only with health on
        self.run, self.env, self.spec, self.session = run, env, spec, session
        self.clock = WaitClock("sampled" if spec.entrypoint is not None else "timed")
        self.identity = rankhealth.RankHealth(
            env.rank, session, socket.gethostname(), _node(env), procs.current(), int(STACK_SIGNAL),
            threading.main_thread().ident, rankhealth.Waits(self.clock.method))
        self.done = threading.Event()
        self.watcher: Optional[subprocess.Popen] = None
        self.watcher_lock = threading.Lock()  # ``stop`` and the monitor's restart of the watcher
        self.starts, self.stopped_looks = 0, 0
        self.inputs = WaitClock("timed")  # the built-in trainer's wait for its next batch
        self.probes: list[Callable[[], dict]] = [self._input_wait]  # further readings for the health file
        self.sampler: Optional[gpusampler.Sampler] = None
        self.write_lock = threading.Lock()
        self.marks: collections.deque = collections.deque()  # (when, seconds waited by then), from the first wait

    def start(self) -> "Health":
        global _beat_path, _current
        self.run.logs.mkdir(parents=True, exist_ok=True)
        stackhandler.register(STACK_SIGNAL, self.run.stacks_file(self.env.rank))
        beat_file = self.run.beat_file(self.env.rank)
        beat_file.touch()
        _beat_path = str(beat_file)
        if self.spec.resources.gpus_per_node > 0:
            nccl_environ(self.run, os.environ)
        with _quiet_errors():
            os.unlink(self.run.ended_file(self.env.rank))
        rankhealth.write(self.run, self.identity)
        self._start_watcher()
        _current = self
        threading.Thread(target=self._monitor, daemon=True, name="clusterjob-health").start()
        self.sampler = gpusampler.start(self.run, self.env, self.spec, self.identity.node)
        return self

    def _input_wait(self) -> dict:
        """The share of its time the trainer waited for its next batch (none before its first)."""
        first = self.inputs.first
        if first is None:
            return {}
        total = time.monotonic() - first
        return {telemetry.INPUT_WAIT: 100 * min(1.0, self.inputs.read() / total)} if total > 0 else {}

    def config(self) -> WatchConfig:
        """What the watcher is told (it reads the rest from the rank's health file)."""
        health = self.spec.health
        assert health is not None  # started only with health on
        nccl = self.spec.resources.gpus_per_node > 0
        return WatchConfig(str(self.run.path), self.env.rank, self.env.world_size, self.session, health.stall_s,
                           health.action(self.spec.resources.max_retries), health.output_counts(self.spec.entrypoint),
                           health.straggler_wait_pct, (os.environ.get(FR_PIPE) or None) if nccl else None,
                           nccl_dump_prefix(os.environ) if nccl else None)

    def stop(self) -> None:
        """The rank's work is done: the last waits are written and the watcher told to go
        (the stacks handler stays: a request may still be on its way)."""
        global _beat_path, _current
        self.done.set()
        _beat_path, _current = None, None
        if self.sampler is not None:
            self.sampler.stop()
        self.write()
        with _quiet_errors():  # before its connections close: a rank they fail knows this one ended first
            rankhealth.mark_ended(self.run, self.env.rank, self.session)
        with self.watcher_lock:  # no restart after this: the watcher is told to go
            watcher = self.watcher
        if watcher is not None:
            with _quiet_errors():
                watcher.stdin.close()  # type: ignore[union-attr]  # Popen made it a pipe
            with _quiet_errors():
                watcher.wait(timeout=2.0)

    def _start_watcher(self) -> None:
        self.starts += 1
        self.watcher = _start_watcher(self.config())
        _let_trace(self.watcher.pid)

    def keep_watcher(self) -> None:
        """A watcher that ended while its rank runs (killed, crashed: it ends by itself only
        with its rank), or stopped (SIGSTOP: killed), is started again, a new leader for
        rank 0 (it watches every rank from then on), with one line in the rank's log; after
        WATCHER_STARTS the rank runs without and run.json says so (``status`` shows it):
        the watch never stops unsaid."""
        with self.watcher_lock:
            if self.done.is_set() or self.watcher is None:
                return
            ended = self._watcher_ended(self.watcher)
            if ended is None:
                return
            how = f"the stall watcher of rank {self.env.rank} {ended}"
            self.watcher = None
            if self.starts < WATCHER_STARTS:
                _say(f"clusterjob: warning: health: {how}; started again")  # before it starts: no progress to it
                try:
                    self._start_watcher()
                    return
                except OSError as err:  # no process left to start
                    how += f", and could not start again ({err.strerror or err})"
            self._watch_stopped(f"{how} ({self.starts} starts)")

    def _watcher_ended(self, watcher: subprocess.Popen) -> Optional[str]:
        """How the watcher ended ("was killed by SIGKILL"), None while it runs. One found
        stopped (state T) at two looks in a row is killed: a stopped watcher watches nothing."""
        if watcher.poll() is not None:
            return procs.ended(watcher.returncode)
        stopped = procs.state(watcher.pid) in ("T", "t")
        self.stopped_looks = self.stopped_looks + 1 if stopped else 0
        if self.stopped_looks < 2:
            return None
        self.stopped_looks = 0
        watcher.kill()  # our own child, not reaped yet: its pid is still that process
        with _quiet_errors():
            watcher.wait(timeout=5.0)
        return "was stopped (state T): killed"

    def _watch_stopped(self, how: str) -> None:
        """The rank runs without its watcher: said in its log and in run.json's warnings."""
        rank = self.env.rank
        line = f"health: {how}; " + ("the stall watch of this run stopped: no stall is noticed from here on"
                                     if rank == 0 else f"a stall shows no stacks of rank {rank} from here on")
        _say(f"clusterjob: warning: {line}")
        with _quiet_errors():
            info = self.run.read()
            self.run.update(warnings=[*info.warnings, line])

    def ended_before(self, exc: BaseException) -> str:
        """`` (rank 1 had ended already: ...)`` when other ranks of this session ended
        before this rank failed in a collective (a rank that ends early fails the others'
        collectives), else "": an error of the code's own (a ValueError of its own lines)
        is no consequence of a rank that ended first, however the two were timed."""
        if not _raised_in_collective(exc):
            return ""
        try:
            ended = [r for r in range(self.env.world_size)
                     if r != self.env.rank and rankhealth.ended_in(self.run, r, self.session)]
        except Exception:  # a second error while failing (DataLoader's SIGCHLD handler): the first one counts
            return ""
        if not ended:
            return ""
        named = f"rank {ended[0]} had" if len(ended) == 1 else f"ranks {','.join(map(str, ended))} had"
        return f" ({named} ended already: a rank that ends early leaves the others' collectives without it)"

    def _monitor(self) -> None:
        """Sample the main thread (code that does not time its own waits) from when its
        process group exists, at random intervals (a fixed rate could keep meeting one
        phase of a periodic step), and write the waits to the health file every WRITE_EVERY_S."""
        from clusterjob.runner import dist

        main, native = threading.main_thread().ident or 0, threading.main_thread().native_id
        sampled = self.clock.method == "sampled"
        last = next_write = next_check = time.monotonic()
        while not self.done.wait(random.uniform(1.0, 2.0) / SAMPLE_HZ if sampled else WATCHER_CHECK_S):
            now = time.monotonic()
            if now >= next_check:
                next_check = now + WATCHER_CHECK_S
                self.keep_watcher()
            if sampled and self.clock.first is None and dist.initialized():
                self.clock.begin()
            elif sampled and self.clock.first is not None and _waiting(sys._current_frames().get(main), native):
                self.clock.add(now - last)
            last = now
            if now >= next_write:
                next_write = now + WRITE_EVERY_S
                self.write()

    def write(self) -> None:
        """The waits so far, and over about the last RECENT_S, into the health file."""
        with self.write_lock:  # the monitor thread, and ``stop`` once more at the end
            self._write()

    def _write(self) -> None:
        now, waited = time.monotonic(), self.clock.read()
        first = self.clock.first
        if first is None:
            waits = rankhealth.Waits(self.clock.method)  # no collective yet
        else:
            if not self.marks:
                self.marks.append((first, 0.0))
            self.marks.append((now, waited))
            while len(self.marks) > 2 and now - self.marks[1][0] >= RECENT_S:
                self.marks.popleft()
            since, before = self.marks[0]
            waits = rankhealth.Waits(self.clock.method, waited, now - first, waited - before, now - since)
        extra: dict = {}
        for probe in self.probes:
            extra.update(probe())
        with _quiet_errors():
            rankhealth.write(self.run, replace(self.identity, waits=waits, extra=extra))


def _waiting(frame: Any, native_id: Optional[int]) -> bool:
    """Whether the main thread waits for the other ranks now: inside a collective, or
    asleep inside a backward (DDP waits there for its last all-reduce)."""
    return _in_collective(frame) or (_in_backward(frame) and _asleep(native_id))


def _in_collective(frame: Any) -> bool:
    """Whether the main thread is inside a ``torch.distributed`` call (or DDP's own
    broadcasts) now: its innermost Python frame is there (a collective releases the GIL
    there while it waits)."""
    return frame is not None and any(part in frame.f_code.co_filename for part in stacks.COLLECTIVE_FILES)


def _in_backward(frame: Any) -> bool:
    """Whether the main thread's innermost Python frame is autograd's backward (its C++
    engine runs below it: DDP's all-reduce waits at its end)."""
    return frame is not None and any(part in frame.f_code.co_filename for part in stacks.BACKWARD_FILES)


def _asleep(native_id: Optional[int]) -> bool:
    """Whether the thread sleeps now (the kernel's state S: blocked on a lock, a socket or
    a futex), read from /proc; a thread that computes is running or runnable."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"S"
    except (OSError, IndexError):
        return False


def _say(line: str) -> None:
    """A line on the rank's stderr (its log)."""
    with _quiet_errors():
        print(line, file=sys.stderr, flush=True)


def _quiet_errors() -> contextlib.suppress:
    """Drops what a full disk or a watcher gone already raise: health never fails the rank."""
    return contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError)


def _node(env: DistEnv) -> str:
    """The rank's node as its executor names it (what ``--exclude`` takes), else its host name."""
    return env.node or socket.gethostname()


def nccl_environ(run: RunDir, environ: Any) -> None:
    """torch's flight recorder under NCCL: its ring buffer on, its dump written under
    logs/ (``nccl-trace-rank<R>``) when the watcher writes to the rank's pipe
    (``nccl-pipe-rank<R>.pipe``). Each is left alone when set under either of its names
    (torch reads the newer name first), else set under the name the installed torch reads
    without a warning. Read by torch when the NCCL group is made, so before the code's
    first collective."""
    newer = _torch_version() >= (2, 11)
    for names, value in ((FR_BUFFER, "2000"), (FR_DUMP, str(run.logs / NCCL_TRACE))):
        if not set(names) & set(environ):
            environ[names[0] if newer else names[1]] = value
    environ.setdefault(FR_PIPE, str(run.logs / NCCL_PIPE))


# (newer name, older name): torch 2.11 warns of the older one
FR_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DUMP = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_PIPE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"  # one name in every torch


def nccl_dump_prefix(environ: Any) -> Optional[str]:
    """Where torch writes its flight recorder's dump (then the rank), as torch reads it."""
    return environ.get(FR_DUMP[0]) or environ.get(FR_DUMP[1]) or None


def _torch_version() -> tuple:
    """(major, minor) of the installed torch, read without importing it; (0, 0) when unknown."""
    found = re.match(r"(\d+)\.(\d+)", provenance.versions().get("torch", ""))
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _start_watcher(config: WatchConfig) -> subprocess.Popen:
    """The watcher, in a session of its own (a kill of the rank's process group on a
    stall verdict is not its own), its stdin a pipe that closes when the rank ends."""
    return subprocess.Popen([sys.executable, "-m", "clusterjob.runner.watchdog", config.to_json()],
                            stdin=subprocess.PIPE, start_new_session=True)


def _let_trace(pid: int) -> None:
    """Allow the watcher (and the py-spy it starts) to read this process's native stack
    under Yama's ptrace rules; elsewhere nothing to do."""
    with _quiet_errors():
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, pid, 0, 0, 0)


def start(run: RunDir, env: DistEnv, spec: Spec) -> Optional[Health]:
    """This rank's health, started; None with ``health: null``. All ranks must call this
    (after the rendezvous): rank 0 deals the session's token."""
    if spec.health is None:  # the same spec on every rank: none of them deals a token
        return None
    from clusterjob.runner import dist

    session = dist.from_rank0("health-session", lambda: secrets.token_hex(6))
    try:
        return Health(run, env, spec, session).start()
    except OSError as err:  # no watcher can start (no process left, a full disk): the training goes on
        print(f"clusterjob: warning: health: the watchdog could not start on rank {env.rank} "
              f"({err.strerror or err}); this rank runs without it", file=sys.stderr, flush=True)
        return None


_DISTRIBUTED = os.path.join("torch", "distributed", "")


def _raised_in_collective(exc: BaseException) -> bool:
    """Whether ``exc`` came out of torch.distributed (a collective, a barrier, the store):
    its type is torch's DistError, or its traceback passes through torch/distributed/."""
    if any(cls.__name__ == "DistError" and cls.__module__.startswith("torch") for cls in type(exc).__mro__):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if _DISTRIBUTED in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False
