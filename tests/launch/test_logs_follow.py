"""`clusterjob logs RUN --follow` with real processes: it prints what the rank writes while
it runs and ends with the run (exit 0), Ctrl-C ends it quietly (exit 130), and it writes
nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from clirun import WAIT_S, cli, start, wait_for
from owncode import Project

pytestmark = pytest.mark.slow

SLOW_PRINTS = """
import sys, time
for i in range(1, 7):
    print(f"line {i}", flush=True)
    time.sleep(0.4)
print("to stderr", file=sys.stderr, flush=True)
"""


def started(own: Project, script: str) -> Path:
    """The run of ``script``, handed to a detached local supervisor, once its rank logs."""
    own.spec(script)
    done = cli(own.folder, "submit", f"{own.name}.yaml", "--executor", "local")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (own.run / "logs" / "rank0.out").exists(), "the rank's log")
    return own.run


def stamps(folder: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if p.is_file()}


def test_follow_prints_the_rank_as_it_writes_and_ends_with_the_run(tmp_path):
    own = Project(tmp_path, "follow")
    run = started(own, SLOW_PRINTS)
    follow = cli(own.folder, "logs", str(run), "--follow", timeout=WAIT_S)
    assert follow.returncode == 0, follow.stderr
    out = follow.stdout
    assert [out.index(f"line {i}\n") for i in range(1, 7)] == sorted(out.index(f"line {i}\n") for i in range(1, 7))
    assert f"==> {run}/logs/rank0.err <==\nto stderr\n" in out
    assert own.info()["status"] == "completed"
    wait_for(lambda: "completed" in (run / "logs/supervisor.log").read_text(),
             "the supervisor's last word, after the run's")
    before = stamps(run)
    again = cli(own.folder, "logs", str(run), "-f", timeout=WAIT_S)  # a finished run: all of it, at once
    assert again.returncode == 0 and "line 6" in again.stdout
    assert stamps(run) == before  # read-only


def test_ctrl_c_ends_follow_quietly(tmp_path):
    own = Project(tmp_path, "interrupt")
    run = started(own, "import time\nprint('started', flush=True)\ntime.sleep(3600)\n")  # cancelled below
    wait_for(lambda: own.info()["status"] == "running", "the run to run")
    printed = tmp_path / "follow.out"
    with printed.open("w") as out:
        follow = start(own.folder, "logs", str(run), "--follow", stdout=out)
    wait_for(lambda: "started\n" in printed.read_text(), "follow to print the rank's line")  # it follows now
    follow.send_signal(signal.SIGINT)
    _, err = follow.communicate(timeout=WAIT_S)
    assert follow.returncode == 130 and err == "", err
    assert "started" in printed.read_text()
    assert cli(own.folder, "cancel", str(run)).returncode == 0
