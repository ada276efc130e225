"""Run state that does not lie, with real processes through the command line: of three
`clusterjob resume` of one stopped run exactly one starts it, and a run whose every
process was killed (-9) shows as failed in `status` (which writes nothing) and resumes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from clirun import WAIT_S, cli, start
from healthutil import processes_of
from trainutil import epochs_of, run_info, write_spec

from clusterjob.core import procs

pytestmark = pytest.mark.slow

FINAL = ("completed", "failed", "cancelled")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def only_run(tmp_path: Path, name: str) -> Path:
    (run,) = [p for p in (tmp_path / "results" / name).iterdir() if not p.name.startswith(".")]
    return run


def files_of(folder: Path) -> dict:
    """{relative path: sha256} of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def rank_refs(run: Path) -> list:
    return [procs.ProcessRef.from_dict(json.loads(p.read_text())) for p in sorted((run / "logs").glob("rank*.proc.json"))]


def test_three_resumes_at_once_start_the_run_once(tmp_path):
    spec = write_spec(tmp_path, "race", train={"epochs": 3}, data={"limit_train": 1024},
                      debug={"exit_after_epoch": 1})
    first = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = only_run(tmp_path, "race")
    assert run_info(run)["status"] == "preempted", first.stdout + first.stderr
    resumes = [start(tmp_path, "resume", str(run)) for _ in range(3)]
    done = [(p.wait(timeout=WAIT_S), *p.communicate()) for p in resumes]
    assert sorted(code for code, _, _ in done) == [0, 2, 2], done
    for code, out, err in done:
        if code == 2:  # one line naming who has the run
            (line,) = err.splitlines()
            assert line.startswith(f"clusterjob: error: {run} is "), line
            assert ("is claimed by clusterjob resume (pid " in line or "is claimed by local supervisor (pid " in line
                    or "(its processes are alive: supervisor pid " in line), line
        else:
            assert f"resuming {run} (local)" in out
    wait_for(lambda: run_info(run)["status"] in FINAL, WAIT_S, "the resumed run to end")
    info = run_info(run)
    assert info["status"] == "completed", info
    assert [r["epoch"] for r in epochs_of(run)] == [1, 2, 3]
    assert info["restarts"] == 1 and info["requeues"] == 0


def test_a_run_whose_every_process_was_killed_is_failed_and_resumes(tmp_path):
    spec = write_spec(tmp_path, "killed", train={"epochs": 4}, data={"limit_train": 4096},
                      resources={"tasks_per_node": 2})
    detached = cli(tmp_path, "submit", str(spec), "--executor", "local")
    assert detached.returncode == 0, detached.stderr
    run = only_run(tmp_path, "killed")
    wait_for(lambda: (run / "metrics.jsonl").exists() and len(rank_refs(run)) == 2, WAIT_S, "the first epoch")
    everyone = [procs.ProcessRef.from_dict(run_info(run)["launcher"]), *rank_refs(run)]
    for ref in everyone:  # stopped first, so that none sees the others die and records it
        os.kill(ref.pid, signal.SIGSTOP)
    for ref in reversed(everyone):
        os.kill(ref.pid, signal.SIGKILL)
    wait_for(lambda: all(procs.check(ref) is not None for ref in everyone), WAIT_S, "the processes to die")
    # each rank's health watcher ends with it and marks its end (logs/rank<R>.ended) first
    wait_for(lambda: not processes_of(run), WAIT_S, "the ranks' watchers to end")
    assert run_info(run)["status"] == "running"  # what the run recorded: nobody lived to say otherwise

    before = files_of(tmp_path / "results")
    status = cli(tmp_path, "status", "results/killed")
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith(f"killed/{run.name}"))
    assert row.split()[1] == "failed", status.stdout
    assert "every process of the run ended before it recorded its end" in status.stdout
    assert files_of(tmp_path / "results") == before  # read only: nothing written, no lock made

    resumed = cli(tmp_path, "resume", str(run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = run_info(run)
    assert info["status"] == "completed" and info["restarts"] == 1 and info["error"] is None
    epochs = [r["epoch"] for r in epochs_of(run)]
    assert epochs == [1, 2, 3, 4]
