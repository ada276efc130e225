"""Other ways real scripts hang, with real processes (two local gloo ranks, ``on_stall:
stop``): a deadlock between two collectives, a rank that ends before the others'
collective (before its process group, or in the middle of the run), a DataLoader worker
that hangs or dies. Each ends the run in seconds with a line that names the rank and
the cause, and leaves no process behind (DataLoader workers included)."""

from __future__ import annotations

import json
import socket

import pytest
from healthutil import assert_nothing_left, cli, info, project, the_run

pytestmark = pytest.mark.slow

HOST = socket.gethostname()

# Rank 0 reduces over group a then b, rank 1 over b then a: each waits for the other.
DEADLOCK = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
t = torch.ones(1)
if rank == 0:
    dist.all_reduce(t, group=a)
    dist.all_reduce(t, group=b)
else:
    dist.all_reduce(t, group=b)
    dist.all_reduce(t, group=a)
"""

# Rank 1 leaves before its process group exists: rank 0 waits for it in init_process_group.
LEAVES_FIRST = """import os
import sys
import torch.distributed as dist

if os.environ["RANK"] == "1":
    sys.exit(0)
dist.init_process_group("gloo")
"""

# Rank 1 ends its part after the first all-reduce; rank 0 reduces once more.
LEAVES_EARLY = """import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    sys.exit(0)
dist.all_reduce(t)
"""

# A DataLoader with two workers; on rank 1 the item 40 hangs its worker (HANG) or kills it.
LOADER = """import os
import signal
import time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        if i == 40 and dist_rank == 1:
            HANG_OR_KILL
        return torch.ones(2)

dist.init_process_group("gloo")
dist_rank = dist.get_rank()
t = torch.ones(1)
for step, batch in enumerate(DataLoader(Items(), batch_size=4, num_workers=2)):
    dist.all_reduce(t)
    print(f"step {step}", flush=True)  # progress: the stall begins with the hang, not with a slow start
"""


def stopped(folder, script: str) -> tuple:
    """The run of ``script`` (stall_s 5, on_stall stop) once ``submit --wait`` returned:
    its folder and its error's message; nothing of it is left running."""
    project(folder, script, health={"stall_s": 5, "on_stall": "stop"})
    done = cli(folder, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(folder)
    got = info(run)
    assert done.returncode == 1 and got["status"] == "failed", done.stdout + done.stderr
    assert_nothing_left(run)
    runs = cli(folder, "report", str(run.parent), "--runs", "--format", "json")  # the report's error line, the same
    assert [row["error"] for row in json.loads(runs.stdout)["runs"]] == [got["error"]["message"]]
    return run, got["error"]["message"]


def test_a_deadlock_between_two_collectives_is_named_with_where_each_rank_waits(tmp_path):
    run, message = stopped(tmp_path, DEADLOCK)
    assert message.startswith(f"stalled: rank 1 on {HOST}: in all_reduce at train.py:12, its last progress the oldest")
    assert message.endswith("; rank 0 in all_reduce at train.py:9; every rank waits in a collective, each at "
                            "another call: a deadlock between collectives"), message
    for rank, line in ((0, 9), (1, 12)):
        assert f'train.py", line {line} in <module>' in (run / "logs" / "stall-1" / f"rank{rank}.txt").read_text()


def test_a_rank_that_ends_before_its_process_group_is_named(tmp_path):
    _, message = stopped(tmp_path, LEAVES_FIRST)
    assert message == (f"stalled: rank 1 on {HOST}: its process ended while the others waited; "
                       "rank 0 in init_process_group")


def test_a_rank_that_ends_early_is_named_in_the_error_of_the_rank_it_failed(tmp_path):
    _, message = stopped(tmp_path, LEAVES_EARLY)
    assert "Connection closed by peer" in message and not message.startswith("stalled")
    assert message.endswith(" (rank 1 had ended already: a rank that ends early leaves the others' collectives "
                            "without it)"), message


def test_a_hung_dataloader_worker_names_the_rank_waiting_for_its_batch(tmp_path):
    run, message = stopped(tmp_path, LOADER.replace("HANG_OR_KILL", "time.sleep(3600)"))
    assert message.startswith(f"stalled: rank 1 on {HOST}: enumerate at train.py:19 (in __next__, dataloader.py:")
    assert message.endswith("); rank 0 in all_reduce"), message
    dumped = (run / "logs" / "stall-1" / "rank1.txt").read_text()
    assert "dataloader.py" in dumped
    # its workers, forked with the rank's stack handler, are dumped beside it: the hung one sleeps
    assert dumped.count("(a DataLoader worker, say)") == 2, dumped
    assert 'train.py", line 13 in __getitem__' in dumped.split("(a DataLoader worker, say)", 1)[1], dumped


def test_a_dead_dataloader_worker_fails_the_run_at_once(tmp_path):
    run, message = stopped(tmp_path, LOADER.replace("HANG_OR_KILL", "os.kill(os.getpid(), signal.SIGKILL)"))
    # rank 1's own error, before the others' closed connections: DataLoader's word on its dead
    # worker ("(pid 12) is killed by signal", or "(pid(s) 12) exited unexpectedly" when its
    # watchdog sees the end first), or the connection to it that broke as it died
    error = info(run)["error"]
    assert error["rank"] == 1 and not message.startswith("stalled"), message
    assert message.startswith(("RuntimeError: DataLoader worker (pid", "ConnectionResetError")), message
    assert "torch/utils/data/" in error["traceback"]
