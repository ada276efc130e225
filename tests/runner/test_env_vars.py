"""The spec's ``env`` through the real command line and real local processes: every rank
of your own code and of the built-in trainer gets it, at every start; a secret's value
reaches the ranks from the submitting process's environment and no file, printout or
logger store holds it; a resume from another shell without the secret is one line; a
swept variable groups the report."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import clirun
import pytest
import yaml
from clirun import base_env
from loggerread import mlflow_client, tensorboard_series, wandb_records
from secretscan import environ_without, files_holding
from trainutil import TINY, merge

SECRET = "hf_Zq8s3cr3t-v4lue-0f-the-t0ken"
SECRET_SHA = hashlib.sha256(SECRET.encode()).hexdigest()

# Prints what the rank sees of the variables named in params (never the secret itself:
# a hash of it), and fails its first start when asked to (a run to resume).
CHECK_ENV = """\
import hashlib, json, os, sys
import clusterjob
p = clusterjob.params
seen = {name: os.environ.get(name) for name in p["names"]}
secret = os.environ.get(p["secret"])
ok = secret is not None and hashlib.sha256(secret.encode()).hexdigest() == p["secret_sha"]
print(f"rank {os.environ['RANK']} sees {json.dumps(seen, sort_keys=True)}", flush=True)
print(f"secret_ok {int(ok)}", flush=True)
if int(os.environ["CLUSTERJOB_RESTARTS"]) < p["fail_starts"]:
    sys.exit(3)
"""

ENV = {"NCCL_DEBUG": "WARN", "MY_COUNT": 3, "MY_RATE": 0.5, "MY_FLAG": True, "MY_EMPTY": "", "HF_TOKEN": SECRET}
SEEN = {"NCCL_DEBUG": "WARN", "MY_COUNT": "3", "MY_RATE": "0.5", "MY_FLAG": "true", "MY_EMPTY": ""}


def cli(folder: Path, *argv: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return clirun.cli(folder, *argv, env=env if env is not None else shell(), timeout=timeout)


def shell() -> dict:
    """A shell that has none of the spec's variables of its own."""
    return environ_without(base_env(), *ENV, "MY_MODE", "WANDB_API_KEY")


