"""Hostile strings through every writer of a shell script: submitit's job script (what
`submit` sends and `submit --dry-run` prints), its teardown line, and `clusterjob sbatch`.
Each value must reach its command as one intact argument, and nothing in it may run."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli

from clusterjob.launch import sbatch
from clusterjob.launch.executors import slurm
from clusterjob.spec.schema import spec_from_dict

HOSTILE = ["x $(touch {canary}) ;", "a b", "it's", 'q"uote', "`touch {canary}`", "$HOME and ${{HOME}}",
           "semi;colon && touch {canary}", "back\\slash", "*glob?[x]", "-dash", "--output=x"]
PRINT_ARGS = "printf '<%s>\\n'"


def hostile(tmp_path: Path, template: str) -> str:
    return template.format(canary=tmp_path / "CANARY")


def run_bash(script: str, cwd: Path, env: dict = None) -> list:
    done = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], **(env or {})}, timeout=30)
    assert done.returncode == 0, done.stderr
    return [line[1:-1] for line in done.stdout.splitlines() if line.startswith("<")]


@pytest.mark.parametrize("template", HOSTILE)
def test_teardown_passes_the_runs_file_as_one_argument(tmp_path, template):
    runs_file = tmp_path / hostile(tmp_path, template) / "name" / ".slurm" / "20261122.runs.json"
    (line,) = slurm._teardown(runs_file)
    python = shlex.quote(sys.executable)
    assert line.startswith(python + " ")
    args = run_bash(PRINT_ARGS + line[len(python):], tmp_path, {"SLURM_ARRAY_TASK_ID": "3"})
    assert args == ["-m", "clusterjob.launch.executors.slurm", "finalize", str(runs_file), "3", "0"]
    assert not (tmp_path / "CANARY").exists()


@pytest.mark.parametrize("template", HOSTILE)
def test_submitit_job_script_keeps_paths_whole(tmp_path, template):
    root = tmp_path / hostile(tmp_path, template)
    spec = spec_from_dict({"name": "n", "output": {"root": str(root)},
                           "resources": {"setup": ["export CLUSTERJOB_SETUP_RAN=1"]}})
    folder = root / "n" / ".slurm"
    (script,) = slurm.scripts(spec, 1, folder)
    headers = {k: v for k, v in (shlex.split(line[len("#SBATCH "):])[0].split("=", 1)
                                 for line in script.splitlines() if line.startswith("#SBATCH --") and "=" in line)}
    # the job is named after its sweep (a submit killed after sbatch leaves a job found by that name)
    assert headers["--output"] == f"{folder}/%j_0_log.out" and headers["--job-name"] == "n-<stamp>"
    python = shlex.quote(sys.executable)
    shimmed = script.replace(python + " ", PRINT_ARGS + " ").replace("\nsrun ", f"\n{PRINT_ARGS} srun ")
    args = run_bash(shimmed, tmp_path, {"SLURM_ARRAY_TASK_ID": "0"})
    srun_at = args.index("srun")
    assert args[srun_at:srun_at + 5] == ["srun", "--unbuffered", "--output", f"{folder}/%j_%t_log.out", "--error"]
    assert args[args.index("clusterjob.run") + 1:args.index("clusterjob.run") + 3] == [
        "--runs", str(folder / "<stamp>.p<part>.runs.json")]  # each task's run: no pickle per task
    assert args[args.index("finalize") + 1] == str(folder / "<stamp>.p<part>.runs.json")
    assert not (tmp_path / "CANARY").exists()


def test_submit_dry_run_through_the_cli_prints_the_same_quoted_script(tmp_path, slurm_shims):
    root = tmp_path / hostile(tmp_path, "x $(touch {canary}) ;")
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: n\noutput: {{root: {shlex.quote(str(root))}}}\n")
    for name in ("sbatch", "sinfo", "scontrol"):  # "Slurm is reachable": the slurm path is taken
        slurm_shims.answer(name)
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", "--dry-run", env=slurm_shims.env(), timeout=60)
    assert done.returncode == 0, done.stderr
    # the folder reaches the script inside whole quoted arguments (the runs file each task reads)
    assert shlex.quote(str(root / "n" / ".slurm" / "<stamp>.p<part>.runs.json")) in done.stdout
    assert not root.exists() and not (tmp_path / "CANARY").exists()  # a dry run writes nothing


FAKE_SRUN = "while [ $# -gt 0 ] && [[ $1 == --* ]]; do shift; done\nexec \"$@\"\n"
FAKE_PYTHON = "printf '%s\\0' \"$@\"\n"  # NUL-separated: an argument may hold a newline


@pytest.mark.parametrize("template", HOSTILE + ["new\nline"])
def test_clusterjob_sbatch_passes_the_spec_path_as_one_argument(tmp_path, slurm_shims, template):
    bin_dir = slurm_shims.folder
    for name, text in (("srun", FAKE_SRUN), ("python", FAKE_PYTHON)):
        slurm_shims.script(name, text, shell="/bin/bash")
    spec_path = str(tmp_path / hostile(tmp_path, template) / "spec.yaml")
    spec = spec_from_dict({"name": "n", "resources": {"cpus_per_task": 1}})
    text = sbatch.render(spec, spec_path, "srun", ["train.lr=0.2"])
    assert "\n" not in text.splitlines()[1] and text.splitlines()[1].startswith("# Rendered by")
    assert "#SBATCH --job-name=n" in text  # the #SBATCH block is still on
    script = tmp_path / "run.sbatch"
    script.write_text(text)
    done = subprocess.run([shutil.which("bash"), str(script)], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": slurm_shims.path(), "CLUSTERJOB_PYTHON": str(bin_dir / "python"),
                               "SLURM_CPUS_PER_TASK": "1"}, timeout=30)
    assert done.returncode == 0, done.stderr
    # the runner, then the teardown after srun: each gets the path as one argument
    assert done.stdout.split("\0")[:-1] == ["-m", "clusterjob.run", spec_path, "--set", "train.lr=0.2",
                                             "-m", "clusterjob.launch.teardown", "0", spec_path, "--set", "train.lr=0.2"]
    assert not (tmp_path / "CANARY").exists()
