"""The one path of metric records on rank 0 (docs/design.md, "Metrics and loggers").

Every record, from any source (the built-in trainer's epochs, ``clusterjob.log``, the
output regexes, a metrics file), is first committed to metrics.jsonl, the record
everything else is rebuilt from, and then handed, as written, to each sink in turn: the
built-in trainer's console line, then TensorBoard, MLflow and W&B when the spec asks.
A new sink is one small class with ``send(record)``, ``close(status)`` and ``wait``.

Each logger runs on a thread of its own (``Courier``), so a slow or failing network
never holds the training. Exactly once, across requeues, resumes and kills: at each
start a courier asks its logger what its run holds, read back from the tool itself
(each metric's highest step), and sends a metric only at a step beyond that: first what
metrics.jsonl holds (what the job wrote but had not sent, or the tool had not yet
written, when it died, or what a logger that failed could not take), then each new
record. A logger that fails is warned about once (stderr and run.json's warnings) and
left alone for the rest of the session; training goes on, and the other loggers too.
"""

from __future__ import annotations

import contextlib
import functools
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from clusterjob.core import metrics, runstate, units
from clusterjob.core.files import is_number, shown
from clusterjob.core.record import parse_time
from clusterjob.core.rundir import RunDir
from clusterjob.health.telemetry import Sample
from clusterjob.runner import gpusampler, health
from clusterjob.runner import loggers as loggermod
from clusterjob.runner.preempt import StopSignal
from clusterjob.search import pruner as prunermod
from clusterjob.search import record as searchmod
from clusterjob.spec.schema import Spec

CLOSE_BUDGET_S = 30.0  # at the end: how long each logger may still send; the rest goes at the next start
STOP_BUDGET_S = 5.0  # the same at a stop, which is recorded (and the job requeued) only after it
STALL_S = 120.0  # a call into a logger that has not returned for this long is warned about, once
MAX_BEHIND = 100_000  # a logger this many records behind gets nothing more in this session


class Sink(Protocol):
    """Where a committed record goes after metrics.jsonl: ``close`` starts its end,
    ``wait`` waits for it, ``budget`` seconds at most."""

    def send(self, record: dict) -> None: ...

    def close(self, status: str) -> None: ...

    def wait(self, budget: float) -> None: ...


class Sinks:
    """Rank 0's metric records: ``commit`` writes one to metrics.jsonl and returns it as
    written (None when nothing was left to write), then every sink gets it, in order.
    Thread-safe (the output regexes and a metrics file log from threads of their own);
    a context manager that closes the sinks with the run's outcome."""

    def __init__(self, run: RunDir, commit: Callable[[Any, dict], Optional[dict]], sinks: list[Sink]):
        self.run, self.commit, self.sinks = run, commit, sinks
        self._lock = threading.Lock()
        self._closed = False
        self._since: Optional[float] = None  # the run's start (unix s): system metrics' steps count from it
        if any(isinstance(sink, Courier) for sink in sinks):
            gpusampler.listen(self.system)

    def system(self, samples: list) -> None:
        """GPU samples (every rank's, from rank 0's sampler) to the loggers as system
        metrics, never to metrics.jsonl: ``system/gpu<rank>_util`` (and ``_mem_mib``,
        ``_power_w``) at the whole seconds since the run's first start."""
        if self._since is None:
            self._since = _unix(self.run.read().started_at) or min(s.time for s in samples)
        points = [system_point(sample, self._since) for sample in samples]
        with self._lock:
            if self._closed:
                return
            for sink in self.sinks:
                if isinstance(sink, Courier):
                    for point in points:
                        sink.send_point(point)

    def log(self, step: Any, values: dict) -> Optional[dict]:
        health.beat()  # a metric record is progress (the watchdog's)
        with self._lock:
            record = self.commit(step, values)
            if record is not None and not self._closed:
                for sink in self.sinks:
                    sink.send(record)
        return record

    def close(self, status: str) -> None:
        """Every sink is closed, then waited for in turn, whatever one of them raises (a
        stop arriving meanwhile is raised after)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        gpusampler.unlisten(self.system)
        budget = STOP_BUDGET_S if status == "stopped" else CLOSE_BUDGET_S
        raised = [err for sink in self.sinks if (err := _raised_by(sink.close, status)) is not None]
        raised += [err for sink in self.sinks if (err := _raised_by(sink.wait, budget)) is not None]
        if raised:
            raise raised[0]

    def __enter__(self) -> "Sinks":
        return self

    def __exit__(self, kind: Optional[type], *rest: object) -> None:
        if not self._closed:  # the completed and stopped paths closed them already: no run.json to read
            self.close(runstate.FAILED if kind is not None else (self.run.read().status or runstate.RUNNING))


def _unix(text: Optional[str]) -> Optional[float]:
    """Unix seconds of one of run.json's times; None when absent or unreadable."""
    found = parse_time(text)
    return found.timestamp() if found is not None else None


