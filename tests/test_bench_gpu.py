"""bench/bench_gpu.py's parts that need no GPU: the runner's spec, the metrics it reads,
the rounds (their order, the per-round ratios, medians and ranges, the goal), the tables,
a CPU smoke of three rounds, and what it does on a machine without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
import torch

from clusterjob.spec.schema import spec_from_dict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_gpu  # noqa: E402

Entry, Row = bench_gpu.Entry, bench_gpu.Row
BARE, CJ, BARE_C, CJ_C = Entry("bare"), Entry("clusterjob"), Entry("bare", True), Entry("clusterjob", True)


def test_the_runners_spec_is_a_valid_spec_of_the_benchmarks_work(tmp_path):
    work = bench_gpu.Work(images=20_000, epochs=3, compiled=True)
    spec = spec_from_dict(bench_gpu.clusterjob_spec(work, tmp_path))
    assert (spec.data.dataset, spec.data.loader, spec.data.limit_train, spec.data.drop_last) == \
        ("synthetic", "tensor", 20_000, True)
    assert (spec.model.arch, spec.model.channels_last) == ("resnet18", True)
    assert (spec.train.batch_size, spec.train.amp, spec.train.compile, spec.train.epochs) == (512, "bf16", True, 3)
    assert spec.resources.gpus_per_node == 1 and spec.name == "bench-gpu-compile"
    cpu = spec_from_dict(bench_gpu.clusterjob_spec(bench_gpu.Work(device="cpu", arch="convnet"), tmp_path))
    assert cpu.resources.gpus_per_node == 0 and cpu.train.compile is False and cpu.model.arch == "convnet"


def test_the_health_rows_specs_turn_off_the_sampler_alone_or_the_whole_watchdog(tmp_path):
    work, default = bench_gpu.Work(), spec_from_dict({"name": "x"}).health
    specs = {name: spec_from_dict(bench_gpu.clusterjob_spec(work, tmp_path, name)).health
             for name in ("", "sampler off", "health off", "sampler every 0.5 s")}
    assert "health" not in bench_gpu.clusterjob_spec(work, tmp_path)  # clusterjob's row: the defaults
    assert specs[""] == default and default is not None and default.gpu_sample_s == 10.0
    assert specs["sampler off"] == replace(default, gpu_sample_s=None)  # the watchdog stays as it was
    assert specs["health off"] is None
    assert specs["sampler every 0.5 s"] == replace(default, gpu_sample_s=0.5)


def test_samples_per_s_come_in_epoch_order_and_the_median_skips_epoch_one(tmp_path):
    lines = [{"epoch": 2, "samples_per_s": 900.0}, {"epoch": 1, "samples_per_s": 100.0},
             {"epoch": 3, "samples_per_s": 1000.0}, {"epoch": 4, "samples_per_s": 950.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    epochs = bench_gpu.samples_per_s(tmp_path / "metrics.jsonl")
    assert epochs == [100.0, 900.0, 1000.0, 950.0]
    assert bench_gpu.median_after_first(epochs) == 950.0
    assert bench_gpu.median_after_first([70.0]) == 70.0 and bench_gpu.median_after_first([]) is None


def test_each_round_rotates_the_order_so_every_row_runs_once_in_every_place():
    assert [bench_gpu.rotated(("a", "b", "c"), i) for i in range(4)] == \
        [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c")]
    assert bench_gpu.rotated((), 3) == ()
    lightning, lightning_c = Entry("lightning"), Entry("lightning", True)
    plan = bench_gpu.Plan((BARE, CJ, lightning, BARE_C, CJ_C, lightning_c), BARE, 3)
    orders = [bench_gpu.round_order(plan, i) for i in range(3)]
    assert orders[0] == (BARE, CJ, lightning, BARE_C, CJ_C, lightning_c)
    assert orders[1] == (CJ, lightning, BARE, CJ_C, lightning_c, BARE_C)
    assert orders[2] == (lightning, BARE, CJ, lightning_c, BARE_C, CJ_C)
    for order in orders:  # eager first, then compiled, each row once
        assert [e.compiled for e in order] == [False] * 3 + [True] * 3 and sorted(map(repr, order)) == \
            sorted(map(repr, plan.entries))
    for place in range(6):
        assert len({order[place] for order in orders}) == 3


def test_the_plan_has_the_rows_the_arguments_ask_for():
    def plan(*argv):
        return bench_gpu.plan_for(bench_gpu.parse_args(list(argv)))

    off, health_off = Entry("clusterjob", False, "sampler off"), Entry("clusterjob", False, "health off")
    full = plan()
    assert full.rounds == 5 and full.reference == BARE and full.judged
    assert full.entries == (BARE, CJ, off, health_off, Entry("lightning"), BARE_C, CJ_C, Entry("lightning", True))
    assert [e.label for e in full.entries[:4]] == ["bare", "clusterjob", "clusterjob, sampler off",
                                                   "clusterjob, health off"]
    assert plan("--cpu-smoke").entries == (BARE, CJ) and plan("--cpu-smoke").rounds == 1
    assert plan("--rounds", "3", "--lightning", "eager", "--toggles", "none").entries == \
        (BARE, CJ, Entry("lightning"), BARE_C, CJ_C)
    assert plan("--toggles", "both", "--lightning", "none", "--no-compile").entries == (BARE, CJ, off, health_off)
    sampler = plan("--sampler-rounds", "4")
    assert (sampler.entries, sampler.reference, sampler.rounds, sampler.judged) == \
        ((off, Entry("clusterjob", False, "sampler every 0.5 s")), off, 4, False)


def test_a_round_count_under_one_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_gpu.parse_args(["--rounds", "0"])
    assert stop.value.code == 2
    assert "argument --rounds: 0 is not a count of rounds: give 1 or more" in capsys.readouterr().err


def test_another_round_starts_only_when_one_as_long_as_the_longest_still_fits_the_budget():
    assert bench_gpu.time_for_another(0.0, 0.0, 10.0)
    assert bench_gpu.time_for_another(200.0, 100.0, 300.0)
    assert not bench_gpu.time_for_another(200.1, 100.0, 300.0)
    assert bench_gpu.time_for_another(1e9, 1e9, None)


def made_up_rounds() -> list[dict]:
    """Three rounds in which the bare loop drifts by 2x: the ratio is taken within each round."""
    bare, cj = [100.0, 200.0, 150.0], [99.0, 190.0, 160.0]
    bare_start, cj_start = [6.0, 7.0, 8.0], [6.5, 9.0, 8.2]
    rounds = []
    for i in range(3):
        rounds.append({CJ: Row("clusterjob", "eager", cj[i], startup_s=cj_start[i]),
                       BARE: Row("bare", "eager", bare[i], startup_s=bare_start[i]),
                       BARE_C: Row("bare", "compile", 300.0 + i, startup_s=20.0),
                       CJ_C: Row("clusterjob", "compile", 297.0 + i, startup_s=20.5) if i != 1 else
                       Row("clusterjob", "compile", note="timed out after 300 s")})
    return rounds


def test_ratios_and_start_up_differences_are_per_round_then_median_and_range():
    plan = bench_gpu.Plan((BARE, CJ, BARE_C, CJ_C), BARE, 3)
    rounds = made_up_rounds()
    assert bench_gpu.compare(rounds[0], plan)[CJ] == bench_gpu.Compared(0.99, 0.5)
    assert bench_gpu.compare(rounds[1], plan)[CJ_C] == bench_gpu.Compared(None, None)
    by = {s.entry: s for s in bench_gpu.summarize(rounds, plan)}
    cj = by[CJ]
    assert cj.ratio == bench_gpu.Spread(0.99, 0.95, pytest.approx(160 / 150), 3)  # not 160 / 150 of the medians
    assert cj.img_s == bench_gpu.Spread(160.0, 99.0, 190.0, 3)
    assert cj.startup == bench_gpu.Spread(8.2, 6.5, 9.0, 3)
    assert cj.startup_over == bench_gpu.Spread(0.5, pytest.approx(0.2), 2.0, 3)
    assert by[BARE].ratio == bench_gpu.Spread(1.0, 1.0, 1.0, 3) and by[BARE].startup_over.median == 0.0
    assert by[CJ_C].ratio == bench_gpu.Spread(pytest.approx((0.99 + 299 / 302) / 2), 0.99, 299 / 302, 2)
    assert by[CJ_C].note == "timed out after 300 s"
    assert bench_gpu.spread([None, None]) is None and bench_gpu.spread([2.0, None, 1.0, 5.0]) == \
        bench_gpu.Spread(2.0, 1.0, 5.0, 3)


def test_the_tables_give_each_rows_median_and_range_and_every_round_as_it_ran():
    plan = bench_gpu.Plan((BARE, CJ, BARE_C, CJ_C, Entry("lightning")), BARE, 3)
    rounds = made_up_rounds()
    rounds[0][Entry("lightning")] = Row("lightning", "eager", note="skipped: neither lightning nor "
                                        "pytorch_lightning imports here")
    lines = bench_gpu.summary_table(bench_gpu.summarize(rounds, plan), plan, 3).splitlines()
    assert lines[0] == ("| row | mode | rounds | img/s: median | img/s: range | vs bare: median | vs bare: range | "
                        "start-up (s): median | start-up (s): range | start-up over bare (s): median | "
                        "start-up over bare (s): range | note |")
    assert lines[3] == "| clusterjob | eager | 3 of 3 | 160 | 99 to 190 | 0.990 | 0.950 to 1.067 | 8.2 | 6.5 to 9.0 | " \
                       "+0.5 | +0.2 to +2.0 |  |"
    assert lines[5] == "| clusterjob | compile | 2 of 3 | 298 | 297 to 299 | 0.990 | 0.990 to 0.990 | 20.5 | " \
                       "20.5 to 20.5 | +0.5 | +0.5 to +0.5 | timed out after 300 s |"
    assert lines[6] == "| lightning | eager | 0 of 3 | - | - | - | - | - | - | - | - | skipped: neither lightning " \
                       "nor pytorch_lightning imports here |"
    per_round = bench_gpu.rounds_table(rounds, plan).splitlines()
    assert per_round[2] == "| 1 | 1 | clusterjob | eager | 99 | 0.990 | 6.5 | +0.5 |  |"
    assert per_round[3] == "| 1 | 2 | bare | eager | 100 | 1.000 | 6.0 | +0.0 |  |"
    assert per_round[6] == "| 1 | 5 | lightning | eager | - | - | - | - | skipped: neither lightning nor " \
                           "pytorch_lightning imports here |"
    assert per_round[9] == "| 2 | 3 | bare | compile | 301 | 1.000 | 20.0 | +0.0 |  |"
    assert per_round[10] == "| 2 | 4 | clusterjob | compile | - | - | - | - | timed out after 300 s |"
    assert len(per_round) == 2 + 5 + 4 + 4


def test_the_goal_is_met_missed_or_for_a_smoke_not_judged_with_the_numbers():
    def summary(ratios, overs, entry=CJ):
        return bench_gpu.Summary(entry, None, bench_gpu.spread(ratios), None, bench_gpu.spread(overs), "")

    met = bench_gpu.judge(summary([0.97, 0.99, 1.02], [0.2, 1.5, 3.0]), "bare", smoke=False)
    assert met == bench_gpu.Goal("eager", True, "goal, eager: met: clusterjob / bare median 0.990 (0.970 to 1.020 "
                                 "over 3 rounds), start-up over bare median +1.5 s (+0.2 to +3.0); goal: median >= "
                                 "0.97 (met), start-up within bare + 1.5 s (met)")
    slow = bench_gpu.judge(summary([0.90, 0.96, 1.2], [0.0, 0.1, 0.2], CJ_C), "bare", smoke=False)
    assert (slow.mode, slow.met) == ("compile", False) and "median 0.960" in slow.line
    assert "median >= 0.97 (missed), start-up within bare + 1.5 s (met)" in slow.line
    late = bench_gpu.judge(summary([1.0], [1.6]), "bare", smoke=False)
    assert late.met is False and late.line.startswith("goal, eager: missed:") and "+ 1.5 s (missed)" in late.line
    smoke = bench_gpu.judge(summary([0.5], [9.0]), "bare", smoke=True)
    assert smoke.met is None and smoke.line.startswith("goal, eager: not judged, a CPU smoke")
    none = bench_gpu.judge(bench_gpu.Summary(CJ, None, None, None, None, "exit 1: boom"), "bare", smoke=False)
    assert none.met is False and none.line.endswith("(exit 1: boom)")
    plan = bench_gpu.Plan((BARE, CJ, Entry("clusterjob", False, "health off")), BARE, 1)
    summaries = bench_gpu.summarize([{BARE: Row("bare", "eager", 10.0, startup_s=1.0),
                                      CJ: Row("clusterjob", "eager", 10.0, startup_s=1.0),
                                      plan.entries[2]: Row("clusterjob", "eager", 5.0, startup_s=1.0)}], plan)
    assert [g.met for g in bench_gpu.goals(summaries, plan, smoke=False)] == [True]  # clusterjob's own row only
    assert bench_gpu.goals(summaries, replace(plan, judged=False), smoke=False) == []


def summary_rows(stdout: str) -> dict:
    """The summary table of the bench's output, as {(row, mode): {column: cell}}."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| row | mode | rounds |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        rows[cells["row"], cells["mode"]] = cells
    return rows


