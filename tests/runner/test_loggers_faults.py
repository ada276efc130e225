"""The loggers against what kills, breaks or confuses them, through real processes and
the real libraries, read back with each tool's own reader: a kill -9 at any moment
then a resume leaves each step once in each logger; a garbage, cut or deleted
loggers.json (of an earlier version) changes nothing; logger runs deleted meanwhile are
made again and sent everything; names a logger refuses are cleaned or dropped with one
warning per name and run; a logger that raises SystemExit, hangs or fails to close is
one warning and the others get everything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import base_env, cli
from loggerread import as_float32, check_each_step_once, jsonl_series, logger_series, mlflow_client
from owncode import Project

pytestmark = pytest.mark.slow

ALL = {"tensorboard": True, "mlflow": {"tracking_uri": "file:./mlruns", "experiment": "exp"},
       "wandb": {"mode": "offline", "project": "proj"}}


def project(tmp_path: Path, script: str) -> Project:
    found = Project(tmp_path)
    spec = found.spec(script)
    spec.write_text(spec.read_text() + "logging: " + json.dumps(ALL) + "\n")
    return found


def by_hand(found: Project, **env: str) -> subprocess.CompletedProcess:
    """One more start of the run, as a requeued job would start it."""
    return subprocess.run([sys.executable, "-m", "clusterjob.run", str(found.run / "spec.yaml")], cwd=found.folder,
                          env={**base_env(), **env}, capture_output=True, text=True, timeout=300)


def logger_warnings(run: Path) -> list:
    return [w for w in json.loads((run / "run.json").read_text())["warnings"] if w.startswith("logging.")]


def stderr_of(run: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run / "logs").rglob("rank0*.err")))


# ----------------------------------------------------------------------------- kill -9

KILLED = """\
import json, os, signal, time, clusterjob

def mlflow_holds(step):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient
    info = json.load(open(os.path.join(os.environ["CLUSTERJOB_RUN_DIR"], "run.json")))
    if not info.get("mlflow_run_id"):
        return False
    history = MlflowClient(info["mlflow_tracking_uri"]).get_metric_history(info["mlflow_run_id"], "acc")
    return any(m.step == step for m in history)

state = clusterjob.load_checkpoint()
kill_at, when = int(os.environ.get("KILL_AT") or 0), os.environ.get("KILL_WHEN", "now")
for step in range(state["step"] + 1 if state else 1, 9):
    clusterjob.log(step=step, acc=step / 16, loss=1 / step)
    clusterjob.save_checkpoint({"step": step}, step)
    if step == kill_at:
        if when != "now":  # once MLflow holds the step (the others are a moment behind, or ahead), and a while
            deadline = time.time() + 120
            while not mlflow_holds(step) and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(float(when))
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def shared_wandb_service(tmp_path):
    """A W&B process of the submitting shell's own (as a notebook that ran wandb.init
    leaves one), handed down to what it starts through WANDB_SERVICE."""
    wandb = str(Path(sys.executable).parent / "wandb")
    started = subprocess.run([wandb, "beta", "core", "start", "--idle-timeout", "5m"], capture_output=True, text=True,
                             cwd=tmp_path, env=base_env(), timeout=120)
    token = started.stdout.strip()
    assert started.returncode == 0 and token, started.stderr
    yield token
    subprocess.run([wandb, "beta", "core", "stop"], capture_output=True, cwd=tmp_path,
                   env={**base_env(), "WANDB_SERVICE": token}, timeout=120)


def test_kill_9_at_any_moment_then_a_resume_leaves_each_step_once_in_each_logger(tmp_path, shared_wandb_service):
    found = project(tmp_path, KILLED)
    shared = {"WANDB_SERVICE": shared_wandb_service}  # W&B's writer must still die with the rank
    first = cli(found.folder, "submit", "own.yaml", "--executor", "local", "--wait",
                env={**base_env(), "KILL_AT": "2", **shared})
    assert first.returncode == 1 and found.info()["status"] == "failed", first.stdout + first.stderr  # killed opening
    for kill_at, when, loggers_json in (("4", "0", None), ("6", "0.4", "{\"tensorboard\": {\"acc\": \"x\"}, 3: ["),
                                        ("", "now", "")):
        if loggers_json is not None:  # what an earlier version kept: ignored now
            (found.run / "loggers.json").write_text(loggers_json)
        again = by_hand(found, KILL_AT=kill_at, KILL_WHEN=when, **shared)
        assert again.returncode == (-9 if kill_at else 0), again.stdout + again.stderr
    assert [p[0] for p in jsonl_series(found.run, "step", skip=("step",))["acc"]] == list(range(1, 9))
    check_each_step_once(found.run, "step", skip=("step",))
    assert logger_warnings(found.run) == []


# ----------------------------------------------------------------------------- names, deleted logger runs

NAMES = """\
import os, clusterjob
state = clusterjob.load_checkpoint()
for step in range(state["step"] + 1 if state else 1, 5):
    clusterjob.log(step=step, **{"x//y": step / 2, "a/../b": step / 3, "_lr": 0.1, "_step": 5.0, "acc": step / 4})
    clusterjob.log(step=step, **{"x/y": 1.0})
    clusterjob.save_checkpoint({"step": step}, step)
    if step == 2 and os.environ["CLUSTERJOB_RESTARTS"] == "0":
        clusterjob.requeue()
"""


def renamed(series: dict, names: dict) -> dict:
    """``series`` by the names a logger takes (``names``: name -> the name sent, or None)."""
    return {names.get(name, name): points for name, points in series.items() if names.get(name, name)}


