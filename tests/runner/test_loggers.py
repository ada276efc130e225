"""TensorBoard, MLflow and W&B with the real libraries, read back with their own readers:
every epoch (or step) exactly once, in one logger run, with metrics.jsonl's values,
across a preemption and resume; a restart from scratch rewrites the logger runs; a
logger that fails costs one warning and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import base_env, cli
from loggerread import (
    as_float32,
    jsonl_series,
    mlflow_client,
    mlflow_series,
    tensorboard_series,
    wandb_records,
    wandb_series,
)
from owncode import Project
from trainutil import run_info, write_spec

from clusterjob.core.metrics import StepWriter
from clusterjob.core.rundir import create_run
from clusterjob.runner import sinks
from clusterjob.runner.loggers import tracking_uri
from clusterjob.spec.schema import dump_spec, spec_from_dict

pytestmark = pytest.mark.slow

ALL = {"tensorboard": True, "mlflow": {"tracking_uri": "file:./mlruns", "experiment": "exp"},
       "wandb": {"mode": "offline", "project": "proj"}}


def only_run(folder: Path, name: str) -> Path:
    (run,) = [p for p in (folder / "results" / name).iterdir() if not p.name.startswith(".")]
    return run


def check_every_logger(run: Path, axis: str) -> None:
    """Each logger holds exactly what metrics.jsonl holds, each position once, in one run."""
    info = run_info(run)
    want = jsonl_series(run, axis)
    assert tensorboard_series(run / "tensorboard") == as_float32(want)
    assert info["tensorboard_dir"] == str(run.resolve() / "tensorboard")
    assert mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]) == want
    assert sorted(p.name.rsplit("-", 1)[1] for p in (run / "wandb").glob("offline-run-*")) == [info["wandb_run_id"]] * 2
    assert wandb_series(run, info["wandb_run_id"], axis) == want


# ----------------------------------------------------------------------------- the built-in trainer


def test_a_preempted_then_resumed_trainer_run_has_every_epoch_once_in_each_logger(tmp_path):
    spec = write_spec(tmp_path, "pre", train={"epochs": 3}, resources={"tasks_per_node": 2},  # rank 1: no sinks
                      debug={"exit_after_epoch": 1}, logging=ALL)
    first = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = only_run(tmp_path, "pre")
    assert first.returncode == 1 and run_info(run)["status"] == "preempted", first.stdout + first.stderr
    assert [p[0] for p in tensorboard_series(run / "tensorboard")["val_acc"]] == [1]  # sent before the stop
    again = cli(tmp_path, "resume", str(run), "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [p[0] for p in jsonl_series(run, "epoch")["val_acc"]] == [1, 2, 3]
    check_every_logger(run, "epoch")
    info = run_info(run)
    client = mlflow_client(info["mlflow_tracking_uri"])
    mlrun = client.get_run(info["mlflow_run_id"])
    assert mlrun.info.run_name == run.name and mlrun.info.status == "FINISHED"
    assert mlrun.data.params["train.epochs"] == "3" and mlrun.data.tags["clusterjob.run_dir"] == str(run.resolve())
    assert client.get_experiment(mlrun.info.experiment_id).name == "exp"
    assert len(client.search_runs([mlrun.info.experiment_id])) == 1  # one MLflow run, continued
    assert "epoch 1/3 train_loss" in (run / "logs" / "rank0.out").read_text()  # the console line, a sink too


def test_a_restart_from_scratch_rewrites_every_logger_run(tmp_path):
    spec = write_spec(tmp_path, "scratch", train={"epochs": 2}, debug={"exit_after_epoch": 1}, logging=ALL)
    cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = only_run(tmp_path, "scratch")
    old = run_info(run)
    for path in (run / "checkpoints").glob("*.pt"):
        path.write_bytes(b"not a checkpoint")  # every checkpoint unreadable: epoch 1 again
    again = subprocess.run([sys.executable, "-m", "clusterjob.run", str(run / "spec.yaml"),
                            "--set", "debug.exit_after_epoch=null"], cwd=tmp_path, env=base_env(),
                           capture_output=True, text=True, timeout=300)  # by hand, without the stop
    assert again.returncode == 0, again.stdout + again.stderr
    new = run_info(run)
    want = jsonl_series(run, "epoch")
    assert [p[0] for p in want["val_acc"]] == [1, 2]
    assert tensorboard_series(run / "tensorboard") == as_float32(want)
    assert new["mlflow_run_id"] != old["mlflow_run_id"]
    assert mlflow_series(new["mlflow_tracking_uri"], new["mlflow_run_id"]) == want
    client = mlflow_client(new["mlflow_tracking_uri"])
    assert client.get_run(old["mlflow_run_id"]).info.lifecycle_stage == "deleted"
    assert new["wandb_run_id"] != old["wandb_run_id"]
    assert not list((run / "wandb").glob(f"offline-run-*-{old['wandb_run_id']}"))
    assert wandb_series(run, new["wandb_run_id"], "epoch") == want


def test_a_logger_that_fails_is_one_warning_and_training_goes_on(tmp_path):
    (tmp_path / "blocked").write_text("a file where the MLflow store would be\n")
    spec = write_spec(tmp_path, "fails", train={"epochs": 2},
                      logging={"tensorboard": True, "mlflow": {"tracking_uri": "file:./blocked"}})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = only_run(tmp_path, "fails")
    assert done.returncode == 0, done.stdout + done.stderr
    info = run_info(run)
    assert info["status"] == "completed" and [json.loads(x)["epoch"] for x in
                                              (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    (warning,) = [w for w in info["warnings"] if w.startswith("logging.")]
    assert warning.startswith("logging.mlflow: ") and "metrics.jsonl holds every metric" in warning
    assert (run / "logs" / "rank0.err").read_text().count("clusterjob: warning: logging.mlflow:") == 1
    assert tensorboard_series(run / "tensorboard") == as_float32(jsonl_series(run, "epoch"))
    (tmp_path / "blocked").unlink()  # the store can be made now: the next start sends MLflow all it missed
    again = subprocess.run([sys.executable, "-m", "clusterjob.run", str(run / "spec.yaml")], cwd=tmp_path,
                           env=base_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    info = run_info(run)
    assert mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]) == jsonl_series(run, "epoch")
    assert tensorboard_series(run / "tensorboard") == as_float32(jsonl_series(run, "epoch"))  # nothing twice


# ----------------------------------------------------------------------------- your own code

OWN = """\
import os, clusterjob
state = clusterjob.load_checkpoint()
first = state["step"] + 1 if state else 1
for step in range(first, 7):
    clusterjob.log(step=step, val_acc=step / 8)                      # the API
    print(f"iter {step}: loss {1 / step:.6f}", flush=True)            # a regex capture
    with open(os.path.join(os.environ["CLUSTERJOB_RUN_DIR"], "log.csv"), "a") as f:  # a metrics file
        f.write(("step,train_acc\\n" if step == 1 else "") + f"{step},{step / 10}\\n")
    clusterjob.save_checkpoint({"step": step}, step)
    if step == 3 and os.environ["CLUSTERJOB_RESTARTS"] == "0":
        clusterjob.requeue()                                          # preempted after step 3
