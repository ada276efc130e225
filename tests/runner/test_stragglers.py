"""Stragglers with real processes (two local gloo ranks): the rank the others wait for is
named in ``status`` with the share of their time they wait, for any code (its main thread
sampled) and for the built-in trainer (its all-reduce timed), and recorded in run.json
for the report; the share is within 20% of the true one."""

from __future__ import annotations

import json
import math
import re
import socket

import pytest
from clirun import WAIT_S
from healthutil import assert_nothing_left, cli, info, log, project, start, the_run, wait_for
from trainutil import write_spec

pytestmark = pytest.mark.slow

HOST = socket.gethostname()
SLOWEST = re.compile(r"slowest: rank (\d+) \((\S+)\), the others wait (\d+)% of their time")

# Rank 1 does 200 ms of its own work per step; rank 0 does 20 ms and times its own wait.
OWN = """import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
waited, total = 0.0, 0.0
for step in range(110):
    began = time.perf_counter()
    time.sleep(0.2 if rank == 1 else 0.02)
    before = time.perf_counter()
    dist.all_reduce(t)
    waited += time.perf_counter() - before
    total += time.perf_counter() - began
    if rank == 0:
        print(f"step {step} waited {waited:.3f} of {total:.3f}", flush=True)
"""


def true_share(run, at_s: float = math.inf) -> float:
    """Rank 0's own measure of its wait, as it last printed it by ``at_s`` seconds of its
    run (the health file's time: status reads a file up to 5 s old, while the share still
    grows as the set-up weighs less)."""
    printed = [(float(w), float(t)) for w, t in re.findall(r"waited ([0-9.]+) of ([0-9.]+)", log(run, 0))]
    waited, total = ([p for p in printed if p[1] <= at_s] or printed[:1])[-1]
    return waited / total


def slowest_in_status(folder, run):
    found = SLOWEST.search(cli(folder, "status", str(run.parent)).stdout)
    return (int(found.group(1)), found.group(2), int(found.group(3))) if found else None


def status_and_truth(folder, run) -> tuple:
    """The slowest rank as status shows it, and rank 0's true share when the health file
    status read was written (read again should it have been rewritten meanwhile)."""
    for _ in range(5):
        before = (run / "logs" / "rank0.health.json").read_text()
        shown = slowest_in_status(folder, run)
        if (run / "logs" / "rank0.health.json").read_text() == before:
            return shown, true_share(run, json.loads(before)["waits"]["total_s"])
    raise AssertionError("the health file changed under every status")


def rank_1_named_in_status(folder, script: str, steps: int):
    """Runs ``script`` on two ranks: once rank 0 made ``steps`` steps (the health files are
    5 s fresh), status names rank 1 and rank 0's wait within 20% of its own measure; the
    run folder once the run completed."""
    project(folder, script, health={"stall_s": None})
    waiting = start(folder, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(folder)
    wait_for(lambda: log(run, 0).count("step ") >= steps, 120, f"{steps} steps")
    shown, truth = status_and_truth(folder, run)
    assert shown is not None and shown[:2] == (1, HOST), (shown, truth)
    assert abs(shown[2] / 100 - truth) <= 0.2 * truth, (shown, truth)
    out, err = waiting.communicate(timeout=WAIT_S)
    assert waiting.returncode == 0, out + err
    return run


def test_the_rank_the_others_wait_for_is_named_for_any_code(tmp_path):
    run = rank_1_named_in_status(tmp_path, OWN, 60)
    recorded, truth = info(run)["straggler"], true_share(run)
    assert (recorded["rank"], recorded["host"]) == (1, HOST)
    assert abs(recorded["wait_pct"] / 100 - truth) <= 0.2 * truth, (recorded, truth)
    assert json.loads((run / "logs" / "rank0.health.json").read_text())["waits"]["method"] == "sampled"
    runs = cli(tmp_path, "report", str(run.parent), "--runs", "--format", "json")
    (row,) = json.loads(runs.stdout)["runs"]
    assert row["straggler"] == f"rank 1 ({HOST}) {recorded['wait_pct']:.0f}%"
    assert_nothing_left(run)


# Your own DDP script: rank 1 does 200 ms of its own work per step, rank 0 20 ms; rank 0
# waits for rank 1 inside its backward (DDP's all-reduce), and times that itself, out of
# its time since its process group exists (as the sampler counts: DDP's set-up, seconds
# of work on a busy machine, is time it did not wait).
DDP_SCRIPT = """import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
began = time.perf_counter()
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(8, 1))
x = torch.ones(4, 8)
waited = 0.0
for step in range(80):
    time.sleep(0.2 if rank == 1 else 0.02)
    loss = model(x).sum()
    before = time.perf_counter()
    loss.backward()
    waited += time.perf_counter() - before
    if rank == 0:
        print(f"step {step} waited {waited:.3f} of {time.perf_counter() - began:.3f}", flush=True)
"""


def test_a_ddp_script_waiting_in_its_backward_names_the_rank_it_waits_for(tmp_path):
    run = rank_1_named_in_status(tmp_path, DDP_SCRIPT, 50)
    slow = json.loads((run / "logs" / "rank1.health.json").read_text())["waits"]
    fast = json.loads((run / "logs" / "rank0.health.json").read_text())["waits"]
    assert slow["method"] == "sampled" and slow["wait_s"] < 0.25 * fast["wait_s"], (slow, fast)
    assert_nothing_left(run)


def test_the_built_in_trainer_times_its_own_wait_for_the_slow_rank(tmp_path):
    spec = write_spec(tmp_path, "t", train={"epochs": 6}, resources={"tasks_per_node": 2},
                      debug={"slow_rank": 1, "slow_ms": 200}, health={"stall_s": None})
    waiting = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = the_run(tmp_path, "t")
    wait_for(lambda: (run / "logs" / "rank0.health.json").exists()
             and json.loads((run / "logs" / "rank0.health.json").read_text())["waits"]["total_s"] > 4, WAIT_S, "waits")
    shown = slowest_in_status(tmp_path, run)
    assert shown is not None and shown[:2] == (1, HOST) and shown[2] >= 50
    out, err = waiting.communicate(timeout=WAIT_S)
    assert waiting.returncode == 0, out + err
    waits = json.loads((run / "logs" / "rank0.health.json").read_text())["waits"]
    steps = 6 * 256 // (16 * 2)  # epochs x batches per rank: rank 0 waits about 200 ms in each
    assert waits["method"] == "timed" and abs(waits["wait_s"] - 0.2 * steps) <= 0.2 * 0.2 * steps, waits
    slow = json.loads((run / "logs" / "rank1.health.json").read_text())["waits"]
    assert slow["wait_s"] < 0.25 * waits["wait_s"]  # the straggler hardly waits
    assert info(run)["straggler"]["rank"] == 1
    assert_nothing_left(run)
