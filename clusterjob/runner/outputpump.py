"""Rank 0's output pump: the user's code's stdout and stderr, each copied to where it
went before (the rank's .out and .err logs) and matched line by line against
``entrypoint.metrics`` (scripts that log through ``logging`` print to stderr).

Three promises, whatever the code prints or leaves behind:

- the matching is bounded: each regex gets MATCH_BUDGET_S per line (the ``regex``
  engine's timeout, which ``re`` lacks, with the GIL released while it matches, so the
  main thread still takes SIGTERM); a regex that blows it is disabled with one warning
  on stderr (the rank's .err log) and the run goes on;
- the copy is linear: only the new chunk is split, and a line longer than
  MAX_MATCHED_LINE is passed through to the log but neither kept nor scanned;
- the end never waits on, nor corrupts anything for, a process that outlives the code
  (a daemon it forked holds the pipe open): at the end the pump takes what is already
  in the pipe, then closes its own read end itself; a descriptor is closed only once no
  thread can still write to it.
"""

from __future__ import annotations

import array
import fcntl
import math
import os
import re
import selectors
import sys
import termios
import threading
import time
from typing import Any, Callable, Optional

import regex

from clusterjob.core import metrics
from clusterjob.core.files import shown

MAX_MATCHED_LINE = 4096  # bytes of an output line the metric regexes look at; longer lines are only copied
MATCH_BUDGET_S = 0.5  # time one regex may take on one line before it is disabled
DRAIN_BUDGET_S = 5.0  # at the end: time to copy what is still in the pipe (a daemon may keep it full)
SYNC_BUDGET_S = 2.0  # a metric logged through the API waits this long at most for the prints before it
CHUNK = 65536
_NEWLINE = re.compile(rb"[\r\n]")


_warn_to: list[Optional[int]] = [None]  # the rank's own stderr while the pump holds fd 2


def warn_metrics(text: str) -> None:
    line = f"clusterjob: warning: entrypoint.metrics: {text}\n"
    try:
        if _warn_to[0] is None:
            sys.stderr.write(line)
            sys.stderr.flush()
        else:
            _write_all(_warn_to[0], line.encode())
    except OSError:  # the log's disk is full: a warning must not stop the pump
        pass


class Lines:
    """Splits a byte stream into lines in time linear in its length: each chunk is split
    once, and the open line is kept as parts (never re-joined per chunk) until it ends
    or passes ``cap``, after which it is dropped (too long to scan)."""

    def __init__(self, cap: int = MAX_MATCHED_LINE):
        self.cap = cap
        self.parts: list[bytes] = []
        self.size, self.overlong = 0, False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that ``chunk`` completes, without those past the cap."""
        *ended, rest = _NEWLINE.split(chunk)
        done = []
        if ended:
            done.append(self._close(ended[0]))
            done.extend(line for line in ended[1:] if len(line) <= self.cap)
        self._keep(rest)
        return [line for line in done if line is not None]

    def end(self) -> Optional[bytes]:
        """The last line, which had no newline."""
        return self._close(b"")

    def _keep(self, part: bytes) -> None:
        self.size += len(part)
        self.overlong = self.overlong or self.size > self.cap
        if not self.overlong and part:
            self.parts.append(part)

    def _close(self, part: bytes) -> Optional[bytes]:
        self._keep(part)
        line = None if self.overlong else b"".join(self.parts)
        self.parts, self.size, self.overlong = [], 0, False
        return line


class Matcher:
    """Each metric's regex over lines. A metric's step is the number its regex's
    ``(?P<step>...)`` group matched, else the count of its matches (the k-th is step k);
    the value is the other group. The values one line gives at one step are one line of
    metrics.jsonl."""

    def __init__(self, patterns: dict, writer: metrics.Writer):
        self.writer = writer
        self.patterns: dict[str, Any] = {}
        for name, rx in patterns.items():
            self._compile(name, rx)
        self.counts = dict.fromkeys(self.patterns, 0)
        self.open = True  # False once the run's end no longer waits for the pump

    def _compile(self, name: str, rx: str) -> None:
        try:
            self.patterns[name] = regex.compile(rx)
        except Exception as err:  # the spec checked it with re: a rare difference of engines
            warn_metrics(f"{shown(name)}: this regex is not supported ({type(err).__name__}: {err}); it is not matched")

    def match(self, raw: bytes) -> None:
        line = raw.decode(errors="replace")
        by_step: dict = {}
        for name, pattern in list(self.patterns.items()):
            try:
                found = list(pattern.finditer(line, timeout=MATCH_BUDGET_S, concurrent=True))
            except TimeoutError:
                self._disable(name)
                continue
            for step, value in filter(None, map(_step_and_value, found)):
                self.counts[name] += 1
                by_step.setdefault(self.counts[name] if step is None else step, {})[name] = value
        for step, values in by_step.items():
            if self.open:
                self.writer.log(step, values)

    def _disable(self, name: str) -> None:
        """A regex that backtracks badly would stall the output and hold the run: off it goes."""
        del self.patterns[name]
        warn_metrics(f"{shown(name)}: the regex took over {MATCH_BUDGET_S:g} s on one line (it backtracks badly); "
             "disabled it, the run goes on without this metric")


def _step_and_value(found: Any) -> Optional[tuple]:
    """(step, or None for the count, and value) of one match; None when the value is no
    number, or the step group matched no finite number."""
    named = found.re.groupindex.get("step")
    value = _number(found.group(2 if named == 1 else 1))
    if value is None:
        return None
    if named is None:
        return None, value
    step = _number(found.group(named))
    if step is None or not math.isfinite(step):
        return None
    return (int(step) if step.is_integer() else step), value


def _number(text: Optional[str]) -> Optional[float]:
    """The number a group matched; None for a group that did not take part or no number.
    Non-finite values stay: the writer drops them with its warning."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