def _raised_by(call: Callable, *args: Any) -> Optional[BaseException]:
    try:
        call(*args)
    except BaseException as err:  # noqa: BLE001 -- raised by Sinks.close once every sink had its turn
        return err
    return None


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


def for_trainer(spec: Spec, run: RunDir, fresh: bool, stop: Optional[StopSignal] = None) -> Sinks:
    """The built-in trainer's epochs: metrics.jsonl and run.json's ``final``, the console
    line, the loggers, and for a trial of a search its prune decision (``stop`` is asked
    to stop it). ``fresh``: no checkpoint could be read, so the run starts from epoch 1
    and its logger runs start again too."""
    def commit(epoch: int, record: dict) -> dict:
        written = metrics.append_epoch(run.metrics_file, record)
        run.update(final=written)  # as written: finite values only
        return written

    return Sinks(run, commit, [EpochLine(spec.train.epochs), *couriers(spec, run, "epoch", fresh),
                               *pruning(run, "epoch", stop)])


def for_own_code(spec: Spec, run: RunDir, stop: Optional[StopSignal] = None) -> Sinks:
    """Your own code's metrics (``clusterjob.log``, the regexes, a metrics file): each
    metric at its own steps in metrics.jsonl (``metrics.StepWriter``), then the loggers,
    then a trial's prune decision. No console line: the code prints its own, and a line
    of ours would meet the regexes."""
    return Sinks(run, metrics.StepWriter(run.metrics_file).log, [*couriers(spec, run, "step", fresh=False),
                                                                 *pruning(run, "step", stop)])


# ----------------------------------------------------------------------------- a trial's prune decision


def pruning(run: RunDir, axis: str, stop: Optional[StopSignal]) -> list:
    """The prune sink of a trial of a search (last in line: a plain script's stop may be
    raised in the thread that logs), else none. A search that prunes nothing gives its
    trials the pruner that never prunes (clusterjob.search.pruner.NoPruning)."""
    info = run.read()
    found = info.search or {}
    trial = found.get("trial")
    if stop is None or not isinstance(trial, int) or isinstance(trial, bool):
        return []
    folder = run.path.parent  # a trial's folder is in its search's
    record, _ = searchmod.read(folder)
    pruner = prunermod.of(folder, record) if record.id == found.get("id") else prunermod.NoPruning()
    return [PruneSink(run, trial, record.metric or "", pruner, stop, Axis(axis))]


class PruneSink:
    """Each record's value of the search's metric goes to the search's pruner
    (clusterjob.search.pruner); a verdict that stops the trial is recorded in run.json
    (``pruned``) and the run is asked to stop as on a cancel (``StopSignal.prune``): it
    checkpoints and ends pruned."""

    def __init__(self, run: RunDir, trial: int, metric: str, pruner: prunermod.Pruner, stop: StopSignal, axis: Axis):
        self.run, self.trial, self.metric, self.pruner, self.stop, self.axis = run, trial, metric, pruner, stop, axis
        self.pruned = False

    def send(self, record: dict) -> None:
        point = self.axis.point(record)
        value = point.values.get(self.metric) if point is not None else None
        if self.pruned or point is None or value is None:
            return
        verdict = self.pruner.prune(self.trial, point.step, value)
        if verdict is None:
            return
        self.pruned = True
        self.run.update(pruned=verdict.to_dict())
        print(f"clusterjob: pruned at {verdict.line(self.metric)}", flush=True)
        self.stop.prune()

    def close(self, status: str) -> None:
        return None

    def wait(self, budget: float) -> None:
        return None


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

    def wait(self, budget: float) -> None:
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
    """One record as the loggers take it: its position and its metrics (``system``: a
    system metric's, at its own axis, the seconds since the run started)."""

    step: float
    values: dict
    system: bool = False


