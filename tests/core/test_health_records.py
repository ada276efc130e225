"""What the health watchdog leaves for every reader (clusterjob.health.stalls, rankhealth,
stackdump): the verdict that ended a session, the open stall and its words, the rank the
others wait for, and a rank's stacks taken from outside, only from its verified process."""

from __future__ import annotations

import dataclasses
import faulthandler  # noqa: F401  (the child registers it; imported here to fail early without it)
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from clirun import wait_for

from clusterjob.core import procs
from clusterjob.core.record import RunError, RunRecord, Stall
from clusterjob.core.rundir import RunDir
from clusterjob.health import rankhealth, stackdump, stalls

LINE = "rank 1 on node2: time.sleep at train.py:40; rank 0 in all_reduce"


def stall(action: str = "retry", **more) -> Stall:
    return Stall(1, "2026-01-01T12:00:30+00:00", "2026-01-01T12:00:00+00:00", LINE, 1, "node2", action, **more)


def test_a_verdict_stands_while_the_run_holds_its_error():
    ended = stall("stop")
    info = RunRecord(status="failed", stalls=[ended], error=stalls.error(ended))
    assert info.error.message == f"stalled: {LINE}" and info.error.rank == 1
    assert stalls.verdict(info) == ended
    # a collateral error replaced it, or a retry reopened the run: no verdict any more
    assert stalls.verdict(dataclasses.replace(info, error=RunError(0, "RuntimeError: Connection closed"))) is None
    assert stalls.verdict(dataclasses.replace(info, error=None, status="pending")) is None
    assert stalls.verdict(RunRecord(status="running", stalls=[stall("warn")], error=None)) is None


def test_an_open_stall_is_shown_with_how_long_and_the_culprit():
    warned = stall("warn")
    assert stalls.open_stall(RunRecord(status="running", stalls=[warned])) == warned
    assert stalls.open_stall(RunRecord(status="running", stalls=[stall("warn", ended_at="x")])) is None
    assert stalls.open_stall(RunRecord(status="failed", stalls=[warned])) is None
    now = datetime(2026, 1, 1, 12, 12, tzinfo=timezone.utc)
    assert stalls.summary(warned, now) == "stalled 12.0 min (rank 1 on node2: time.sleep at train.py:40)"
    assert stalls.summary(warned, now + timedelta(hours=2)).startswith("stalled 2.20 h (")


def health(rank: int, share: float, total: float = 60.0, host: str = "") -> rankhealth.RankHealth:
    waits = rankhealth.Waits("timed", share * total * 2, total * 2, share * total, total)
    return rankhealth.RankHealth(rank, "s1", host or f"node{rank}", host or f"node{rank}", waits=waits)


def test_the_slowest_rank_is_the_one_that_waits_least_against_the_median_of_the_others():
    slow = rankhealth.slowest([health(0, 0.40), health(1, 0.50), health(2, 0.45), health(3, 0.02)])
    assert (slow.rank, slow.host, round(slow.others_wait_pct)) == (3, "node3", 45)
    assert slow.line() == "slowest: rank 3 (node3), the others wait 45% of their time"
    assert rankhealth.slowest([health(0, 0.4)]) is None  # one rank measured tells nothing
    assert rankhealth.slowest([health(0, 0.4, total=0.5), health(1, 0.1, total=0.5)]) is None  # too short yet


def test_health_files_of_another_session_are_not_counted(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "logs").mkdir()
    for rank, session in ((0, "new"), (1, "new"), (2, "old")):
        rankhealth.write(run, dataclasses.replace(health(rank, 0.3), session=session))
    (tmp_path / "logs" / "rank3.health.json").write_text("{not json")
    assert [h.rank for h in rankhealth.of_session(run, 4)] == [0, 1]
    assert rankhealth.read(run, 0) == dataclasses.replace(health(0, 0.3), session="new")


SLEEPER = """import faulthandler, signal, sys, time
f = open(sys.argv[1], "ab", buffering=0)
faulthandler.register(signal.SIGRTMIN + 6, file=f, all_threads=True, chain=False)
print("ready", flush=True)
time.sleep(60)
"""


def asleep(pid: int) -> bool:
    """Whether process ``pid`` is in an interruptible sleep (state S)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"


def children(pid: int) -> list:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def sleeper(tmp_path):
    stacks = tmp_path / "rank0.stacks"
    child = subprocess.Popen([sys.executable, "-c", SLEEPER, str(stacks)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    wait_for(lambda: asleep(child.pid), "the child out of print, into the sleep")
    yield child, stacks
    child.kill()
    child.wait()


def test_stacks_are_taken_from_the_verified_process_only(sleeper):
    child, stacks = sleeper
    ref = procs.current(child.pid)
    me = rankhealth.RankHealth(0, "s", "h", "h", ref, int(signal.SIGRTMIN + 6))
    text, why = stackdump.take(me, stacks)
    assert why == "" and "(most recent call first)" in text and 'File "<string>", line 5 in <module>' in text
    again, _ = stackdump.take(me, stacks)  # only the new dump, not the first one again
    assert again.count("most recent call first") == text.count("most recent call first")
    reused = dataclasses.replace(ref, start_ticks=ref.start_ticks + 1)  # the pid of another process now
    none, why = stackdump.take(dataclasses.replace(me, ref=reused), stacks)
    assert none is None and "belongs to another process" in why
    none, why = stackdump.take(dataclasses.replace(me, stack_signal=None), stacks)
    assert none is None and "takes no stack requests" in why
    time.sleep(0.1)
    assert child.poll() is None  # asked three times, alive and untouched


# A rank with two children: one forked (it keeps the stack handler, as a DataLoader worker
# does) and one started as another program (``sleep``: the signal's default would end it).
PARENT = """import faulthandler, os, signal, subprocess, sys, time
f = open(sys.argv[1], "ab", buffering=0)
faulthandler.register(signal.SIGRTMIN + 6, file=f, all_threads=True, chain=False)
other = subprocess.Popen(["sleep", "60"])
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
print(other.pid, flush=True)
time.sleep(60)
"""


def test_only_a_ranks_children_that_take_its_signal_are_dumped(tmp_path):
    stacks = tmp_path / "rank0.stacks"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(stacks)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        other = int(parent.stdout.readline())
        wait_for(lambda: all(asleep(pid) for pid in children(parent.pid)), "the forked child into its sleep")
        me = rankhealth.RankHealth(0, "s", "h", "h", procs.current(parent.pid), int(signal.SIGRTMIN + 6))
        (forked,) = stackdump.children(me)
        assert forked.pid not in (parent.pid, other)
        text = stackdump.take_children(me, stacks)
        assert text.startswith(f"{stackdump.CHILD_MARK}{forked.pid} of rank 0") and 'line 6 in <module>' in text
        assert procs.check(procs.current(other)) is None  # never signalled: it would have ended
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
