"""bench/bench_gpu.py's parts that need no GPU: the runner's spec, the metrics it reads,
the ratios and the table, and what it does on a machine without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clusterjob.spec.schema import spec_from_dict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_gpu  # noqa: E402


def test_the_runners_spec_is_a_valid_spec_of_the_benchmarks_work(tmp_path):
    work = bench_gpu.Work(images=20_000, epochs=3, compiled=True)
    spec = spec_from_dict(bench_gpu.clusterjob_spec(work, tmp_path))
    assert (spec.data.dataset, spec.data.loader, spec.data.limit_train, spec.data.drop_last) == \
        ("synthetic", "tensor", 20_000, True)
    assert (spec.model.arch, spec.model.channels_last) == ("resnet18", True)
    assert (spec.train.batch_size, spec.train.amp, spec.train.compile, spec.train.epochs) == (512, "bf16", True, 3)
    assert spec.resources.gpus_per_node == 1 and spec.name == "bench-gpu-compile"
    cpu = spec_from_dict(bench_gpu.clusterjob_spec(bench_gpu.Work(device="cpu"), tmp_path))
    assert cpu.resources.gpus_per_node == 0 and cpu.train.compile is False


def test_samples_per_s_come_in_epoch_order_and_the_median_skips_epoch_one(tmp_path):
    lines = [{"epoch": 2, "samples_per_s": 900.0}, {"epoch": 1, "samples_per_s": 100.0},
             {"epoch": 3, "samples_per_s": 1000.0}, {"epoch": 4, "samples_per_s": 950.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    epochs = bench_gpu.samples_per_s(tmp_path / "metrics.jsonl")
    assert epochs == [100.0, 900.0, 1000.0, 950.0]
    assert bench_gpu.median_after_first(epochs) == 950.0
    assert bench_gpu.median_after_first([70.0]) == 70.0 and bench_gpu.median_after_first([]) is None


def test_ratios_are_against_the_bare_loop_of_the_same_mode_and_the_table_shows_skips():
    rows = bench_gpu.with_ratios([
        bench_gpu.Row("bare", "eager", img_s=40_000.0, startup_s=6.0),
        bench_gpu.Row("clusterjob", "eager", img_s=39_000.0, startup_s=6.8),
        bench_gpu.Row("bare", "compile", img_s=50_000.0, startup_s=40.0),
        bench_gpu.Row("clusterjob", "compile", img_s=49_000.0, startup_s=41.0),
        bench_gpu.Row("lightning", "eager", note="skipped: neither lightning nor pytorch_lightning imports here")])
    assert [row.vs_bare for row in rows[:4]] == [1.0, 0.975, 1.0, 0.98] and rows[4].vs_bare is None
    lines = bench_gpu.table(rows).splitlines()
    assert lines[3] == "| clusterjob | eager | 39,000 | 0.97 | 6.8 |  |"
    assert lines[6] == "| lightning | eager | - | - | - | skipped: neither lightning nor pytorch_lightning imports here |"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--json", str(tmp_path / "r.json")],
                          check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "bench_gpu: no CUDA GPU is visible on this machine; nothing run\n")
    assert not any(tmp_path.iterdir())