def low_high(cell: str) -> tuple[float, float]:
    low, high = cell.split(" to ")
    return float(low.replace(",", "")), float(high.replace(",", ""))


def test_a_cpu_smoke_of_three_rounds_gives_medians_and_ranges_and_judges_no_goal(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--cpu-smoke", "--rounds", "3",
                           "--json", str(tmp_path / "r.json")],
                          check=False, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = summary_rows(done.stdout)
    assert sorted(rows) == [("bare", "eager"), ("clusterjob", "eager")]
    for (runner, _), cells in rows.items():
        assert cells["rounds"] == "3 of 3" and cells["note"] == ""
        for name in ("img/s", "vs bare", "start-up (s)", "start-up over bare (s)"):
            median, (low, high) = float(cells[f"{name}: median"].replace(",", "")), low_high(cells[f"{name}: range"])
            assert low <= median <= high, (runner, name, cells)
        assert float(cells["img/s: median"].replace(",", "")) > 0 and low_high(cells["vs bare: range"])[0] > 0
        assert float(cells["start-up (s): median"]) > 0
    assert (rows["bare", "eager"]["vs bare: median"], rows["bare", "eager"]["vs bare: range"]) == \
        ("1.000", "1.000 to 1.000")
    assert "goal, eager: not judged, a CPU smoke (its numbers are no GPU's): clusterjob / bare median " in done.stdout
    found = json.loads((tmp_path / "r.json").read_text())
    assert (found["rounds_asked"], found["rounds_run"], found["reference"]) == (3, 3, "bare")
    assert found["goal"] == {"ratio": 0.97, "startup_over_s": 1.5}
    assert [[row["row"] for row in one] for one in found["rounds"]] == \
        [["bare", "clusterjob"], ["clusterjob", "bare"], ["bare", "clusterjob"]]  # the order rotates
    ratios = [row["ratio"] for one in found["rounds"] for row in one if row["row"] == "clusterjob"]
    assert all(ratio > 0 for ratio in ratios)
    assert found["summary"][1]["ratio"]["median"] == pytest.approx(sorted(ratios)[1])
    assert [goal["met"] for goal in found["goals"]] == [None]


