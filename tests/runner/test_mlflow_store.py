"""The MLflow default through the real command line: a run with `logging.mlflow: {}` writes
MLflow's file store `./mlruns` in the folder submit ran in, whatever mlflow package is
installed; the commands of docs/loggers.md read it (MLflow 3 refuses the file store without
MLFLOW_ALLOW_FILE_STORE, so they set it); a database store without SQLAlchemy is bad
input at validate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import clirun
import yaml
from clirun import REPO, base_env
from loggerread import mlflow_series

BIN = Path(sys.executable).parent
SCRIPT = "for step in (1, 2, 3):\n    print(f'iter {step}: acc {step / 4}', flush=True)\n"


def readme_store_commands() -> list[str]:
    """The commands of docs/loggers.md that read the store, as written there (comments cut)."""
    lines = (REPO / "docs" / "loggers.md").read_text().splitlines()
    start = lines.index("    export MLFLOW_ALLOW_FILE_STORE=true")
    block = lines[start:lines.index("    ```", start)]
    return [line.split("#", 1)[0].strip() for line in block]


def cli(folder: Path, *argv: str, first_on_path: str = "") -> subprocess.CompletedProcess:
    """``clusterjob ARGV`` in a fresh shell's environment; with ``first_on_path``, a real
    process with that folder first on PYTHONPATH."""
    env = {**base_env(), "PATH": f"{BIN}:{os.environ['PATH']}"}
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}  # a fresh shell
    if first_on_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (first_on_path, env.get("PYTHONPATH"))))
    return clirun.cli(folder, *argv, env=env, process=bool(first_on_path) or None)


def shell(folder: Path, lines: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in base_env().items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{BIN}:{env['PATH']}"  # `mlflow` of this Python
    return subprocess.run(["bash", "-ec", "\n".join(lines)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_default_store_is_a_file_store_that_the_readmes_commands_read(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = {"name": "store", "output": {"root": "results"}, "resources": {"cpus_per_task": 1},
            "entrypoint": {"script": "train.py", "metrics": {"acc": r"iter (?P<step>\d+): acc ([0-9.]+)"}},
            "logging": {"mlflow": {}}}
    (tmp_path / "store.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "store.yaml", "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = (tmp_path / "results" / "store").glob("2*")
    info = json.loads((run / "run.json").read_text())
    assert info["mlflow_tracking_uri"] == (tmp_path / "mlruns").as_uri()  # a file store, in the submit folder
    assert (tmp_path / "mlruns" / info["mlflow_experiment_id"] / "meta.yaml").is_file()

    commands = readme_store_commands()
    assert commands[:2] == ["export MLFLOW_ALLOW_FILE_STORE=true", "export MLFLOW_TRACKING_URI=file:./mlruns"]
    search, listing, ui = commands[2:]
    assert ui.startswith("mlflow ui --backend-store-uri ./mlruns")  # the full package's server: not run here
    found = shell(tmp_path, [*commands[:2], search])
    assert found.returncode == 0 and re.search(rf"{info['mlflow_experiment_id']}\s+store\s", found.stdout), found
    listed = shell(tmp_path, [*commands[:2], listing.replace(" ID", " " + info["mlflow_experiment_id"])])
    assert listed.returncode == 0 and info["mlflow_run_id"] in listed.stdout and run.name in listed.stdout, listed

    refused = shell(tmp_path, [commands[1], search])  # without the first line: MLflow 3 refuses the store
    assert refused.returncode != 0 and "maintenance mode" in refused.stderr
    assert mlflow_series(info["mlflow_tracking_uri"], info["mlflow_run_id"]) == {
        "acc": [(1, 0.25), (2, 0.5), (3, 0.75)]}


# A Python without SQLAlchemy and alembic (mlflow-skinny alone), wherever they are installed
# (the test setup has them, for Optuna): the import system itself says they are missing.
HIDE_DATABASE_PACKAGES = """import sys
class _Hidden:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in ("sqlalchemy", "alembic"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None
sys.meta_path.insert(0, _Hidden)
"""


def test_a_database_store_without_the_full_mlflow_package_is_one_line_at_validate(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(HIDE_DATABASE_PACKAGES)
    (tmp_path / "db.yaml").write_text("name: db\nlogging: {mlflow: {tracking_uri: 'sqlite:///mlflow.db'}}\n")
    done = cli(tmp_path, "validate", "db.yaml", first_on_path=str(hidden))
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob: error: logging.mlflow.tracking_uri: 'sqlite:///mlflow.db' is a database store") and \
        "pip install mlflow" in line, line
