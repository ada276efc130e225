"""The stall watchdog with real processes (two local gloo ranks): a rank that sleeps
before an all-reduce, one that spins in pure Python, an unmodified script that prints
and then hangs. Each is found, its stacks written, the culprit named, and dealt with as
``health.on_stall`` says; ``clusterjob stack`` shows a live run's stacks; no process is
left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from datetime import datetime

import pytest
from clirun import WAIT_S
from healthutil import assert_nothing_left, cli, info, log, project, start, the_run, wait_for

pytestmark = pytest.mark.slow

HOST = socket.gethostname()

# Rank 1 sleeps before the second all-reduce; rank 0 waits in it. Line 10 is the sleep.
SLEEPER = """import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} ready", flush=True)
if rank == 1: time.sleep(3600)
dist.all_reduce(t)
"""


def test_a_rank_asleep_before_an_all_reduce_is_named_and_the_run_stopped(tmp_path):
    project(tmp_path, SLEEPER, health={"stall_s": 10, "on_stall": "stop"})
    (tmp_path / "bin").mkdir()  # a py-spy (the [health] extra) that says how it was asked
    (tmp_path / "bin" / "py-spy").write_text('#!/bin/sh\necho "native frames: $*"\n')
    (tmp_path / "bin" / "py-spy").chmod(0o755)
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait", path_first=str(tmp_path / "bin"))
    run = the_run(tmp_path)
    wait_for(lambda: "rank 1 ready" in log(run, 1) and "rank 0 ready" in log(run, 0), WAIT_S, "both ranks")
    hung = time.monotonic()

    shown = cli(tmp_path, "stack", str(run))  # while it hangs, before the stall is seen
    assert shown.returncode == 0, shown.stderr
    rank0, rank1 = shown.stdout.split("==> rank 1 ")
    assert rank0.startswith(f"==> rank 0 on {HOST}, pid ") and "line 11 in <module>" in rank0
    assert "distributed_c10d.py" in rank0 and " in all_reduce" in rank0
    assert 'train.py", line 10 in <module>' in rank1 and "all_reduce" not in rank1
    one = cli(tmp_path, "stack", str(run), "--rank", "1")
    assert one.returncode == 0 and "==> rank 0" not in one.stdout and "line 10 in <module>" in one.stdout

    out, err = waiting.communicate(timeout=WAIT_S)
    assert time.monotonic() - hung < 120, out + err  # at stall_s (10 s), not at the rank's 3600 s sleep
    line = f"rank 1 on {HOST}: time.sleep at train.py:10; rank 0 in all_reduce"
    got = info(run)
    assert waiting.returncode == 1 and got["status"] == "failed", out + err
    assert got["error"]["message"] == f"stalled: {line}" and got["error"]["rank"] == 1
    (stall,) = got["stalls"]
    assert (stall["n"], stall["line"], stall["rank"], stall["host"], stall["action"]) == (1, line, 1, HOST, "stop")
    folder = run / "logs" / "stall-1"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.txt", "rank1.txt", "request.json", "verdict.json"]
    assert " in all_reduce" in (folder / "rank0.txt").read_text()
    rank1 = (folder / "rank1.txt").read_text()
    assert rank1.startswith(f"# rank 1 on {HOST}, pid ") and 'train.py", line 10 in <module>' in rank1
    pid = json.loads((run / "logs" / "rank1.health.json").read_text())["ref"]["pid"]
    assert rank1.endswith(f"# native frames (py-spy dump --native)\nnative frames: dump --native --pid {pid}\n")
    assert json.loads((folder / "verdict.json").read_text())["action"] == "stop"
    assert f"stall 1: no progress on any rank for 10 s; stacks in {folder}; {line}" in (
        run / "logs" / "rank0.err").read_text()
    assert_nothing_left(run)
    after = cli(tmp_path, "stack", str(run))
    assert after.returncode == 2 and after.stderr.count("\n") == 1 and "is failed, not running" in after.stderr


# Rank 1 spins in pure Python (holding the GIL) in the run's first session only; lines 11-12.
SPINNER = """import os
import torch
import torch.distributed as dist
import clusterjob

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1 and os.environ["CLUSTERJOB_RESTARTS"] == "0":
    x = 0
    while True:
        x += 1
