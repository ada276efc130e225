"""GPU telemetry through the command line with real processes and a fake NVML
(tests/fakenvml): two local ranks on two scripted GPUs (one at 90%, one at 10% that falls
off the bus after four readings), the telemetry file, the report's columns and their
sums, the system metrics in TensorBoard, MLflow and W&B (offline), read back with each
library's own reader; a power reading NVML refuses; no NVML at all."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from clirun import cli
from gpufake import fake_env, records
from loggerread import (
    as_float32,
    history_series,
    jsonl_series,
    mlflow_series,
    tensorboard_series,
    wandb_history,
    wandb_records,
)
from trainutil import run_info, write_spec

from clusterjob.health import telemetry

pytestmark = pytest.mark.slow

SCRIPT = {"gpus": {"GPU-aaaa": {"util": 90, "mem_mib": 2048, "power_w": 250.5},
                   "GPU-bbbb": {"util": 10, "mem_mib": 512, "power_w": 80.0, "lost_after": 4}}}
FIELDS = ["time", "rank", "host", "gpu", "util_pct", "mem_used_mib", "power_w"]
SYSTEM = {"system/gpu0_util": {90.0}, "system/gpu0_mem_mib": {2048.0}, "system/gpu0_power_w": {250.5},
          "system/gpu1_util": {10.0}, "system/gpu1_mem_mib": {512.0}, "system/gpu1_power_w": {80.0}}
LOGGERS = {"tensorboard": True, "mlflow": {"tracking_uri": "file:./mlruns"}, "wandb": {"mode": "offline"}}


def gpu_spec(folder, **sections):
    return write_spec(folder, "g", data={"limit_train": 2048}, train={"epochs": 2},
                      resources={"gpus_per_node": 2, "tasks_per_node": 2},
                      health={"gpu_sample_s": 0.25}, **sections)


def the_run(folder):
    (run,) = [p for p in (folder / "results" / "g").iterdir() if (p / "run.json").exists()]
    return run


def test_two_ranks_sample_their_own_gpu_and_the_report_sums_the_samples(tmp_path):
    spec = gpu_spec(tmp_path, logging=LOGGERS)
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
    check_system_metrics(run)


def check_system_metrics(run):
    """Each logger holds each rank's samples as system metrics, at their scripted values
    and at whole seconds since the run started (each once, rising), and the trainer's
    metrics just as metrics.jsonl holds them, which has none of the samples."""
    info, epochs = run_info(run), jsonl_series(run, "epoch")
    assert "system/" not in (run / "metrics.jsonl").read_text()
    records = wandb_records(run, info["wandb_run_id"])
    rows = wandb_history(records)
    system_rows = [row for row in rows if "system_s" in row]
    assert system_rows and not [row for row in system_rows if "epoch" in row]  # no epoch axis on a sample
    defined = {r["metric"].get("name"): r["metric"].get("step_metric") for r in records if r["type"] == "metric"}
    assert {name: defined.get(name) for name in SYSTEM} == dict.fromkeys(SYSTEM, "system_s")
    found = {"tensorboard": tensorboard_series(run / "tensorboard"),
             "mlflow": mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]),
             "wandb": {**history_series(system_rows, "system_s"),
                       **history_series([row for row in rows if "system_s" not in row], "epoch")}}
    started, finished = (datetime.fromisoformat(info[key]) for key in ("started_at", "finished_at"))
    seconds = (finished - started).total_seconds()
    for name, series in found.items():
        assert {k: v for k, v in series.items() if not k.startswith("system/")} == (
            as_float32(epochs) if name == "tensorboard" else epochs), name
        system = {k: v for k, v in series.items() if k.startswith("system/")}
        assert {k: {value for _, value in points} for k, points in system.items()} == SYSTEM, name
        assert len(system["system/gpu0_util"]) >= 2, name
        for points in system.values():
            steps = [step for step, _ in points]
            assert steps == sorted(set(steps)), name
            assert all(float(s).is_integer() and 0 <= s <= seconds + 1 for s in steps), (name, steps, seconds)


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
