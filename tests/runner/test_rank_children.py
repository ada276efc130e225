"""Every process a rank started ends with it, and the stall watch outlives its leader's
watcher. Real processes through the command line (two local gloo ranks): a rank blocked
in ``Popen(...).wait()`` on a sleeping child is failed by a stall and its child (and the
child's own child, in a session of its own) ended; the same after a retry and after
``clusterjob cancel``; a ``kill -9`` (or SIGSTOP) of rank 0's watcher, then a hang on
rank 1, still ends the run as stalled; a watcher that keeps dying leaves a warning that
``status`` shows; a watcher whose main thread is blocked for good ends with its rank; a
supervisor killed with kill -9 leaves no process in its ranks' groups."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
from pathlib import Path

import pytest
from healthutil import assert_nothing_left, cli, info, log, processes_of, project, start, the_run, wait_for

from clusterjob.core import procs
from clusterjob.runner import health

pytestmark = pytest.mark.slow

HOST = socket.gethostname()

# The rank named by CHILD_RANK starts a child (in the rank's process group) that starts
# a grandchild in a session of its own (out of that group, as a daemon is), records both
# (logs/child.proc.json, logs/grandchild.proc.json) and waits for its child: line 19.
# In a later session (a retry) it goes on and the run completes.
SPAWNER = """import os
import subprocess
import sys
from pathlib import Path
import torch
import torch.distributed as dist
import clusterjob
from clusterjob.core import procs

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
logs = Path(os.environ["CLUSTERJOB_RUN_DIR"]) / "logs"
if dist.get_rank() == CHILD_RANK and os.environ["CLUSTERJOB_RESTARTS"] == "0":
    code = ("import subprocess, sys, time; from pathlib import Path; from clusterjob.core import procs; "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], start_new_session=True); "
            f"procs.save(Path({str(logs / 'grandchild.proc.json')!r}), procs.current(g.pid)); time.sleep(3600)")
    child = subprocess.Popen([sys.executable, "-c", code]); procs.save(logs / "child.proc.json", procs.current(child.pid))
    child.wait()
dist.all_reduce(t)
clusterjob.log(step=1, sessions=float(os.environ["CLUSTERJOB_RESTARTS"]) + 1)
"""


def spawner(rank: int) -> str:
    return SPAWNER.replace("CHILD_RANK", str(rank))


def started(run: Path) -> list[procs.ProcessRef]:
    """The child and the grandchild the rank recorded, once both are (each verified alive then)."""
    names = ("child.proc.json", "grandchild.proc.json")
    wait_for(lambda: all(procs.load(run / "logs" / name) is not None for name in names), 180, "the rank's child")
    refs = [procs.load(run / "logs" / name) for name in names]
    assert all(ref is not None for ref in refs)
    return [ref for ref in refs if ref is not None]


def assert_ended(refs: list[procs.ProcessRef], within_s: float = 20.0) -> None:
    """Each recorded process has ended (its pid exited, or now another process's)."""
    wait_for(lambda: all(procs.check(ref) is not None for ref in refs), within_s,
             f"the rank's processes {[ref.pid for ref in refs]} to end")


def test_a_stalled_rank_blocked_on_its_child_is_failed_and_its_child_ended(tmp_path):
    stalled_rank_fails_and_its_children_end(tmp_path)


def stalled_rank_fails_and_its_children_end(tmp_path, **sections):
    """Rank 1 blocked on its child stalls: the run fails naming it, and its child and the
    child's own child end (``sections``: more of the spec, as a container)."""
    project(tmp_path, spawner(1), health={"stall_s": 5, "on_stall": "stop"}, **sections)
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    refs = started(run)
    assert all(procs.check(ref) is None for ref in refs)  # alive while the rank waits for them
    out, err = waiting.communicate(timeout=240)
    got = info(run)
    assert waiting.returncode == 1 and got["status"] == "failed", out + err
    assert got["error"]["message"].startswith(f"stalled: rank 1 on {HOST}: child.wait at train.py:19"), got["error"]
    assert_ended(refs)
    assert_nothing_left(run)


def test_a_stall_retried_ends_the_first_sessions_children_before_the_run_goes_on(tmp_path):
    project(tmp_path, spawner(1), health={"stall_s": 5, "on_stall": "retry"},
            resources={"tasks_per_node": 2, "cpus_per_task": 1, "max_retries": 1, "retry_backoff_s": 0.5})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    refs = started(run)
    out, err = waiting.communicate(timeout=300)
    got = info(run)
    assert waiting.returncode == 0 and got["status"] == "completed", out + err
    assert got["retries"] == 1 and got["final"] == {"sessions": 2.0, "step": 1}
    assert_ended(refs)
    assert_nothing_left(run)


def test_cancel_ends_the_processes_a_rank_started(tmp_path):
    cancel_ends_the_ranks_children(tmp_path)


def cancel_ends_the_ranks_children(tmp_path, **sections):
    """``clusterjob cancel`` of a run whose rank 0 waits on its child ends them all."""
    project(tmp_path, spawner(0), health=None, **sections)
    assert start(tmp_path, "submit", "h.yaml", "--executor", "local").communicate(timeout=60)[0]
    run = the_run(tmp_path)
    refs = started(run)
    done = cli(tmp_path, "cancel", str(run), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: info(run)["status"] == "cancelled", 60, "the run cancelled")
    assert_ended(refs)
    assert_nothing_left(run)


def test_a_killed_supervisor_leaves_no_process_in_a_ranks_group(tmp_path):
    """kill -9 of the supervisor: its ranks end (their parent's death), and each ends
    the rest of its process group (the child its rank 0 waits for) on its way out. The
    grandchild, in a session of its own, only a live supervisor finds: ended here by
    the test."""
    project(tmp_path, spawner(0), health=None)
    assert start(tmp_path, "submit", "h.yaml", "--executor", "local").communicate(timeout=60)[0]
    run = the_run(tmp_path)
    child, grandchild = started(run)
    try:
        os.kill(info(run)["launcher"]["pid"], signal.SIGKILL)
        assert_ended([child], within_s=60)
        wait_for(lambda: not [line for line in processes_of(run) if "clusterjob.run " in line], 60,
                 "the ranks to end with their supervisor")
        assert info(run)["status"] == "preempted"  # resumable, as any run whose supervisor died
    finally:  # what the test itself leaves, whatever failed
        for ref in (child, grandchild):
            procs.terminate(ref, signal.SIGKILL)


# Both ranks step every 0.2 s; rank 1 hangs once logs/hang exists.
STEPPER = """import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
hang = os.path.join(os.environ["CLUSTERJOB_RUN_DIR"], "logs", "hang")
t = torch.ones(1)
step = 0
while True:
    dist.all_reduce(t)
    print(f"rank {rank} step {step}", flush=True)
    step += 1
    if rank == 1 and os.path.exists(hang):
        time.sleep(3600)
    time.sleep(0.2)
"""


def watchers(run: Path, rank: int) -> list[int]:
    """The pids of rank ``rank``'s live watchers (their config names the run and the rank)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if "clusterjob.runner.watchdog" in cmdline and f'"run": "{run}", "rank": {rank},' in cmdline \
                and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def kill_watcher(run: Path, rank: int, sig: int = signal.SIGKILL) -> int:
    """``kill -9`` (or ``sig``) of rank ``rank``'s watcher, once it runs, until it is gone; its pid."""
    wait_for(lambda: watchers(run, rank), 90, f"rank {rank}'s watcher")
    (pid,) = watchers(run, rank)
    os.kill(pid, sig)
    wait_for(lambda: pid not in watchers(run, rank), 30, f"watcher {pid} to die")
    return pid


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGKILL, "was killed by SIGKILL"),
                                           (signal.SIGSTOP, "was stopped (state T): killed")])
