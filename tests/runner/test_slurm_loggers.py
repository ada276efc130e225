"""The loggers on the real local Slurm: a run preempted by USR2, requeued and resumed,
holds every epoch (the built-in trainer) or step (your own code, through clusterjob.log
and a regex capture) exactly once in TensorBoard, MLflow and W&B, in one logger run
each, with the values of metrics.jsonl."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S
from loggerread import as_float32, jsonl_series, mlflow_series, tensorboard_series, wandb_series
from slurmcluster import rank0_log, submit, wait_for
from trainutil import run_info, write_spec

pytestmark = pytest.mark.slurm

LOGGING = {"tensorboard": True, "mlflow": {"tracking_uri": "file:./mlruns"}, "wandb": {"mode": "offline"}}
# As tests/launch/test_slurm_submit.py's LONG: a few seconds per epoch, 2 nodes x 2 tasks.
LONG = dict(model={"arch": "convnet"}, data={"limit_train": 1024, "limit_val": 64},
            train={"epochs": 3, "batch_size": 16, "amp": "bf16", "log_every": 2},
            resources={"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 3, "time_min": 10})


def diagnosis(run: Path) -> str:
    logs = "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-20:])
                   for p in sorted((run / "logs").glob("rank0.*")) if p.suffix in (".out", ".err"))
    return json.dumps(run_info(run), indent=1) + logs


def usr2_then_finish(cluster, run: Path, started: str) -> None:
    wait_for(lambda: started in rank0_log(run), WAIT_S, "training to start")
    subprocess.run(["scancel", "--signal=USR2", run_info(run)["slurm_job_id"]], check=True, env=cluster.env())
    wait_for(lambda: run_info(run).get("status") in ("completed", "failed", "cancelled"), WAIT_S, "the run to end")
    info = run_info(run)
    assert info["status"] == "completed" and info["requeues"] == 1, diagnosis(run)


def check_every_logger(run: Path, axis: str) -> None:
    info = run_info(run)
    want = jsonl_series(run, axis, skip=("epoch", "step") if axis == "epoch" else ("step",))
    assert tensorboard_series(run / "tensorboard") == as_float32(want)
    assert mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]) == want
    sessions = sorted((run / "wandb").glob("offline-run-*"))  # the first may be killed before W&B made its folder
    assert sessions and {p.name.rsplit("-", 1)[1] for p in sessions} == {info["wandb_run_id"]}
    assert wandb_series(run, info["wandb_run_id"], axis) == want


def test_usr2_preemption_of_the_trainer_keeps_every_epoch_once_in_each_logger(slurm_cluster, tmp_path):
    (run,) = submit(slurm_cluster, write_spec(tmp_path, "tb", **LONG, logging=LOGGING))
    usr2_then_finish(slurm_cluster, run, "[progress] epoch 1/3 step 4/")
    assert [p[0] for p in jsonl_series(run, "epoch")["val_acc"]] == [1, 2, 3]
    check_every_logger(run, "epoch")


OWN = """\
import time, clusterjob
state = clusterjob.load_checkpoint()
for step in range(state["step"] + 1 if state else 1, 31):
    time.sleep(0.1)
    clusterjob.log(step=step, val_acc=step / 64)
    print(f"iter {step}: loss {1 / step:.6f}", flush=True)
    if clusterjob.should_stop():
        clusterjob.save_checkpoint({"step": step}, step)
        clusterjob.requeue()
"""


def test_usr2_preemption_of_your_code_keeps_every_step_once_in_each_logger(slurm_cluster, tmp_path):
    (tmp_path / "train.py").write_text(OWN)
    spec = tmp_path / "own.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "own", "output": {"root": str(tmp_path / "results")}, "logging": LOGGING,
        "entrypoint": {"script": "train.py", "metrics": {"loss": r"iter (?P<step>[0-9]+): loss ([0-9.]+)"}},
        "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10}}))
    (run,) = submit(slurm_cluster, spec)
    usr2_then_finish(slurm_cluster, run, "iter 5:")
    want = jsonl_series(run, "step", skip=("step",))
    assert [p[0] for p in want["val_acc"]] == list(range(1, 31)) == [p[0] for p in want["loss"]]
    check_every_logger(run, "step")
