"""``validate`` says what ``submit`` will say about a secret the spec holds as ``***``
(its value kept out of every file): unset in this environment, both refuse in the same
one line, exit 2, and nothing is made; set, both go on. Through the real command line."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from clirun import cli


def spec_file(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('ok')\n")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "output": {"root": str(tmp_path / "results")},
                                    "entrypoint": {"script": "train.py"}, "env": {"HF_TOKEN": "***", "A": "1"}}))
    return path


def test_an_unset_secret_is_refused_by_validate_as_by_submit(tmp_path):
    spec = spec_file(tmp_path)
    env = {key: value for key, value in os.environ.items() if key != "HF_TOKEN"}
    said = ("clusterjob: error: env.HF_TOKEN: HF_TOKEN is not set in this environment, and the spec holds *** for "
            "it (a secret's value never goes into a file); export HF_TOKEN in the shell that runs `clusterjob "
            "submit` or `clusterjob resume` (a Slurm job keeps it across requeues)")
    validated = cli(tmp_path, "validate", str(spec), env=env)
    assert validated.returncode == 2 and validated.stdout == ""
    assert validated.stderr.splitlines() == [said]
    submitted = cli(tmp_path, "submit", str(spec), "--executor", "local", env=env, timeout=120)
    assert submitted.returncode == 2 and submitted.stderr.splitlines() == [said]
    assert not (tmp_path / "results").exists()


def test_a_secret_that_is_set_validates_and_is_not_shown(tmp_path):
    spec = spec_file(tmp_path)
    done = cli(tmp_path, "validate", str(spec), env={**os.environ, "HF_TOKEN": "s3cr3t"})
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["env"] == {"HF_TOKEN": "***", "A": "1"}
    assert "s3cr3t" not in done.stdout + done.stderr and done.stderr == "ok: 1 run(s)\n"
