"""Each start of a run is a session in run.json (the report's cost reads them): when, in
which Slurm job, and the checkpoint it resumes (clusterjob.runner.runrecord.mark_running)."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from fakeslurm import in_job

from clusterjob.core.record import Job
from clusterjob.core.rundir import create_run
from clusterjob.runner import runrecord
from clusterjob.taskenv.environment import detect
from clusterjob.taskenv.slurmjob import SlurmJob

ENV = detect({})  # one process, no job


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setattr(runrecord.taskenv, "current", lambda: in_job(SlurmJob("40_2", restart_count=0)))
    return create_run(tmp_path, "exp", "r1", "name: exp\n", {}, executor="slurm", job=Job("slurm", "40_2"))


def test_each_start_records_its_job_and_the_checkpoint_it_resumes(run):
    runrecord.mark_running(run, ENV, {})
    (run.checkpoints / "epoch-0001.pt").write_bytes(b"old")
    newest = run.checkpoints / "epoch-0002.pt"
    newest.write_bytes(b"new")
    os.utime(newest, (1_795_000_000.25, 1_795_000_000.25))
    runrecord.mark_running(run, ENV, {})
    first, second = run.read().sessions
    assert first.job == second.job == "40_2" and first.checkpoint_at is None and first.knows_checkpoints
    assert second.checkpoint_at == datetime.fromtimestamp(1_795_000_000.25, timezone.utc).isoformat(timespec="milliseconds")
    assert datetime.fromisoformat(first.at) <= datetime.fromisoformat(second.at)


def test_your_code_without_checkpoints_here_may_keep_them_elsewhere(run):
    runrecord.mark_running(run, ENV, {}, own_code=True)
    (run.checkpoints / "step-000000010.pt").write_bytes(b"x")
    runrecord.mark_running(run, ENV, {}, own_code=True)
    first, second = run.read().sessions
    assert first.knows_checkpoints is False and second.knows_checkpoints is True and second.checkpoint_at