def test_names_a_logger_refuses_are_cleaned_or_dropped_with_one_warning_and_deleted_logger_runs_made_again(tmp_path):
    found = project(tmp_path, NAMES)
    first = cli(found.folder, "submit", "own.yaml", "--executor", "local", "--wait")
    assert first.returncode == 1 and found.info()["status"] == "preempted", first.stdout + first.stderr
    info = found.info()
    mlflow_client(info["mlflow_tracking_uri"]).delete_run(info["mlflow_run_id"])  # every logger run deleted
    shutil.rmtree(found.run / "tensorboard")
    shutil.rmtree(found.run / "wandb")
    again = cli(found.folder, "resume", str(found.run), "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    want = jsonl_series(found.run, "step", skip=("step",))
    assert [p[0] for p in want["acc"]] == [1, 2, 3, 4] == [p[0] for p in want["x/y"]]
    got = logger_series(found.run, "step")
    assert got["tensorboard"] == as_float32(want)
    assert got["mlflow"] == renamed(want, {"x//y": "x/y", "a/../b": "a/b", "x/y": None})
    assert got["wandb"] == renamed(want, {"_lr": "lr", "_step": None})
    assert found.info()["mlflow_run_id"] != info["mlflow_run_id"] and found.info()["wandb_run_id"] == info["wandb_run_id"]
    naming = {"mlflow": "(MLflow takes letters, digits, _ - . : / and spaces, at most 250 characters, and no empty, "
                        "'.' or '..' part between slashes)",
              "wandb": "(W&B keeps names that begin with _ for itself, and the x axis)"}
    lines = [f"logging.mlflow.metrics: 'x//y' is sent as 'x/y' {naming['mlflow']}",
             f"logging.mlflow.metrics: 'a/../b' is sent as 'a/b' {naming['mlflow']}",
             f"logging.wandb.metrics: '_lr' is sent as 'lr' {naming['wandb']}",
             f"logging.wandb.metrics: '_step' is not sent: it would be 'step', a name kept for the tool itself "
             f"{naming['wandb']}",
             f"logging.mlflow.metrics: 'x/y' is not sent: it would be 'x/y', which 'x//y' is sent as {naming['mlflow']}"]
    assert sorted(w for w in logger_warnings(found.run) if ".metrics: " in w) == sorted(lines)  # one per name
    err = stderr_of(found.run)
    assert [err.count(f"clusterjob: warning: {line}\n") for line in lines] == [1] * 5, err


# ----------------------------------------------------------------------------- loggers that break

BROKEN = """\
import os, threading, time, clusterjob
first = os.environ["CLUSTERJOB_RESTARTS"] == "0"
if first:  # the first session: each library breaks in its own way
    from mlflow.tracking import MlflowClient
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from wandb.sdk import wandb_run
    from clusterjob.runner import sinks
    sinks.STALL_S, check_stall = 0.5, sinks.Courier._check_stall
    sinks.Courier._check_stall = lambda self: self.logger.name == "tensorboard" and check_stall(self)  # not opening
    log_batch, add_event, finish = MlflowClient.log_batch, EventFileWriter.add_event, wandb_run.Run.finish

    def quits(self, run_id, metrics=(), **rest):  # MLflow quits the process from its courier
        if any(m.step == 3 for m in metrics):
            raise SystemExit(1)
        return log_batch(self, run_id, metrics=metrics, **rest)

    def hangs(self, event):  # TensorBoard never returns
        if event.step == 4:
            threading.Event().wait()
        return add_event(self, event)

    def fails_to_close(self, *args, **kwargs):  # W&B raises as it closes, once
        if not getattr(wandb_run, "broke", False):
            wandb_run.broke = True
            raise RuntimeError("finish broke")
        return finish(self, *args, **kwargs)

    MlflowClient.log_batch, EventFileWriter.add_event, wandb_run.Run.finish = quits, hangs, fails_to_close
state = clusterjob.load_checkpoint()
for step in range(state["step"] + 1 if state else 1, 7):
    clusterjob.log(step=step, acc=step / 8, loss=1 / step)
    clusterjob.save_checkpoint({"step": step}, step)
    if first and step == 4:
        time.sleep(1.5)  # the next record finds TensorBoard stalled
    if first and step == 5:
        clusterjob.requeue()
"""


def test_a_logger_that_quits_hangs_or_fails_to_close_is_one_warning_and_the_next_start_sends_the_rest(tmp_path):
    found = project(tmp_path, BROKEN)
    first = cli(found.folder, "submit", "own.yaml", "--executor", "local", "--wait")
    assert first.returncode == 1 and found.info()["status"] == "preempted", first.stdout + first.stderr
    warnings = logger_warnings(found.run)
    assert sorted(w.split(":", 1)[0] for w in warnings) == ["logging.mlflow", "logging.tensorboard", "logging.wandb"]
    assert any(w.startswith("logging.mlflow: SystemExit: 1; it gets nothing more in this session") for w in warnings)
    assert any(w.startswith("logging.wandb: RuntimeError: finish broke;") for w in warnings)
    err = stderr_of(found.run)
    assert [err.count(f"clusterjob: warning: logging.{name}:") for name in ("mlflow", "tensorboard", "wandb")] == \
        [1, 1, 1], err
    got = logger_series(found.run, "step")
    assert [p[0] for p in got["mlflow"]["acc"]] == [1, 2]
    again = cli(found.folder, "resume", str(found.run), "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [p[0] for p in jsonl_series(found.run, "step", skip=("step",))["acc"]] == [1, 2, 3, 4, 5, 6]
    check_each_step_once(found.run, "step", skip=("step",))
