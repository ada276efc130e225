"""The watchdog's leader, in process (clusterjob.runner.watchdog): progress seen on its
own clock, the straggler recorded and warned about once a whole minute says so."""

from __future__ import annotations

from clusterjob.core.rundir import RunDir, create_run
from clusterjob.health import rankhealth
from clusterjob.runner import watchdog
from clusterjob.runner.watchconfig import WatchConfig


def config(run: RunDir) -> WatchConfig:
    return WatchConfig(str(run.path), rank=0, world=2, session="s1", stall_s=None, action="stop", output=True,
                       straggler_pct=30.0)


def waits(rank: int, share: float, minute: float) -> rankhealth.RankHealth:
    timed = rankhealth.Waits("timed", share * 90, 90, share * minute, minute)
    return rankhealth.RankHealth(rank, "s1", f"node{rank + 1}", f"node{rank + 1}", waits=timed)


def test_the_straggler_is_recorded_and_warned_about_once_a_whole_minute_says_so(tmp_path, capsys):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(status="running")
    leader = watchdog.Leader(watchdog.Watcher(config(run)))
    for rank, share in ((0, 0.45), (1, 0.03)):
        rankhealth.write(run, waits(rank, share, minute=30))
    leader.stragglers()  # half a minute: recorded, no warning yet
    recorded = run.read().straggler
    assert (recorded.rank, recorded.host, recorded.wait_pct) == (1, "node2", 45.0) and run.read().warnings == []
    for rank, share in ((0, 0.45), (1, 0.03)):
        rankhealth.write(run, waits(rank, share, minute=60))
    leader.stragglers()
    leader.stragglers()
    line = ("health: rank 1 on node2 is the slowest: the others waited 45% of their time in collectives over the "
            "last minute (health.straggler_wait_pct: 30)")
    assert run.read().warnings == [line]
    assert capsys.readouterr().err == f"clusterjob: warning: {line}\n"


def test_progress_is_any_change_of_a_ranks_marks_seen_on_the_watchers_clock(tmp_path):
    run = RunDir(tmp_path)
    run.logs.mkdir()
    progress = watchdog.Progress(run, [0, 1], output=True)
    before = progress.latest()
    progress.update()
    assert progress.latest() == before  # nothing there, nothing changed
    (run.logs / "rank1.out").write_text("step 1\n")
    progress.update()
    assert progress.changed[1] > before and progress.changed[0] == before
    quiet = watchdog.Progress(run, [0], output=False)
    first = quiet.changed[0]
    (run.logs / "rank0.err").write_text("a line\n")
    quiet.update()
    assert quiet.changed[0] == first  # output is no progress without output_is_progress
    run.beat_file(0).touch()
    quiet.update()
    assert quiet.changed[0] > first


def test_stalls_are_numbered_on_across_sessions(tmp_path):
    run = RunDir(tmp_path)
    run.logs.mkdir()
    assert watchdog._next_number(run) == 1
    (run.logs / "stall-3").mkdir()
    (run.logs / "stall-x").mkdir()
    assert watchdog._next_number(run) == 4
