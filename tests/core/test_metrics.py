"""metrics.jsonl of your own code (clusterjob.core.metrics): each metric at its own steps,
exactly once per metric, and what readers make of the lines."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np

from clusterjob.core import metrics
from clusterjob.core.metrics import Latest, StepWriter


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def series(path: Path, name: str) -> list:
    """(step, value) of one metric, in file order."""
    return [(line.get("step"), line[name]) for line in lines(path) if name in line]


def test_metrics_at_different_rates_never_erase_each_other(tmp_path):
    """nanoGPT's shape: a loss every iteration, a val loss at every 10th; all are kept."""
    writer = StepWriter(tmp_path / "metrics.jsonl")
    for k in range(1, 22):
        writer.log(k, {"train_loss": 10.0 / k})
        if k % 10 == 0:
            writer.log(k // 10, {"val_loss": 5.0 / k})  # the k-th match of its own regex
    assert series(writer.path, "train_loss") == [(k, 10.0 / k) for k in range(1, 22)]
    assert series(writer.path, "val_loss") == [(1, 0.5), (2, 0.25)]


def test_a_metric_logged_again_replaces_its_own_values_from_that_step_on_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = StepWriter(path)
    for step in range(1, 9):
        first.log(step, {"loss": float(step), **({"acc": step / 10} if step % 2 == 0 else {})})
    again = StepWriter(path)  # a resumed run: it reads the file once
    again.log(5, {"loss": 50.0})
    again.log(6, {"loss": 60.0})
    assert series(path, "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0)]
    assert series(path, "acc") == [(2, 0.2), (4, 0.4), (6, 0.6), (8, 0.8)]  # untouched
    assert {"step": 8, "acc": 0.8} in lines(path)  # the line keeps the other metric's value
    assert {"step": 7, "loss": 7.0} not in lines(path) and {"step": 7} not in lines(path)  # no empty line is left


def test_one_call_is_one_line_and_a_line_without_step_is_appended(tmp_path):
    writer = StepWriter(tmp_path / "metrics.jsonl")
    assert writer.log(3, {"a": 1.0, "b": 2.0}) == {"step": 3, "a": 1.0, "b": 2.0}
    assert writer.log(None, {"a": 9.0}) == {"a": 9.0}
    assert writer.log(3, {"c": float("nan")}) is None  # nothing finite: no line
    assert lines(writer.path) == [{"step": 3, "a": 1.0, "b": 2.0}, {"a": 9.0}]


def test_final_values_are_each_metrics_latest_with_the_step_when_shared(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = StepWriter(path)
    writer.log(1, {"loss": 3.0, "acc": 0.1})
    writer.log(2, {"loss": 2.0, "acc": 0.2})
    assert metrics.final_values(path) == {"step": 2, "loss": 2.0, "acc": 0.2}
    writer.log(3, {"loss": 1.0})
    assert metrics.final_values(path) == {"loss": 1.0, "acc": 0.2}  # no one step: none said
    assert metrics.final_values(tmp_path / "absent.jsonl") == {}


def test_latest_reads_back_from_the_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    losses = "".join(json.dumps({"step": step, "loss": 1.0 / step}) + "\n" for step in range(1, 20_000))
    path.write_text('{"step": 1, "val": 0.5}\n' + losses + '{"step": 20000, "lo')  # 600 KiB, cut off by a crash
    assert metrics.latest(path, "val") == Latest("val", 0.5, 1)
    assert metrics.latest(path) == Latest("loss", 1.0 / 19_999, 19_999)
    assert metrics.latest(path, "nope") is None and metrics.latest(tmp_path / "absent") is None
    assert str(Latest("train_loss", 1.23456, 20)) == "train_loss 1.235 (step 20)"
    assert str(Latest("score", 2.25)) == "score 2.25"


def test_latest_never_opens_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")
    assert metrics.latest(tmp_path / "metrics.jsonl") is None  # a reader of a FIFO would block


def test_own_latest_shows_the_metric_the_report_ranks_by(tmp_path):
    writer = StepWriter(tmp_path / "metrics.jsonl")
    writer.log(4, {"train_loss": 0.5})
    writer.log(1, {"val_loss": 0.7})
    # The report's choice (core.metrics.default_metric), not the configured order nor the last line:
    # train_loss and val_loss are both known names, train_loss comes first in the tables.
    assert str(metrics.own_latest(tmp_path, {"metrics": ["val_loss", "train_loss"]})) == "train_loss 0.5 (step 4)"
    assert str(metrics.own_latest(tmp_path, {"metrics": []})) == "train_loss 0.5 (step 4)"
    writer.log(5, {"epoch": 3, "val_acc": 0.97031})  # the API example's line: epoch first, val_acc ranks
    assert str(metrics.own_latest(tmp_path, {"metrics": []})) == "val_acc 97.03% (step 5)"
    assert metrics.own_latest(tmp_path, None) is None  # the built-in trainer
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "epoch": 1, "lr": 0.1}\n')
    assert metrics.own_latest(tmp_path, {}) is None  # only bookkeeping logged: nothing ranks


def test_default_metric_is_one_rule_for_the_report_and_a_glance():
    assert metrics.default_metric(["epoch", "step", "train_loss", "val_acc"]) == "val_acc"
    assert metrics.default_metric(["epoch", "lr", "lr_head", "samples_per_s", "score"]) == "score"
    assert metrics.default_metric(["epoch", "step"]) == "val_acc"
    assert metrics.table_order(["score", "epoch", "val_loss", "train_loss"]) == ["epoch", "train_loss", "val_loss",
                                                                                  "score"]


def test_logged_names_reads_the_head_and_the_tail_of_a_big_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "b": 1}\n' + '{"step": 2, "a": 1, "ok": true}\n' * 50 + '{"step": 3, "late": 2}\n')
    assert metrics.logged_names(path) == ["b", "a", "late"]  # "ok" is no number
    monkeypatch.setattr(metrics, "TAIL_LIMIT", 64)  # the middle lies beyond both ends
    assert metrics.logged_names(path) == ["b", "a", "late"]
    assert metrics.logged_names(tmp_path / "absent") == []


def test_readers_meet_the_lines_of_one_step_in_one_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = StepWriter(path)
    for step in (1, 2, 3):
        writer.log(step, {"train_loss": float(step)})
    writer.log(2, {"val_loss": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names, matrix, problems = metrics.read_matrix(str(path))
    assert problems == []
    rows = {name: matrix[:, names.index(name)].tolist() for name in names}
    assert rows["step"] == [1, 2, 3] and rows["train_loss"] == [1.0, 2.0, 3.0]
    assert np.isnan(rows["val_loss"][0]) and rows["val_loss"][1] == 0.5 and np.isnan(rows["val_loss"][2])


def test_an_epoch_logged_beside_finer_steps_does_not_merge_the_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "epoch": 1 + s // 4, "loss": float(s)}) + "\n"
                            for s in range(1, 9)))
    names, matrix, problems = metrics.read_matrix(str(path))
    assert problems == [] and matrix[:, names.index("loss")].tolist() == [float(s) for s in range(1, 9)]
