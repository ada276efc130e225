"""`submit --wait` is never silent for long: a run with no progress for a minute gets a
status line a minute, and a sequential local sweep says which run starts and whose each
progress line is. Real runs through the command line."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from clirun import cli
from slurmcluster import slurm_cluster  # noqa: F401  (session fixture: the local Slurm cluster)
from trainutil import write_spec

from clusterjob.launch.progress import QUIET_S, Quiet, _position


def test_the_status_line_says_where_the_run_is_how_long_and_when_it_stalls():
    assert Quiet(since=0.0).due(QUIET_S - 1, 1800.0) is None
    assert Quiet(since=0.0).due(QUIET_S, 1800.0) == "still running, no progress for 1 min; stall after 30 min"
    at = Quiet(since=0.0, at=_position("epoch 2/4 step 15/32 loss 0.7031 454 samples/s"))
    assert at.due(185.0, 45.0) == "still at epoch 2 step 15, no progress for 3 min; stall after 45 s"
    assert at.due(185.0, None) == "still at epoch 2 step 15, no progress for 3 min; no stall watch"
    said = Quiet(since=0.0, said=150.0)
    assert said.due(200.0, 1800.0) is None and said.due(210.0, 1800.0) is not None  # one a minute, no more
    assert _position("epoch 3/4 train_loss 1.2 val_acc 96.39%") == "the end of epoch 3"
    assert _position("val_acc 0.93 (step 20)") == ""


def quiet_spec(tmp_path, quiet_s: int = 70, **resources) -> str:
    """Your own code that says nothing it counts as progress for ``quiet_s``, then its metric."""
    (tmp_path / "quiet.py").write_text(f"import time\ntime.sleep({quiet_s})\nprint('acc 0.5', flush=True)\n")
    spec = tmp_path / "quiet.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "quiet", "output": {"root": str(tmp_path / "results")},
        "resources": {"tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, **resources},
        "health": {"stall_s": 600}, "entrypoint": {"script": "quiet.py", "metrics": {"acc": "acc ([0-9.]+)"}}}))
    return str(spec)


@pytest.mark.slow
def test_a_run_without_progress_for_a_minute_gets_a_status_line(tmp_path):
    done = cli(tmp_path, "submit", quiet_spec(tmp_path), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    still = [line for line in done.stdout.splitlines() if line.startswith("still ")]
    assert still and still[0] == "still running, no progress for 1 min; stall after 10 min", done.stdout


@pytest.mark.slurm
def test_a_slurm_run_without_progress_for_a_minute_gets_a_status_line_too(slurm_cluster, tmp_path):  # noqa: F811
    done = cli(tmp_path, "submit", quiet_spec(tmp_path, 90, mem_gb=1, time_min=10), "--executor", "slurm", "--wait",
               env=slurm_cluster.env())
    assert done.returncode == 0, done.stdout + done.stderr
    still = [line for line in done.stdout.splitlines() if line.startswith("still ")]
    assert still and still[0].startswith("still running, no progress for 1 min; stall after 10 min"), done.stdout


@pytest.mark.slow
def test_a_sequential_local_sweep_says_which_run_starts_and_whose_lines_they_are(tmp_path):
    spec = write_spec(tmp_path, "seq", resources={"tasks_per_node": 1, "cpus_per_task": 64},  # one at a time
                      train={"epochs": 1, "log_every": 8}, sweep={"train.lr": [0.05, 0.07]})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    runs = sorted(p.name for p in (tmp_path / "results" / "seq").iterdir() if not p.name.startswith("."))
    starts = [line for line in lines if " started " in line]
    assert starts == ["run 001 of 2 started (train.lr=0.05)", "run 002 of 2 started (train.lr=0.07)"]
    progress = [line for line in lines if re.search(r"epoch 1/1 (step|train_loss)", line)]
    assert progress and all(line.split("  ")[0] in runs for line in progress), progress
    assert lines.index(starts[1]) > max(i for i, line in enumerate(lines) if line.startswith(runs[0] + "  epoch"))
    assert sys.executable  # the runs ran here, one after the other


def test_a_progress_line_resets_the_clock_and_the_slurm_wait_sees_only_status_lines(tmp_path):
    from clusterjob.core.rundir import RunDir
    from clusterjob.launch.progress import ProgressTail

    (tmp_path / "logs").mkdir()
    run, now = RunDir(tmp_path), [0.0]
    tail = ProgressTail([run], own_code=False, stall_s=1800.0)
    tail.clock = lambda: now[0]
    (tmp_path / "logs" / "rank0.out").write_text("[progress] epoch 2/4 step 15/32 loss 1\n")
    assert [line.text for line in tail.new_lines(run)] == ["epoch 2/4 step 15/32 loss 1"]
    now[0] = QUIET_S - 1
    assert tail.new_lines(run) == []
    now[0] = QUIET_S + 1
    assert [line.text for line in tail.new_lines(run)] == [
        "still at epoch 2 step 15, no progress for 1 min; stall after 30 min"]
    with open(tmp_path / "logs" / "rank0.out", "a") as log:
        log.write("[progress] epoch 2/4 step 20/32 loss 1\n")
    now[0] = 2 * QUIET_S
    assert tail.quiet_lines(run) == []  # the line is read in silence, and resets the clock
    now[0] = 3 * QUIET_S + 1
    assert [line.text for line in tail.quiet_lines(run)] == [
        "still at epoch 2 step 20, no progress for 1 min; stall after 30 min"]
