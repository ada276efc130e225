"""clusterjob.core.procs on what a process started: the members of the process group it
leads (read while it lives, each a ref to verify later), this process's children, and
the environment a process started with. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from clusterjob.core import procs

# Starts a child (in its own group, as the leader's children are), prints its pid, sleeps.
LEADER = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          "print(c.pid, flush=True); time.sleep(60)")

EXITS = LEADER.removesuffix("; time.sleep(60)")  # the same, but the leader exits at once


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_leaders_group_is_read_while_it_lives_and_each_member_ended_by_its_ref():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "CJ_MARK": "a=b"})
    try:
        child = int(leader.stdout.readline())  # type: ignore[union-attr]  # a pipe
        ref = procs.current(leader.pid)
        assert ref is not None
        members = procs.group(ref)
        assert [m.pid for m in members] == [child] and members[0] == procs.current(child)
        assert leader.pid in [pid for pid, _ in procs.children()]
        assert procs.environ(leader.pid)["CJ_MARK"] == "a=b"
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait(timeout=30)
        assert procs.group(ref) == []  # the leader is gone: its group's id is no longer its own
        assert procs.check(members[0]) is None  # the child lives on, out of reach of the group
        assert procs.terminate(members[0], signal.SIGKILL) is None
        wait_until(lambda: procs.check(members[0]) is not None)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def test_a_process_that_leads_no_group_has_no_group_and_a_gone_one_no_environment():
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ref = procs.current(plain.pid)
        assert ref is not None and procs.group(ref) == []  # in our group, which it does not lead
    finally:
        plain.kill()
        plain.wait()
    assert procs.environ(plain.pid) == {} and (plain.pid, "Z") not in procs.children()


def test_an_exited_leader_not_reaped_keeps_its_group_for_end_group():
    leader = subprocess.Popen([sys.executable, "-c", EXITS], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(leader.stdout.readline())  # type: ignore[union-attr]  # a pipe
    wait_until(lambda: os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None)
    ref = procs.current(child)
    assert ref is not None and procs.check(ref) is None  # the leader exited; its child lives in its group
    procs.end_group(leader.pid)
    assert leader.wait(timeout=30) == 0
    wait_until(lambda: procs.check(ref) is not None)
    procs.end_group(leader.pid)  # an empty group: nothing, no error
