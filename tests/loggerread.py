"""What the loggers hold, read back with each library's own reader, for the tests:
TensorBoard's event reader, MlflowClient.get_metric_history, and W&B's reader of its
transaction log (`wandb leet inspect --json`). Each gives {metric: [(step, value), ...]}
in the order the logger holds them, so a step sent twice shows twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent


def tensorboard_series(folder: Path) -> dict:
    """Every scalar of every event file in ``folder`` (all kept: no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_client(uri: str):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def mlflow_series(uri: str, run_id: str) -> dict:
    client = mlflow_client(uri)
    names = client.get_run(run_id).data.metrics
    return {name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)] for name in names}


def wandb_records(run_dir: Path, wandb_id: str) -> list:
    """The records of every offline session of W&B run ``wandb_id``, oldest first."""
    records = []
    for folder in sorted((run_dir / "wandb").glob(f"offline-run-*-{wandb_id}")):
        if not list(folder.glob("*.wandb")):
            continue  # a session killed while W&B started: nothing was written
        out = subprocess.run([str(BIN / "wandb"), "leet", "inspect", "--json", str(folder)], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, timeout=120)
        assert out.returncode == 0, out.stderr
        records += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return records


def wandb_history(records: list) -> list:
    """The history rows among W&B records (``wandb_records``)."""
    return [r["history"]["item"] for r in records if r["type"] == "history"]


def wandb_series(run_dir: Path, wandb_id: str, axis: str) -> dict:
    """{metric: [(position, value)]} from the history of every session, the position
    being the run's x axis (``axis``: epoch or step)."""
    return history_series(wandb_history(wandb_records(run_dir, wandb_id)), axis)


def history_series(rows: list, axis: str) -> dict:
    """{metric: [(position, value)]} of W&B history rows, the position being their x axis
    (``axis``: epoch or step, system_s)."""
    series: dict = {}
    for item in rows:
        for name, value in item.items():
            if not name.startswith("_") and name != axis:
                series.setdefault(name, []).append((item[axis], value))
    return series


def jsonl_series(run_dir: Path, axis: str, skip: tuple = ("epoch", "step")) -> dict:
    """{metric: [(position, value)]} of metrics.jsonl, what every logger must hold."""
    series: dict = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for name, value in record.items():
            if name not in skip:
                series.setdefault(name, []).append((record[axis], value))
    return series


def as_float32(series: dict) -> dict:
    """The values as TensorBoard keeps them (float32)."""
    return {name: [(step, float(np.float32(value))) for step, value in points] for name, points in series.items()}


def logger_series(run_dir: Path, axis: str) -> dict:
    """{logger: {metric: [(position, value)]}} of each logger of the run, read back with
    its own reader."""
    info = json.loads((run_dir / "run.json").read_text())
    return {"tensorboard": tensorboard_series(run_dir / "tensorboard"),
            "mlflow": mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]),
            "wandb": wandb_series(run_dir, info["wandb_run_id"], axis)}


def check_each_step_once(run_dir: Path, axis: str, skip: tuple = ("epoch", "step")) -> None:
    """Each logger holds what metrics.jsonl holds: each metric at each position once."""
    want = jsonl_series(run_dir, axis, skip)
    got = logger_series(run_dir, axis)
    assert got["tensorboard"] == as_float32(want), got["tensorboard"]
    assert got["mlflow"] == want, got["mlflow"]
    assert got["wandb"] == want, got["wandb"]
