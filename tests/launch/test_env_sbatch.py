"""`clusterjob sbatch` and the spec's env: a script is a file, so a secret given with
--set is written *** in it (the job takes the value from the environment sbatch passes
on), with a note on stderr; other variables pass as given."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import clirun
from clirun import base_env
from secretscan import environ_without

from clusterjob.spec.schema import load_spec

SECRET = "hf_s3cr3t-0f-the-sbatch-test"


def sbatch(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    return clirun.cli(folder, "sbatch", "spec.yaml", *argv, env=environ_without(base_env(), "HF_TOKEN"), timeout=120)


def script_args(script: str) -> list[str]:
    """The spec and --set arguments the rendered script passes on (its `set --` line)."""
    (line,) = [line for line in script.splitlines() if line.startswith("set -- ")]
    return shlex.split(line)[2:-1]  # less `set --` and the trailing "$@"


def test_a_secret_given_with_set_is_stars_in_the_script_and_the_rest_as_given(tmp_path):
    (tmp_path / "spec.yaml").write_text(f"name: sb\nenv: {{WANDB_API_KEY: {SECRET}x}}\n")
    done = sbatch(tmp_path, "--set", f"env.HF_TOKEN={SECRET}", "--set", "env.NCCL_DEBUG=INFO",
                  "--set", f"env={{HF_TOKEN: {SECRET}, MY_N: 1}}")
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout  # nor the spec file's secret: the script names the file, the job reads it
    args = script_args(done.stdout)
    assert args[1:] == ["--set", "env.HF_TOKEN=***", "--set", "env.NCCL_DEBUG=INFO",
                        "--set", 'env={"HF_TOKEN": "***", "MY_N": "1"}']
    notes = done.stderr.splitlines()
    assert len(notes) == 2 and all(n.startswith("note: env.HF_TOKEN is written *** in the script") for n in notes)
    assert "export HF_TOKEN in the shell that runs sbatch" in notes[0]
    spec = load_spec(args[0], args[2::2])  # what the job reads: the secret from its environment
    assert spec.env == {"HF_TOKEN": "***", "MY_N": "1"}


def test_without_secrets_nothing_changes_and_nothing_is_said(tmp_path):
    (tmp_path / "spec.yaml").write_text("name: sb\n")
    done = sbatch(tmp_path, "--set", "env.NCCL_DEBUG=INFO", "--set", "env={A: 1}")
    assert done.returncode == 0 and done.stderr == ""
    assert script_args(done.stdout)[1:] == ["--set", "env.NCCL_DEBUG=INFO", "--set", "env={A: 1}"]
