"""Which run folder a raw sbatch job's task takes (clusterjob.run): its own ``slurm-<id>``
across requeues and restarts of the same start, never the run of an earlier job that
had the same id, of another spec, or a completed one (Slurm faked: its variables and
the SubmitTime that ``scontrol show job`` gives; the sbatch test on the local cluster
runs it for real)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterjob import run as runner
from clusterjob.core import slurmctl
from clusterjob.core.rundir import RunDir


@pytest.fixture
def job(monkeypatch, tmp_path):
    """Set the job's restart count and SubmitTime: ``job(restarts, submitted)``."""
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")

    def set_job(restarts: int, submitted: str) -> None:
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restarts))
        monkeypatch.setattr(slurmctl, "submit_time", lambda job_id: submitted if job_id == "7" else None)
    return set_job


def choose(tmp_path: Path, lr: float = 0.1) -> Path:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "exp", "train": {"lr": lr}, "output": {"root": str(tmp_path)}}))
    args = runner.parse_args([str(spec_file)])
    spec, params = runner._spec_point(args, runner.taskenv.detect(environ={}))
    return runner._choose_run(args, spec, params).path


def test_a_job_keeps_its_folder_and_a_later_job_with_its_id_gets_its_own(tmp_path, job, capsys):
    job(0, "2026-01-01T10:00:00")
    first = choose(tmp_path)
    assert first.name == "slurm-7"
    info = RunDir(first).read()
    assert (info.slurm_job_id, info.slurm_job_submitted) == ("7", "2026-01-01T10:00:00")
    assert choose(tmp_path) == first  # the same start again (torchrun restarting its workers)
    job(0, "2026-02-01T10:00:00")  # Slurm gave id 7 to a new job
    second = choose(tmp_path)
    assert second.name == "slurm-7-2"
    assert f"{first} is a run of another job with the same id; this job runs in {second}" in capsys.readouterr().out
    job(1, "2026-02-01T11:00:00")  # that job requeued: a new SubmitTime
    assert choose(tmp_path) == second


def test_a_requeued_job_never_continues_a_completed_run_or_another_spec(tmp_path, job, capsys):
    job(0, "2026-01-01T10:00:00")
    first = choose(tmp_path)
    job(1, "2026-01-01T11:00:00")
    changed = choose(tmp_path, lr=0.2)  # the spec file was edited before the requeue
    assert changed.name == "slurm-7-2" and "is a run of another spec" in capsys.readouterr().out
    RunDir(changed).update(status="completed")
    job(2, "2026-01-01T12:00:00")
    again = choose(tmp_path, lr=0.2)
    assert again.name == "slurm-7-3" and f"{changed} is completed" in capsys.readouterr().out
    assert RunDir(first).read().status == "pending" and RunDir(changed).read().status == "completed"
