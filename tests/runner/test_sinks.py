"""The one path of metric records (clusterjob.runner.sinks), with a logger of the test's
own: metrics.jsonl first, then each sink; each step sent once across sessions, from what
the logger's tool holds; a failing, hanging or raising logger is one warning, the other
loggers get everything and the rest goes at the next start; a name the logger takes
otherwise is cleaned or dropped with one warning per name and run."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from clusterjob.core.metrics import StepWriter
from clusterjob.core.rundir import RunDir, create_run
from clusterjob.runner import sinks
from clusterjob.runner.loggers import highest
from clusterjob.runner.preempt import StopRequested
from clusterjob.runner.sinks import Axis, Courier, Sinks, epoch_line


class Tool:
    """What a fake logger's tool holds, across sessions: (step, values) as it took them."""

    def __init__(self):
        self.held = []


class Fake:
    """A logger that keeps what it gets in ``tool``; ``fail_at``: the step whose send
    raises ``raises``; ``hang_at``: the step whose send never returns (until ``release``);
    ``continues=False``: its run was lost, a new one starts."""

    whole_steps, reserved, naming = True, ("pos",), "the fake takes no '!'"

    def __init__(self, tool=None, fail_at=None, continues=True, close_s=0.0, raises=None, hang_at=None,
                 name="fake", fail_in=None):
        self.tool, self.got, self.name = tool or Tool(), [], name
        self.fail_at, self.continues, self.close_s, self.hang_at = fail_at, continues, close_s, hang_at
        self.raises = raises or ConnectionError("the server went away")
        self.fail_in, self.release, self.hanging = fail_in, threading.Event(), threading.Event()
        self.closed = None

    def _maybe_fail(self, where):
        if self.fail_in == where:
            raise self.raises

    def open(self, fresh):
        self._maybe_fail("open")
        if fresh or not self.continues:
            self.tool.held.clear()

    def held(self):
        self._maybe_fail("held")
        return highest((name, step) for step, values in self.tool.held for name in values)

    def key(self, name):
        return name.replace("!", "")

    def send(self, step, values):
        if step == self.hang_at:
            self.hanging.set()
            self.release.wait()
        if step == self.fail_at:
            raise self.raises
        self.got.append((step, values))
        self.tool.held.append((step, values))

    def close(self, status):
        time.sleep(self.close_s)
        self.closed = status
        self._maybe_fail("close")


def _run(tmp_path) -> RunDir:
    return create_run(tmp_path, "own", "r1", "name: own\n", {})


def session(run: RunDir, *loggers: Fake, fresh: bool = False) -> tuple[Sinks, list]:
    """What ``sinks.for_own_code`` opens, with fake loggers in place of the spec's."""
    axis = Axis("step")
    backlog = [p for p in map(axis.point, json_lines(run)) if p is not None]
    found = [Courier(run, logger, Axis("step", axis.unstepped), backlog, fresh) for logger in loggers]
    for courier in found:
        courier.start()
    return Sinks(run, StepWriter(run.metrics_file).log, found), found


def json_lines(run: RunDir) -> list:
    return [json.loads(x) for x in run.metrics_file.read_text().splitlines()] if run.metrics_file.exists() else []


def test_a_record_is_committed_first_then_sent_as_written(tmp_path):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, logger := Fake())
    with metric_sinks:
        assert metric_sinks.log(1, {"loss": 0.5, "bad": math.nan}) == {"step": 1, "loss": 0.5}
        assert metric_sinks.log(2, {"bad": math.inf}) is None  # nothing written: nothing sent
    assert json_lines(run) == [{"step": 1, "loss": 0.5}]
    assert logger.got == [(1, {"loss": 0.5})] and logger.closed == "pending"  # run.json's status at the end
    assert logger.tool.held == [(1, {"loss": 0.5})]


def test_each_step_is_sent_once_across_sessions_and_the_backlog_goes_first(tmp_path):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, first := Fake())
    with metric_sinks:
        for step in (1, 2):
            metric_sinks.log(step, {"loss": 1 / step})
    StepWriter(run.metrics_file).log(3, {"loss": 1 / 3})  # written; the job died before it was sent
    metric_sinks, _ = session(run, again := Fake(first.tool))
    with metric_sinks:
        metric_sinks.log(2, {"loss": 0.5})  # the resumed code logs step 2 again
        metric_sinks.log(3, {"loss": 1 / 3})
        metric_sinks.log(4, {"loss": 0.25, "acc": 0.9})
    assert [s for s, _ in first.got] == [1, 2]
    assert again.got == [(3, {"loss": 1 / 3}), (4, {"loss": 0.25, "acc": 0.9})]


def test_a_new_logger_run_is_sent_everything(tmp_path):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, first := Fake())
    with metric_sinks:
        metric_sinks.log(1, {"loss": 1.0})
    metric_sinks, _ = session(run, fresh := Fake(first.tool, continues=False))  # its run was lost: a new one
    with metric_sinks:
        metric_sinks.log(2, {"loss": 0.5})
    assert [s for s, _ in fresh.got] == [1, 2]


