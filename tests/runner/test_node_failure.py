"""Slurm's NODE_FAIL as a retry: a job Slurm requeued after a node failure counts it in
``retries`` (not ``requeues``) when retries are on, and fails once none is left
(clusterjob.runner.runrecord.after_requeue, with fake Slurm answers)."""

from __future__ import annotations

import pytest
from fakeslurm import in_job

from clusterjob.core import slurmctl
from clusterjob.core.record import Job
from clusterjob.core.rundir import create_run
from clusterjob.runner import runrecord
from clusterjob.taskenv.slurmjob import SlurmJob


@pytest.fixture
def requeued(tmp_path, monkeypatch):
    """A run of job 40 in its second session, after a first that ended as ``state``."""
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {}, executor="slurm", job=Job("slurm", "40"))
    run.update(status="running", hosts=["node1", "node2"])
    monkeypatch.setattr(runrecord.taskenv, "current", lambda: in_job(SlurmJob("40", restart_count=1)))

    def set_state(state):
        monkeypatch.setattr(slurmctl, "previous_state", lambda job: state if job == "40" else None)
        return run
    return set_state


def test_a_node_failure_is_a_retry(requeued):
    run = requeued("NODE_FAIL")
    assert runrecord.after_requeue(run, max_retries=2) == "go"
    info = run.read()
    assert info.retries == 1 and not info.requeues
    (attempt,) = info.attempts
    assert attempt.why == "node failure (Slurm ended job 40 with NODE_FAIL on node1, node2)" and attempt.retry == 1
    assert runrecord.after_requeue(run, max_retries=2) == "go" and len(run.read().attempts) == 1  # counted once


def test_a_node_failure_with_no_retry_left_fails_the_run(requeued, monkeypatch):
    run = requeued("NODE_FAIL")
    run.update(retries=1, requeues=0)
    monkeypatch.setattr(runrecord.taskenv, "current", lambda: in_job(SlurmJob("40", restart_count=2)))
    assert runrecord.after_requeue(run, max_retries=1) == "failed"
    info = run.read()
    assert info.status == "failed" and "resources.max_retries=1 reached" in info.error.message


@pytest.mark.parametrize("state, max_retries", [("REQUEUED", 2), ("PREEMPTED", 2), (None, 2), ("NODE_FAIL", 0)])
def test_other_requeues_stay_requeues(requeued, state, max_retries):
    run = requeued(state)
    assert runrecord.after_requeue(run, max_retries) == "go"
    assert run.read().attempts == [] and not run.read().retries
