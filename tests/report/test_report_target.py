"""What ``clusterjob report`` is pointed at, through the real command line: a sweep's id
(as submit prints it, and as status, logs and cancel take it) reports that sweep's runs
only; a --group-by key that is empty or blank is bad input in one line, exit 2."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from clirun import cli

from clusterjob.core.files import now_iso
from clusterjob.core.rundir import RunDir, make_runs


def sweep(tmp_path: Path, lrs: list) -> list[RunDir]:
    points = [(i, f"name: exp\ntrain:\n  lr: {lr}\n", {"train.lr": lr}) for i, lr in enumerate(lrs)]
    runs = make_runs(tmp_path / "results", "exp", points, executor="local")
    for run in runs:
        run.update(status="completed", started_at=now_iso(), finished_at=now_iso(), world_size=1,
                   final={"epoch": 2, "val_acc": 0.5})
    return runs


def sweep_id(run: RunDir) -> str:
    return f"exp-{run.path.name.rsplit('-', 1)[0]}"


def test_a_sweep_id_reports_that_sweeps_runs(tmp_path):
    first, second = sweep(tmp_path, [0.1, 0.2]), sweep(tmp_path, [0.3, 0.4, 0.5])
    for named, runs in ((sweep_id(first[0]), first), (f"results/{sweep_id(second[0])}", second)):
        done = cli(tmp_path, "report", named, "--runs", "--format", "csv")
        assert done.returncode == 0, done.stderr
        rows = list(csv.DictReader(io.StringIO(done.stdout)))
        assert [row["run_id"] for row in rows] == [run.path.name for run in runs]
    status = cli(tmp_path, "status", sweep_id(first[0]))
    assert status.returncode == 0  # the same runs as status shows for the id
    assert [line.split()[0] for line in status.stdout.splitlines()[1:]] == [f"exp/{run.path.name}" for run in first]
    whole = cli(tmp_path, "report", "results/exp", "--runs", "--format", "csv")
    assert len(list(csv.DictReader(io.StringIO(whole.stdout)))) == 5
    missing = cli(tmp_path, "report", "exp-20990101-000000-abcd")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith("clusterjob: error: no such results folder: exp-20990101-000000-abcd")


@pytest.mark.parametrize("keys", [[""], [" "], ["train.lr,"], ["train.lr", ""], ["train.lr, ,status"]])
def test_an_empty_group_key_is_one_line_and_exit_2(tmp_path, keys):
    sweep(tmp_path, [0.1, 0.2])
    done = cli(tmp_path, "report", "results/exp", "--group-by", *keys)
    assert done.returncode == 2 and done.stdout == ""
    bad = next(key for key in keys if not all(part.strip() for part in key.split(",")))
    assert done.stderr.splitlines() == [
        f"clusterjob: error: argument --group-by: {bad!r}: a key is empty; name a key of the runs' spec, e.g. "
        "--group-by train.lr, or leave --group-by out for the default grouping; see `clusterjob report --help`"]
    fine = cli(tmp_path, "report", "results/exp", "--group-by", "train.lr, status", "--format", "csv")
    assert fine.returncode == 0 and fine.stdout.splitlines()[0].startswith("train.lr,status,"), fine.stdout
