"""``clusterjob stack`` and the stall's stacks with real processes, where a rank cannot
answer its stack signal: a process named in a running run's health file that is no rank
(it has not installed the handler) is never signalled, and survives; a rank stopped by
SIGSTOP has its stacks read from outside by py-spy, its state named (``stopped (T)``) by
``stack`` and in the stall's culprit line; without py-spy each says so in one line. The
main thread comes first. Nothing in the run folder changes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from clirun import checkout_env
from healthutil import assert_nothing_left, cli, info, log, project, start, the_run, wait_for

from clusterjob.core import procs
from clusterjob.core.files import now_iso
from clusterjob.core.rundir import RunDir, make_runs
from clusterjob.health import pyspy, rankhealth
from clusterjob.runner.health import STACK_SIGNAL

HOST = socket.gethostname()
SIG = int(STACK_SIGNAL)

# No stack handler: the signal is blocked, so a signal sent stays pending where the test sees it.
BLOCKER = f"""import signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {{{SIG}}})
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def no_py_spy(tmp_path) -> list:
    """A Python with this venv's packages but no py-spy beside it (and a PATH without
    one): the ``clusterjob`` command of an installation without the ``[health]`` extra."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert not (venv / "bin" / "py-spy").exists()
    return [str(python), "-m", "clusterjob"]


def bare_env() -> dict:
    env = checkout_env()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not Path(p, "py-spy").exists())
    return env


def pending(pid: int) -> tuple[int, int]:
    """(the signals pending for the process, for its thread) from /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["ShdPnd"], 16), int(fields["SigPnd"], 16)


def threads_in(text: str) -> list[int]:
    """The ids of the threads in a dump, in its order."""
    return [int(found, 16) for found in re.findall(r"^(?:Current thread|Thread) (0x[0-9a-f]+) ", text, re.M)]


def folder_state(run: RunDir) -> dict:
    return {str(p.relative_to(run.path)): p.read_bytes() for p in sorted(run.path.rglob("*")) if p.is_file()}


