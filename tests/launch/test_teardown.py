"""The raw templates' teardown (``python -m clusterjob.launch.teardown STATUS SPEC ...``)
without a cluster: it finds the job's run folder by the runner's rule and names the rank
that ended the session, from srun's report in its own stderr (the job script's log) or
torchrun's root cause in the node's log, this session's part only. The same on the real
cluster: tests/launch/test_slurm_templates.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from clirun import REPO, base_env

from clusterjob.core.record import SLURM, Job
from clusterjob.core.rundir import create_run
from clusterjob.launch.resources import SESSION_MARK

ROOT_CAUSE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
clusterjob.run FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_23:24:31
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1191)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1191
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_23:24:31
  host      : node1
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 1192)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1192
======================================================
"""


@pytest.fixture
def job(tmp_path):
    """A raw template's run (slurm-12, stopped by the SIGTERM torchrun sent its other
    rank), its ranks' logs linked to one node log, and the teardown run with a log."""
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"name": "exp", "output": {"root": str(tmp_path / "r")}}))
    run = create_run(tmp_path / "r", "exp", "slurm-12", (tmp_path / "spec.yaml").read_text(), {},
                     job=Job(SLURM, "12"), slurm_job_submitted="2026-11-25T23:00:00")
    run.update(status="preempted", hosts=["node1"])
    node_log = tmp_path / "job-12.node0.err"
    run.logs.mkdir(exist_ok=True)
    for rank in (0, 1):
        (run.logs / f"rank{rank}.err").symlink_to(node_log)

    def teardown(node: str, batch: str, status: str = "1", restarts: str = "1") -> subprocess.CompletedProcess:
        node_log.write_text(node)
        log = tmp_path / "job-12.err"
        log.write_text(batch)
        env = {**base_env(), "SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": restarts, "PYTHONPATH": str(REPO)}
        with open(log, "a") as err:
            return subprocess.run([sys.executable, "-m", "clusterjob.launch.teardown", status, "spec.yaml"],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True, timeout=60)
    return run, teardown


def test_the_rank_torchrun_names_as_the_root_cause_is_the_error(job):
    run, teardown = job
    done = teardown(f"{SESSION_MARK}\n{ROOT_CAUSE.format(rank=1, code=-9)}",
                    f"{SESSION_MARK}\nsrun: error: node1: task 0: Exited with exit code 1\n")
    assert done.returncode == 1  # the job fails: the run did not complete
    info = run.read()
    assert (info.status, info.error.rank) == ("failed", 1)
    assert info.error.message == "rank 1 on node1 was killed by SIGKILL (no traceback)"


def test_a_task_srun_reports_killed_is_named(job):
    run, teardown = job
    done = teardown("", f"{SESSION_MARK}\nsrun: error: node1: task 0: Terminated\n"
                        "srun: error: node1: task 1: Killed\n", status="137")
    assert done.returncode == 1
    assert run.read().error.message == "task 1 on node1: Killed (ended by a signal, no traceback)"


def test_an_earlier_sessions_root_cause_is_not_this_ones(job):
    run, teardown = job
    done = teardown(f"{ROOT_CAUSE.format(rank=1, code=-9)}{SESSION_MARK}\n{ROOT_CAUSE.format(rank=0, code=3)}",
                    f"{SESSION_MARK}\nsrun: error: node1: task 0: Exited with exit code 1\n")
    assert done.returncode == 1
    info = run.read()
    assert (info.status, info.error.rank, info.error.message) == ("failed", 0, "rank 0 on node1 exited with code 3 "
                                                                              "(no traceback)")


def test_a_completed_run_exits_0_and_a_job_without_a_run_keeps_srun_status(job, tmp_path):
    run, teardown = job
    run.update(status="completed")
    assert teardown("", "", status="0").returncode == 0 and run.read().status == "completed"
    (tmp_path / "r" / "exp" / "slurm-12" / "run.json").rename(tmp_path / "moved.json")  # no run of job 12 there
    assert teardown("", "", status="2").returncode == 2


def test_the_job_run_is_found_as_the_runner_finds_it(tmp_path):
    """A requeued job (restart count 1) continues the newest folder recording its id."""
    from clusterjob.taskenv import jobrun
    from clusterjob.taskenv.slurmjob import SlurmJob

    parent = tmp_path / "exp"
    for name, job_id in (("slurm-7", "7"), ("slurm-7-2", "7"), ("slurm-7-3", "8")):
        create_run(tmp_path, "exp", name, "name: exp\n", {}, job=Job(SLURM, job_id))
    found = jobrun.find(parent, SlurmJob("7", restart_count=1))
    assert found is not None and found.path.name == "slurm-7-2"
    assert jobrun.find(parent, SlurmJob("9", restart_count=1)) is None
    assert [n for n, _ in jobrun.job_runs(parent, "7")] == [1, 2, 3]
    assert json.loads((parent / "slurm-7-3" / "run.json").read_text())["slurm_job_id"] == "8"