def test_a_hang_after_the_leading_watcher_was_killed_is_still_a_stall(tmp_path, sig, said):
    project(tmp_path, STEPPER, health={"stall_s": 5, "on_stall": "stop"})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "rank 1 step 3" in log(run, 1), 180, "both ranks stepping")
    killed = kill_watcher(run, 0, sig)
    wait_for(lambda: [pid for pid in watchers(run, 0) if pid != killed], 30, "rank 0's watcher started again")
    (run / "logs" / "hang").touch()
    out, err = waiting.communicate(timeout=240)
    got = info(run)
    assert waiting.returncode == 1 and got["status"] == "failed", out + err
    assert got["error"]["message"].startswith(f"stalled: rank 1 on {HOST}: time.sleep at train.py:16"), got["error"]
    logged = (run / "logs" / "rank0.err").read_text()
    assert f"clusterjob: warning: health: the stall watcher of rank 0 {said}; started again\n" in logged
    assert_nothing_left(run)


def test_a_watcher_that_keeps_dying_leaves_a_warning_status_shows(tmp_path):
    project(tmp_path, STEPPER, tasks=1, health={"stall_s": 5, "on_stall": "stop"})
    assert start(tmp_path, "submit", "h.yaml", "--executor", "local").communicate(timeout=60)[0]
    run = the_run(tmp_path)
    killed: list[int] = []
    for _ in range(health.WATCHER_STARTS):
        wait_for(lambda: [pid for pid in watchers(run, 0) if pid not in killed], 60, "a watcher of rank 0")
        killed.append(kill_watcher(run, 0))
    line = (f"health: the stall watcher of rank 0 was killed by SIGKILL ({health.WATCHER_STARTS} starts); "
            "the stall watch of this run stopped: no stall is noticed from here on")
    wait_for(lambda: line in info(run).get("warnings", []), 30, "the warning in run.json")
    shown = cli(tmp_path, "status", str(run))
    assert shown.returncode == 0 and f"{run.name}: warning: {line}" in shown.stdout, shown.stdout + shown.stderr
    assert watchers(run, 0) == [] and info(run)["status"] == "running"
    done = cli(tmp_path, "cancel", str(run), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: info(run)["status"] == "cancelled", 60, "the run cancelled")
    assert_nothing_left(run)


def test_a_watcher_blocked_in_a_lock_ends_with_its_rank(tmp_path):
    """The leader's main thread blocked for good (run.json's lock held by another process,
    as one stopped while holding it would): its rank's kill -9 still ends it within
    seconds, not when the lock comes free."""
    project(tmp_path, STEPPER, health={"stall_s": 5, "on_stall": "stop"})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "rank 1 step 3" in log(run, 1) and watchers(run, 0), 180, "both ranks stepping")
    rank0 = procs.load(run / "logs" / "rank0.proc.json")
    assert rank0 is not None and procs.check(rank0) is None
    fd = os.open(run / "run.json.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (run / "logs" / "hang").touch()
        # the leader asked for stacks, got rank 1's and now waits for the lock to record the stall
        wait_for(lambda: (run / "logs" / "stall-1" / "rank1.txt").exists(), 120, "the stall's stacks")
        (leader,) = watchers(run, 0)
        os.kill(rank0.pid, signal.SIGKILL)
        wait_for(lambda: leader not in watchers(run, 0), 30, f"rank 0's watcher {leader} to end with its rank")
    finally:
        os.close(fd)
    out, err = waiting.communicate(timeout=240)
    assert waiting.returncode == 1 and info(run)["status"] == "failed", out + err
    assert_nothing_left(run)
