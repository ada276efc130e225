"""What status and report make of a run's telemetry.jsonl, written here as a rank writes
it: the last minute in status, the low-utilisation warning with its cause, and a file
cut off or full of garbage that breaks neither."""

from __future__ import annotations

import json
import socket
import time

import pytest
import yaml
from clirun import cli

from clusterjob.core.rundir import create_run
from clusterjob.health import telemetry

HOST = socket.gethostname()


def sample(at: float, rank: int, gpu: str, util: float, mem: float = 1024.0) -> str:
    return json.dumps({"time": at, "rank": rank, "host": HOST, "gpu": gpu, "util_pct": util,
                       "mem_used_mib": mem, "power_w": 100.0}) + "\n"


def running_run(tmp_path, lines: list, low_util_pct: float = 30.0):
    spec = yaml.safe_dump({"name": "e", "health": {"low_util_pct": low_util_pct}})
    run = create_run(tmp_path / "results", "e", "r1", spec, {})
    run.update(status="running", world_size=4, started_at="2026-01-01T00:00:00+00:00")
    run.telemetry_file.write_text("".join(lines))
    return run


def eleven_minutes(utils: dict, end: float, period: float = 10.0) -> list:
    """Samples every ``period`` s for 11 minutes up to ``end``, GPU k on rank k."""
    lines, at = [], end - 660
    while at <= end:
        lines += [sample(at, rank, gpu, util, 1024.0 * (rank + 1)) for rank, (gpu, util) in enumerate(utils.items())]
        at += period
    return lines


GARBAGE = ["not json at all\n", '{"time": "soon", "rank": 0}\n', "\x00\xff" * 50 + "\n", '{"time": 1e999}\n',
           json.dumps({"time": 1.0, "rank": True, "host": "h", "gpu": "g", "util_pct": 5, "mem_used_mib": 1}) + "\n",
           "x" * 10000 + "\n"]


def test_status_shows_the_last_minute_and_names_one_busy_gpu_of_several(tmp_path):
    lines = eleven_minutes({"GPU-a": 90.0, "GPU-b": 5.0, "GPU-c": 5.0, "GPU-d": 5.0}, time.time())
    run = running_run(tmp_path, lines[:40] + GARBAGE + lines[40:] + ['{"time": 17'])  # cut off at the end
    done = cli(tmp_path, "status", str(run.path))
    assert done.returncode == 0, done.stderr
    assert "r1: GPUs: 26% busy, peak 4.0 GiB (4 GPUs, last minute)" in done.stdout
    assert ("r1: warning: GPU utilisation 26% for 11 min, under health.low_util_pct (30%): likely one busy GPU "
            f"of 4: GPU-a on {HOST} at 90%, the others at 5%") in done.stdout

    report = json.loads(cli(tmp_path, "report", "results", "--runs", "--format", "json").stdout)
    (row,) = report["runs"]
    assert row["gpu_util_pct"] == pytest.approx(26.25, abs=0.01) and row["gpu_mem_peak_gib"] == 4.0
    hours = sum(w for ws in (telemetry.weights([float(t) for t in range(len(lines) // 4)]),) for w in ws) * 10 / 3600
    assert row["idle_gpu_hours"] == pytest.approx(4 * hours * (1 - 0.2625), rel=1e-6)
    assert row["gpu_warning"].startswith("GPU utilisation 26% for 11 min") and "one busy GPU of 4" in row["gpu_warning"]
    assert any("telemetry.jsonl: 7 line(s) that are no sample" in w for w in report["warnings"])
    md = cli(tmp_path, "report", "results", "--runs").stdout
    assert "GPU warnings:" in md and "idle GPU-h" in md


def test_the_cause_is_the_data_loader_or_low_utilisation_everywhere():
    lines = eleven_minutes({"GPU-a": 12.0, "GPU-b": 8.0}, 1000.0)
    samples = [telemetry.parse(line) for line in lines]
    assert "likely the data loader: the trainer waited for its next batch 64%" in \
        telemetry.low_util_warning(samples, 30.0, 64.0)
    assert "low utilisation on every GPU" in telemetry.low_util_warning(samples, 30.0, 5.0)
    assert telemetry.low_util_warning(samples, 10.0, None) is None  # 10% mean: not under 10
    assert telemetry.low_util_warning(samples[:100], 30.0, None) is None  # under 10 minutes


@pytest.mark.parametrize("content", [b"", b"\x00" * 5000, b'{"time": 1', b"[]\n{}\nnull\n", b"\n" * 100])
def test_a_damaged_telemetry_file_breaks_neither_status_nor_report(tmp_path, content):
    run = running_run(tmp_path, [])
    run.telemetry_file.write_bytes(content)
    assert cli(tmp_path, "status", str(run.path)).returncode == 0
    done = cli(tmp_path, "report", "results", "--runs", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "gpu_util_pct" not in json.loads(done.stdout)["runs"][0]  # no sample: no columns


@pytest.mark.parametrize("value", ["health.gpu_sample_s=0", "health.gpu_sample_s=-5", "health.gpu_sample_s=soon",
                                   "health.gpu_sample_s=1e999", "health.gpu_sample_s=99999",
                                   "health.low_util_pct=0", "health.low_util_pct=101", "health.low_util_pct=null",
                                   "health.low_util_pct=[1]"])
def test_hostile_sampling_values_exit_2_with_one_line(tmp_path, value):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "output": {"root": str(tmp_path / "results")}}))
    done = cli(tmp_path, "validate", str(spec), "--set", value)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob: error: {value.split('=')[0]}: ") and not (tmp_path / "results").exists()
