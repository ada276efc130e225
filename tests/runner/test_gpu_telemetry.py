"""GPU telemetry through the command line with real processes and a fake NVML
(tests/fakenvml): two local ranks on two scripted GPUs (one at 90%, one at 10% that falls
off the bus after four readings), the telemetry file, the report's columns and their
sums, TensorBoard's system metrics; a power reading NVML refuses; no NVML at all."""

from __future__ import annotations

import json

import pytest
from clirun import cli
from gpufake import fake_env, records
from loggerread import tensorboard_series
from trainutil import write_spec

from clusterjob.core import telemetry

pytestmark = pytest.mark.slow

SCRIPT = {"gpus": {"GPU-aaaa": {"util": 90, "mem_mib": 2048, "power_w": 250.5},
                   "GPU-bbbb": {"util": 10, "mem_mib": 512, "power_w": 80.0, "lost_after": 4}}}
FIELDS = ["time", "rank", "host", "gpu", "util_pct", "mem_used_mib", "power_w"]


def gpu_spec(folder, **sections):
    return write_spec(folder, "g", data={"limit_train": 2048}, train={"epochs": 2},
                      resources={"gpus_per_node": 2, "tasks_per_node": 2},
                      health={"gpu_sample_s": 0.25}, **sections)


def the_run(folder):
    (run,) = [p for p in (folder / "results" / "g").iterdir() if (p / "run.json").exists()]
    return run


def test_two_ranks_sample_their_own_gpu_and_the_report_sums_the_samples(tmp_path):
    spec = gpu_spec(tmp_path, logging={"tensorboard": True})
    env = fake_env(SCRIPT, visible="GPU-aaaa,GPU-bbbb")
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = the_run(tmp_path)
    found = records(run)
    assert all(list(r) == FIELDS for r in found)
    by_rank = {rank: [r for r in found if r["rank"] == rank] for rank in (0, 1)}
    assert {r["gpu"] for r in by_rank[0]} == {"GPU-aaaa"} and {r["gpu"] for r in by_rank[1]} == {"GPU-bbbb"}
    assert {(r["util_pct"], r["mem_used_mib"], r["power_w"]) for r in by_rank[0]} == {(90.0, 2048.0, 250.5)}
    assert len(by_rank[0]) >= 8 and 1 <= len(by_rank[1]) <= 4  # GPU-bbbb answered four readings
    assert "GPU-bbbb stopped answering (NVMLError: GpuIsLost)" in (run / "logs" / "rank1.err").read_text()
    assert "sampling GPU-aaaa every 0.25 s" in (run / "logs" / "rank0.err").read_text()
    assert (run / "metrics.jsonl").read_text().count("\n") == 2  # samples are no metric

    usage = telemetry.usage([telemetry.parse(json.dumps(r)) for r in found])
    report = json.loads(cli(tmp_path, "report", "results", "--runs", "--format", "json").stdout)
    (row,) = report["runs"]
    assert row["gpu_util_pct"] == pytest.approx(usage.util_pct) and 10 < row["gpu_util_pct"] < 90
    assert row["gpu_mem_peak_gib"] == 2.0
    assert row["idle_gpu_hours"] == pytest.approx(usage.idle_gpu_hours) and row["idle_gpu_hours"] > 0
    assert row["gpu_warning"] is None
    (group,) = json.loads(cli(tmp_path, "report", "results", "--format", "json").stdout)["groups"]
    assert (group["gpu_util_pct"], group["gpu_mem_peak_gib"]) == (pytest.approx(usage.util_pct), 2.0)
    md = cli(tmp_path, "report", "results", "--runs").stdout
    assert f"gpu_util {usage.util_pct:.0f}%" in md and "gpu_mem_peak 2.0 GiB" in md
    html = cli(tmp_path, "report", "results", "--format", "html").stdout
    assert "<h2>GPU utilisation</h2>" in html and html.count('data-metric="gpu_util"') == 1

    series = tensorboard_series(run / "tensorboard")
    assert {v for _, v in series["system/gpu0_util"]} == {90.0} and len(series["system/gpu0_util"]) >= 2
    assert {v for _, v in series["system/gpu1_util"]} == {10.0}
    assert {v for _, v in series["system/gpu0_power_w"]} == {250.5}
    steps = [s for s, _ in series["system/gpu0_util"]]
    assert steps == sorted(set(steps)) and "system/gpu0_util" not in (run / "metrics.jsonl").read_text()


def test_a_power_reading_nvml_refuses_is_null_and_no_nvml_is_one_line(tmp_path):
    spec = gpu_spec(tmp_path)
    script = {"gpus": {"GPU-aaaa": {"util": 50, "mem_mib": 100}, "GPU-bbbb": {"util": 50, "mem_mib": 100}},
              "raise": {"nvmlDeviceGetPowerUsage": "NotSupported"}, "memory_v1_only": True}
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait",
               env=fake_env(script, visible="GPU-aaaa,GPU-bbbb"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = the_run(tmp_path)
    assert {r["power_w"] for r in records(run)} == {None} and {r["util_pct"] for r in records(run)} == {50.0}
    # a driver without NVML's version-2 memory reading: version 1, the driver's own reserve counted in
    assert {r["mem_used_mib"] for r in records(run)} == {100.0 + 512}
    assert "GPU-aaaa gives no power reading (NVMLError: NotSupported)" in (run / "logs" / "rank0.err").read_text()

    for path in (tmp_path / "results").iterdir():
        import shutil

        shutil.rmtree(path)
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait",
               env=fake_env({"init": "DriverNotLoaded"}, visible="GPU-aaaa,GPU-bbbb"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = the_run(tmp_path)
    assert not (run / "telemetry.jsonl").exists()
    err = (run / "logs" / "rank0.err").read_text()
    assert err.count("gpu telemetry on rank 0: off: NVML did not answer (NVMLError: DriverNotLoaded)") == 1
