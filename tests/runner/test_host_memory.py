"""The most host memory a run used (clusterjob.health.hostmem, the report's mem_peak):
each rank's watcher samples the PSS of the rank and the processes under it, the highest
is kept over the run's sessions, and the report shows it; real processes, real /proc."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from clirun import cli
from owncode import Project

from clusterjob.health import hostmem

# A parent whose child holds MB megabytes (touched) until its stdin closes.
HOLDER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import sys
block = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("held", flush=True)
sys.stdin.read()
''', sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder():
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "200"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    child = int(proc.stdout.readline())
    yield proc, child
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_tree_holds_what_its_children_hold(holder):
    proc, child = holder
    assert hostmem.tree(proc.pid) == [proc.pid, child]
    held = hostmem.tree_bytes(proc.pid)
    assert held is not None and held >= 200 << 20  # the child's 200 MB, its pages its own
    assert hostmem.tree_bytes(child) <= held and hostmem.pss_bytes(2**22 + 7) is None  # no such process


def test_the_peak_is_kept_over_sessions_and_only_grows(tmp_path, holder):
    proc, _ = holder
    first = hostmem.Peak(tmp_path, 3, proc.pid)
    first.sample()
    first.save()
    kept = hostmem.recorded(hostmem.path_of(tmp_path, 3))
    assert kept >= 200 << 20
    again = hostmem.Peak(tmp_path, 3, proc.pid)  # the next session's watcher: starts from the file
    again.peak = again.written  # as if it sampled less
    again.save()
    assert hostmem.recorded(hostmem.path_of(tmp_path, 3)) == kept
    hostmem.path_of(tmp_path, 4).write_text("{damaged")
    assert hostmem.recorded(hostmem.path_of(tmp_path, 4)) == 0


def test_a_runs_peak_is_its_highest_ranks_and_nan_for_none(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    assert math.isnan(hostmem.run_peak(tmp_path))
    for rank, peak in ((0, 3 << 30), (1, 5 << 30), (2, "x")):
        hostmem.path_of(logs, rank).write_text(json.dumps({"peak_bytes": peak}))
    assert hostmem.run_peak(tmp_path) == 5 << 30
    os.mkfifo(hostmem.path_of(logs, 3))  # read by every report: never blocks
    hostmem.path_of(logs, 4).write_text(json.dumps({"peak_bytes": 9 << 30}) + " " * 8192)  # larger than any
    assert hostmem.run_peak(tmp_path) == 5 << 30


# Holds 300 MB in a child process it started (as a DataLoader worker would) for 12 s: two of its
# watcher's samples (every 5 s) fall in that time, even on a loaded machine.
WORKER = """
import multiprocessing as mp, time

def hold():
    block = bytearray(300 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(12)

if __name__ == "__main__":
    worker = mp.get_context("fork").Process(target=hold)
    worker.start()
    worker.join()
    print("done", flush=True)
"""


def test_the_report_shows_the_peak_of_a_rank_and_its_worker(tmp_path):
    own = Project(tmp_path)
    own.spec(WORKER)
    done = own.submit()
    assert done.returncode == 0, done.stdout + done.stderr
    peak = hostmem.recorded(hostmem.path_of(own.run / "logs", 0))
    assert peak >= 300 << 20, peak  # the worker's pages counted with its rank's
    asked = [cli(tmp_path, "report", str(own.run.parent), "--format", "json", *runs) for runs in ([], ["--runs"])]
    assert [report.returncode for report in asked] == [0, 0], [report.stderr for report in asked]
    (group,), (row,) = json.loads(asked[0].stdout)["groups"], json.loads(asked[1].stdout)["runs"]
    assert row["mem_peak_gib"] == group["mem_peak_gib"] == pytest.approx(peak / 2**30)
    shown = cli(tmp_path, "report", str(own.run.parent), "--runs").stdout
    assert "mem_peak" in shown and f"{peak / 2**30:.1f} GiB" in shown, shown
    assert "mem_peak" not in cli(tmp_path, "report", str(own.run.parent)).stdout  # the grouped table as it was


def test_without_health_nothing_is_sampled_and_the_report_has_no_column(tmp_path):
    own = Project(tmp_path)
    path = own.spec("print('done')\n")
    path.write_text(path.read_text() + "health: null\n")
    assert own.submit().returncode == 0
    assert not list((own.run / "logs").glob("*.mem.json"))
    assert "mem_peak" not in cli(tmp_path, "report", str(own.run.parent)).stdout
