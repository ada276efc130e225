"""The follower of a metrics file (clusterjob.runner.metricsfile), poll by poll: steps from
the columns, whole lines only, a file cut short or replaced read again without a step
twice, the format sniffed, and files of earlier runs left alone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from clusterjob.core.metrics import StepWriter
from clusterjob.runner.metricsfile import Follower


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # relative paths are the code's working directory's
    return tmp_path


def follower(here: Path, pattern: str) -> Follower:
    found = Follower(pattern, here / "run", StepWriter(here / "metrics.jsonl"))
    found.start()  # polled here, without its thread
    return found


def lines(here: Path) -> list:
    path = here / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("text, first", [
    ("step,epoch,loss\n10,1,0.5\n", {"step": 10, "loss": 0.5}),
    ("Epoch,loss,note\n3,0.5,ok\n", {"step": 3, "loss": 0.5}),
    ("iteration,loss\n7,0.5\n", {"step": 7, "loss": 0.5}),
    ("loss,acc\n0.5,\n", {"step": 1, "loss": 0.5}),  # the row number; an empty cell is no value
    ("epoch,loss\nlast,0.5\n1,0.25\n", {"step": 1, "loss": 0.25}),  # a step that is no number: no place
])
def test_the_step_column_and_else_the_row_number(here, text, first):
    f = follower(here, "log.csv")
    (here / "log.csv").write_text(text)
    f.poll(final=False)
    assert lines(here)[0] == first  # positions and text are no metrics


def test_only_whole_lines_until_the_end(here):
    f = follower(here, "log.jsonl")
    (here / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    f.poll(final=False)
    assert lines(here) == [{"step": 1, "loss": 1.0}]
    with open(here / "log.jsonl", "a") as out:
        out.write('ss": 0.5}')
    f.poll(final=False)
    assert len(lines(here)) == 1  # still no newline
    f.poll(final=True)  # the code ended: its last line is whole
    assert lines(here) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]


def test_a_file_cut_short_is_read_again_and_each_step_kept_once(here):
    f = follower(here, "log")  # no suffix: the first line says JSON
    (here / "log").write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in (1, 2, 3)))
    f.poll(final=False)
    (here / "log").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")  # rewritten from the start
    f.poll(final=True)
    assert lines(here)[-1] == {"step": 1, "loss": 9.0} and [line["step"] for line in lines(here)] == [1]


def test_a_file_of_an_earlier_run_is_read_only_once_it_changes(here):
    (here / "out" / "old").mkdir(parents=True)
    (here / "out" / "old" / "summary.csv").write_text("epoch,loss\n7,99\n")
    f = follower(here, "out/*/summary.csv")
    f.poll(final=True)
    assert lines(here) == [] and "no file matched" in f.problem()
    time.sleep(0.01)
    with open(here / "out" / "old" / "summary.csv", "a") as out:
        out.write("8,98\n")  # this run appends to it: all of it is this run's now
    os.utime(here / "out" / "old" / "summary.csv", ns=(time.time_ns(), time.time_ns() + 10**9))
    f.poll(final=True)
    assert lines(here) == [{"step": 7, "loss": 99.0}, {"step": 8, "loss": 98.0}] and f.problem() is None


def test_run_dir_is_filled_in_and_a_file_without_numbers_is_a_problem(here):
    (here / "run").mkdir()
    f = follower(here, "{run_dir}/notes.csv")
    (here / "run" / "notes.csv").write_text("epoch,comment\n1,fine\n")
    f.poll(final=True)
    assert lines(here) == [] and f.problem() == (
        f"entrypoint.metrics_file: '{here}/run/notes.csv' held no row with a number; CSV needs a header row, "
        "JSON lines one object per line")
