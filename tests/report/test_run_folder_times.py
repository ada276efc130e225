"""Every time read from a run folder is parsed once, into UTC (record.parse_time): a
run.json copied, merged or edited by hand whose times mix an offset and none, or hold
no time at all, never makes `report` raise; a time without an offset is taken as UTC,
what clusterjob writes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from clirun import cli
from test_results import epoch_line, write_run

from clusterjob.core.record import parse_time

UTC = timezone.utc


@pytest.mark.parametrize("text, parsed", [
    ("2026-11-22T00:00:10+00:00", datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)),
    ("2026-11-22T00:00:10", datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)),
    ("2026-11-22T00:00:10Z", datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)),
    ("2026-11-22T02:00:10+02:00", datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)),
    ("2026-11-22", datetime(2026, 11, 22, tzinfo=UTC)),
    ("0001-01-01T00:00:00+14:00", None),  # before year 1 in UTC
    ("9999-12-31T23:59:59-14:00", None),  # after year 9999 in UTC
    ("yesterday", None), ("", None), (None, None), (1795000000, None), (["2026-11-22"], None),
])
def test_a_time_parses_into_utc_or_none(text, parsed):
    found = parse_time(text)
    assert found == parsed
    assert found is None or found.utcoffset().total_seconds() == 0


def test_sessions_with_and_without_an_offset_report_their_wall_time(tmp_path):
    sessions = [{"at": "2026-11-22T00:00:00+00:00", "job": None, "checkpoint_at": None},
                {"at": "2026-11-22T00:01:00", "job": None, "checkpoint_at": "2026-11-22T00:00:20"}]
    write_run(tmp_path, "mixed", {}, [epoch_line(1, 0.5)], sessions=sessions, stopped_at="2026-11-22T00:00:30",
              finished_at="2026-11-22T00:01:15+00:00", attempts=[{"at": "2026-11-22T00:00:25Z", "hosts": ["n1"],
                                                                  "why": "node failure", "retry": 1, "job": None}])
    write_run(tmp_path, "junk", {}, [epoch_line(1, 0.6)], started_at=12, finished_at="2026-11-22T00:00:09",
              sessions=[{"at": "0001-01-01T00:00:00+14:00"}, {"at": 5}, {"at": "noon"}])
    md = cli(tmp_path, "report", "exp", "--runs", process=True)
    assert md.returncode == 0, md.stderr
    assert "Traceback" not in md.stderr and "mixed" in md.stdout and "junk" in md.stdout
    done = cli(tmp_path, "report", "exp", "--runs", "--format", "json", process=True)
    assert done.returncode == 0, done.stderr
    rows = {row["run_id"]: row for row in json.loads(done.stdout)["runs"]}
    # 0:00 to 0:30 (stopped), then 1:00 to 1:15 (finished): the naive times are UTC
    assert rows["mixed"]["wall_time_s"] == pytest.approx(30.0 + 15.0)
    assert rows["junk"]["wall_time_s"] == pytest.approx(10.0)  # no session time reads: the epochs' time