def system_point(sample: Sample, since: float) -> Point:
    """A GPU sample as the loggers take it: ``system/gpu<rank>_...`` at the whole seconds since ``since``."""
    head = f"system/gpu{sample.rank}_"
    values = {f"{head}util": sample.util_pct, f"{head}mem_mib": sample.mem_used_mib}
    if sample.power_w is not None:
        values[f"{head}power_w"] = sample.power_w
    return Point(float(max(0, int(sample.time - since))), values, system=True)


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


# ----------------------------------------------------------------------------- the couriers


def couriers(spec: Spec, run: RunDir, axis: str, fresh: bool) -> list:
    """A started courier per logger the spec asks for (none: nothing is read)."""
    if not spec.logging.any:
        return []
    key = Axis(axis)
    backlog = [p for p in map(key.point, metrics.read_epochs(run.metrics_file)) if p is not None]
    target = loggermod.Target(run, run.read(), spec, axis)
    found = [Courier(run, logger, Axis(axis, key.unstepped), backlog, fresh) for logger in loggermod.for_spec(target)]
    for courier in found:
        courier.start()
    return found


_END = object()  # the queue's last item


class Courier:
    """One logger on a thread of its own: it opens the logger's run, asks it what it
    holds (each metric's highest step, read back from the tool), sends the backlog
    (metrics.jsonl as it was at the start) beyond that, then each new record, in order.
    A logger that raises anything (SystemExit and KeyboardInterrupt too) gets nothing
    more in this session; one that does not answer for STALL_S is warned about once
    and waited for; ``wait`` leaves it at the end."""

    def __init__(self, run: RunDir, logger: loggermod.Logger, axis: Axis, backlog: list, fresh: bool):
        self.run, self.logger, self.axis, self.backlog, self.fresh = run, logger, axis, backlog, fresh
        self.queue: queue.Queue = queue.Queue()
        self.names = Names(logger, functools.partial(warn, run))
        self.held: dict = {}
        self.status = runstate.RUNNING
        self.off = self.stalled = self.noted = False  # off: it gets nothing more in this session
        self.busy_since: Optional[float] = None  # when the logger's call now running began
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name=f"clusterjob-{logger.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def send(self, record: dict) -> None:
        self.send_point(self.axis.point(record))  # here, in commit order: the step of a line without one counts

    def send_point(self, point: Optional[Point]) -> None:
        self._check_stall()
        if point is None or self.off:
            return
        if self.queue.qsize() >= MAX_BEHIND:
            self._give_up(f"is more than {MAX_BEHIND} records behind; it gets nothing more in this session and "
                          "the rest is sent at the next start (training goes on, metrics.jsonl holds every metric)")
        else:
            self.queue.put(point)

    def close(self, status: str) -> None:
        """``status``: the run's, or "stopped" (before the stop is recorded: a shorter wait)."""
        self.status = status
        self.queue.put(_END)

    def wait(self, budget: float) -> None:
        """Until the logger took everything and closed, ``budget`` seconds at most."""
        if not self.stalled:
            self.thread.join(timeout=budget)
        if self.thread.is_alive():  # left behind: nothing it still holds is sent in this session
            self._give_up(None if self.stalled else f"still sending after {budget:g} s at the end; what it did not "
                          "send is sent at the next start of the run (metrics.jsonl holds every metric)")

    def _work(self) -> None:
        try:
            self._call(self.logger.open, self.fresh)
            self.held = self._call(self.logger.held)
            for point in self.backlog:
                self._send(point)
            self._drain()
        except BaseException as err:  # SystemExit and KeyboardInterrupt too: a thread has no one to tell
            self._give_up(f"{type(err).__name__}: {err}; it gets nothing more in this session and the rest is sent "
                          "at the next start (training goes on, metrics.jsonl holds every metric)")
        if self.off:
            with contextlib.suppress(BaseException):
                self.logger.close(runstate.FAILED)

    def _drain(self) -> None:
        while True:
            item = self.queue.get()
            if self.off:
                return
            if item is _END:
                self._call(self.logger.close, self.status)
                return
            self._send(item)

    def _call(self, call: Callable, *args: Any) -> Any:
        """One call into the logger, timed for ``_check_stall``."""
        self.busy_since = time.monotonic()
        try:
            return call(*args)
        finally:
            self.busy_since = None

    def _send(self, point: Point) -> None:
        """The point's metrics the logger does not hold yet, by the names it takes; a step
        it does not take (a fraction where it takes whole steps) is passed over
        (metrics.jsonl has it)."""
        new = {key: value for key, value in ((self.names.key(k), v) for k, v in point.values.items())
               if key is not None and point.step > self.held.get(key, -math.inf)}
        if not new or self.off:
            return
        problem = self._step_problem(point.step)
        if problem is not None:
            self._note(point.step, problem)
            return
        self._call(self.logger.send_system if point.system else self.logger.send, point.step, new)
        self.held.update(dict.fromkeys(new, point.step))

    def _step_problem(self, step: float) -> Optional[str]:
        if not self.logger.whole_steps:
            return None
        if not float(step).is_integer():
            return "is no whole number"
        return f"is beyond the steps {self.logger.name} takes (below 2**63)" if abs(step) >= 2**63 else None

    def _note(self, step: float, problem: str) -> None:
        if not self.noted:
            self.noted = True
            print(f"clusterjob: note: logging.{self.logger.name}: step {step:g} {problem}, which "
                  f"{self.logger.name} does not take; such steps stay in metrics.jsonl only", file=sys.stderr,
                  flush=True)

    def _check_stall(self) -> None:
        """Warn once when one call into the logger has not returned for STALL_S (its records wait for it)."""
        since = self.busy_since
        if since is None or self.stalled or self.off or time.monotonic() - since < STALL_S:
            return
        self.stalled = True
        warn(self.run, f"logging.{self.logger.name}: has not answered for {STALL_S:g} s; its records wait for it "
             "(training goes on, metrics.jsonl holds every metric; what it lacks at the end is sent at the next "
             "start)")

    def _give_up(self, why: Optional[str]) -> None:
        """Off for the rest of this session, with one warning (``why``; none when it was
        warned about already); the next start sends what it lacks."""
        with self.lock:
            if self.off:
                return
            self.off = True
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        self.queue.put(_END)  # wakes the thread, which then ends
        if why is not None:
            warn(self.run, f"logging.{self.logger.name}: {why}")