dist.all_reduce(t)
clusterjob.log(step=1, sessions=float(os.environ["CLUSTERJOB_RESTARTS"]) + 1)
"""


def test_a_rank_spinning_in_python_gets_its_stack_dumped_and_the_run_is_retried(tmp_path):
    project(tmp_path, SPINNER, health={"stall_s": 5},  # on_stall auto: retry, as retries are on
            resources={"tasks_per_node": 2, "cpus_per_task": 1, "max_retries": 1, "retry_backoff_s": 0.5})
    done = cli(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    got = info(run)
    assert done.returncode == 0 and got["status"] == "completed", done.stdout + done.stderr
    # the stacks are taken where the spinning thread hands the GIL over: the loop's jump
    # back (line 11) on this Python, its body (line 12) on others
    (why,) = [a["why"] for a in got["attempts"]]
    at = re.fullmatch(rf"stalled: rank 1 on {HOST}: <module> \((while True:|x \+= 1)\) at train\.py:(1[12]); "
                      "rank 0 in all_reduce", why)
    assert at is not None and got["retries"] == 1, why
    line = why[len("stalled: "):]
    assert [(s["line"], s["action"]) for s in got["stalls"]] == [(line, "retry")]
    assert got["final"] == {"sessions": 2.0, "step": 1}
    assert f'train.py", line {at.group(2)} in <module>' in (run / "logs" / "stall-1" / "rank1.txt").read_text()
    assert f"stalled: {line}; retry 1 of 1 from the last checkpoint" in done.stdout
    assert_nothing_left(run)


# An unmodified script: prints every step, then rank 1 hangs for 15 s (past stall_s) and goes on.
PRINTER = """import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for step in range(30):
    if step == 10 and rank == 1:
        time.sleep(15)
    dist.all_reduce(t)
    print(f"step {step}", flush=True)
    time.sleep(0.2)
"""


def test_a_plain_script_that_prints_then_hangs_is_caught_from_its_last_line_and_warned_about(tmp_path):
    project(tmp_path, PRINTER, health={"stall_s": 5, "on_stall": "warn"})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "step 2" in log(run, 0), WAIT_S, "the steps")
    for _ in range(2):  # stacks of ranks making progress: they go on as before (every step below)
        assert cli(tmp_path, "stack", str(run)).stdout.count("most recent call first") >= 2
    wait_for(lambda: info(run).get("stalls"), WAIT_S, "the stall")
    last_line = (run / "logs" / "rank0.out").stat().st_mtime
    line = f"rank 1 on {HOST}: time.sleep at train.py:10; rank 0 in all_reduce"
    (stall,) = info(run)["stalls"]
    assert (stall["line"], stall["action"], stall["ended_at"]) == (line, "warn", None)
    assert datetime.fromisoformat(stall["at"]).timestamp() - last_line >= 5 - 1.5  # stall_s after the last line
    folder = run / "logs" / "stall-1"  # the stacks, as for any rank: rank 0's in the collective, rank 1's asleep
    assert " in all_reduce" in (folder / "rank0.txt").read_text()
    assert 'train.py", line 10 in <module>' in (folder / "rank1.txt").read_text()
    shown = cli(tmp_path, "status", str(run.parent)).stdout.splitlines()
    assert shown[1].split()[1:3][0] == "stalled" and shown[2].startswith(f"{run.name}: stalled ")
    assert shown[2].endswith(f"({line.split(';')[0]})")

    out, err = waiting.communicate(timeout=WAIT_S)
    got = info(run)
    assert waiting.returncode == 0 and got["status"] == "completed", out + err
    (stall,) = got["stalls"]
    assert stall["ended_at"] is not None and stall["action"] == "warn"  # progress came back: the stall is over
    assert log(run, 0).count("step ") == 30
    assert_nothing_left(run)


def test_a_watcher_ends_with_its_rank_and_leaves_nothing(tmp_path):
    project(tmp_path, SLEEPER, health={"stall_s": 600})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "rank 1 ready" in log(run, 1), WAIT_S, "rank 1")
    os.kill(json.loads((run / "logs" / "rank1.health.json").read_text())["ref"]["pid"], signal.SIGKILL)
    out, err = waiting.communicate(timeout=WAIT_S)
    assert info(run)["error"]["message"] == "rank 1 was killed by SIGKILL (no traceback)", out + err
    assert_nothing_left(run)
    assert json.loads((run / "logs" / "rank1.ended").read_text())["session"] == json.loads(
        (run / "logs" / "rank0.health.json").read_text())["session"]  # its watcher saw it go
