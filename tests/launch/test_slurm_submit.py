"""`clusterjob submit` on the real local Slurm (scripts/local-slurm): multi-node runs, arrays,
preemption with requeue, failures and cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli
from slurmcluster import check_cost_against_sacct, rank0_log, submit, task_pid, wait_for
from trainutil import epochs_of, final_state, max_abs_diff, run_info, write_spec

pytestmark = pytest.mark.slurm

# How soon after a rank raised or was killed every rank of the job has ended (Slurm's
# epilog included): the feature's bound, measured from the event and generous for a loaded
# machine; a job that did not end fast would wait out dist.timeout_s (600 s) or its time limit.
FAST_S = 180

# Slow enough to signal mid-run (a few seconds per epoch), small enough for 2 cores.
LONG = dict(model={"arch": "convnet"}, data={"limit_train": 1024, "limit_val": 64},
            train={"epochs": 3, "batch_size": 16, "amp": "bf16", "log_every": 2},
            resources={"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 3, "time_min": 10})


# What a shell inside another allocation or launch holds: must not reach the new job.
LEAKS = {"SLURM_JOB_ID": "999", "SLURM_PROCID": "7", "SLURM_NTASKS": "9", "SLURM_NODELIST": "gpu[1-9]",
         "SLURM_TASKS_PER_NODE": "1(x9)", "RANK": "3", "WORLD_SIZE": "9", "MASTER_ADDR": "nowhere.invalid",
         "MASTER_PORT": "1", "LOCAL_RANK": "2", "SBATCH_TIMELIMIT": "1"}


def status_of(cluster, run: Path) -> str:
    out = cli(run, "status", str(run), env=cluster.env()).stdout.splitlines()
    return out[1].split()[1]


@pytest.fixture(scope="module")
def baseline(slurm_cluster, tmp_path_factory):
    """An uninterrupted 2 nodes x 2 tasks run of LONG, for the preemption tests to match,
    submitted from a shell that looks like the inside of another job."""
    folder = tmp_path_factory.mktemp("baseline")
    (run,) = submit(slurm_cluster, write_spec(folder, "base", **LONG), "--wait", extra_env=LEAKS)
    return run


def test_multi_node_submit_completes(slurm_cluster, baseline):
    info = run_info(baseline)
    assert info["status"] == "completed" and info["world_size"] == 4
    assert info["hosts"] == ["node1", "node2"] and info["master_addr"] == "node1"  # no leaked layout
    assert info["master_port"] != 1 and info["slurm_job_id"] != "999"
    assert info["executor"] == "slurm" and info["slurm_job_id"]
    assert [r["epoch"] for r in epochs_of(baseline)] == [1, 2, 3]
    logs = cli(baseline, "logs", str(baseline), "--rank", "3", env=slurm_cluster.env())
    # rank 3's own files (each task runs clusterjob.run from the runs file: no submitit line of its own)
    assert logs.returncode == 0 and f"{baseline}/logs/rank3.out <==" in logs.stdout, logs.stdout
    assert f"{baseline}/logs/rank3.err <==" in logs.stdout
    assert (baseline / "logs" / "rank3.err").read_text() in logs.stdout


def test_dry_run_prints_the_script_and_submits_nothing(slurm_cluster, tmp_path):
    spec = write_spec(tmp_path, "dry", resources={"nodes": 2, "tasks_per_node": 2, "partition": "debug"})
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", "--dry-run", env=slurm_cluster.env())
    assert done.returncode == 0, done.stderr
    for flag in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=debug",
                 "#SBATCH --requeue", "--kill-on-bad-exit=1", "export SRUN_CPUS_PER_TASK=1", "#SBATCH --signal=USR2@"):
        assert flag in done.stdout
    assert not (tmp_path / "results").exists()
    auto = cli(tmp_path, "submit", str(spec), "--dry-run", env=slurm_cluster.env())  # --executor auto: sbatch works
    assert auto.returncode == 0 and "#SBATCH --nodes=2" in auto.stdout


def test_sweep_is_one_array_with_a_run_folder_per_point(slurm_cluster, tmp_path):
    spec = write_spec(tmp_path, "sweep", sweep={"train.lr": [0.02, 0.05], "train.seed": [0, 1]},
                      resources={"array_parallelism": 2})
    runs = submit(slurm_cluster, spec, "--wait")
    infos = [run_info(r) for r in runs]
    assert len(runs) == 4 and all(i["status"] == "completed" for i in infos)
    assert sorted(json.dumps(i["params"], sort_keys=True) for i in infos) == sorted(
        json.dumps({"train.lr": lr, "train.seed": s}, sort_keys=True) for lr in (0.02, 0.05) for s in (0, 1))
    array_ids = {i["slurm_job_id"].split("_")[0] for i in infos}
    assert len(array_ids) == 1 and sorted(i["slurm_job_id"].split("_")[1] for i in infos) == ["0", "1", "2", "3"]
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID", "-j", array_ids.pop()], capture_output=True,
                         text=True, env=slurm_cluster.env()).stdout.split()
    assert len(out) == 4
    for run, info in zip(runs, infos):  # each task trained its own point
        spec = yaml.safe_load((run / "spec.yaml").read_text())
        assert (spec["train"]["lr"], spec["train"]["seed"]) == (info["params"]["train.lr"], info["params"]["train.seed"])
        assert [r["epoch"] for r in epochs_of(run)] == [1]
    assert len({i["master_port"] for i in infos}) == 4  # array tasks never share a port


def _start(cluster, folder: Path, name: str, **extra) -> tuple[Path, str]:
    (run,) = submit(cluster, write_spec(folder, name, **{**LONG, **extra}))
    wait_for(lambda: "[progress] epoch 1/3 step 4/" in rank0_log(run), WAIT_S, "training to start")
    return run, run_info(run)["slurm_job_id"]


def _check_resumed_like(run: Path, baseline: Path, requeues: int) -> None:
    info = run_info(run)
    assert info["status"] == "completed" and info["requeues"] == requeues
    assert [r["epoch"] for r in epochs_of(run)] == [1, 2, 3]
    # Not bit-equal: after a resume DDP rebuilds its gradient buckets at a different step,
    # and 4-rank ring all-reduces then sum some elements in another order (~1e-9 apart).
    assert max_abs_diff(final_state(run)["model"], final_state(baseline)["model"]) <= 1e-6
    for mine, theirs in zip(epochs_of(run), epochs_of(baseline)):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5, abs=1e-7)


def test_usr2_preemption_checkpoints_requeues_and_resumes(slurm_cluster, baseline, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "base")
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm_cluster.env())
    wait_for(lambda: run_info(run).get("status") == "preempted", WAIT_S, "the preempted record")
    assert status_of(slurm_cluster, run).startswith("preempted")
    wait_for(lambda: run_info(run).get("status") == "completed", WAIT_S, "the requeued job to finish")
    _check_resumed_like(run, baseline, requeues=1)
    assert "resuming" in rank0_log(run)
    # checkpointed at the stop: what is lost is the ranks' ending after it (slower on a loaded machine)
    assert check_cost_against_sacct(slurm_cluster, run, job) < 120


def test_scontrol_requeue_resumes_from_the_last_checkpoint(slurm_cluster, baseline, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "base")
    wait_for(lambda: "epoch 1/3 train_loss" in rank0_log(run), WAIT_S, "epoch 1 to end")
    subprocess.run(["scontrol", "requeue", job], check=True, env=slurm_cluster.env())
    wait_for(lambda: run_info(run).get("status") == "completed", WAIT_S, "the requeued job to finish")
    _check_resumed_like(run, baseline, requeues=1)


def test_a_raising_rank_fails_the_job_fast_with_its_traceback(slurm_cluster, tmp_path):
    spec = write_spec(tmp_path, "fail", debug={"fail_at_epoch": 2, "fail_rank": 1},
                      **{k: v for k, v in LONG.items() if k != "debug"})
    (run,) = submit(slurm_cluster, spec)
    wait_for(lambda: (run / "logs" / "rank1.error.json").exists(), WAIT_S, "rank 1 to raise")
    raised = time.monotonic()
    wait_for(lambda: run_info(run).get("status") == "failed", WAIT_S, "the run to be failed")
    job = run_info(run)["slurm_job_id"]
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                                        env=slurm_cluster.env()).stdout.strip(), WAIT_S, "every rank to exit")
    assert time.monotonic() - raised < FAST_S
    error = run_info(run)["error"]
    assert error["rank"] == 1 and "debug.fail_at_epoch" in error["message"]
    assert "RuntimeError" in error["traceback"]
    shown = cli(tmp_path, "status", str(run), env=slurm_cluster.env()).stdout
    assert "failed on rank 1" in shown and "debug.fail_at_epoch" in shown


def test_a_killed_task_fails_the_job_fast(slurm_cluster, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "killed")
    os.kill(task_pid(job, 3), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                                        env=slurm_cluster.env()).stdout.strip(), WAIT_S, "every rank to exit")
    assert time.monotonic() - killed < FAST_S
    assert status_of(slurm_cluster, run) == "failed"
    error = run_info(run)["error"]
    assert error["rank"] == 3 and "task 3 on node2: Killed" in error["message"], error


def test_cancel_ends_a_running_job(slurm_cluster, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "cancel")
    done = cli(tmp_path, "cancel", str(run), env=slurm_cluster.env())
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                                        env=slurm_cluster.env()).stdout.strip(), WAIT_S, "the job to leave the queue")
    assert run_info(run)["status"] == "cancelled" and status_of(slurm_cluster, run) == "cancelled"
