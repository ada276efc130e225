"""What ``clusterjob submit`` records, through the real command line: every run's
run.json holds its resolved params (swept or not), so the report groups a run without a
sweep with the sweep's runs of its value."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from clirun import cli

# Prints a loss the metric regex reads ("loss: 0.6" holds ": ", which YAML would take for a mapping).
SCRIPT = "import clusterjob\nprint(f\"loss: {0.5 + clusterjob.params['lr']}\", flush=True)\n"
LOSS = "entrypoint.metrics.loss=loss: ([0-9.]+)"


def write_spec(folder: Path, name: str, **extra) -> Path:
    spec = {"name": "lr", "entrypoint": {"script": "train.py"}, "params": {"lr": 0.1, "tag": "a"},
            "resources": {"tasks_per_node": 1, "cpus_per_task": 1}, "output": {"root": str(folder / "results")},
            **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def infos(folder: Path) -> list:
    runs = sorted(p for p in (folder / "results" / "lr").iterdir() if (p / "run.json").exists())
    return [json.loads((run / "run.json").read_text()) for run in runs]


def test_every_run_records_its_resolved_params_and_groups_by_them(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    write_spec(tmp_path, "single")
    write_spec(tmp_path, "sweep", sweep={"params.lr": [0.1, 0.2]})
    for spec in ("single.yaml", "sweep.yaml"):
        done = cli(tmp_path, "submit", spec, "--executor", "local", "--wait", "--set", LOSS)
        assert done.returncode == 0, done.stdout + done.stderr
    found = infos(tmp_path)
    assert [(i["params"], i["final"]["loss"]) for i in found] == [
        ({"params.lr": 0.1, "params.tag": "a"}, 0.6),  # no sweep: its params all the same
        ({"params.lr": 0.1, "params.tag": "a"}, 0.6),
        ({"params.lr": 0.2, "params.tag": "a"}, 0.7)]
    done = cli(tmp_path, "report", "results/lr", "--group-by", "params.lr", "--metric", "loss", "--format", "json")
    assert done.returncode == 0, done.stderr
    groups = json.loads(done.stdout)["groups"]
    assert [(g["params.lr"], g["n"], g["loss_mean"]) for g in groups] == [(0.1, 2, 0.6), (0.2, 1, 0.7)]  # min loss first