class Tee:
    """Rank 0's stdout and stderr through the pump (``logging`` writes to stderr), at the
    file descriptors, so prints of C code and subprocesses count. A no-op without
    patterns or writer. Both streams feed one matcher, one line at a time."""

    def __init__(self, patterns: dict, writer: Optional[metrics.Writer]):
        self.matcher = Matcher(patterns, writer) if writer and patterns else None
        self.match_lock = threading.Lock()  # the two streams' pumps take turns at the matcher
        self.pumps: list[_Pump] = []

    def __enter__(self) -> "Tee":
        if self.matcher:
            sys.stdout.flush()
            sys.stderr.flush()
            self.pumps = [_Pump(fd, self._match) for fd in (1, 2)]
            _warn_to[0] = self.pumps[1].saved  # a warning of the pump never goes into its own pipe
        return self

    def __exit__(self, *exc: object) -> None:
        if self.matcher:
            sys.stdout.flush()
            sys.stderr.flush()
            budget = DRAIN_BUDGET_S + 2 * MATCH_BUDGET_S * max(1, len(self.matcher.patterns)) + 5
            for pump in self.pumps:
                pump.stop()
            _warn_to[0] = None  # fd 2 is the rank's own again; the saved copy is closed below
            for pump in self.pumps:
                pump.finish(budget, self.matcher)

    def sync(self) -> None:
        """Wait (SYNC_BUDGET_S at most) until the pumps have matched all the code printed
        so far: a metric the code logs through the API after a print then lands after
        the print's matches."""
        if not self.matcher:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        deadline = time.monotonic() + SYNC_BUDGET_S
        while time.monotonic() < deadline and not all(pump.idle() for pump in self.pumps):
            time.sleep(0.001)

    def _match(self, found: list[bytes]) -> None:
        assert self.matcher is not None  # only a matcher has pumps
        with self.match_lock:
            for line in found:
                self.matcher.match(line)


class _Pump:
    """One stream (fd 1 or 2) of the code: a pipe in its place, and a thread that copies
    it to where the stream went before and hands its lines to ``match``."""

    def __init__(self, fd: int, match: Callable[[list[bytes]], None]):
        self.fd, self.match = fd, match
        self.lock = threading.Lock()  # the pump's state as idle() sees it
        self.busy, self.copying = False, True
        self.saved = os.dup(fd)
        read, write = os.pipe()
        self.wake_read, self.wake_write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.read, self.reading = read, True
        self.thread = threading.Thread(target=self._pump, args=(read,), daemon=True, name=f"clusterjob-pump-{fd}")
        self.thread.start()

    def stop(self) -> None:
        """The code ended: its stream goes back, and the pump takes what is in the pipe."""
        os.dup2(self.saved, self.fd)  # the code's own write end is gone: what it wrote is in the pipe
        os.write(self.wake_write, b"x")

    def finish(self, budget: float, matcher: "Matcher") -> None:
        """Close the pump's descriptors, unless the pump still runs (stuck writing to a
        log that does not take it): a closed number is soon reused by another file, and
        the pump would write into that one."""
        self.thread.join(timeout=budget)
        if self.thread.is_alive():
            matcher.open = False
            warn_metrics("the output pump did not finish; the rest of the output may be missing from the log")
            return
        for fd in (self.saved, self.wake_read, self.wake_write):
            os.close(fd)

    def _copy_out(self, chunk: bytes) -> None:
        """Copy to the log; once that fails (a full disk) the pump still drains the pipe,
        so the code never blocks on a full pipe, and still matches the metrics."""
        if self.copying:
            try:
                _write_all(self.saved, chunk)
            except OSError as err:
                self.copying = False
                warn_metrics(f"could not write the output to its log ({err.strerror or err}); "
                     "the rest of this stream is not logged, metrics are still matched")

    def idle(self) -> bool:
        with self.lock:
            return not self.reading or (not self.busy and _unread(self.read) == 0)

    def _pump(self, read: int) -> None:
        lines = Lines()
        try:
            self._copy(read, lines)
        finally:
            with self.lock:  # the number may be reused once closed: idle() must not ask it
                self.reading = False
                os.close(read)  # here, by the one thread that reads it; a daemon's writes now fail
        last = lines.end()
        if last is not None:
            self.match([last])

    def _copy(self, read: int, lines: Lines) -> None:
        """Copy until every writer is gone, or until told the code ended; then take only
        what is already in the pipe, for DRAIN_BUDGET_S at most."""
        os.set_blocking(read, False)
        with selectors.DefaultSelector() as sel:
            sel.register(read, selectors.EVENT_READ)
            sel.register(self.wake_read, selectors.EVENT_READ)
            while True:
                ready = {key.fd for key, _ in sel.select()}
                if read in ready and self._take(read, lines) is False:
                    return
                if self.wake_read in ready:
                    return self._drain(read, lines)

    def _drain(self, read: int, lines: Lines) -> None:
        deadline = time.monotonic() + DRAIN_BUDGET_S
        while time.monotonic() < deadline and self._take(read, lines):
            pass

    def _take(self, read: int, lines: Lines) -> Optional[bool]:
        """Copy one chunk and match its lines: True; False at the end of the pipe (no
        writer left); None when it is empty for now."""
        with self.lock:
            self.busy = True
        try:
            chunk = os.read(read, CHUNK)
            if chunk:
                self._copy_out(chunk)
                self.match(lines.feed(chunk))
        except BlockingIOError:
            return None
        finally:
            with self.lock:
                self.busy = False
        return bool(chunk)


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
