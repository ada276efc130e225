"""How ``--set`` reads a value, through the real command line: a key that holds text
keeps what was typed where YAML would read something else (a regex with ": " is no
mapping), and a bad escape in double quotes says to use single quotes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import cli


@pytest.fixture
def spec(tmp_path) -> Path:
    (tmp_path / "train.py").write_text("print('loss: 0.5')\n")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "entrypoint": {"script": "train.py"}, "params": {"lr": 0.1}}))
    return path


def validate(spec: Path, *sets: str) -> subprocess.CompletedProcess:
    return cli(spec.parent, "validate", str(spec), *(f"--set={item}" for item in sets), env=os.environ, timeout=60)


@pytest.mark.parametrize("typed, meant", [
    ("loss: ([0-9.]+)", "loss: ([0-9.]+)"),  # YAML would read a mapping {loss: ([0-9.]+)}
    (r"loss (\d+)", r"loss (\d+)"),  # plain YAML: a backslash is itself
    (r"'loss: (\d+)'", r"loss: (\d+)"),  # YAML's single quotes: the same
    ("[0-9]+ (x)", "[0-9]+ (x)"),  # no YAML at all
])
def test_a_regex_stays_as_typed(spec, typed, meant):
    done = validate(spec, f"entrypoint.metrics.loss={typed}")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["entrypoint"]["metrics"] == {"loss": meant}


def test_text_keys_keep_text_and_the_rest_keep_yaml(spec):
    done = validate(spec, "name=2024", "resources.partition=null", "params.opt=beta: 0.9", "params.lr=0.2")
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["name"] == "2024" and resolved["resources"]["partition"] is None
    assert resolved["params"] == {"lr": 0.2, "opt": {"beta": 0.9}}  # params: YAML's own reading


def test_a_bad_escape_in_double_quotes_says_to_use_single_quotes(spec):
    done = validate(spec, 'entrypoint.metrics.loss="loss: (\\d+)"')
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob: error: --set entrypoint.metrics.loss line 1, column ")
    assert "found unknown escape character" in line and "write the value in single quotes" in line
