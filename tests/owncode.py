"""Your own code through the real command line, for the tests: a script and its spec in a
folder, ``submit --wait`` run there (local processes; other commands through
``clirun.cli(project.folder, ...)``), and what the run left."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from clirun import cli


class Project:
    """A folder holding ``train.py`` and the spec ``<name>.yaml`` that runs it on one local rank."""

    def __init__(self, folder: Path, name: str = "own"):
        self.folder, self.name = folder, name

    def spec(self, script: str, **entrypoint) -> Path:
        (self.folder / "train.py").write_text(script)
        spec = {"name": self.name, "output": {"root": str(self.folder / "results")},
                "entrypoint": {"script": "train.py", **entrypoint},
                "resources": {"tasks_per_node": 1, "cpus_per_task": 1}}
        path = self.folder / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    def submit(self, *extra: str) -> subprocess.CompletedProcess:
        """``submit SPEC --executor local --wait``."""
        return cli(self.folder, "submit", f"{self.name}.yaml", "--executor", "local", "--wait", *extra)

    @property
    def run(self) -> Path:
        (run,) = [p for p in (self.folder / "results" / self.name).iterdir() if not p.name.startswith(".")]
        return run

    def lines(self) -> list:
        return [json.loads(line) for line in (self.run / "metrics.jsonl").read_text().splitlines()]

    def series(self, name: str) -> list:
        """(step, value) of one metric, in file order."""
        return [(line.get("step"), line[name]) for line in self.lines() if name in line]

    def info(self) -> dict:
        return json.loads((self.run / "run.json").read_text())
