"""A node failure on the real local Slurm, simulated by killing one rank of a two-node run
with SIGKILL: the job script requeues its own job as a retry, and the run resumes from its
last checkpoint and completes, with the attempt in run.json."""

from __future__ import annotations

import os
import signal

import pytest
from clirun import WAIT_S, cli
from slurmcluster import check_cost_against_sacct, job_of, rank0_log, submit, task_pid, wait_for
from trainutil import epochs_of, run_info, write_spec

pytestmark = pytest.mark.slurm

TWO_NODES = dict(model={"arch": "convnet"}, data={"limit_train": 1024, "limit_val": 64},
                 train={"epochs": 3, "batch_size": 16, "amp": "bf16", "log_every": 2},
                 resources={"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10,
                            "max_retries": 1, "retry_backoff_s": 1})


def test_a_rank_killed_with_sigkill_is_retried_from_the_last_checkpoint(slurm_cluster, tmp_path):
    (run,) = submit(slurm_cluster, write_spec(tmp_path, "retry", **TWO_NODES))
    job = job_of(run)  # from the sweep's record: run.json names it once the ranks started
    # the epoch's line comes before its checkpoint (written whole, under its own name, then
    # renamed): a kill between the two is retried from the beginning, which is right too
    wait_for(lambda: "epoch 1/3 train_loss" in rank0_log(run) and any((run / "checkpoints").glob("epoch-*.pt")),
             180, "epoch 1 and its checkpoint")
    os.kill(task_pid(job, 1), signal.SIGKILL)
    wait_for(lambda: run_info(run).get("retries") == 1, WAIT_S, "the retry")
    wait_for(lambda: run_info(run).get("status") in ("completed", "failed", "cancelled"), WAIT_S, "the run to end")
    info = run_info(run)
    assert (info["status"], info["retries"], info["requeues"], info["slurm_job_id"]) == ("completed", 1, 0, job)
    (attempt,) = info["attempts"]
    assert attempt["why"] == "task 1 on node2: Killed" and attempt["hosts"] == ["node1", "node2"]
    assert (attempt["retry"], attempt["job"]) == (1, job)
    assert [r["epoch"] for r in epochs_of(run)] == [1, 2, 3]  # every epoch once
    assert "resuming" in rank0_log(run)  # from the checkpoint, not from epoch 1
    shown = cli(tmp_path, "status", str(run), env=slurm_cluster.env()).stdout
    assert "completed" in shown and "retried 1x" in shown
    check_cost_against_sacct(slurm_cluster, run, job)  # the time from the epoch's checkpoint to the kill is lost