@pytest.fixture
def strangers(tmp_path):
    """A running run whose health files name two live processes of this user that are no
    ranks: a Python that blocks the stack signal (rank 0) and ``sleep`` (rank 1)."""
    python = subprocess.Popen([sys.executable, "-c", BLOCKER], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen(["sleep", "600"])
    try:
        assert python.stdout.readline() == "ready\n"
        (run,) = make_runs(tmp_path / "results", "exp", [(0, "name: exp\n", {})], executor="local",
                           started_at=now_iso(), world_size=2)
        run.update(status="running", launcher=procs.current())
        for rank, proc in enumerate((python, other)):
            rankhealth.write(run, rankhealth.RankHealth(rank, "s", HOST, HOST, procs.current(proc.pid), SIG))
        yield run, python, other
    finally:
        for proc in (python, other):
            proc.kill()
            proc.wait()


def test_a_process_that_is_no_rank_is_never_signalled_by_stack(tmp_path, strangers):
    run, python, other = strangers
    assert pyspy.executable() is not None, "py-spy belongs in the test setup (pip install py-spy)"
    before = folder_state(run)
    shown = cli(tmp_path, "stack", str(run.path))
    assert shown.returncode == 0, shown.stderr
    rank0, rank1 = shown.stdout.split("==> rank 1 ")
    not_sent = f"does not catch signal {SIG} (it has not installed the stack handler), so it was not sent"
    assert rank0.splitlines()[:2] == [
        f"==> rank 0 on {HOST}, pid {python.pid} <==",
        f"# read from outside by py-spy dump --nonblocking: rank 0 (pid {python.pid}) {not_sent}"]
    assert re.match(r"Thread 0x[0-9a-f]{16} \(most recent call first\):$", rank0.splitlines()[2])
    assert rank0.splitlines()[3] == '  File "<string>", line 4 in <module>'
    said = rank1.splitlines()  # ``sleep`` is no Python: py-spy's own words say so
    assert len(said) == 2 and said[0] == f"on {HOST}, pid {other.pid} <==" and said[1].endswith(")")
    assert said[1].startswith(f"(no stacks: rank 1 (pid {other.pid}) {not_sent}; py-spy dump --nonblocking could "
                              "not read them (")
    time.sleep(0.2)  # a signal sent would have ended ``sleep`` by now, or be pending in the Python
    assert python.poll() is None and other.poll() is None
    assert pending(python.pid) == (0, 0) and pending(other.pid) == (0, 0)
    assert folder_state(run) == before  # read-only


def test_without_py_spy_stack_says_so_in_one_line_and_signals_nothing(tmp_path, strangers, no_py_spy):
    run, python, other = strangers
    before = folder_state(run)
    done = subprocess.run([*no_py_spy, "stack", str(run.path)], cwd=tmp_path, env=bare_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"clusterjob: error: no rank of {run.path} gave its stacks: rank 0 (pid ")
    lines = done.stdout.splitlines()
    assert lines[1] == (f"(no stacks: rank 0 (pid {python.pid}) does not catch signal {SIG} (it has not installed "
                        f"the stack handler), so it was not sent; {pyspy.ABSENT})")
    assert len(lines) == 4 and lines[3].endswith(f"; {pyspy.ABSENT})")
    assert python.poll() is None and other.poll() is None and pending(python.pid) == (0, 0)
    assert folder_state(run) == before


# A rank's stack handler as clusterjob.runner.health installs it, and a second thread.
HANDLER = f"""import faulthandler, sys, threading, time
f = open(sys.argv[1], "ab", buffering=0)
faulthandler.register({SIG}, file=f, all_threads=True, chain=False)
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print(threading.main_thread().ident, flush=True)
time.sleep(600)
"""


def test_stack_shows_the_main_thread_first_and_reads_a_stopped_rank_from_outside(tmp_path):
    assert pyspy.executable() is not None, "py-spy belongs in the test setup (pip install py-spy)"
    (run,) = make_runs(tmp_path / "results", "exp", [(0, "name: exp\n", {})], executor="local",
                       started_at=now_iso(), world_size=1)
    run.update(status="running", launcher=procs.current())
    rank = subprocess.Popen([sys.executable, "-c", HANDLER, str(run.stacks_file(0))], stdout=subprocess.PIPE,
                            text=True)
    try:
        main = int(rank.stdout.readline())
        rankhealth.write(run, rankhealth.RankHealth(0, "s", HOST, HOST, procs.current(rank.pid), SIG, main))
        asked = cli(tmp_path, "stack", str(run.path))
        assert asked.returncode == 0, asked.stderr
        lines = asked.stdout.splitlines()  # by its handler (faulthandler lists the main thread last)
        assert lines[0] == f"==> rank 0 on {HOST}, pid {rank.pid} <==" and lines[1].startswith(("Current thread", "Thread"))
        assert lines[2] == '  File "<string>", line 6 in <module>' and lines[3] == ""
        assert len(threads_in(asked.stdout)) == 2 and threads_in(asked.stdout)[0] == main

        os.kill(rank.pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", 30,
                 "the stop")
        size = run.stacks_file(0).stat().st_size
        shown = cli(tmp_path, "stack", str(run.path))
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[:5] == [f"==> rank 0 on {HOST}, pid {rank.pid} <==", "# process state: stopped (T)",
                             f"# read from outside by py-spy dump --nonblocking: rank 0 (pid {rank.pid}) is stopped "
                             "(T): it cannot run its stack handler until it is continued (SIGCONT)",
                             f"Thread 0x{main:016x} (most recent call first):", '  File "<string>", line 6 in <module>']
        assert len(threads_in(shown.stdout)) == 2 and pending(rank.pid) == (0, 0)  # not signalled while stopped
        os.kill(rank.pid, signal.SIGCONT)
        time.sleep(0.3)  # a signal queued while it was stopped would be answered now
        assert run.stacks_file(0).stat().st_size == size and rank.poll() is None
    finally:
        rank.kill()
        rank.wait()


# Both ranks all-reduce and print every step until the test makes the file GO (both see it
# at the same step: it is all-reduced); the test stops rank 1 with SIGSTOP meanwhile.
STEPPER = """import os
import threading
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
threading.Thread(target=time.sleep, args=(3600,), daemon=True, name="side").start()
step = 0
while True:
    go = torch.tensor([float(os.path.exists(GO))])
    dist.all_reduce(go)
    print(f"step {step}", flush=True)
    if go.item() > 0:
        break
    step += 1
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_stopped_rank_gets_its_stacks_from_py_spy_and_its_state_named(tmp_path, no_py_spy):
    assert pyspy.executable() is not None, "py-spy belongs in the test setup (pip install py-spy)"
    project(tmp_path, STEPPER.replace("GO", repr(str(tmp_path / "go"))), health={"stall_s": 10, "on_stall": "warn"})
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "step 3" in log(run, 1), 120, "the steps")
    health = [json.loads((run / "logs" / f"rank{r}.health.json").read_text()) for r in (0, 1)]
    stopped = health[1]["ref"]["pid"]
    os.kill(stopped, signal.SIGSTOP)
    try:
        steps = stopped_rank_seen(tmp_path, run, health, no_py_spy)
        os.kill(stopped, signal.SIGCONT)
        wait_for(lambda: info(run)["stalls"][0]["ended_at"], 120, "the stall's end")  # it went on
        assert log(run, 1).count("step ") > steps
    finally:
        os.kill(stopped, signal.SIGCONT)
        (tmp_path / "go").touch()  # the ranks end
    out, err = waiting.communicate(timeout=180)
    got = info(run)
    assert waiting.returncode == 0 and got["status"] == "completed", out + err
    assert_nothing_left(run)


def stopped_rank_seen(tmp_path: Path, run: Path, health: list, no_py_spy: list) -> int:
    """The stall's culprit and stacks, ``clusterjob stack`` with py-spy and without, while
    rank 1 is stopped; the steps rank 1 had printed by the stall."""
    stopped = health[1]["ref"]["pid"]
    wait_for(lambda: info(run).get("stalls"), 120, "the stall")
    steps = log(run, 1).count("step ")
    (stall,) = info(run)["stalls"]
    assert stall["rank"] == 1 and stall["line"].startswith(f"rank 1 on {HOST}: stopped (T), ")
    assert stall["line"].endswith("; rank 0 in all_reduce"), stall["line"]
    dumped = (run / "logs" / "stall-1" / "rank1.txt").read_text()
    assert "# process state: stopped (T)\n# read from outside by py-spy dump --nonblocking: rank 1 (pid " in dumped
    assert 'train.py", line ' in dumped and "native frames" not in dumped

    shown = cli(tmp_path, "stack", str(run))
    assert shown.returncode == 0, shown.stderr
    rank0, rank1 = shown.stdout.split("==> rank 1 ")
    assert threads_in(rank0)[0] == health[0]["main_thread"] and len(threads_in(rank0)) >= 2  # main first
    assert "distributed_c10d.py" in rank0
    assert rank1.splitlines()[1:3] == [
        "# process state: stopped (T)",
        f"# read from outside by py-spy dump --nonblocking: rank 1 (pid {stopped}) is stopped (T): it cannot run "
        "its stack handler until it is continued (SIGCONT)"]
    assert threads_in(rank1)[0] == health[1]["main_thread"] and len(threads_in(rank1)) >= 2
    assert 'train.py", line ' in rank1

    bare = subprocess.run([*no_py_spy, "stack", str(run), "--rank", "1"], cwd=tmp_path, env=bare_env(),
                          capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1, bare.stderr
    assert bare.stdout.splitlines()[1] == (
        f"(no stacks: rank 1 (pid {stopped}) is stopped (T): it cannot run its stack handler until it is "
        f"continued (SIGCONT); {pyspy.ABSENT})")
    return steps


# Threads come and go all the time (a logger's, a pool's): the main thread prints (line 10)
# and waits (line 11).
CHURNER = """import threading, time
def churn():
    while True:
        t = threading.Thread(target=lambda: sum(range(100)))
        t.start(); t.join()
for _ in range(2):
    threading.Thread(target=churn, daemon=True).start()
step = 0
while True:
    print(f"step {step}", flush=True); step += 1
    time.sleep(0.05)
"""


def test_stack_requests_never_kill_a_rank_whose_threads_come_and_go(tmp_path):
    """faulthandler's all-threads dump from its signal handler reads the other threads'
    frames without the GIL and died of SIGSEGV within a few hundred requests here: the
    rank answers every request under the GIL, and lives."""
    project(tmp_path, CHURNER, tasks=1)
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    wait_for(lambda: "step 3" in log(run, 0), 120, "the rank stepping")
    wait_for(lambda: rankhealth.read(RunDir(run), 0) is not None, 60, "its health file")
    try:
        rank = rankhealth.read(RunDir(run), 0)
        assert rank is not None and rank.ref is not None and rank.stack_signal == SIG
        for _ in range(400):  # as many as a long stall's watchers and a user's ``stack`` calls send
            assert procs.terminate(rank.ref, SIG) is None
            time.sleep(0.005)
        shown = cli(tmp_path, "stack", str(run))
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"==> rank 0 on {HOST}, pid {rank.ref.pid} <==" and lines[1].startswith("Current thread")
        assert threads_in(shown.stdout)[0] == rank.main_thread
        assert re.match(r'  File "\S+/train\.py", line 1[01] in <module>$', lines[2]), shown.stdout
        assert procs.check(rank.ref) is None and info(run)["status"] == "running"
    finally:  # a failure above leaves no run behind
        cancelled = cli(tmp_path, "cancel", str(run), timeout=120)
        waiting.communicate(timeout=120)
    assert cancelled.returncode == 0 and info(run)["status"] == "cancelled", cancelled.stdout + cancelled.stderr
    assert_nothing_left(run)


def test_a_dump_taken_while_the_main_thread_runs_the_requests_handler_shows_the_code_it_interrupted():
    # The request's signal runs its (empty) handler in the main thread and wakes the thread
    # that answers: caught inside the handler, the main thread's stack is the code beneath.
    from clusterjob.runner import stackhandler

    caught = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is stackhandler._noop.__code__:
            caught.append(frame)

    def spinning_loop():
        sys.settrace(tracer)
        try:
            stackhandler._noop(0, None)
        finally:
            sys.settrace(None)

    spinning_loop()
    (inside,) = caught
    lines = list(stackhandler._frames(stackhandler._interrupted(inside)))
    assert lines[0].endswith("in spinning_loop\n") and "_noop" not in "".join(lines), lines
