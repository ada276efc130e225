"""One retry decision (clusterjob.core.retry.decide) for the three places a failure of the
machine is met: the local supervisor, the Slurm job script's teardown line and the runner
that starts again after Slurm's NODE_FAIL. Each waits the back-off: the runner after a
NODE_FAIL waits out what Slurm's own hold of the requeued job did not cover."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta

import pytest
import yaml
from fakeslurm import in_job

from clusterjob.core import retry, slurmctl
from clusterjob.core.record import Job
from clusterjob.core.rundir import create_run
from clusterjob.launch.executors import slurm as slurm_launch
from clusterjob.launch.resources import SESSION_MARK
from clusterjob.runner import runrecord
from clusterjob.taskenv.slurmjob import SlurmJob

SPEC = {"name": "exp", "resources": {"max_retries": 2, "retry_backoff_s": 45}}


@pytest.fixture
def run(tmp_path):
    made = create_run(tmp_path, "exp", "r1", yaml.safe_dump(SPEC), {}, executor="slurm", job=Job("slurm", "40"),
                      log_dir=str(tmp_path))
    made.update(status="running", hosts=["node1", "node2"])
    return made


def test_retries_off_decide_nothing_and_record_nothing(run):
    assert retry.decide(run, "rank 1 was killed by SIGKILL", 0, 30) is None
    assert run.read().attempts == [] and run.read().status == "running"


def test_each_retry_waits_twice_the_one_before_and_says_so(run):
    first = retry.decide(run, "rank 1 was killed by SIGKILL", 3, 30, hosts=["vm"])
    assert (first.number, first.wait_s) == (1, 30)
    assert first.line == "rank 1 was killed by SIGKILL; retry 1 of 3 from the last checkpoint in 30 s"
    assert (first.record.status, first.record.retries, first.record.attempts[0].hosts) == ("pending", 1, ["vm"])
    second = retry.decide(run, "rank 1 was killed by SIGKILL", 3, 30)
    assert (second.number, second.wait_s, second.record.retries) == (2, 60, 2)


def test_with_no_retry_left_the_attempt_is_recorded_and_the_run_stays_as_it_was(run):
    run.update(retries=2, status="failed")
    last = retry.decide(run, "task 1 on node2: Killed", 2, 30, job="40")
    assert (last.number, last.wait_s) == (None, 0.0)
    assert last.line == "task 1 on node2: Killed; resources.max_retries=2 reached"
    assert (last.record.status, last.record.retries) == ("failed", 2)
    assert [(a.retry, a.job) for a in last.record.attempts] == [(None, "40")]


# ----------------------------------------------------------------------------- the callers


@pytest.fixture
def node_failed(run, monkeypatch):
    """The run's job in its second session, Slurm having requeued it after NODE_FAIL
    ``ago`` seconds before (its SubmitTime)."""
    monkeypatch.setattr(runrecord.taskenv, "current", lambda: in_job(SlurmJob("40", restart_count=1)))
    monkeypatch.setattr(slurmctl, "previous_state", lambda job: "NODE_FAIL")

    def requeued(ago: float):
        at = (datetime.now() - timedelta(seconds=ago)).isoformat(timespec="seconds")
        monkeypatch.setattr(slurmctl, "submit_time", lambda job: at)
        return run
    return requeued


def test_after_a_node_failure_the_ranks_wait_the_back_off_slurm_did_not_cover(node_failed, capsys):
    run = node_failed(5)  # Slurm held the requeued job 5 s; the back-off is 45 s
    decided = runrecord.after_requeue(run, max_retries=2, retry_backoff_s=45)
    kind, seconds = decided.split()
    assert kind == runrecord.WAIT and 39 <= float(seconds) <= 40
    info = run.read()
    assert (info.status, info.retries, [a.retry for a in info.attempts]) == ("pending", 1, [1])
    said = capsys.readouterr().out
    assert said.startswith("node failure (Slurm ended job 40 with NODE_FAIL on node1, node2); retry 1 of 2 from the "
                           f"last checkpoint in 45 s ({float(seconds):.0f} s left after Slurm's own hold)"), said


def test_after_a_node_failure_a_hold_longer_than_the_back_off_is_enough(node_failed):
    run = node_failed(121)  # Slurm's own delay of a requeued job (JobCredentialExpiration + 1 s)
    assert runrecord.after_requeue(run, max_retries=2, retry_backoff_s=45) == runrecord.GO
    assert run.read().retries == 1


def test_the_ranks_hold_until_the_wait_ends_or_a_stop_comes():
    started = time.monotonic()
    runrecord.hold(f"{runrecord.WAIT} 0.6", lambda: False)
    assert time.monotonic() - started >= 0.6
    started = time.monotonic()
    runrecord.hold(f"{runrecord.WAIT} 60", lambda: True)
    runrecord.hold(runrecord.GO, lambda: False)
    assert time.monotonic() - started < 30  # at the stop, not at the wait's end (60 s)


def test_the_job_script_requeues_and_holds_its_job_for_the_decided_wait(run, tmp_path, monkeypatch):
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([str(run.path)]))
    (tmp_path / "40_0_log.err").write_text(f"{SESSION_MARK}\nsrun: error: node2: task 1: Killed\n")
    asked: list = []
    monkeypatch.setattr(slurmctl, "requeue", lambda job: asked.append(("requeue", job)) or True)
    monkeypatch.setattr(slurmctl, "start_later", lambda job, s: asked.append(("start_later", job, s)) or True)
    handler = signal.getsignal(signal.SIGTERM)  # the teardown ignores SIGTERM around its requeue
    try:
        run.update(retries=1)  # the second retry waits twice the first back-off
        assert slurm_launch.finalize(str(runs_file), "0", "137") == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert asked == [("requeue", "40"), ("start_later", "40", 90)]
    assert [(a.why, a.retry) for a in run.read().attempts] == [("task 1 on node2: Killed", 2)]
