"""Bad nodes remembered on the real local Slurm: the node of a rank that hung a
collective (the health watchdog's culprit, ``on_stall: retry``), or whose GPU failed,
goes on the results root's list, the next submit of another spec keeps its job off it (ExcNodeList), and
``clusterjob nodes --forget`` lifts it."""

from __future__ import annotations

import json

import pytest
import yaml
from clirun import cli
from slurmcluster import job_of, submit, wait_for
from trainutil import run_info

pytestmark = pytest.mark.slurm

# Rank 1 hangs in the first session; the retry ends at once.
HANG = """import os
import time

import torch
import torch.distributed as dist

import clusterjob

dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(1, 4):
    dist.all_reduce(t)
    clusterjob.log(step=step, loss=1.0 / step)
    if step == 2 and dist.get_rank() == 1 and os.environ["CLUSTERJOB_RESTARTS"] == "0":
        time.sleep(3600)
"""

SHORT = "import time\ntime.sleep(2)\nprint('done', flush=True)\n"


def spec(folder, name: str, script: str, resources: dict, **extra) -> object:
    (folder / f"{name}.py").write_text(script)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "output": {"root": str(folder / "results")},
                                    "entrypoint": {"script": f"{name}.py"}, "resources": resources, **extra}))
    return path


def test_a_hung_ranks_node_is_kept_off_the_next_submit_until_forgotten(slurm_cluster, tmp_path):
    two = {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10, "max_retries": 1,
           "retry_backoff_s": 1}
    (run,) = submit(slurm_cluster, spec(tmp_path, "hang", HANG, two, health={"stall_s": 8, "on_stall": "retry"}))
    listed = tmp_path / "results" / ".clusterjob" / "bad-nodes.json"
    wait_for(lambda: listed.exists() and run_info(run).get("stalls"), 180, "the stall's culprit on the list")
    (stall,) = run_info(run)["stalls"]
    node = stall["host"]
    (entry,) = json.loads(listed.read_text())["nodes"]
    assert (entry["node"], entry["run"]) == (node, str(run))
    assert entry["why"].startswith(f"stalled: rank 1 on {node}: time.sleep at hang.py:")

    one = {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 5}
    (other,) = submit(slurm_cluster, spec(tmp_path, "other", SHORT, one))
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job_of(other))
    assert f"ExcNodeList={node} " in shown, shown
    nodes = cli(tmp_path, "nodes", str(tmp_path / "results"), env=slurm_cluster.env())
    assert nodes.returncode == 0 and f"{node} " in nodes.stdout and "yes" in nodes.stdout, nodes.stdout
    checked = cli(tmp_path, "validate", str(tmp_path / "other.yaml"), "--cluster", env=slurm_cluster.env())
    assert f"1 node(s) excluded as bad within resources.bad_node_ttl ({node})" in checked.stdout + checked.stderr

    forgot = cli(tmp_path, "nodes", str(tmp_path / "results"), "--forget", node, env=slurm_cluster.env())
    assert forgot.returncode == 0, forgot.stderr
    assert json.loads(listed.read_text())["nodes"] == []
    (third,) = submit(slurm_cluster, spec(tmp_path, "third", SHORT, one))
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job_of(third))
    assert "ExcNodeList=(null)" in shown, shown
    for done in (run, other, third):
        wait_for(lambda done=done: run_info(done).get("status") in ("completed", "failed", "cancelled"), 300,
                 "the runs' end")
    assert run_info(run)["status"] == "completed" and node not in run_info(run)["hosts"]


# Rank 1's GPU fails in the first session (the error CUDA raises on such a node); rank 0
# then loses its peer.
FAULT = """import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1 and os.environ["CLUSTERJOB_RESTARTS"] == "0":
    raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
dist.all_reduce(t)
print("reduced", t.item(), flush=True)
"""


def test_a_ranks_gpu_fault_lists_its_node_and_the_retry_runs_elsewhere(slurm_cluster, tmp_path):
    two = {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10, "max_retries": 1,
           "retry_backoff_s": 1}
    (run,) = submit(slurm_cluster, spec(tmp_path, "fault", FAULT, two))
    wait_for(lambda: run_info(run).get("status") in ("completed", "failed", "cancelled") and
             run_info(run).get("retries"), 300, "the retry's end")
    got = run_info(run)
    (attempt,) = got["attempts"]
    (entry,) = json.loads((tmp_path / "results" / ".clusterjob" / "bad-nodes.json").read_text())["nodes"]
    node = entry["node"]  # rank 1's: the other node of the first session is not listed
    assert node in attempt["hosts"] and entry["run"] == str(run), (entry, attempt)
    assert entry["why"] == "rank 1: RuntimeError: CUDA error: uncorrectable ECC error encountered", entry
    assert got["status"] == "completed" and node not in got["hosts"], got