class Names:
    """Each metric's name as one logger takes it (``Logger.key``), decided the first time
    the name comes (metrics.jsonl's order, the same at every start): a name the logger
    takes otherwise is sent so, one that comes to nothing, to a name it keeps for itself
    or to the name of another metric is not sent; each with one warning per name and run."""

    def __init__(self, logger: loggermod.Logger, warn: Callable[..., None]):
        self.logger, self.warn = logger, warn
        self.keys: dict = {}  # metric name: the name sent, or None
        self.owners: dict = dict.fromkeys(logger.reserved, "")  # name sent: its metric ("" for reserved)

    def key(self, name: str) -> Optional[str]:
        if name not in self.keys:
            self.keys[name] = self._decide(name)
        return self.keys[name]

    def _decide(self, name: str) -> Optional[str]:
        key = self.logger.key(name)
        owner = self.owners.get(key)
        if key and owner is None:
            self.owners[key] = name
            if key != name:
                self._warn(name, f"is sent as {shown(key)}")
            return key
        self._warn(name, "is not sent: " + ("nothing of it is left" if not key else
                   f"it would be {shown(key)}, " + ("a name kept for the tool itself" if owner == ""
                                                     else f"which {shown(owner)} is sent as")))
        return None

    def _warn(self, name: str, text: str) -> None:
        head = f"logging.{self.logger.name}.metrics: {shown(name)} "
        self.warn(f"{head}{text} ({self.logger.naming})", key=head, once=True)


_warning = threading.Lock()  # the couriers' warnings take turns: each reads the list the one before wrote


def warn(run: RunDir, line: str, key: Optional[str] = None, once: bool = False) -> None:
    """A warning on stderr and in run.json's warnings, in place of an earlier one that
    begins with ``key`` (by default the part before the first colon: one warning per
    logger and run); ``once``: not printed again when run.json holds it already."""
    line = " ".join(line.split())[:1000]
    key = key if key is not None else line.split(":", 1)[0] + ":"
    with _warning:
        held = run.read().warnings
        if not (once and line in held):
            print(f"clusterjob: warning: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):  # run.json unwritable: the warning is on stderr at least
            run.update(warnings=[w for w in held if not w.startswith(key)] + [line])
