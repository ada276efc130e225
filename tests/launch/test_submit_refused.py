"""A submission that sbatch refuses, through the real command line: one line and no run
left ``pending`` without a job. On the real local Slurm (a partition it does not have:
bad input, exit 2), and with an sbatch shim for what the local cluster does not do on
demand (a controller that stops answering halfway through a sweep: exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import cli
from fakeslurm import fake_slurm_at

from clusterjob.core.record import info_path, read_raw
from clusterjob.core.rundir import find_runs


def write_spec(folder: Path, **extra) -> Path:
    spec = {"name": "refused", "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 16},
            "model": {"arch": "mlp"}, "train": {"epochs": 1, "batch_size": 16},
            "resources": {"cpus_per_task": 1, "mem_gb": 1, "time_min": 5}, "output": {"root": str(folder / "results")},
            **extra}
    path = folder / "refused.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(folder: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    # --no-preflight: what sbatch itself says is under test here (the preflight has its own tests)
    return cli(folder, "submit", "refused.yaml", "--executor", "slurm", "--no-preflight", *extra, env=env)


@pytest.mark.slurm
def test_a_partition_slurm_does_not_have_is_bad_input_and_leaves_nothing(slurm_cluster, tmp_path):
    write_spec(tmp_path, sweep={"train.seed": [0, 1]})
    (tmp_path / "results" / "refused").mkdir(parents=True)  # an experiment folder from before: kept as it was
    done = submit(tmp_path, slurm_cluster.env(), "--set", "resources.partition=nosuch", "--no-preflight")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()  # submitit's echo of sbatch's stderr is not repeated
    assert line.startswith("clusterjob: error: resources.partition: sbatch refused the job: "
                           "Invalid partition name specified (resources.partition: 'nosuch'); ")
    assert line.endswith("; no run was left behind")
    assert [p.name for p in (tmp_path / "results").rglob("*")] == ["refused"]  # no run, no .slurm, no script


# ----------------------------------------------------------------------------- with an sbatch shim

SBATCH = """# answers the first submission, then the controller is gone
if [ -e "$0.done" ]; then
  echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)" >&2
  exit 1
fi
touch "$0.done"
echo "Submitted batch job 4242"
"""


@pytest.fixture
def shims(tmp_path, tmp_path_factory):
    """sbatch as above, sinfo that answers, scontrol saying MaxArraySize=2 (a sweep of 3
    is an array of 2, then one job)."""
    fake = fake_slurm_at(tmp_path / "bin", tmp_path_factory).script("sbatch", SBATCH)
    fake.answer("sinfo", "debug\n").answer("scontrol", "MaxArraySize = 2\n").answer("squeue").answer("sacct")
    return fake.env({k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))})


def test_a_controller_gone_halfway_fails_the_runs_it_did_not_take(tmp_path, shims):
    write_spec(tmp_path, sweep={"train.seed": [0, 1, 2]})
    done = submit(tmp_path, shims, "--no-preflight")  # the shims answer sbatch, not the preflight's questions
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob: error: sbatch failed: Unable to contact slurm controller (connect failure); "
                           "1 run(s) marked failed, `clusterjob resume RUN` starts one: ")
    runs = [run.path for run in find_runs(tmp_path / "results" / "refused")]
    # the submitted runs are left to their tasks to make (clusterjob.core.unmade); the refused one is made to
    # record its failure; the array's job id goes into the sweep's record, not into a run.json
    assert [(run / "run.json").exists() for run in runs] == [False, False, True]
    infos = [read_raw(info_path(run))[0] for run in runs]  # as every reader reads them
    assert [(i["status"], i["slurm_job_id"]) for i in infos] == [("pending", None), ("pending", None),
                                                               ("failed", None)]
    stamp = runs[0].name.rsplit("-", 1)[0]
    record = json.loads((tmp_path / "results" / "refused" / ".sweeps" / f"{stamp}.json").read_text())
    assert [(part["runs"], part["job"], part["array"]) for part in record["parts"]] == [
        ("0-1", {"executor": "slurm", "id": "4242"}, True), ("2", None, False)]
    assert infos[2]["error"]["message"] == "submit failed: sbatch failed: Unable to contact slurm controller " \
                                           "(connect failure)"
    assert str(runs[2]) in line
    # what status shows: the submitted runs pending in their array (the fake squeue lists nothing, sacct neither:
    # they left the queue unaccounted, so failed), the refused one failed: none pending without a job
    shown = cli(tmp_path, "status", str(runs[0].parent), "--runs", env=shims, timeout=120)
    assert [row.split()[-1] for row in shown.stdout.splitlines()[2:5]] == ["4242_0", "4242_1", "-"], shown.stdout
    # the refused part's runs file is gone; no file per task was ever written
    leftovers = sorted(p.name for p in (tmp_path / "results" / "refused" / ".slurm").iterdir())
    assert leftovers == [f"{stamp}.p0.runs.json"]
    resumed = cli(tmp_path, "resume", str(runs[2]), env=shims, timeout=120)
    assert resumed.returncode == 1  # sbatch still fails: the run is failed again, not left pending
    assert resumed.stderr.splitlines()[-1].startswith("clusterjob: error: sbatch failed: Unable to contact")
    info = json.loads((runs[2] / "run.json").read_text())
    assert (info["status"], info["executor"], info["restarts"]) == ("failed", "slurm", 1)
    assert info["error"]["message"].startswith("resume failed: sbatch failed: Unable to contact slurm controller")


def test_a_controller_that_does_not_answer_leaves_no_run(tmp_path, shims):
    (tmp_path / "bin" / "sbatch.done").touch()  # every submission fails
    write_spec(tmp_path)
    done = submit(tmp_path, shims, "--no-preflight")
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["clusterjob: error: sbatch failed: Unable to contact slurm controller "
                                        "(connect failure); no run was left behind"]
    assert not (tmp_path / "results").exists()
