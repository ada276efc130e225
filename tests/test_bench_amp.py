"""bench/bench_amp.py's arithmetic: ratios to amp off taken within each round."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_amp  # noqa: E402


def test_the_table_takes_each_ratio_within_its_round_with_median_and_range():
    results = [{"auto": {"amp": "off", "samples_s": 300.0, "wall_s": 50.0},
                "off": {"amp": "off", "samples_s": 330.0, "wall_s": 48.0}},
               {"auto": {"amp": "off", "samples_s": 100.0, "wall_s": 90.0},   # a loaded round: both slow
                "off": {"amp": "off", "samples_s": 100.0, "wall_s": 91.0}},
               {"auto": {"amp": "off", "samples_s": 340.0, "wall_s": 47.0},
                "off": {"amp": "off", "samples_s": 320.0, "wall_s": 49.0}}]
    lines = bench_amp.table(results, ["auto", "off"])
    assert lines[2] == "| auto | off | 300 | 50.0 | 1.000 | 0.909 to 1.062 |"
    assert lines[3] == "| off | off | 320 | 49.0 | 1.000 | 1.000 to 1.000 |"