def gpu_check():
    """scripts/gpu-check as a module (its file has no .py)."""
    loader = SourceFileLoader("gpu_check", str(REPO / "scripts" / "gpu-check"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    loader.exec_module(module)
    return module


def test_gpu_checks_bench_case_reads_the_rounds_medians_and_goals(tmp_path, monkeypatch, capsys):
    check = gpu_check()
    assert check.BENCH_ARGS[:2] == ("--rounds", "3") and check.CHECK_S == 480
    monkeypatch.setattr(check, "BENCH_ARGS", ("--cpu-smoke", "--rounds", "2"))
    ok, _, detail = check.run_bench(tmp_path, budget_s=0)  # no time left: the first round still runs
    assert "bench_gpu: 1 of 2 rounds: another would pass --budget-s 0" in capsys.readouterr().out
    assert ok is False  # a smoke judges no goal: never a pass
    assert detail.startswith("1 of 2 rounds (the check had 0 s left for them); eager missed: clusterjob / bare ")
    assert detail.endswith(" (goal: clusterjob / bare median >= 0.97, start-up within bare + 1.5 s)")
    assert check.bench_numbers({"median": 0.99, "low": 0.95, "high": 1.01}, {"median": 0.3, "low": -0.1,
                                                                         "high": 1.2}) == \
        "clusterjob / bare 0.990 (0.950 to 1.010), start-up +0.3 s (-0.1 to +1.2)"
    assert check.bench_numbers(None, None) == "no number"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--json", str(tmp_path / "r.json")],
                          check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "bench_gpu: no CUDA GPU is visible on this machine; nothing run\n")
    assert not any(tmp_path.iterdir())
