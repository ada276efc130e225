"""A rank that dies while another waits for it in a collective ends the run within
seconds, locally (the supervisor polls every rank at every tick) and in a Slurm job
(srun --kill-on-bad-exit): the run fails, or retries, naming the rank and how it ended,
long before ``dist.timeout_s`` (600 s here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli
from owncode import Project
from slurmcluster import job_of, submit, task_pid, wait_for

from clusterjob.core.record import Job
from clusterjob.core.rundir import create_run
from clusterjob.launch.executors import slurm as slurm_launch
from clusterjob.launch.resources import SESSION_MARK

# Rank 1 dies in the first ``kills`` sessions, ``how``: killed by SIGKILL or exiting with
# code 3 (no traceback either way), having written when; rank 0 meanwhile waits for it in
# save_checkpoint's barrier.
DYING = (
    "import os, signal, time, clusterjob\n"
    "restarts = int(os.environ['CLUSTERJOB_RESTARTS'])\n"
    "if os.environ['RANK'] == '1' and restarts < clusterjob.params['kills']:\n"
    "    time.sleep(1)\n"
    "    with open(os.path.join(os.environ['CLUSTERJOB_RUN_DIR'], f'died-{restarts}'), 'w') as f:\n"
    "        f.write(repr(time.time()))\n"
    "    if clusterjob.params['how'] == 'kill':\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "    os._exit(3)\n"
    "clusterjob.save_checkpoint({'step': 1}, step=1)\n"
    "clusterjob.log(step=1, sessions=float(restarts + 1))\n")
TIMEOUT_S = 600  # dist.timeout_s: what rank 0 would wait for a dead rank 1
SOON_S = 60.0  # from the death to the run's end (or its next start): generous, and far below TIMEOUT_S


def project(folder: Path, how: str, **resources) -> Project:
    own = Project(folder, "dead")
    path = own.spec(DYING)
    spec = yaml.safe_load(path.read_text())
    spec["params"] = {"kills": 1, "how": how}
    spec["dist"] = {"timeout_s": TIMEOUT_S}
    spec["resources"].update(tasks_per_node=2, **resources)
    path.write_text(yaml.safe_dump(spec))
    return own


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def died_at(run: Path, session: int = 0) -> float:
    return float((run / f"died-{session}").read_text())


@pytest.mark.parametrize("how, retries, said", [
    ("kill", 0, "rank 1 was killed by SIGKILL (no traceback)"),
    ("exit", 2, "rank 1 exited with code 3 (no traceback)"),  # the code's own exit: never retried
])
def test_a_dead_rank_fails_the_run_within_seconds_naming_it(tmp_path, how, retries, said):
    own = project(tmp_path, how, max_retries=retries)
    done = cli(own.folder, "submit", "dead.yaml", "--executor", "local", "--wait", timeout=WAIT_S)
    info = own.info()
    assert done.returncode == 1, done.stdout + done.stderr
    assert info["status"] == "failed" and info["error"]["rank"] == 1
    assert info["error"]["message"] == said
    assert seconds(info["finished_at"]) - died_at(own.run) < SOON_S
    assert "retries" not in info


def test_the_retry_after_a_killed_rank_starts_within_seconds(tmp_path):
    own = project(tmp_path, "kill", max_retries=1, retry_backoff_s=0.5)
    done = cli(own.folder, "submit", "dead.yaml", "--executor", "local", "--wait", timeout=WAIT_S)
    info = own.info()
    assert done.returncode == 0, done.stdout + done.stderr
    assert (info["status"], info["retries"]) == ("completed", 1)
    assert [(a["why"], a["retry"]) for a in info["attempts"]] == [("rank 1 was killed by SIGKILL", 1)]
    first, second = info["sessions"]
    assert seconds(second["at"]) - died_at(own.run) < SOON_S + 0.5
    assert info["final"] == {"sessions": 2.0, "step": 1}


# ----------------------------------------------------------------------------- in a Slurm job


@pytest.fixture
def ended_job(tmp_path):
    """A Slurm run whose step srun ended badly, with srun's lines in the job's log."""
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"name": "exp"}))
    run = create_run(tmp_path, "exp", "r1", (tmp_path / "spec.yaml").read_text(), {}, executor="slurm",
                     job=Job("slurm", "12"), log_dir=str(tmp_path))
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([str(run.path)]))

    def ended(status: str, log: str):
        run.update(status=status, hosts=["node1", "node2"])
        (tmp_path / "12_0_log.err").write_text(f"{SESSION_MARK}\n{log}")
        assert slurm_launch.finalize(str(runs_file), "0", "1") == 1  # the job fails
        return run.read()
    return ended


def test_a_killed_task_is_named_over_the_stop_its_siblings_recorded(ended_job):
    # srun --kill-on-bad-exit sent the other task SIGTERM, and its rank 0 recorded a stop
    info = ended_job("preempted", "srun: error: node2: task 1: Killed\nsrun: error: node1: task 0: Terminated\n")
    assert (info.status, info.error.rank) == ("failed", 1)
    assert info.error.message == "task 1 on node2: Killed (ended by a signal, no traceback)"


def test_a_task_that_exited_non_zero_without_a_traceback_is_named(ended_job):
    info = ended_job("running", "srun: error: node2: task 1: Exited with exit code 3\n"
                                "srun: error: node1: task 0: Terminated\n")
    assert (info.status, info.error.rank) == ("failed", 1)
    assert info.error.message == "task 1 on node2: exited with code 3 (no traceback)"


def test_a_torch_warning_is_never_the_killed_task_s_traceback(ended_job, tmp_path):
    # what a rank's stderr holds when its sibling's store closed: the rank said nothing itself
    (tmp_path / "exp" / "r1" / "logs" / "rank1.err").write_text(
        "epoch 1/3 step 4/8\n[W1206 12:00:00.123456789 socket.cpp:207] [c10d] The hostname of the client "
        "socket cannot be retrieved. err=-3\n")
    info = ended_job("running", "srun: error: node2: task 1: Killed\nsrun: error: node1: task 0: Terminated\n")
    assert (info.status, info.error.rank) == ("failed", 1)
    assert info.error.traceback == "epoch 1/3 step 4/8", info.error



@pytest.mark.slurm
def test_a_rank_killed_in_a_slurm_job_ends_the_job_within_seconds(slurm_cluster, tmp_path):
    (tmp_path / "train.py").write_text(DYING.replace("os.kill(os.getpid(), signal.SIGKILL)",
                                                     "time.sleep(600)"))  # killed from outside, below
    spec = {"name": "dead", "entrypoint": {"script": "train.py"}, "params": {"kills": 1, "how": "kill"},
            "dist": {"timeout_s": TIMEOUT_S}, "output": {"root": str(tmp_path / "results")},
            "resources": {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 15}}
    (tmp_path / "dead.yaml").write_text(yaml.safe_dump(spec))
    (run,) = submit(slurm_cluster, tmp_path / "dead.yaml")
    job = job_of(run)  # from the sweep's record: run.json names it once the ranks started
    wait_for(lambda: (run / "died-0").exists(), WAIT_S, "rank 1 to start")
    os.kill(task_pid(job, 1), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not _queued(slurm_cluster, job), WAIT_S, "the job to leave the queue")
    took = time.monotonic() - killed
    shown = cli(tmp_path, "status", "results", env=slurm_cluster.env())
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["error"]["rank"] == 1, info
    assert info["error"]["message"].startswith("task 1 on node2: Killed"), info["error"]
    said = info["error"]["traceback"].splitlines()  # the rank's own last lines: never torch's warnings
    assert not [line for line in said if line.startswith(("[W", "[I", "[rank"))], info["error"]
    assert "failed on rank 1: task 1 on node2: Killed" in shown.stdout, shown.stdout
    assert took < SOON_S + 10, took  # squeue is asked every 0.5 s, and Slurm's epilog runs first


def _queued(cluster, job: str) -> bool:
    return bool(subprocess.run(["squeue", "-h", "-o", "%T", "-j", job], capture_output=True, text=True,
                               env=cluster.env()).stdout.strip())