def own_spec(folder: Path, name: str, fail_starts: int = 0, **extra) -> Path:
    (folder / "check_env.py").write_text(CHECK_ENV)
    spec = {"name": name, "output": {"root": "results"}, "resources": {"tasks_per_node": 2, "cpus_per_task": 1},
            "entrypoint": {"script": "check_env.py", "metrics": {"secret_ok": r"secret_ok (\d)"}},
            "params": {"names": sorted(SEEN), "secret": "HF_TOKEN", "secret_sha": SECRET_SHA,
                       "fail_starts": fail_starts}, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def only_run(folder: Path, name: str) -> Path:
    (run,) = [p for p in (folder / "results" / name).iterdir() if not p.name.startswith(".")]
    return run


def rank_sees(run: Path, rank: int) -> list[dict]:
    """What rank ``rank`` printed it sees, once per start."""
    text = (run / "logs" / f"rank{rank}.out").read_text()
    return [json.loads(line.split(" sees ", 1)[1]) for line in text.splitlines() if f"rank {rank} sees " in line]


def test_every_rank_of_your_code_gets_the_env_and_the_secret_stays_out_of_every_file(tmp_path):
    own_spec(tmp_path, "own", env=ENV)
    done = cli(tmp_path, "submit", "own.yaml", "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(tmp_path, "own")
    assert rank_sees(run, 0) == rank_sees(run, 1) == [SEEN]  # numbers and true as their text
    info = json.loads((run / "run.json").read_text())
    assert info["final"]["secret_ok"] == 1  # rank 0 got the real value, from the submitting process
    assert info["env"] == {**SEEN, "HF_TOKEN": "***"}
    assert yaml.safe_load((run / "spec.yaml").read_text())["env"] == {**SEEN, "HF_TOKEN": "***"}
    printed = [done, cli(tmp_path, "status", "results/own"), cli(tmp_path, "validate", "own.yaml"),
               cli(tmp_path, "logs", str(run)), cli(tmp_path, "report", "results", "--runs", "--format", "json"),
               cli(tmp_path, "submit", "own.yaml", "--executor", "local", "--dry-run"),
               cli(tmp_path, "submit", "own.yaml", "--executor", "slurm", "--dry-run")]
    for out in printed:
        assert out.returncode == 0, out.args
        assert SECRET not in out.stdout + out.stderr, out.args
    assert "HF_TOKEN: '***'" in printed[2].stdout  # validate's resolved spec
    assert files_holding(SECRET, tmp_path / "results") == []


def test_a_resume_from_another_shell_needs_the_secret_exported_and_then_runs_the_same_way(tmp_path):
    own_spec(tmp_path, "again", fail_starts=1, env=ENV)
    first = cli(tmp_path, "submit", "again.yaml", "--executor", "local", "--wait")
    assert first.returncode == 1, first.stdout + first.stderr  # its first start fails on purpose
    run = only_run(tmp_path, "again")
    before = (run / "run.json").read_bytes()

    refused = cli(tmp_path, "resume", str(run), "--wait")  # another shell: no HF_TOKEN there
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert "env.HF_TOKEN" in line and "export HF_TOKEN" in line and "***" in line, line
    assert (run / "run.json").read_bytes() == before  # bad input changes nothing

    resumed = cli(tmp_path, "resume", str(run), "--wait", env={**shell(), "HF_TOKEN": SECRET})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["restarts"] == 1 and info["final"]["secret_ok"] == 1
    assert rank_sees(run, 0) == rank_sees(run, 1) == [SEEN, SEEN]  # the spec's values again, not the shell's
    assert files_holding(SECRET, tmp_path / "results") == []


def test_a_secret_only_in_the_submitting_shell_needs_no_spec_at_all(tmp_path):
    """The way the docs give first: export it, and name it nowhere (or as ***)."""
    own_spec(tmp_path, "shellonly", env={**ENV, "HF_TOKEN": "***"})
    missing = cli(tmp_path, "submit", "shellonly.yaml", "--executor", "local", "--wait")
    assert missing.returncode == 2 and "export HF_TOKEN" in missing.stderr
    assert not (tmp_path / "results").exists()  # nothing written
    done = cli(tmp_path, "submit", "shellonly.yaml", "--executor", "local", "--wait",
               env={**shell(), "HF_TOKEN": SECRET})
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((only_run(tmp_path, "shellonly") / "run.json").read_text())["final"]["secret_ok"] == 1
    assert files_holding(SECRET, tmp_path / "results") == []


def test_a_swept_variable_is_a_column_the_report_groups_by(tmp_path):
    (tmp_path / "mode.py").write_text("import os\nprint('score', {'ring': 1, 'tree': 2}[os.environ['MY_MODE']])\n")
    spec = {"name": "nccl", "output": {"root": "results"}, "resources": {"cpus_per_task": 1},
            "entrypoint": {"script": "mode.py", "metrics": {"score": r"score (\d)"}},
            "sweep": {"env.MY_MODE": ["ring", "tree"]}}
    (tmp_path / "nccl.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "nccl.yaml", "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(cli(tmp_path, "report", "results/nccl", "--format", "json").stdout)
    assert report["group_by"] == ["env.MY_MODE"]
    assert {(g["env.MY_MODE"], g["score_mean"]) for g in report["groups"]} == {("ring", 1.0), ("tree", 2.0)}
    params = sorted(json.loads((run / "run.json").read_text())["params"]["env.MY_MODE"]
                    for run in (tmp_path / "results" / "nccl").glob("2*"))
    assert params == ["ring", "tree"]


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> Path:
    """The built-in trainer on 2 ranks with env and every logger: TORCH_CPP_LOG_LEVEL (torch
    reads it as it loads: every rank then logs c10d's INFO lines) and a secret."""
    folder = tmp_path_factory.mktemp("trainer")
    spec = merge(TINY, {"name": "tiny", "output": {"root": "results"}, "resources": {"tasks_per_node": 2},
                        "data": {"limit_train": 64, "limit_val": 32},
                        "env": {"TORCH_CPP_LOG_LEVEL": "INFO", "WANDB_API_KEY": SECRET},
                        "logging": {"tensorboard": True, "mlflow": {}, "wandb": {"mode": "offline"}}})
    (folder / "tiny.yaml").write_text(yaml.safe_dump(spec))
    done = cli(folder, "submit", "tiny.yaml", "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    return folder


def test_every_rank_of_the_built_in_trainer_gets_the_env(trainer_run):
    run = only_run(trainer_run, "tiny")
    for rank in (0, 1):
        err = (run / "logs" / f"rank{rank}.err").read_text()
        assert f"[rank{rank}]:[I" in err and "Reducer" in err, err  # DDP's INFO lines: the level reached torch


def test_no_file_and_no_logger_store_holds_the_secret_and_the_logger_runs_say_stars(trainer_run):
    run = only_run(trainer_run, "tiny")
    assert files_holding(SECRET, trainer_run / "results", trainer_run / "mlruns") == []
    info = json.loads((run / "run.json").read_text())
    params = mlflow_client(info["mlflow_tracking_uri"]).get_run(info["mlflow_run_id"]).data.params
    assert params["env.WANDB_API_KEY"] == "***" and params["env.TORCH_CPP_LOG_LEVEL"] == "INFO"
    (record,) = [r["run"] for r in wandb_records(run, info["wandb_run_id"]) if r["type"] == "run"]
    assert record["config"]["update"]["spec"]["env"]["WANDB_API_KEY"] == "***", record["config"]
    assert tensorboard_series(run / "tensorboard")  # the event files were read above, byte by byte, too
    events = b"".join(path.read_bytes() for path in (run / "tensorboard").rglob("*") if path.is_file())
    assert b"WANDB_API_KEY: '***'" in events  # the spec text TensorBoard shows


def test_a_start_without_a_hidden_variable_is_one_line_naming_it(tmp_path):
    """A task started by hand (or by a raw sbatch script) from a spec that holds ***."""
    path = own_spec(tmp_path, "bare", env={"HF_TOKEN": "***"})
    done = subprocess.run([sys.executable, "-m", "clusterjob.run", str(path)], cwd=tmp_path, env=shell(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("clusterjob.run: error: env.HF_TOKEN: HF_TOKEN is not set")
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "results").exists()
