"""An executor of another package is one module plus its entry point: the toy executor
(toyexec.py beside this file), installed for the test as a dist-info folder on PYTHONPATH,
submits, shows its runs in status and cancels them through the real command line, and
its own key (resources.toy_slots) is checked and written like clusterjob's, on the login
side and by the task's own reading of the spec. Its task side runs a 2-rank job through
the runner, found by the same entry point. No file of clusterjob/ names it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import yaml
from clirun import REPO, cli

ENTRY_POINTS = "[clusterjob.executors]\ntoy = toyexec:ToyExecutor\n"


@pytest.fixture
def toy_site(tmp_path) -> Path:
    """A folder that holds the toy's package as pip would install it: its module and a
    dist-info folder whose entry_points.txt registers it."""
    site = tmp_path / "site"
    info = site / "clusterjob_toy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clusterjob-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    shutil.copy(Path(__file__).with_name("toyexec.py"), site / "toyexec.py")
    return site


def env(site: Optional[Path]) -> dict:
    """No Slurm, and the toy's package on the path when ``site`` holds it (a process of its
    own then: clirun)."""
    return {**{key: value for key, value in os.environ.items() if not key.startswith("SLURM")},
            "PYTHONPATH": os.pathsep.join([str(REPO)] + ([str(site)] if site else []))}


def write_spec(folder: Path, **resources) -> Path:
    spec = {"name": "toyrun", "output": {"root": str(folder / "results")}, "sweep": {"train.lr": [0.1, 0.2]},
            "resources": {"cpus_per_task": 1, **resources}}
    path = folder / "toyrun.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_toy_submits_shows_and_cancels_its_runs_through_the_command_line(tmp_path, toy_site):
    write_spec(tmp_path, toy_slots=2)
    preview = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", "--dry-run", env=env(toy_site))
    assert (preview.returncode, preview.stdout) == (0, "toy: 2 run(s) into 2 slot(s)\n"), preview.stderr
    assert cli(tmp_path, "validate", "toyrun.yaml", env=env(toy_site)).returncode == 0
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", env=env(toy_site))
    assert done.returncode == 0, done.stderr
    runs = sorted(p for p in (tmp_path / "results" / "toyrun").iterdir() if not p.name.startswith("."))
    assert [line for line in done.stdout.splitlines() if line.startswith("toy:")] == [
        f"toy: queued {run.name}" for run in runs]
    for index, run in enumerate(runs):
        record = json.loads((run / "run.json").read_text())
        assert (record["executor"], record["status"]) == ("toy", "pending")
        assert (record["job"], record["slurm_job_id"]) == ({"executor": "toy", "id": f"toy-{index}"}, None)
        assert yaml.safe_load((run / "spec.yaml").read_text())["resources"]["toy_slots"] == 2  # the resolved spec

    shown = cli(tmp_path, "status", "results/toyrun", env=env(toy_site))
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:] if line}
    assert sorted(rows) == [f"toyrun/{run.name}" for run in runs], shown.stdout
    assert all("pending (in the toy queue (queued))" in row for row in rows.values()), shown.stdout
    assert [row.split()[-1] for row in rows.values()] == ["toy-0", "toy-1"]  # the JOB column: the toy's ids

    gone = cli(tmp_path, "cancel", str(runs[0]), env=env(toy_site))
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.splitlines() == ["taken out of the toy queue", f"{runs[0]}: cancelled"]
    assert json.loads((runs[0] / "run.json").read_text())["status"] == "cancelled"
    shown = cli(tmp_path, "status", "results/toyrun", env=env(toy_site))
    again = {line.split()[0]: line for line in shown.stdout.splitlines() if line.startswith("toyrun/")}
    assert again[f"toyrun/{runs[0].name}"].split()[1] == "cancelled"
    assert "pending (in the toy queue (queued))" in again[f"toyrun/{runs[1].name}"]


@pytest.mark.parametrize("extra, message", [
    (["--set", "resources.toy_slots=0"], "resources.toy_slots: 0 is out of range; it must be >= 1"),
    (["--set", "resources.toy_slots=many"], "resources.toy_slots: expected a whole number, got 'many' (str)"),
    (["--set", "resources.toy_slot=2"], "resources.toy_slot: unknown key (did you mean 'toy_slots'?)"),
    ([], "resources.toy_slots: 1 slot(s) cannot hold 2 runs; set resources.toy_slots to at least 2"),  # its check
])
def test_the_toys_own_key_is_checked_in_one_line_and_nothing_is_written(tmp_path, toy_site, extra, message):
    write_spec(tmp_path)
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", *extra, env=env(toy_site))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"clusterjob: error: {message}\n")
    assert not (tmp_path / "results").exists()


def test_an_executor_that_runs_no_debug_refuses_it_in_one_line_and_writes_nothing(tmp_path, toy_site):
    write_spec(tmp_path, toy_slots=2)
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", "--debug", "--set", "sweep={}",
               env=env(toy_site))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "clusterjob: error: --debug: the toy executor "
                                                           "cannot run a rank in the foreground; use --executor local "
                                                           "(here) or slurm (in an salloc)\n")
    assert not (tmp_path / "results").exists()


def test_a_task_reads_the_toys_key_too(tmp_path, toy_site):
    write_spec(tmp_path, toy_slots=0)
    done = subprocess.run([sys.executable, "-m", "clusterjob.run", "toyrun.yaml", "--point", "0"], cwd=tmp_path,
                          env=env(toy_site), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "clusterjob.run: error: resources.toy_slots: 0 is out of range; "
                                                 "it must be >= 1\n")
    assert not (tmp_path / "results").exists()


def test_without_its_package_the_toy_and_its_key_are_unknown(tmp_path):
    write_spec(tmp_path)
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", "--dry-run", env=env(None))
    assert (done.returncode, done.stderr) == (2, "clusterjob: error: --executor 'toy': no such executor; choose one "
                                                 "of: auto, slurm, local\n")
    done = cli(tmp_path, "validate", "toyrun.yaml", "--set", "resources.toy_slots=2", env=env(None))
    assert done.returncode == 2 and done.stderr.startswith("clusterjob: error: resources.toy_slots: unknown key;")


def test_an_entry_point_that_cannot_be_loaded_is_one_line_naming_its_package(tmp_path, toy_site):
    info = toy_site / "clusterjob_toy-0.1.dist-info" / "entry_points.txt"
    info.write_text(ENTRY_POINTS + "broken = nosuchmodule:Executor\n")
    write_spec(tmp_path, toy_slots=2)
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "broken", "--dry-run", env=env(toy_site))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("clusterjob: error: executor 'broken': the entry point 'nosuchmodule:Executor' of "
                           "clusterjob.executors cannot be loaded (ModuleNotFoundError: No module named "
                           "'nosuchmodule'); reinstall or uninstall clusterjob-toy\n")


def test_the_toys_task_side_runs_a_two_rank_job(tmp_path, toy_site):
    """The runner asks the toy's task side (its ``environment``, found through its entry
    point) for the ranks and the job: two local processes meet over gloo, and run.json
    records the toy's job as the run's."""
    import toyexec
    from trainutil import TINY, merge

    spec = merge(TINY, {"name": "toyrun", "output": {"root": str(tmp_path / "results")},
                        "resources": {"tasks_per_node": 2, "toy_slots": 1}, "dist": {"backend": "gloo"}})
    (tmp_path / "toyrun.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "toyrun.yaml", "--executor", "toy", env=env(toy_site))
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in (tmp_path / "results" / "toyrun").iterdir() if not p.name.startswith(".")]
    ranks = toyexec.serve(run, 2, env(toy_site))
    assert [code for code, _ in ranks] == [0, 0], [said[-3000:] for _, said in ranks]
    record = json.loads((run / "run.json").read_text())
    assert (record["status"], record["executor"], record["world_size"], record["backend"]) == (
        "completed", "toy", 2, "gloo")
    assert (record["job"], record["slurm_job_id"]) == ({"executor": "toy", "id": "toy-0"}, None)
    assert [session["job"] for session in record["sessions"]] == ["toy-0"]
    shown = cli(tmp_path, "status", "results/toyrun", env=env(toy_site))
    assert shown.returncode == 0 and f"toyrun/{run.name}" in shown.stdout and "completed" in shown.stdout, shown.stdout


def test_no_file_of_clusterjob_names_the_toy():
    assert [path for path in (REPO / "clusterjob").rglob("*.py") if "toy" in path.read_text().lower()] == []
