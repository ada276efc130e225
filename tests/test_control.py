"""Job control without a cluster: reconciling run.json with the queue, requeue caps,
array chunking, truncated checkpoints (Slurm commands faked, files real)."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from clusterjob import checkpoint, control, slurmctl
from clusterjob.launch import slurm as slurm_launch
from clusterjob.rundir import RunDir, create_run
from clusterjob.spec import dump_spec, expand_sweep, spec_from_dict


def make_run(tmp_path, run_id="r1", **fields) -> RunDir:
    run = create_run(tmp_path, "exp", run_id, dump_spec(spec_from_dict({"name": "exp"})), {})
    run.update(**fields)
    return run


@pytest.fixture
def fake_slurm(monkeypatch):
    state = SimpleNamespace(queue={}, sacct={})
    monkeypatch.setattr(slurmctl, "queue_states", lambda ids: {i: s for i, s in state.queue.items() if i in ids})
    monkeypatch.setattr(slurmctl, "accounting_states", lambda ids: {i: s for i, s in state.sacct.items() if i in ids})
    return state


def test_a_job_gone_without_accounting_is_failed_not_unknown(tmp_path, fake_slurm):
    run = make_run(tmp_path, status="running", slurm_job_id="77", executor="slurm")
    (info,) = control.refresh([run])
    assert info["status"] == "failed" and "no accounting record" in info["error"]["message"]
    assert run.read_info()["status"] == "failed"  # written back for the report


def test_queue_and_accounting_states(tmp_path, fake_slurm):
    queued = make_run(tmp_path, "a", status="preempted", slurm_job_id="5_1", executor="slurm")
    cancelled = make_run(tmp_path, "b", status="running", slurm_job_id="6", executor="slurm")
    timed_out = make_run(tmp_path, "c", status="running", slurm_job_id="7", executor="slurm")
    done = make_run(tmp_path, "d", status="completed", slurm_job_id="8", executor="slurm")
    fake_slurm.queue = {"5_1": "PENDING"}
    fake_slurm.sacct = {"6": "CANCELLED", "7": "TIMEOUT", "8": "FAILED"}
    infos = control.refresh([queued, cancelled, timed_out, done])
    assert [i["status"] for i in infos] == ["preempted", "cancelled", "timeout", "completed"]
    table = control.status_table([queued, cancelled, timed_out, done], infos)
    assert "preempted (pending)" in table and "exp/d" in table


def test_status_shows_the_failing_rank_and_traceback(tmp_path, fake_slurm):
    run = make_run(tmp_path, status="failed", error={"rank": 1, "message": "RuntimeError: boom",
                                                     "traceback": "Traceback...\n  line\nRuntimeError: boom"})
    text = control.status_table([run], control.refresh([run]))
    assert "failed on rank 1: RuntimeError: boom" in text and "    RuntimeError: boom" in text


def test_cancel_marks_cancelled_and_later_writes_keep_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(slurmctl, "cancel", lambda job: calls.append(job) or True)
    run = make_run(tmp_path, status="running", slurm_job_id="9", executor="slurm")
    assert control.cancel(run)["status"] == "cancelled" and calls == ["9"]
    run.update(status="completed", final={"epoch": 3})  # a dying task's late write
    assert run.read_info()["status"] == "cancelled" and run.read_info()["final"] == {"epoch": 3}
    with pytest.raises(Exception, match="already cancelled"):
        control.cancel(run)


def test_requeue_cap_fails_the_run_instead_of_requeueing(tmp_path, monkeypatch):
    from clusterjob import worker
    from clusterjob.env import SlurmJob
    from clusterjob.preempt import StopSignal

    requeued = []
    monkeypatch.setattr(worker.envmod, "slurm_job", lambda environ=None: SlurmJob("40"))
    monkeypatch.setattr(slurmctl, "requeue", lambda job: requeued.append(job) or True)
    monkeypatch.setattr(slurmctl, "time_left_s", lambda job: 3000)
    spec = spec_from_dict({"name": "exp", "resources": {"max_requeues": 1}})
    run = make_run(tmp_path, status="running", requeues=0)
    stop = StopSignal()
    stop.received_at = 1.0
    worker._record_stop(run, spec, stop)
    assert run.read_info()["status"] == "preempted" and run.read_info()["requeues"] == 1 and requeued == ["40"]
    worker._record_stop(run, spec, stop)
    info = run.read_info()
    assert info["status"] == "failed" and "max_requeues=1 reached" in info["error"]["message"]
    assert requeued == ["40"]
    monkeypatch.setattr(slurmctl, "time_left_s", lambda job: 100)
    assert worker._stop_reason(SlurmJob("40"), stop) == "timeout"


def test_sweeps_larger_than_max_array_size_are_chunked(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(slurm_launch, "max_array_size", lambda: 2)
    spec = spec_from_dict({"name": "exp", "sweep": {"train.seed": [0, 1, 2, 3, 4]},
                           "resources": {"array_parallelism": 4}, "output": {"root": str(tmp_path)}})
    slurm_launch.dry_run(spec, expand_sweep(spec))
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 3
    assert out.count("#SBATCH --array=0-1%2") == 2 and out.count("#SBATCH --array=0-0%1") == 1
    assert not any(tmp_path.iterdir())
    assert slurm_launch.chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


def test_slurm_parameters_follow_the_spec():
    spec = spec_from_dict({"name": "exp", "resources": {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4,
                                                       "cpus_per_task": 8, "mem_gb": 1.5, "time_min": 90,
                                                       "partition": "gpu", "qos": "high", "setup": ["module load x"]}})
    params = slurm_launch.slurm_parameters(spec, [])
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"], params["cpus_per_task"]) == (2, 4, 4, 8)
    assert params["mem"] == "1536M" and params["time"] == 90 and params["partition"] == "gpu" and params["qos"] == "high"
    assert params["setup"] == ["module load x", "export SRUN_CPUS_PER_TASK=8"] and "account" not in params
    assert "--kill-on-bad-exit=1" in params["srun_args"] and params["additional_parameters"] == {"requeue": True}
    cpu = slurm_launch.slurm_parameters(spec_from_dict({"name": "c", "resources": {"mem_gb": 0}}), [])
    assert "gpus_per_node" not in cpu and "mem" not in cpu


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    for epoch in (1, 2):
        checkpoint.save(tmp_path, epoch, {"epoch": epoch, "w": torch.full((64,), float(epoch))}, keep_last=2)
    latest = checkpoint.path_for(tmp_path, 2)
    latest.write_bytes(latest.read_bytes()[:100])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = checkpoint.load_latest(tmp_path)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(64))
    assert any("epoch-0002.pt does not load" in str(w.message) for w in caught)


def test_checkpoints_sort_mid_epoch_after_their_epoch_and_keep_last(tmp_path):
    for epoch, batches in ((1, 0), (1, 40), (2, 0), (2, 8)):
        checkpoint.save(tmp_path, epoch, {"epoch": epoch}, keep_last=3, batches=batches)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "epoch-0001-000040.pt", "epoch-0002.pt", "epoch-0002-000008.pt"]
    assert not list(tmp_path.glob(".*"))  # no temp files left


def test_finalize_names_a_killed_task(tmp_path):
    run = make_run(tmp_path, status="failed", slurm_job_id="12", log_dir=str(tmp_path),
                   error={"rank": 0, "message": "gloo: connection closed"})
    (tmp_path / "12_0_log.err").write_text("srun: error: node2: task 1: Terminated\n"
                                           "srun: error: node2: task 3: Killed\n")
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([str(run.path)]))
    slurm_launch.finalize(str(runs_file), "0", "137")
    error = run.read_info()["error"]
    assert error["rank"] == 3 and error["message"].startswith("task 3 on node2: Killed")
