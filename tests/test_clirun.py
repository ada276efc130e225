"""The tests' one way to run the CLI (clirun): a command run in the test process answers
as ``python -m clusterjob`` does, byte for byte; the commands that must have a process of
their own get one; a command that leaves state behind in the test process, or runs past
its timeout, fails the test."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from clirun import REPO, base_env, cli, needs_process
from trainutil import write_spec


def a_run(folder: Path) -> None:
    """A completed run of two epochs, with its log."""
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "rank0.out").write_text("epoch 1\nepoch 2\n")
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "name": "exp", "status": "completed",
                                                 "params": {"train.lr": 0.1}, "executor": "local", "world_size": 1,
                                                 "started_at": "2026-11-22T00:00:00+00:00",
                                                 "finished_at": "2026-11-22T00:01:00+00:00"}))
    lines = [{"epoch": n, "step": 10 * n, "val_acc": 0.5 + n / 10, "val_loss": 1.0 / n} for n in (1, 2)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_command_in_this_process_answers_as_a_real_one(tmp_path):
    spec = str(write_spec(tmp_path, "t"))
    a_run(tmp_path / "results" / "exp" / "r0")
    a_run(tmp_path / "results" / "exp" / "r1\x1b[2J")  # a name to escape
    (tmp_path / "results" / "exp" / "r2").mkdir()  # a run without its run.json: a warning
    for argv in (["--help"], ["--version"], ["validate", spec, "--set", "train.lr=0.2"], ["sbatch", spec],
                 ["submit", spec, "--executor", "local", "--dry-run"], ["env", "--json"], ["status", "results"],
                 ["report", "results", "--runs"], ["report", "results", "--format", "json"],
                 ["logs", "results/exp/r0"], ["status", "nope"], ["report", "results", "--format", "xml"],
                 ["validate", "missing.yaml"], ["nosuchcommand"]):
        here, there = cli(tmp_path, *argv, process=False), cli(tmp_path, *argv, process=True)
        assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr), argv
    shown = cli(tmp_path, "status")
    assert shown.returncode == 0 and "exp/r1\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout, shown.stdout


@pytest.mark.parametrize("argv, env, process", [
    (["status", "results"], {}, False),
    (["report", "results", "--format", "json"], {}, False),
    (["submit", "t.yaml", "--executor", "local", "--dry-run"], {}, False),
    (["cancel", "results/exp/r0"], {}, True),
    (["submit", "t.yaml", "--executor", "local"], {}, True),
    (["resume", "results/exp/r0"], {}, True),
    (["data", "fetch", "mnist"], {}, True),
    (["logs", "results/exp/r0", "-f"], {}, True),
    (["report", "--watch", "results"], {}, True),
    (["status", "results"], {"PYTHONPATH": f"/elsewhere:{REPO}"}, True),
    (["status", "results"], {"PYTHONHASHSEED": "12345"}, True),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_commands_that_start_processes_import_torch_or_signal_run_in_a_process(argv, env, process):
    assert needs_process(argv, {**base_env(), **env}) is process


def test_a_command_that_leaves_state_here_fails_the_test(tmp_path, monkeypatch):
    from clusterjob.core import claim
    from clusterjob.launch import control

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(control, "cmd_status", lambda folder, **_: claim.take(run, "a test") and 0)
    try:
        with pytest.raises(AssertionError, match="left claims .* run it with process=True"):
            cli(tmp_path, "status", str(run))
    finally:
        claim.release(run)


def test_a_command_past_its_timeout_is_stopped_as_subprocess_stops_it(tmp_path, monkeypatch):
    from clusterjob.launch import control

    monkeypatch.setattr(control, "cmd_status", lambda folder, **_: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli(tmp_path, "status", timeout=0.5)
    assert time.monotonic() - started < 25  # at the timeout, not at the command's end (30 s)
    monkeypatch.undo()
    assert cli(tmp_path, "status", "nope").returncode == 2  # and the next one runs as before


def test_a_process_runs_this_checkout_whatever_the_environment_says(tmp_path):
    other = tmp_path / "other" / "clusterjob"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text("print('another clusterjob')\n")
    for env in ({**base_env(), "PYTHONPATH": str(other.parent)}, {k: v for k, v in base_env().items() if k != "PYTHONPATH"}):
        done = cli(tmp_path, "--version", env=env, process=True)
        assert (done.returncode, done.stdout) == (0, cli(tmp_path, "--version").stdout), done.stdout + done.stderr
        assert done.args[-2:] == ["clusterjob", "--version"]
