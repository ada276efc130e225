"""Retries after a failure of the machine (``resources.max_retries``): the local supervisor
with real processes (a rank killed with SIGKILL is retried, a Python error is not, the
cap holds), and the Slurm job script's teardown line with fake Slurm commands."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import cli

from clusterjob.core import slurmctl
from clusterjob.core.record import Job
from clusterjob.core.rundir import RunDir, create_run
from clusterjob.launch.executors import slurm as slurm_launch
from clusterjob.launch.resources import SESSION_MARK

# Rank 1 kills itself with SIGKILL in the first ``kills`` sessions (a node going away);
# the run counts its sessions in a file of its own.
KILLED = (
    "import os, signal, time, clusterjob\n"
    "restarts = int(os.environ['CLUSTERJOB_RESTARTS'])\n"
    "time.sleep(1)\n"
    "if os.environ['RANK'] == '1' and restarts < clusterjob.params['kills']:\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(2)\n"
    "clusterjob.log(step=1, sessions=float(restarts + 1))\n")
RAISING = "import os, time\ntime.sleep(1)\nif os.environ['RANK'] == '1':\n    raise KeyError('label')\ntime.sleep(5)\n"


def project(folder: Path, script: str, **resources) -> Path:
    (folder / "train.py").write_text(script)
    spec = {"name": "retry", "entrypoint": {"script": "train.py"}, "params": {"kills": 1},
            "resources": {"cpus_per_task": 1, "tasks_per_node": 2, "retry_backoff_s": 0.5, **resources},
            "output": {"root": str(folder / "results")}}
    (folder / "retry.yaml").write_text(yaml.safe_dump(spec))
    return folder / "retry.yaml"


def submit(folder: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = cli(folder, "submit", "retry.yaml", "--executor", "local", "--wait", *extra)
    (run,) = [p for p in (folder / "results" / "retry").iterdir() if not p.name.startswith(".")]
    return done, json.loads((run / "run.json").read_text())


def test_a_rank_killed_by_sigkill_is_retried_from_the_last_checkpoint(tmp_path):
    project(tmp_path, KILLED, max_retries=2)
    done, info = submit(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (info["status"], info["retries"], info["requeues"]) == ("completed", 1, 0)
    (attempt,) = info["attempts"]
    assert attempt["why"] == "rank 1 was killed by SIGKILL" and attempt["retry"] == 1 and attempt["hosts"]
    assert info["final"] == {"sessions": 2.0, "step": 1}
    assert "rank 1 was killed by SIGKILL; retry 1 of 2 from the last checkpoint in 0.5 s" in done.stdout
    shown = cli(tmp_path, "status", "results").stdout
    assert "completed" in shown and "retried 1x" in shown


def test_the_retries_stop_at_max_retries_with_every_attempt_recorded(tmp_path):
    spec = project(tmp_path, KILLED, max_retries=1)
    done, info = submit(tmp_path, "--set", "params.kills=5")
    assert done.returncode == 1 and spec.exists()
    assert (info["status"], info["retries"]) == ("failed", 1)
    assert [(a["why"], a["retry"]) for a in info["attempts"]] == [("rank 1 was killed by SIGKILL", 1),
                                                                   ("rank 1 was killed by SIGKILL", None)]
    assert info["error"]["message"] == "rank 1 was killed by SIGKILL (no traceback)"
    assert "resources.max_retries=1 reached" in done.stdout


def test_a_python_error_is_never_retried(tmp_path):
    project(tmp_path, RAISING, max_retries=3)
    done, info = submit(tmp_path)
    assert done.returncode == 1
    assert info["status"] == "failed" and "KeyError" in info["error"]["message"]
    assert "retries" not in info and "attempts" not in info


# ----------------------------------------------------------------------------- the Slurm job script's teardown


@pytest.fixture
def slurm_run(tmp_path, monkeypatch):
    """A Slurm run whose session srun ended badly; scontrol answers through fakes."""
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"name": "exp", "resources": {"max_retries": 2,
                                                                                      "retry_backoff_s": 45}}))
    run = create_run(tmp_path, "exp", "r1", (tmp_path / "spec.yaml").read_text(), {}, executor="slurm",
                     job=Job("slurm", "12_3"), log_dir=str(tmp_path))
    run.update(status="running", hosts=["node1", "node2"])
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([str(run.path)]))
    asked: list = []
    monkeypatch.setattr(slurmctl, "requeue", lambda job: asked.append(("requeue", job)) or True)
    monkeypatch.setattr(slurmctl, "start_later", lambda job, s: asked.append(("start_later", job, s)) or True)
    handler = signal.getsignal(signal.SIGTERM)  # the teardown ignores SIGTERM around its requeue
    yield run, runs_file, asked
    signal.signal(signal.SIGTERM, handler)  # later tests' processes would inherit the ignore


def _log(run: RunDir, text: str) -> None:
    (Path(run.read().log_dir) / "12_3_0_log.err").write_text(text)


def test_a_killed_task_requeues_the_job_as_a_retry(slurm_run):
    run, runs_file, asked = slurm_run
    _log(run, f"{SESSION_MARK}\nsrun: error: node1: task 0: Terminated\nsrun: error: node2: task 1: Killed\n")
    assert slurm_launch.finalize(str(runs_file), "0", "137") == 0
    info = run.read()
    assert (info.status, info.retries, info.error) == ("pending", 1, None)
    assert [(a.why, a.hosts, a.retry, a.job) for a in info.attempts] == [
        ("task 1 on node2: Killed", ["node1", "node2"], 1, "12_3")]
    assert asked == [("requeue", "12_3"), ("start_later", "12_3", 45)]


@pytest.mark.parametrize("log, why", [
    (f"{SESSION_MARK}\nsrun: error: node2: task 1: Out Of Memory\n", "the job's own memory"),
    (f"{SESSION_MARK}\nsrun: error: node1: task 0: Exited with exit code 2\n", "bad input"),
    (f"srun: error: node2: task 1: Killed\n{SESSION_MARK}\nsrun: error: node1: task 0: Exited with exit code 1\n",
     "a kill of an earlier session"),
])
def test_no_retry_for_memory_bad_input_or_an_earlier_session(slurm_run, log, why):
    run, runs_file, asked = slurm_run
    _log(run, log)
    assert slurm_launch.finalize(str(runs_file), "0", "1") == 1, why  # the job fails
    assert run.read().status == "failed" and asked == [] and run.read().attempts == []


def test_an_exhausted_retry_budget_fails_the_job(slurm_run):
    run, runs_file, asked = slurm_run
    run.update(retries=2)
    _log(run, f"{SESSION_MARK}\nsrun: error: node2: task 1: Killed\n")
    assert slurm_launch.finalize(str(runs_file), "0", "137") == 1
    info = run.read()
    assert info.status == "failed" and info.error.message.startswith("task 1 on node2: Killed")
    assert [a.retry for a in info.attempts] == [None] and asked == []