def test_a_failing_logger_warns_once_training_goes_on_and_the_rest_goes_next_time(tmp_path, capfd):
    run = _run(tmp_path)
    metric_sinks, (courier,) = session(run, failing := Fake(fail_at=2))
    with metric_sinks:
        for step in (1, 2, 3, 4):
            metric_sinks.log(step, {"loss": 1 / step})
            time.sleep(0.05)
    assert [line["step"] for line in json_lines(run)] == [1, 2, 3, 4]  # metrics.jsonl holds everything
    err = capfd.readouterr().err
    assert err.count("clusterjob: warning: logging.fake: ConnectionError: the server went away") == 1
    assert [w for w in run.read().warnings if w.startswith("logging.fake:")] == [
        "logging.fake: ConnectionError: the server went away; it gets nothing more in this session and the rest is "
        "sent at the next start (training goes on, metrics.jsonl holds every metric)"]
    assert courier.off and failing.tool.held == [(1, {"loss": 1.0})]
    metric_sinks, _ = session(run, later := Fake(failing.tool))
    with metric_sinks:
        pass
    assert [s for s, _ in later.got] == [2, 3, 4]
    assert len(run.read().warnings) == 1  # one warning per logger and run


def test_a_logger_slow_to_close_is_left_behind_with_a_warning(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sinks, "CLOSE_BUDGET_S", 0.2)
    run = _run(tmp_path)
    metric_sinks, _ = session(run, Fake(close_s=30))
    started = time.monotonic()
    with metric_sinks:
        metric_sinks.log(1, {"loss": 1.0})
    assert time.monotonic() - started < 15  # left behind at its budget, not waited for (30 s)
    assert "logging.fake: still sending after 0.2 s at the end" in capfd.readouterr().err


RAISED = [SystemExit(3), KeyboardInterrupt(), StopRequested("SIGTERM"), ConnectionError("gone")]


@pytest.mark.parametrize("where", ["open", "held", "send", "close"])
@pytest.mark.parametrize("raised", RAISED, ids=lambda e: type(e).__name__)
def test_a_logger_that_raises_anything_anywhere_is_one_warning_and_the_other_gets_everything(
        tmp_path, capfd, where, raised):
    run = _run(tmp_path)
    bad = Fake(name="bad", raises=raised, **({"fail_at": 2} if where == "send" else {"fail_in": where}))
    metric_sinks, (courier, _) = session(run, bad, good := Fake(name="good"))
    with metric_sinks:
        for step in (1, 2, 3):
            metric_sinks.log(step, {"loss": 1 / step})
    assert [s for s, _ in good.got] == [1, 2, 3] and good.closed == "pending"
    assert [s for s, _ in bad.got] == {"open": [], "held": [], "send": [1], "close": [1, 2, 3]}[where]
    assert capfd.readouterr().err.count("clusterjob: warning: logging.bad: ") == 1 and courier.off
    (line,) = run.read().warnings
    assert line.startswith(f"logging.bad: {type(raised).__name__}: ")
    metric_sinks, _ = session(run, later := Fake(bad.tool, name="bad"))  # the next start: what it lacks
    with metric_sinks:
        metric_sinks.log(4, {"loss": 0.25})
    assert [s for s, _ in later.got] == {"open": [1, 2, 3, 4], "held": [1, 2, 3, 4], "send": [2, 3, 4],
                                          "close": [4]}[where]


def test_a_logger_that_hangs_is_one_warning_and_is_left_at_the_end(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sinks, "STALL_S", 0.2)
    monkeypatch.setattr(sinks, "CLOSE_BUDGET_S", 0.5)
    run = _run(tmp_path)
    metric_sinks, (courier, _) = session(run, hung := Fake(name="hung", hang_at=2), good := Fake(name="good"))
    started = time.monotonic()
    with metric_sinks:
        for step in (1, 2, 3, 4):
            metric_sinks.log(step, {"loss": 1 / step})
            if step == 2:
                assert hung.hanging.wait(60)
                time.sleep(0.3)  # longer than STALL_S: the next record finds it stalled
    assert time.monotonic() - started < 30  # left at the end's budget: its call in flight never returns by itself
    err = capfd.readouterr().err
    assert err.count("clusterjob: warning: logging.hung: has not answered for 0.2 s") == 1
    assert err.count("logging.hung") == 1 and courier.off  # no second warning at the end
    assert [s for s, _ in good.got] == [1, 2, 3, 4] and [s for s, _ in hung.got] == [1]
    hung.release.set()  # the call in flight returns; the thread left behind takes nothing more
    courier.thread.join(timeout=5)
    assert not courier.thread.is_alive() and [s for s, _ in hung.got] == [1, 2] and hung.closed == "failed"
    metric_sinks, _ = session(run, later := Fake(hung.tool, name="hung"))
    with metric_sinks:
        pass
    assert [s for s, _ in later.got] == [3, 4]


