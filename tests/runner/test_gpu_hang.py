"""A GPU driver that hangs never holds the rank: with a fake NVML (tests/fakenvml) whose
nvmlInit, or a reading, never returns, the run's code runs, the sampler is dropped with one
line in the rank's log, the run ends as it would without it, and `cancel` ends it.
Through the command line, with real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from clirun import cli, ended, start, wait_for
from gpufake import fake_env
from trainutil import write_spec

from clusterjob.core.rundir import RunDir
from clusterjob.health import rankhealth
from clusterjob.runner.gpusampler import NVML_DEADLINE_S

pytestmark = pytest.mark.slow

GPUS = {"gpus": {"GPU-aaaa": {"util": 90, "mem_mib": 2048}}}
LOOP = "import itertools, time\nfor i in itertools.count():\n    print(f'iter {i}', flush=True)\n    time.sleep(0.1)\n"
SAID = "clusterjob: gpu telemetry on rank 0: off: NVML did not answer"


def the_run(folder: Path) -> Path:
    (run,) = [p for p in (folder / "results" / "h").iterdir() if (p / "run.json").exists()]
    return run


def record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def rank0_err(run: Path) -> str:
    path = run / "logs" / "rank0.err"
    return path.read_text() if path.exists() else ""


def loop_spec(folder: Path) -> Path:
    """Your own code that prints a line a tenth of a second until it is stopped, GPU sampling on."""
    (folder / "train.py").write_text(LOOP)
    spec = {"name": "h", "output": {"root": str(folder / "results")}, "entrypoint": {"script": "train.py"},
            "resources": {"tasks_per_node": 1, "cpus_per_task": 1, "gpus_per_node": 0},
            "health": {"gpu_sample_s": 0.25}}
    (folder / "h.yaml").write_text(yaml.safe_dump(spec))
    return folder / "h.yaml"


def lines_printed(run: Path) -> int:
    out = run / "logs" / "rank0.out"
    return out.read_text().count("iter ") if out.exists() else 0


def test_an_nvml_init_that_never_returns_holds_neither_the_code_nor_cancel(tmp_path):
    spec = loop_spec(tmp_path)
    env = fake_env({**GPUS, "hang": ["nvmlInit"]}, fake_gpus="GPU-aaaa")
    submit = start(tmp_path, "submit", str(spec), "--executor", "local", env=env)
    assert submit.wait(timeout=600) == 0, submit.communicate()
    run = wait_for(lambda: next(iter((tmp_path / "results" / "h").glob("*/run.json")), None), "the run folder").parent
    wait_for(lambda: record(run)["status"] == "running" and lines_printed(run) >= 3, "the code to run while "
             "nvmlInit hangs")
    wait_for(lambda: SAID in rank0_err(run), "the line that drops the sampler")
    line = next(line for line in rank0_err(run).splitlines() if SAID in line)
    assert line.startswith(f"{SAID} nvmlInit in {NVML_DEADLINE_S:.0f} s; the sampler is dropped"), line
    assert not (run / "telemetry.jsonl").exists()
    health = rankhealth.read(RunDir(run), 0)
    assert health is not None and health.ref is not None

    done = cli(tmp_path, "cancel", str(run), env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: record(run)["status"] == "cancelled", "the cancelled record")
    wait_for(lambda: ended(health.ref.pid), "rank 0's process to end")
    assert rank0_err(run).count(SAID) == 1


def test_a_reading_that_never_returns_drops_the_sampler_and_the_run_completes(tmp_path):
    spec = write_spec(tmp_path, "h", data={"limit_train": 2048}, train={"epochs": 2},
                      health={"gpu_sample_s": 0.25})
    env = fake_env({**GPUS, "hang": ["nvmlDeviceGetUtilizationRates"]}, fake_gpus="GPU-aaaa")
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run = the_run(tmp_path)
    assert record(run)["status"] == "completed"
    err = rank0_err(run)
    assert "gpu telemetry on rank 0: sampling GPU-aaaa every 0.25 s" in err
    (line,) = [line for line in err.splitlines() if SAID in line]
    assert line.startswith(f"{SAID} a reading in ") and "the sampler is dropped" in line
    assert not (run / "telemetry.jsonl").exists()  # the first reading hung: no sample
