"""The one path of metric records on rank 0 (docs/design.md, "Metrics and loggers").

Every record, from any source (the built-in trainer's epochs, ``clusterjob.log``, the
output regexes, a metrics file), is first committed to metrics.jsonl, the record
everything else is rebuilt from, and then handed, as written, to each sink in turn: the
built-in trainer's console line, then TensorBoard, MLflow and W&B when the spec asks.
A new sink is one small class with ``send(record)`` and ``close(status)``.

Each logger runs on a thread of its own (``Courier``), so a slow or failing network
never holds the training. Exactly once, across requeues and resumes: a courier sends a
metric only at a step beyond the last one it sent of that metric (kept per logger in
``loggers.json`` in the run folder), and at each start it first sends what metrics.jsonl
holds beyond that (what the job wrote but had not sent when it died, or what a logger
that failed could not take). A logger that fails is warned about once (stderr and
run.json's warnings) and left alone for the rest of the session; training goes on.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from clusterjob.core import metrics, units
from clusterjob.core.files import is_number, loads, read_text, write_atomic
from clusterjob.core.rundir import RunDir
from clusterjob.runner import health
from clusterjob.runner import loggers as loggermod
from clusterjob.spec.schema import Spec

SAVE_EVERY_S = 1.0  # at most this long between a send and its mark in loggers.json
CLOSE_BUDGET_S = 30.0  # at the end: how long a logger may still send; the rest goes at the next start
STOP_BUDGET_S = 5.0  # the same at a stop, which is recorded (and the job requeued) only after it


class Sink(Protocol):
    """Where a committed record goes after metrics.jsonl."""

    def send(self, record: dict) -> None: ...

    def close(self, status: str) -> None: ...


class Sinks:
    """Rank 0's metric records: ``commit`` writes one to metrics.jsonl and returns it as
    written (None when nothing was left to write), then every sink gets it, in order.
    Thread-safe (the output regexes and a metrics file log from threads of their own);
    a context manager that closes the sinks with the run's outcome."""

    def __init__(self, run: RunDir, commit: Callable[[Any, dict], Optional[dict]], sinks: list[Sink]):
        self.run, self.commit, self.sinks = run, commit, sinks
        self._lock = threading.Lock()
        self._closed = False

    def log(self, step: Any, values: dict) -> Optional[dict]:
        health.beat()  # a metric record is progress (the watchdog's)
        with self._lock:
            record = self.commit(step, values)
            if record is not None and not self._closed:
                for sink in self.sinks:
                    sink.send(record)
        return record

    def close(self, status: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sink in self.sinks:
            sink.close(status)

    def __enter__(self) -> "Sinks":
        return self

    def __exit__(self, kind: Optional[type], *rest: object) -> None:
        if not self._closed:  # the completed and stopped paths closed them already: no run.json to read
            self.close("failed" if kind is not None else (self.run.read().status or "running"))


class NoSinks:
    """The sinks of every rank but 0: records are rank 0's to write."""

    def log(self, step: Any, values: dict) -> None:
        return None

    def close(self, status: str) -> None:
        return None

    def __enter__(self) -> "NoSinks":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


# ----------------------------------------------------------------------------- what opens them


def for_trainer(spec: Spec, run: RunDir, fresh: bool) -> Sinks:
    """The built-in trainer's epochs: metrics.jsonl and run.json's ``final``, the console
    line, the loggers. ``fresh``: no checkpoint could be read, so the run starts from
    epoch 1 and its logger runs start again too."""
    def commit(epoch: int, record: dict) -> dict:
        written = metrics.append_epoch(run.metrics_file, record)
        run.update(final=written)  # as written: finite values only
        return written

    return Sinks(run, commit, [EpochLine(spec.train.epochs), *couriers(spec, run, "epoch", fresh)])


def for_own_code(spec: Spec, run: RunDir) -> Sinks:
    """Your own code's metrics (``clusterjob.log``, the regexes, a metrics file): each
    metric at its own steps in metrics.jsonl (``metrics.StepWriter``), then the loggers.
    No console line: the code prints its own, and a line of ours would meet the regexes."""
    return Sinks(run, metrics.StepWriter(run.metrics_file).log, couriers(spec, run, "step", fresh=False))


# ----------------------------------------------------------------------------- the console


class EpochLine:
    """The built-in trainer's line per epoch: every metric of the record, as logged."""

    HIDDEN = ("epoch", "step", "epoch_time_s", "samples_per_s")  # the position, and the speed at the end

    def __init__(self, epochs: int):
        self.epochs = epochs

    def send(self, record: dict) -> None:
        print(epoch_line(record, self.epochs), flush=True)

    def close(self, status: str) -> None:
        return None


def epoch_line(record: dict, epochs: int) -> str:
    """``epoch 3/10 train_loss 0.412 ... val_acc 88.12% lr 0.05 1.2 s 2104 samples/s``: one
    unit per quantity, as the report and status write them (core/units.py)."""
    parts = [f"epoch {record.get('epoch')}/{epochs}"]
    for name, value in record.items():
        if name not in EpochLine.HIDDEN and is_number(value):
            parts.append(f"{name} {value:.4g}" if name.startswith("lr") else f"{name} {units.quantity(name, value)}")
    parts += [units.quantity(name, record[name]) for name in ("epoch_time_s", units.THROUGHPUT)
              if is_number(record.get(name))]
    return " ".join(parts)


# ----------------------------------------------------------------------------- positions


@dataclass(frozen=True)
class Point:
    """One record as the loggers take it: its position and its metrics."""

    step: float
    values: dict


class Axis:
    """Where a record stands for the loggers: its epoch (the built-in trainer), else its
    step (your own code); a line without a step is at its number among such lines, which
    never change (metrics.jsonl only appends them)."""

    def __init__(self, key: str, unstepped: int = 0):
        self.key, self.unstepped = key, unstepped
        self.skip = ("epoch", "step") if key == "epoch" else ("step",)  # positions, not metrics

    def point(self, record: dict) -> Optional[Point]:
        values = {k: float(v) for k, v in record.items() if k not in self.skip and is_number(v)}
        at: Any = record.get(self.key)
        if not is_number(at):
            if self.key == "epoch":
                return None  # no trainer line lacks its epoch
            self.unstepped += 1
            at = self.unstepped
        return Point(at, values) if values else None


# ----------------------------------------------------------------------------- what was sent


class Sent:
    """``loggers.json``: per logger, each metric's last step sent. Read once at the
    start; written (atomically) by the couriers as they send."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        raw = loads(read_text(path)[0] or "")
        self.marks = {name: {k: v for k, v in marks.items() if is_number(v)}
                      for name, marks in (raw.items() if isinstance(raw, dict) else ()) if isinstance(marks, dict)}

    def of(self, name: str) -> dict:
        with self.lock:
            return dict(self.marks.get(name, {}))

    def save(self, name: str, marks: dict) -> None:
        with self.lock:
            self.marks[name] = dict(marks)
            write_atomic(self.path, json.dumps(self.marks, indent=1) + "\n")


# ----------------------------------------------------------------------------- the couriers


def couriers(spec: Spec, run: RunDir, axis: str, fresh: bool) -> list:
    """A started courier per logger the spec asks for (none: nothing is read)."""
    if not spec.logging.any:
        return []
    key = Axis(axis)
    backlog = [p for p in map(key.point, metrics.read_epochs(run.metrics_file)) if p is not None]
    sent = Sent(run.loggers_file)
    target = loggermod.Target(run, run.read(), spec, axis)
    found = [Courier(run, logger, Axis(axis, key.unstepped), sent, backlog, fresh)
             for logger in loggermod.for_spec(target)]
    for courier in found:
        courier.start()
    return found


_END = object()  # the queue's last item


class Courier:
    """One logger on a thread of its own: it opens the logger's run, sends the backlog
    (metrics.jsonl as it was at the start) beyond what the logger was sent before, then
    each new record, in order; ``close`` waits CLOSE_BUDGET_S at most for it to finish."""

    def __init__(self, run: RunDir, logger: loggermod.Logger, axis: Axis, sent: Sent, backlog: list, fresh: bool):
        self.run, self.logger, self.axis, self.sent, self.backlog, self.fresh = run, logger, axis, sent, backlog, fresh
        self.queue: queue.Queue = queue.Queue()
        self.marks: dict = {}
        self.status = "running"
        self.failed = self.dirty = self.noted = False
        self.saved_at = 0.0
        self.thread = threading.Thread(target=self._work, name=f"clusterjob-{logger.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def send(self, record: dict) -> None:
        point = self.axis.point(record)  # here, in commit order: the step of a line without one counts
        if point is not None and not self.failed:
            self.queue.put(point)

    def close(self, status: str) -> None:
        """``status``: the run's, or "stopped" (before the stop is recorded: a shorter wait)."""
        self.status = status
        self.queue.put(_END)
        budget = STOP_BUDGET_S if status == "stopped" else CLOSE_BUDGET_S
        self.thread.join(timeout=budget)
        if self.thread.is_alive():
            self._warn(f"still sending after {budget:g} s at the end; what it did not send is sent at the next "
                       "start of the run (metrics.jsonl holds every metric)")

    def _work(self) -> None:
        try:
            if not self.logger.open(self.fresh):
                self.sent.save(self.logger.name, {})  # a new logger run: nothing of it was sent
            self.marks = self.sent.of(self.logger.name)
            for point in self.backlog:
                self._send(point)
            self._save()
            self._drain()
        except Exception as err:
            self._fail(err)

    def _drain(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=SAVE_EVERY_S if self.dirty else None)
            except queue.Empty:
                self._save()
                continue
            if item is _END:
                self._save()
                self.logger.close(self.status)
                return
            self._send(item)
            if time.monotonic() - self.saved_at >= SAVE_EVERY_S:
                self._save()

    def _send(self, point: Point) -> None:
        """The point's metrics not sent yet; a fractional step where the logger takes
        whole ones is passed over (metrics.jsonl has it)."""
        new = {k: v for k, v in point.values.items() if point.step > self.marks.get(k, -math.inf)}
        if not new:
            return
        if self.logger.whole_steps and not float(point.step).is_integer():
            self._note_fraction(point.step)
        else:
            self.logger.send(point.step, new)
        self.marks.update(dict.fromkeys(new, point.step))
        self.dirty = True

    def _save(self) -> None:
        """Make what was sent durable, then mark it sent."""
        if self.dirty:
            self.logger.flush()
            self.sent.save(self.logger.name, self.marks)
            self.dirty = False
        self.saved_at = time.monotonic()

    def _note_fraction(self, step: float) -> None:
        if not self.noted:
            self.noted = True
            print(f"clusterjob: note: logging.{self.logger.name}: step {step:g} is no whole number, which "
                  f"{self.logger.name} does not take; such steps stay in metrics.jsonl only", file=sys.stderr,
                  flush=True)

    def _fail(self, err: Exception) -> None:
        """Off for the rest of this session; its marks stay, so the next start sends the rest."""
        self.failed = True
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        self._warn(f"{type(err).__name__}: {err}; it gets nothing more in this session and the rest is sent at "
                   "the next start (training goes on, metrics.jsonl holds every metric)")
        with contextlib.suppress(Exception):
            self._save()  # what it took before it failed counts as sent, if it can still be made durable
        with contextlib.suppress(Exception):
            self.logger.close("failed")

    def _warn(self, text: str) -> None:
        line = f"logging.{self.logger.name}: {' '.join(text.split())}"[:1000]
        print(f"clusterjob: warning: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):  # the warning is on stderr already
            add_warning(self.run, line)


def add_warning(run: RunDir, line: str) -> None:
    """``line`` in run.json's warnings, in place of an earlier one of the same logger:
    one warning per logger and run."""
    prefix = line.split(":", 1)[0] + ":"
    run.update(warnings=[w for w in run.read().warnings if not w.startswith(prefix)] + [line])