def test_a_logger_too_far_behind_gets_nothing_more_in_the_session(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sinks, "MAX_BEHIND", 2)
    run = _run(tmp_path)
    metric_sinks, (courier,) = session(run, slow := Fake(name="slow", hang_at=1))
    with metric_sinks:
        for step in (1, 2, 3, 4, 5):
            metric_sinks.log(step, {"loss": 1 / step})
            assert slow.hanging.wait(60)
        slow.release.set()
    assert capfd.readouterr().err.count("logging.slow: is more than 2 records behind") == 1
    assert courier.off and [s for s, _ in slow.got] == [1]
    assert [line["step"] for line in json_lines(run)] == [1, 2, 3, 4, 5]


def test_names_the_logger_takes_otherwise_are_cleaned_or_dropped_with_one_warning_per_name_and_run(tmp_path, capfd):
    run, tool = _run(tmp_path), Tool()
    for steps in ((1, 2), (3,)):  # two sessions
        metric_sinks, _ = session(run, Fake(tool))
        with metric_sinks:
            for step in steps:
                metric_sinks.log(step, {"a!": step, "pos!": 1.0, "!": 2.0, "b": 3.0})
                metric_sinks.log(step, {"a": 4.0})  # comes to the name "a!" is sent as
    assert tool.held == [(1, {"a": 1, "b": 3.0}), (2, {"a": 2, "b": 3.0}), (3, {"a": 3, "b": 3.0})]
    err = capfd.readouterr().err
    lines = ["logging.fake.metrics: 'a!' is sent as 'a' (the fake takes no '!')",
             "logging.fake.metrics: 'pos!' is not sent: it would be 'pos', a name kept for the tool itself (the "
             "fake takes no '!')",
             "logging.fake.metrics: '!' is not sent: nothing of it is left (the fake takes no '!')",
             "logging.fake.metrics: 'a' is not sent: it would be 'a', which 'a!' is sent as (the fake takes no '!')"]
    assert [err.count(f"clusterjob: warning: {line}\n") for line in lines] == [1, 1, 1, 1]
    assert run.read().warnings == lines


class RaisesOnClose:
    def send(self, record):
        pass

    def close(self, status):
        raise KeyboardInterrupt

    def wait(self, budget):
        pass


def test_a_sink_that_raises_on_close_leaves_the_others_closed_then_raises(tmp_path):
    run = _run(tmp_path)
    (courier,) = session(run, logger := Fake())[1]
    metric_sinks = Sinks(run, StepWriter(run.metrics_file).log, [RaisesOnClose(), courier])
    metric_sinks.log(1, {"loss": 1.0})
    with pytest.raises(KeyboardInterrupt):
        metric_sinks.close("completed")
    assert logger.closed == "completed" and logger.got == [(1, {"loss": 1.0})]


def test_a_fractional_step_stays_in_metrics_jsonl_for_a_logger_of_whole_steps(tmp_path, capfd):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, logger := Fake())
    with metric_sinks:
        metric_sinks.log(0.5, {"loss": 1.0})
        metric_sinks.log(1.5, {"loss": 0.9})
        metric_sinks.log(2, {"loss": 0.8})
    assert logger.got == [(2, {"loss": 0.8})]
    assert capfd.readouterr().err.count("step 0.5 is no whole number") == 1


def test_positions_are_epochs_steps_or_the_number_of_a_line_without_a_step():
    trainer = Axis("epoch")
    assert trainer.point({"epoch": 3, "step": 120, "val_acc": 0.9, "lr": 0.1}) == sinks.Point(3, {"val_acc": 0.9, "lr": 0.1})
    own = Axis("step")
    assert own.point({"step": 7, "loss": 1, "epoch": 2}) == sinks.Point(7, {"loss": 1.0, "epoch": 2.0})
    assert [own.point({"acc": a}).step for a in (0.1, 0.2)] == [1, 2]  # the 1st and 2nd line without a step
    assert own.point({"step": 8, "note": "text"}) is None


@pytest.mark.parametrize("record, line", [
    ({"epoch": 2, "train_loss": 0.41234, "train_acc": 0.8, "epoch_time_s": 1.23, "samples_per_s": 2104.4,
      "val_loss": 0.3, "val_acc": 0.88123, "step": 40, "lr": 0.05},
     "epoch 2/10 train_loss 0.412 train_acc 80.00% val_loss 0.300 val_acc 88.12% lr 0.05 1.2 s 2104 samples/s"),
    ({"epoch": 1, "val_acc_ema": 0.5, "lr_fc": 1e-4}, "epoch 1/10 val_acc_ema 50.00% lr_fc 0.0001"),
])
def test_the_console_line_shows_every_metric_of_the_epoch(record, line):
    assert epoch_line(record, 10) == line
