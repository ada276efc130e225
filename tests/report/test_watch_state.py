"""Every read-only view derives a run's state the same way (clusterjob.launch.executor.records,
the derivation of ``status``): a local run whose every process was killed with -9 still
says "running" in its run.json, yet ``status``, ``report`` and ``report --watch`` all show
it failed, and the watch ends by itself. Nothing is written. Real processes, local."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
from clirun import cli, ended, wait_for
from owncode import Project

pytestmark = pytest.mark.slow

LOOP = "import itertools, time\nfor i in itertools.count():\n    print(f'iter {i}', flush=True)\n    time.sleep(0.1)\n"


def tree(root: Path) -> dict:
    """{relative path: sha256 or "dir"}: what a read-only command must leave as it was."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def naming(run: Path) -> list:
    """The live processes whose command line names ``run`` (a rank's watcher does)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(run).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Project, Path]:
    """A detached local run whose rank and supervisor were killed with -9 while it ran."""
    own = Project(tmp_path_factory.mktemp("killed"), "loop")
    own.spec(LOOP)
    done = cli(own.folder, "submit", "loop.yaml", "--executor", "local")
    assert done.returncode == 0, done.stdout + done.stderr
    run = own.run
    log = run / "logs" / "rank0.out"
    wait_for(lambda: log.exists() and "iter 2" in log.read_text() and own.info()["status"] == "running",
             "the code to run")
    rank = json.loads((run / "logs" / "rank0.proc.json").read_text())["pid"]
    launcher = own.info()["launcher"]["pid"]
    os.kill(rank, signal.SIGKILL)  # the rank first: its SIGTERM from a dead supervisor could record a stop
    os.kill(launcher, signal.SIGKILL)
    wait_for(lambda: ended(rank) and ended(launcher), "the rank and the supervisor to end")
    # the rank's watcher (its command line names the run) writes logs/rank0.ended once its rank is gone
    wait_for(lambda: not naming(run), "the rank's watcher to end")
    assert own.info()["status"] == "running"  # what run.json still says, with no process left to write it
    return own, run


def test_report_watch_ends_by_itself_with_the_run_failed(killed):
    own, run = killed
    before = tree(own.folder / "results")
    done = cli(own.folder, "report", "--watch", "--interval", "0.2", "results/loop")
    assert done.returncode == 0, done.stderr
    # the first frame is the last: the watch ended by itself at once, never waiting for a state to come
    assert done.stdout.count("clusterjob report --watch results/loop") == 1, done.stdout
    assert "(every run has ended)" in done.stdout and "1 run: 1 failed" in done.stdout, done.stdout
    assert tree(own.folder / "results") == before  # read-only: run.json still says running


def test_report_and_status_show_the_same_derived_state(killed):
    own, run = killed
    report = cli(own.folder, "report", "results/loop", "--runs", "--format", "json")
    assert report.returncode == 0, report.stderr
    (row,) = json.loads(report.stdout)["runs"]
    assert row["status"] == "failed" and row["error"].startswith("every process of the run ended"), row
    assert json.loads(report.stdout)["status_counts"] == {"failed": 1}
    table = cli(own.folder, "report", "results/loop")
    assert "1 run: 1 failed" in table.stdout, table.stdout
    status = cli(own.folder, "status", "results/loop")
    assert "failed" in status.stdout.splitlines()[1], status.stdout
    assert own.info()["status"] == "running"  # none of them wrote it
