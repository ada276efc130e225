"""wall_time is the sum of the run's sessions' running time: the time a run spent
stopped (cancelled, preempted, waiting for its resume or its requeue) is left out."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
from clirun import WAIT_S, cli
from owncode import Project
from test_failed_runs import Page
from test_results import epoch_line, write_run

from clusterjob.report import build as report

T0 = datetime(2026, 11, 22, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def session(start: float, checkpoint: "float | None" = None) -> dict:
    return {"at": at(start), "job": None, "checkpoint_at": None if checkpoint is None else at(checkpoint),
            "knows_checkpoints": True}


CASES = [
    # (sessions, stopped_at, finished_at, attempts, status, wall_time_s)
    ("one session", [session(0)], None, 9, [], "completed", 9.0),
    ("cancelled at 4, resumed at 30", [session(0), session(30)], 4, 39, [], "completed", 13.0),
    ("ended by a node failure at 5", [session(0), session(60)], None, 70, [at(5)], "completed", 15.0),
    ("two stops: the first one's end is its checkpoint", [session(0), session(20, 6), session(50, 26)], 27, 58, [],
     "completed", 6.0 + 7.0 + 8.0),
    ("preempted and not resumed yet", [session(0)], 6, None, [], "preempted", 6.0),
    ("a session whose end no record tells: the epochs' time", [session(0), session(30)], None, 40, [], "completed",
     10.0),
]


@pytest.mark.parametrize("sessions, stopped, finished, attempts, status, wall", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_wall_time_sums_the_sessions_running_time(tmp_path, sessions, stopped, finished, attempts, status, wall):
    fields = {"sessions": sessions, "stopped_at": None if stopped is None else at(stopped),
              "attempts": [{"at": a, "hosts": ["n1"], "why": "node failure", "retry": 1, "job": None}
                           for a in attempts]}
    run = write_run(tmp_path, "r", {}, [epoch_line(1, 0.5)], status=status, started_at=at(0), **fields)
    info = json.loads((run / "run.json").read_text())
    info["finished_at"] = None if finished is None else at(finished)
    (run / "run.json").write_text(json.dumps(info))
    assert report.build_report(tmp_path / "exp").runs["wall_time_s"].tolist() == [pytest.approx(wall)]


def test_without_a_known_end_a_running_run_shows_its_epochs_time(tmp_path):
    lines = [epoch_line(e, 0.5) for e in (1, 2, 3)]  # 10 s each
    write_run(tmp_path, "r", {}, lines, status="running", sessions=[session(0), session(100)], stopped_at=None)
    assert report.build_report(tmp_path / "exp").runs["wall_time_s"].tolist() == [30.0]


SLEEPS = "import time, clusterjob\nfor step in range(1, 13):\n    time.sleep(0.25)\n    clusterjob.log(step=step, score=step)\n"


def wait_for(predicate, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_run_cancelled_and_resumed_counts_its_running_time_only(tmp_path):
    own = Project(tmp_path, "stops")
    own.spec(SLEEPS)
    started = cli(own.folder, "submit", "stops.yaml", "--executor", "local")
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: (own.run / "metrics.jsonl").is_file() and len(own.lines()) >= 2)
    cancelled = cli(own.folder, "cancel", str(own.run))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for(lambda: own.info()["status"] == "cancelled")
    time.sleep(3)  # stopped: no running time
    resumed = cli(own.folder, "resume", str(own.run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = own.info()
    first, second = (datetime.fromisoformat(s["at"]) for s in info["sessions"])
    stopped, finished = datetime.fromisoformat(info["stopped_at"]), datetime.fromisoformat(info["finished_at"])
    running = (stopped - first + finished - second).total_seconds()
    elapsed = (finished - datetime.fromisoformat(info["started_at"])).total_seconds()
    runs = pd.read_csv(io.StringIO(cli(own.folder, "report", "results/stops", "--runs", "--format", "csv").stdout))
    assert runs["wall_time_s"].tolist() == [pytest.approx(running, abs=1e-3)]
    assert running >= 3.0 and running <= elapsed - 3.0  # the second session alone; the stopped 3 s left out
    cli(own.folder, "report", "results/stops", "--runs", "--out", "r.html")
    (row,) = [cells for _, cells in Page((tmp_path / "r.html").read_text()).rows("runs") if "run_id" in cells]
    assert row["wall_time"] == f"{running:.1f} s"
