"""``submit --after`` on the real local Slurm: a job that waits for one job (afterok), for
every task of an array, and for a job that fails (Slurm cancels the waiting job; the run
is failed, "dependency failed")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import cli
from slurmcluster import batch_script, job_of, submit

pytestmark = pytest.mark.slurm

FIRST = ("import time, clusterjob\n"
         "def main():\n"
         "    time.sleep(3)\n"
         "    clusterjob.log(step=1, score=0.5 + clusterjob.params['seed'])\n")
FAILING = "import time\ndef main():\n    time.sleep(2)\n    raise ValueError('the first run broke')\n"
READER = ("import json, os, sys, clusterjob\n"
          "def main():\n"
          "    scores = [json.loads(open(os.path.join(p, 'metrics.jsonl')).read())['score'] for p in clusterjob.after()]\n"
          "    open(os.path.join(os.environ['CLUSTERJOB_RUN_DIR'], 'args.json'), 'w').write(json.dumps(sys.argv[1:]))\n"
          "    return {'total': sum(scores)}\n")
SMALL = {"nodes": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 5}


def spec(folder: Path, name: str, code: str, args=(), **extra) -> Path:
    (folder / f"{name}.py").write_text(code)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "entrypoint": {"function": f"{name}:main", "args": list(args)},
                                    "resources": SMALL, "params": {"seed": 0},
                                    "output": {"root": str(folder / "results")}, **extra}))
    return path


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def script_of(cluster, run: Path) -> str:
    """The sbatch script sent for the run's job."""
    return batch_script(cluster, job_of(run))


def test_a_job_waits_for_one_job_and_reads_its_run(slurm_cluster, tmp_path):
    (first,) = submit(slurm_cluster, spec(tmp_path, "first", FIRST))
    (second,) = submit(slurm_cluster, spec(tmp_path, "second", READER, args=["{after.run_dir}"]),
                       "--after", str(first), "--wait")
    assert info(first)["status"] == "completed" and info(second)["status"] == "completed", info(second)
    assert f"#SBATCH --dependency=afterok:{info(first)['slurm_job_id']}\n" in script_of(slurm_cluster, second)
    assert "#SBATCH --kill-on-invalid-dep=yes" in script_of(slurm_cluster, second)
    assert info(second)["started_at"] >= info(first)["finished_at"]
    assert info(second)["final"]["total"] == 0.5  # it read the first run's metrics
    assert json.loads((second / "args.json").read_text()) == [str(first.resolve())]


def test_a_job_waits_for_every_task_of_an_array(slurm_cluster, tmp_path):
    firsts = submit(slurm_cluster, spec(tmp_path, "sweep", FIRST, sweep={"params.seed": [1, 2]}))
    tasks = [job_of(run) for run in firsts]
    (second,) = submit(slurm_cluster, spec(tmp_path, "second", READER, args=["{after.run_dirs}"]),
                       "--after", str(tmp_path / "results" / "sweep"), "--wait")
    assert len(tasks) == 2 and all("_" in task for task in tasks)  # one array
    assert f"#SBATCH --dependency=afterok:{tasks[0]}:{tasks[1]}\n" in script_of(slurm_cluster, second)
    assert all(info(run)["status"] == "completed" for run in firsts) and info(second)["status"] == "completed"
    assert info(second)["final"]["total"] == 1.5 + 2.5  # it read both runs' metrics
    assert json.loads((second / "args.json").read_text()) == [json.dumps([str(r.resolve()) for r in firsts])]
    assert info(second)["started_at"] >= max(info(run)["finished_at"] for run in firsts)


def test_a_failed_dependency_fails_the_waiting_run_instead_of_leaving_it_pending(slurm_cluster, tmp_path):
    (first,) = submit(slurm_cluster, spec(tmp_path, "first", FAILING))
    done = cli(tmp_path, "submit", str(spec(tmp_path, "second", READER)), "--executor", "slurm",
               "--after", str(first), "--wait", env=slurm_cluster.env())
    assert done.returncode == 1, done.stdout + done.stderr
    (second,) = [p for p in (tmp_path / "results" / "second").iterdir() if not p.name.startswith(".")]
    assert info(second)["status"] == "failed"
    assert info(second)["error"]["message"] == (f"dependency failed: {first.resolve()} is failed: "
                                                "ValueError: the first run broke")
    assert "dependency failed" in done.stdout and not (second / "args.json").exists()
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_of(second)],
                           capture_output=True, text=True, env=slurm_cluster.env()).stdout.split()
    assert sacct[:1] == ["CANCELLED"]  # Slurm ended the job that could never start
    again = cli(tmp_path, "submit", str(tmp_path / "second.yaml"), "--executor", "slurm",
                "--after", str(first), env=slurm_cluster.env())
    assert again.returncode == 2 and "is failed: ValueError: the first run broke" in again.stderr