"""


def test_your_codes_metrics_through_the_api_a_regex_and_a_file_reach_every_logger_once(tmp_path):
    project = Project(tmp_path)
    project.spec(OWN, metrics={"loss": r"iter (?P<step>[0-9]+): loss ([0-9.]+)"}, metrics_file="{run_dir}/log.csv")
    spec = project.folder / "own.yaml"
    text = spec.read_text() + "logging: " + json.dumps(ALL) + "\n"
    spec.write_text(text)
    first = project.submit()
    assert first.returncode == 1 and project.info()["status"] == "preempted", first.stdout + first.stderr
    again = cli(project.folder, "resume", str(project.run), "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    want = jsonl_series(project.run, "step", skip=("step",))
    assert {name: [p[0] for p in points] for name, points in want.items()} == \
        {"val_acc": [1, 2, 3, 4, 5, 6], "loss": [1, 2, 3, 4, 5, 6], "train_acc": [1, 2, 3, 4, 5, 6]}
    check_every_logger(project.run, "step")


# ----------------------------------------------------------------------------- in one process


def test_steps_written_but_not_sent_before_the_job_died_are_sent_at_the_next_start(tmp_path):
    spec = spec_from_dict({"name": "own", "entrypoint": {"function": "json:dumps"}, "output": {"root": str(tmp_path)},
                           "logging": {"tensorboard": True, "mlflow": {"tracking_uri": str(tmp_path / "mlruns")}}})
    run = create_run(tmp_path, "own", "r1", dump_spec(spec), {}, submit_dir=str(tmp_path))
    with sinks.for_own_code(spec, run) as metric_sinks:
        for step in (1, 2, 3):
            metric_sinks.log(step, {"loss": 1 / step})
    StepWriter(run.metrics_file).log(4, {"loss": 0.25})  # written, then the job died before sending it
    StepWriter(run.metrics_file).log(5, {"loss": 0.2, "acc": 0.5})
    with sinks.for_own_code(spec, run) as metric_sinks:  # resumed from its checkpoint of step 2
        for step in (3, 4, 5, 6):
            metric_sinks.log(step, {"loss": 1 / step, **({"acc": 0.5} if step == 5 else {})})
    want = jsonl_series(run.path, "step", skip=("step",))
    assert [p[0] for p in want["loss"]] == [1, 2, 3, 4, 5, 6] and want["acc"] == [(5, 0.5)]
    info = run.read()
    assert info.mlflow_tracking_uri is not None and info.mlflow_run_id is not None
    assert mlflow_series(info.mlflow_tracking_uri, info.mlflow_run_id) == want  # each step once
    assert tensorboard_series(run.tensorboard) == as_float32(want)


def test_a_relative_file_store_lives_in_the_folder_submit_ran_in(tmp_path):
    assert tracking_uri("file:./mlruns", str(tmp_path)) == (tmp_path / "mlruns").as_uri()
    assert tracking_uri("mlruns", str(tmp_path)) == (tmp_path / "mlruns").as_uri()
    assert tracking_uri("http://host:5000", str(tmp_path)) == "http://host:5000"
    assert tracking_uri("file:///abs/store", str(tmp_path)) == "file:///abs/store"
    assert tracking_uri(None, str(tmp_path)).startswith("file:")  # mlflow-skinny can write it


def test_a_sweeps_runs_share_the_experiment_and_project_and_are_grouped_by_their_sweep(tmp_path):
    spec = spec_from_dict({"name": "sw", "entrypoint": {"function": "json:dumps"}, "output": {"root": str(tmp_path)},
                           "params": {"lr": 0.1}, "logging": {"mlflow": {"tracking_uri": "file:./mlruns"},
                                                              "wandb": {"mode": "offline"}}})
    runs = [create_run(tmp_path, "sw", f"20261124-101010-ab12-00{i}", dump_spec(spec), {"params.lr": lr},
                       submit_dir=str(tmp_path)) for i, lr in enumerate((0.1, 0.2))]
    for run in runs:
        with sinks.for_own_code(spec, run) as metric_sinks:
            metric_sinks.log(1, {"loss": 1.0})
    infos = [run.read() for run in runs]
    client = mlflow_client((tmp_path / "mlruns").as_uri())
    got = [client.get_run(info.mlflow_run_id) for info in infos]
    assert {r.info.experiment_id for r in got} == {infos[0].mlflow_experiment_id}
    assert client.get_experiment(infos[0].mlflow_experiment_id).name == "sw"  # the spec's name by default
    assert [r.data.tags["clusterjob.sweep"] for r in got] == ["sw-20261124-101010-ab12"] * 2
    assert [r.data.params["params.lr"] for r in got] == ["0.1", "0.2"] and got[0].data.params["name"] == "sw"
    for run, info in zip(runs, infos):
        (record,) = [r["run"] for r in wandb_records(run.path, info.wandb_run_id) if r["type"] == "run"]
        assert record["run_group"] == "sw-20261124-101010-ab12" and record["project"] == "sw"
        assert record["display_name"] == run.run_id
        config = record["config"]["update"]
        assert config["params"] == info.params and config["spec"]["params"] == {"lr": 0.1}  # the resolved spec


def test_your_codes_run_keeps_the_warning_of_a_logger_that_failed(tmp_path):
    (tmp_path / "blocked").write_text("a file where the MLflow store would be\n")
    (tmp_path / "score.py").write_text("import clusterjob\ndef main():\n    clusterjob.log(step=1, acc=0.5)\n")
    spec = tmp_path / "own.yaml"
    spec.write_text(json.dumps({"name": "own", "output": {"root": str(tmp_path / "results")},
                                "entrypoint": {"function": "score:main", "metrics": {"loss": "loss ([0-9.]+)"}},
                                "resources": {"cpus_per_task": 1}, "logging": {"mlflow": {"tracking_uri": "blocked"}}}))
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    info = run_info(only_run(tmp_path, "own"))
    assert done.returncode == 0 and info["status"] == "completed", done.stdout + done.stderr
    assert [w.split(":")[0] for w in info["warnings"]] == ["entrypoint.metrics.loss", "logging.mlflow"]
