"""The one path of metric records (clusterjob.runner.sinks), with a logger of the test's
own: metrics.jsonl first, then each sink; each step sent once across sessions; a
failing logger is one warning and the rest goes at the next start."""

from __future__ import annotations

import json
import math
import time

import pytest

from clusterjob.core.metrics import StepWriter
from clusterjob.core.rundir import RunDir, create_run
from clusterjob.runner import sinks
from clusterjob.runner.sinks import Axis, Courier, Sent, Sinks, epoch_line


class Fake:
    """A logger that keeps what it gets; ``fail_at``: the step whose send raises."""

    name, whole_steps = "fake", True

    def __init__(self, fail_at=None, continues=True, close_s=0.0):
        self.got, self.fail_at, self.continues, self.close_s = [], fail_at, continues, close_s
        self.flushed = self.closed = None

    def open(self, fresh):
        return self.continues and not fresh

    def send(self, step, values):
        if step == self.fail_at:
            raise ConnectionError("the server went away")
        self.got.append((step, values))

    def flush(self):
        self.flushed = len(self.got)

    def close(self, status):
        time.sleep(self.close_s)
        self.closed = status


def _run(tmp_path) -> RunDir:
    return create_run(tmp_path, "own", "r1", "name: own\n", {})


def session(run: RunDir, logger: Fake, fresh: bool = False) -> tuple[Sinks, Courier]:
    """What ``sinks.for_own_code`` opens, with the fake logger in place of the spec's."""
    axis = Axis("step")
    backlog = [p for p in map(axis.point, json_lines(run)) if p is not None]
    courier = Courier(run, logger, Axis("step", axis.unstepped), Sent(run.loggers_file), backlog, fresh)
    courier.start()
    return Sinks(run, StepWriter(run.metrics_file).log, [courier]), courier


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
    assert json.loads(run.loggers_file.read_text()) == {"fake": {"loss": 1}}


def test_each_step_is_sent_once_across_sessions_and_the_backlog_goes_first(tmp_path):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, first := Fake())
    with metric_sinks:
        for step in (1, 2):
            metric_sinks.log(step, {"loss": 1 / step})
    StepWriter(run.metrics_file).log(3, {"loss": 1 / 3})  # written; the job died before it was sent
    metric_sinks, _ = session(run, again := Fake())
    with metric_sinks:
        metric_sinks.log(2, {"loss": 0.5})  # the resumed code logs step 2 again
        metric_sinks.log(3, {"loss": 1 / 3})
        metric_sinks.log(4, {"loss": 0.25, "acc": 0.9})
    assert [s for s, _ in first.got] == [1, 2]
    assert again.got == [(3, {"loss": 1 / 3}), (4, {"loss": 0.25, "acc": 0.9})]


def test_a_new_logger_run_is_sent_everything(tmp_path):
    run = _run(tmp_path)
    metric_sinks, _ = session(run, Fake())
    with metric_sinks:
        metric_sinks.log(1, {"loss": 1.0})
    metric_sinks, _ = session(run, fresh := Fake(continues=False))  # its run was lost: a new one
    with metric_sinks:
        metric_sinks.log(2, {"loss": 0.5})
    assert [s for s, _ in fresh.got] == [1, 2]


def test_a_failing_logger_warns_once_training_goes_on_and_the_rest_goes_next_time(tmp_path, capfd):
    run = _run(tmp_path)
    metric_sinks, courier = session(run, Fake(fail_at=2))
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
    assert courier.failed and json.loads(run.loggers_file.read_text()) == {"fake": {"loss": 1}}
    metric_sinks, _ = session(run, later := Fake())
    with metric_sinks:
        pass
    assert [s for s, _ in later.got] == [2, 3, 4]
    assert len(run.read().warnings) == 1  # one warning per logger and run


def test_a_logger_slow_to_close_is_left_behind_with_a_warning(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sinks, "CLOSE_BUDGET_S", 0.2)
    run = _run(tmp_path)
    metric_sinks, _ = session(run, Fake(close_s=2))
    started = time.monotonic()
    with metric_sinks:
        metric_sinks.log(1, {"loss": 1.0})
    assert time.monotonic() - started < 1.5
    assert "logging.fake: still sending after 0.2 s at the end" in capfd.readouterr().err


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
