"""A stall on the real local Slurm (two nodes, ``on_stall: retry``, ``max_retries: 1``):
rank 1 sleeps in the job's first session, the watchdog names it, the job is requeued
off its node (ExcNodeList, run.json's ``excluded_hosts``) and completes from the
checkpoint, with the attempt in run.json saying why. ``clusterjob stack`` prints both
ranks' stacks of the live retry through srun. No process is left."""

from __future__ import annotations

import json
import re

import pytest
from clirun import WAIT_S, cli
from healthutil import assert_nothing_left, processes_of
from slurmcluster import submit, wait_for
from trainutil import run_info

pytestmark = pytest.mark.slurm

# Rank 1 sleeps after step 2 in the first session (line 20); the retry waits at step 3
# (lines 21-23) until the test created <run>/go, making progress meanwhile.
SCRIPT = """import os
import time

import torch
import torch.distributed as dist

import clusterjob

dist.init_process_group("gloo")
rank = dist.get_rank()
state = clusterjob.load_checkpoint()
step = state["step"] if state else 0
print(f"rank {rank} starts at step {step}", flush=True)
t = torch.ones(1)
while step < 5:
    step += 1
    dist.all_reduce(t)
    clusterjob.save_checkpoint({"step": step}, step)
    clusterjob.log(step=step, loss=1.0 / step)
    if step == 2 and rank == 1 and os.environ["CLUSTERJOB_RESTARTS"] == "0": time.sleep(3600)
    while step == 3 and not os.path.exists(os.path.join(os.environ["CLUSTERJOB_RUN_DIR"], "go")):
        clusterjob.heartbeat()
        time.sleep(0.2)
"""


def spec(folder) -> object:
    import yaml

    (folder / "train.py").write_text(SCRIPT)
    path = folder / "stall.yaml"
    path.write_text(yaml.safe_dump({
        "name": "stall", "output": {"root": str(folder / "results")}, "entrypoint": {"script": "train.py"},
        "resources": {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10,
                      "max_retries": 1, "retry_backoff_s": 1},
        "health": {"stall_s": 8}}))
    return path


def test_a_stalled_job_is_retried_off_the_culprits_node_and_completes(slurm_cluster, tmp_path):
    (run,) = submit(slurm_cluster, spec(tmp_path))
    # the retry is counted, then the held job is kept off the culprit's node and recorded so
    wait_for(lambda: run_info(run).get("retries") == 1 and run_info(run).get("excluded_hosts"), 180,
             "the stall's retry off the culprit's node")
    (stall,) = run_info(run)["stalls"]
    node, job = stall["host"], run_info(run)["slurm_job_id"]  # the job's task recorded its id as it started
    line = f"rank 1 on {node}: time.sleep at train.py:20; rank 0 in all_reduce"
    assert (stall["line"], stall["rank"], stall["action"]) == (line, 1, "retry")
    assert run_info(run)["excluded_hosts"] == [node]
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job)
    assert f"ExcNodeList={node} " in shown, shown
    folder = run / "logs" / "stall-1"
    assert 'train.py", line 20 in <module>' in (folder / "rank1.txt").read_text()
    assert " in all_reduce" in (folder / "rank0.txt").read_text()

    wait_for(lambda: "starts at step 2" in (run / "logs" / "rank0.out").read_text(errors="replace")
             and len(run_info(run).get("sessions", [])) == 2, WAIT_S, "the retry from the checkpoint")
    wait_for(lambda: json.loads((run / "metrics.jsonl").read_text().splitlines()[-1]).get("step") == 3, WAIT_S, "step 3")
    stacks = cli(tmp_path, "stack", str(run), env=slurm_cluster.env())  # on other nodes than this one: through srun
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    rank0, rank1 = stacks.stdout.split("==> rank 1 on ")
    waiting = re.compile(r'train\.py", line 2[123] in <module>')
    assert rank0.startswith("==> rank 0 on ") and waiting.search(rank0), rank0
    assert waiting.search(rank1) and not rank1.startswith(node), rank1
    (run / "go").touch()

    wait_for(lambda: run_info(run).get("status") in ("completed", "failed", "cancelled"), WAIT_S, "the run's end")
    info = run_info(run)
    assert (info["status"], info["retries"], info["slurm_job_id"]) == ("completed", 1, job)
    (attempt,) = info["attempts"]
    assert attempt["why"] == f"stalled: {line}" and attempt["retry"] == 1
    assert node not in info["hosts"]  # the retry never ran on the excluded node
    steps = [json.loads(text)["step"] for text in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]  # from the checkpoint of step 2, each step once
    wait_for(lambda: not processes_of(run), WAIT_S, "the job's processes to end")
    assert_nothing_left(run)
