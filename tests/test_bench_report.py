"""bench/bench_report.py's command timings on a small fixture: the first call (no cache)
and a cached one of ``clusterjob report``, for this checkout and one given with
--against, each call a fresh process that reports every run, printed side by side."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_report  # noqa: E402

from clusterjob.report import reading  # noqa: E402


def test_the_command_is_timed_first_and_cached_for_both_checkouts(tmp_path, capsys):
    exp = bench_report.build_fixture(tmp_path, 12, 3)
    found = bench_report.measure_cli(exp, REPO, 1)
    assert sorted(found) == [(label, call) for label in ("--against", "this checkout")
                             for call in ("cached call", "first call (no cache)")]
    assert all(len(times) == 1 and times[0][0] > 0 and times[0][1] > 0 for times in found.values())
    assert (exp / reading.CACHE_NAME).is_file()  # the cached call had one to read
    bench_report.print_cli(found)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("| `clusterjob report`, fresh process | this checkout: wall (s) | this checkout: CPU (s) | "
                        "--against: wall (s) | --against: CPU (s) |")
    assert [line.split("|")[1].strip() for line in lines[3:5]] == ["first call (no cache)", "cached call"]
    assert lines[5].startswith("first call (no cache): --against / this checkout = ")
