"""The spec's env on the real local Slurm: a job submitted through submitit gets it on every
rank of both nodes, and again after its requeue, with the secret handed down through the
job's environment (Slurm keeps it across the requeue) and in no file under the results
folder or submitit's .slurm; a script rendered by `clusterjob sbatch --set
env.HF_TOKEN=...` holds *** and the job takes the value from sbatch's environment."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import clirun
import pytest
import yaml
from clirun import REPO
from secretscan import files_holding
from slurmcluster import submit

from clusterjob.core.ranks import clean_environ

pytestmark = pytest.mark.slurm

SECRET = "hf_sl8rm-s3cr3t-0f-the-env-test"
SEEN = {"NCCL_DEBUG": "WARN", "MY_COUNT": "3"}
# The rank says what it sees (a hash of the secret), and asks for a requeue at its first start.
CHECK_ENV = """\
import hashlib, json, os
import clusterjob
p = clusterjob.params
seen = {name: os.environ.get(name) for name in p["names"]}
ok = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest() == p["secret_sha"]
print(f"rank {os.environ['RANK']} on {os.uname().nodename} sees {json.dumps(seen, sort_keys=True)} "
      f"secret_ok {int(ok)}", flush=True)
if p["requeue"] and os.environ["CLUSTERJOB_RESTARTS"] == "0":
    clusterjob.requeue()
"""


def spec(folder: Path, name: str, requeue: bool, env: dict) -> Path:
    (folder / "check_env.py").write_text(CHECK_ENV)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "output": {"root": str(folder / "results")},
        "entrypoint": {"script": "check_env.py", "metrics": {"secret_ok": r"secret_ok (\d)"}},
        "params": {"names": sorted(SEEN), "secret_sha": hashlib.sha256(SECRET.encode()).hexdigest(),
                   "requeue": requeue},
        "resources": {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10},
        "env": env}))
    return path


def sightings(text: str) -> list[tuple[str, str, dict, str]]:
    """(rank, node, what it saw, secret_ok) of each line a rank printed, in order."""
    found = re.findall(r"rank (\d) on (\S+) sees (\{.*\}) secret_ok (\d)", text)
    return [(rank, node, json.loads(seen), ok) for rank, node, seen, ok in found]


def test_every_rank_on_both_nodes_gets_the_env_again_after_a_requeue_and_no_file_holds_the_secret(
        slurm_cluster, tmp_path):
    path = spec(tmp_path, "slurmenv", requeue=True, env={**SEEN, "MY_COUNT": 3, "HF_TOKEN": SECRET})
    (run,) = submit(slurm_cluster, path, "--wait")  # the submitting shell has no HF_TOKEN: the spec gives it
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["requeues"] == 1, info
    assert info["env"] == {**SEEN, "HF_TOKEN": "***"} and info["final"]["secret_ok"] == 1
    nodes = []  # per rank, its node in each start: Slurm places the requeued job anew, on any two nodes
    for rank in ("0", "1"):
        got = sightings((run / "logs" / f"rank{rank}.out").read_text())
        assert [(r, seen, ok) for r, _, seen, ok in got] == [(rank, SEEN, "1")] * 2, got  # each start saw it
        nodes.append([node for _, node, _, _ in got])
    assert all(first != second for first, second in zip(*nodes)), nodes  # both nodes, in each start
    assert files_holding(SECRET, tmp_path / "results") == []  # .slurm included: scripts, pickles, logs


def test_a_rendered_script_holds_stars_and_the_job_takes_the_secret_from_sbatchs_environment(slurm_cluster, tmp_path):
    path = spec(tmp_path, "tplenv", requeue=False, env=SEEN)
    env = {**clean_environ(os.environ), "SLURM_CONF": slurm_cluster.conf, "PYTHONPATH": str(REPO),
           "CLUSTERJOB_PYTHON": sys.executable}
    rendered = clirun.cli(tmp_path, "sbatch", str(path), "--set", f"env.HF_TOKEN={SECRET}", env=env, timeout=60)
    assert rendered.returncode == 0 and SECRET not in rendered.stdout, rendered.stderr
    assert "export HF_TOKEN in the shell that runs sbatch" in rendered.stderr
    script = tmp_path / "run.sbatch"
    script.write_text(rendered.stdout)
    queued = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)],
                            env={**env, "HF_TOKEN": SECRET}, capture_output=True, text=True, timeout=60)
    assert queued.returncode == 0, queued.stderr
    job = queued.stdout.strip().split(";")[0]
    run = tmp_path / "results" / "tplenv" / f"slurm-{job}"
    deadline = time.monotonic() + 300
    while json.loads((run / "run.json").read_text() if (run / "run.json").exists() else "{}").get("status") not in (
            "completed", "failed"):
        assert time.monotonic() < deadline, f"job {job} did not end"
        time.sleep(1)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["final"]["secret_ok"] == 1, info
    assert info["env"] == {**SEEN, "HF_TOKEN": "***"}
    for rank in ("0", "1"):
        assert [s[2:] for s in sightings((run / "logs" / f"rank{rank}.out").read_text())] == [(SEEN, "1")]
    assert files_holding(SECRET, tmp_path) == []  # the script, the job's logs, the run folder
