"""What the commands say about a run, through the real command line and real processes:
a multi-line error shown line by line and once, no "None" in any text, the rank log's
last line in the units of the report and in the word of the state the run ended in,
cancel and status in the same words, resume saying where it starts, `logs` saying why a
rank has no log, and a dry run to Slurm without Slurm."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, base_env, cli, start
from owncode import Project
from slurmcluster import wait_for
from trainutil import write_spec

from clusterjob.core import procs, units

pytestmark = pytest.mark.slow

# a run that trains until stopped: 1 rank, 1024 samples in batches of 8, a progress line every 2 steps
LONG = dict(train={"epochs": 40, "batch_size": 8, "log_every": 2, "lr": 0.005},  # a small lr: no divergence mid-test
            data={"limit_train": 1024, "limit_val": 64},
            resources={"tasks_per_node": 1})


def runs_of(tmp_path: Path, name: str) -> list[Path]:
    return sorted(p for p in (tmp_path / "results" / name).iterdir() if not p.name.startswith("."))


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def progressed(run: Path) -> bool:
    log = run / "logs" / "rank0.out"
    return log.exists() and "[progress]" in log.read_text(errors="replace")


def refs(run: Path) -> list:
    found = [procs.ProcessRef.from_dict(json.loads(p.read_text())) for p in sorted((run / "logs").glob("*.proc.json"))]
    return [procs.ProcessRef.from_dict(info(run)["launcher"]), *found]


MULTI_LINE = """tries = ["Error downloading x.gz:", "Tried https://a.example/, got:", "<urlopen error refused>"]
raise RuntimeError(chr(10).join(tries))
"""


def test_a_multi_line_error_is_shown_line_by_line_and_once(tmp_path):
    project = Project(tmp_path)
    project.spec(MULTI_LINE)
    done = project.submit()
    assert done.returncode == 1, done.stdout + done.stderr
    run = project.run
    out = done.stdout.splitlines()
    at = next(i for i, line in enumerate(out) if "  failed  " in line)
    assert out[at] == f"{run.name}  failed  error (rank 0): RuntimeError: Error downloading x.gz:  -> {run}"
    assert out[at + 1:at + 3] == ["    Tried https://a.example/, got:", "    <urlopen error refused>"]
    status = cli(tmp_path, "status", "results").stdout.splitlines()
    at = next(i for i, line in enumerate(status) if line.startswith(f"{run.name}: "))
    assert status[at:at + 3] == [f"{run.name}: failed on rank 0: RuntimeError: Error downloading x.gz:",
                                 "    Tried https://a.example/, got:", "    <urlopen error refused>"]
    assert status[at + 3].startswith('    File "') and status[at + 3].endswith("train.py\", line 2, in <module>")
    assert status[at + 4:] == ["      raise RuntimeError(chr(10).join(tries))"]  # not the message a second time
    assert "\\n" not in "\n".join(status)


def test_ranks_that_exit_without_finishing_name_no_rank(tmp_path):
    project = Project(tmp_path)
    project.spec("import os\nos._exit(0)\n")
    done = project.submit()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{project.run.name}  failed  error: the ranks exited without finishing the run  -> " in done.stdout
    status = cli(tmp_path, "status", "results").stdout
    assert f"{project.run.name}: failed: the ranks exited without finishing the run" in status
    assert "None" not in done.stdout + status


def test_a_run_whose_every_process_was_killed_shows_no_none(tmp_path):
    spec = write_spec(tmp_path, "killed", **LONG)
    assert cli(tmp_path, "submit", str(spec), "--executor", "local").returncode == 0
    (run,) = runs_of(tmp_path, "killed")
    wait_for(lambda: progressed(run), WAIT_S, "a progress line")
    mine = refs(run)
    assert len(mine) == 2 and all(procs.terminate(ref, signal.SIGKILL) is None for ref in mine)  # verified first
    wait_for(lambda: all(procs.check(ref) is not None for ref in mine), WAIT_S, "the processes to end")
    status = cli(tmp_path, "status", "results").stdout
    assert f"{run.name}: failed: every process of the run ended before it recorded its end (" in status
    shown = status + cli(tmp_path, "logs", str(run)).stdout + cli(tmp_path, "report", "results", "--runs").stdout
    assert "None" not in shown and "rank None" not in shown


def test_a_finished_run_s_logs_say_why_a_rank_has_none_and_end_in_the_report_s_units(tmp_path):
    spec = write_spec(tmp_path, "two", resources={"tasks_per_node": 2})
    assert cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait").returncode == 0
    (run,) = runs_of(tmp_path, "two")
    final = info(run)["final"]
    last = (run / "logs" / "rank0.out").read_text().splitlines()[-1]
    assert last == f"completed {run}: " + " ".join(f"{k} {units.quantity(k, v)}" for k, v in final.items())
    assert f"val_acc {100 * final['val_acc']:.2f}%" in last and str(final["val_acc"]) not in last
    for rank, follow in ((5, ()), (5, ("--follow",)), (-1, ())):
        done = cli(tmp_path, "logs", str(run), "--rank", str(rank), *follow)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == f"clusterjob: error: --rank {rank}: {run} has no rank {rank}: its 2 rank(s) are 0..1"
    for path in (run / "logs").glob("rank1.*"):
        path.unlink()
    gone = cli(tmp_path, "logs", str(run), "--rank", "1")
    assert gone.returncode == 2 and gone.stderr.strip() == (
        f"clusterjob: error: no logs for rank 1 in {run / 'logs'}: the run is completed and the rank's log "
        "files are gone")


def test_cancel_and_status_agree_and_resume_says_where_it_starts(tmp_path):
    one_at_a_time = {**LONG, "resources": {**LONG["resources"], "array_parallelism": 1}}  # the second waits its turn
    spec = write_spec(tmp_path, "pair", **one_at_a_time, sweep={"train.epochs": [40, 1]})
    assert cli(tmp_path, "submit", str(spec), "--executor", "local").returncode == 0
    first, second = sorted(runs_of(tmp_path, "pair"), key=lambda r: -yaml.safe_load((r / "spec.yaml").read_text())[
        "train"]["epochs"])
    wait_for(lambda: progressed(first), WAIT_S, "the first run's progress")
    waiting = cli(tmp_path, "cancel", str(second))  # its supervisor skips it once the first run ended
    assert waiting.returncode == 0 and waiting.stdout.splitlines()[-1] == f"{second}: pending (cancel requested)"
    row = next(line for line in cli(tmp_path, "status", "results").stdout.splitlines() if second.name in line)
    assert "pending (cancel requested)" in row, row
    running = cli(tmp_path, "cancel", str(first))
    assert running.returncode == 0 and running.stdout.splitlines()[-1] == f"{first}: cancelled", running.stdout
    wait_for(lambda: info(second)["status"] == "cancelled", WAIT_S, "the supervisor to skip the cancelled run")
    assert (first / "logs" / "rank0.out").read_text().splitlines()[-1] == "stopped (cancelled)"
    resumed = cli(tmp_path, "resume", str(second), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resuming {second} (local) from the beginning: it never started"


def test_ctrl_c_of_submit_wait_ends_cancelled_and_the_log_says_so(tmp_path):
    spec = write_spec(tmp_path, "stop", **LONG)
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    wait_for(lambda: any(map(progressed, (tmp_path / "results").glob("stop/*"))), WAIT_S, "a progress line")
    (run,) = runs_of(tmp_path, "stop")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130 and info(run)["status"] == "cancelled", out + err
    log = (run / "logs" / "rank0.out").read_text()
    assert log.splitlines()[-1] == "stopped (cancelled)" and "preempted" not in log
    again = cli(tmp_path, "resume", str(run))
    assert again.stdout.splitlines()[0] == f"resuming {run} (local) from its last checkpoint", again.stdout
    wait_for(lambda: info(run)["status"] == "running", WAIT_S, "the resumed run to start")
    assert cli(tmp_path, "cancel", str(run)).stdout.splitlines()[-1] == f"{run}: cancelled"


def test_a_dry_run_to_slurm_without_slurm_prints_the_script(tmp_path):
    env = {**base_env(), "PATH": "/usr/bin/nonexistent", "SLURM_CONF": "/nonexistent"}
    spec = write_spec(tmp_path, "dry", sweep={"train.lr": [0.1, 0.2]})
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash") and "#SBATCH --array=0-1" in done.stdout
    assert done.stderr.startswith("note: --executor slurm: Slurm is not reachable from here")
    assert "A dry run needs no cluster, so here is what would be sent, unchecked" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dry.yaml"]  # nothing written
    assert cli(tmp_path, "submit", str(spec), "--executor", "slurm", env=env).returncode == 2  # a real submit needs it
