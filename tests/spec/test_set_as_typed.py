"""A value typed after ``--set`` for a key that holds text arrives exactly as typed,
through the real command line: YAML folds no line break and drops no ``  #`` as a comment,
for a secret as for any variable (a variable's line break reaches the rank; another
control character is refused with its position); keys of other types are read as YAML,
as before."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from clirun import cli
from test_set_values import spec, validate  # noqa: F401  (spec: a fixture)

SECRET_SAID = "the value (a secret: not shown)"


@pytest.mark.parametrize("name, said", [("FOO", "'a\\x1bb'"), ("HF_TOKEN", SECRET_SAID)])
def test_a_control_character_is_refused_where_it_is(spec, name, said):
    done = validate(spec, f"env.{name}=a\x1bb")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"clusterjob: error: env.{name}: {said} contains the control character '\\x1b' at position 1; a variable "
        "holds printable text (line breaks and tabs allowed): remove it"]


def test_a_line_break_in_a_variable_arrives_as_typed(spec):
    done = validate(spec, "env.FOO=a\nb", "env.TAB=a\tb")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["env"] == {"FOO": "a\nb", "TAB": "a\tb"}


def test_what_yaml_would_drop_as_a_comment_stays(spec):
    done = validate(spec, "env.FOO=a  #b", "env.BAR=#b", "env.BAZ= lead and trail ", "output.root=res #1",
                    "env.HF_TOKEN=a  #b")
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["env"] == {"FOO": "a  #b", "BAR": "#b", "BAZ": " lead and trail ", "HF_TOKEN": "***"}
    assert resolved["output"]["root"] == "res #1"


def test_quotes_null_and_keys_of_other_types_read_as_yaml(spec):
    done = validate(spec, "env.Q='a  #b'", "resources.partition=null", "params.lr=0.2  # a comment",
                    "params.seeds=[1, 2]", "resources.nodes=2", "env.N=010")
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["env"] == {"Q": "a  #b", "N": "010"}
    assert resolved["resources"]["partition"] is None and resolved["resources"]["nodes"] == 2
    assert resolved["params"] == {"lr": 0.2, "seeds": [1, 2]}


def test_a_name_is_checked_as_typed(spec):
    done = validate(spec, "name=run #2")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob: error: name: 'run #2' ")


@pytest.mark.slow
def test_a_variable_and_a_secret_reach_the_rank_as_typed(tmp_path):
    seen = tmp_path / "seen.json"
    (tmp_path / "train.py").write_text(
        "import json, os\n"
        f"json.dump({{n: os.environ.get(n) for n in ('FOO', 'HF_TOKEN')}}, open({str(seen)!r}, 'w'))\n")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "name": "s", "output": {"root": str(tmp_path / "results")}, "resources": {"cpus_per_task": 1},
        "entrypoint": {"script": "train.py"}}))
    env = {key: value for key, value in os.environ.items() if key != "HF_TOKEN"}
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", "--set", "env.FOO=a  #b\n c",
               "--set", "env.HF_TOKEN=s3  #cr3t\nline 2", env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(seen.read_text()) == {"FOO": "a  #b\n c", "HF_TOKEN": "s3  #cr3t\nline 2"}
    (run,) = [p for p in (tmp_path / "results" / "s").iterdir() if not p.name.startswith(".")]
    written = yaml.safe_load((run / "spec.yaml").read_text())["env"]
    assert written == {"FOO": "a  #b\n c", "HF_TOKEN": "***"}
    assert "cr3t" not in (run / "run.json").read_text()
    report = cli(tmp_path, "report", str(tmp_path / "results"), "--format", "json")
    assert report.returncode == 0, report.stderr
