"""``clusterjob attach`` on a live 2-node run of the real local Slurm: the shell opens
through ``srun --overlap --pty`` on the node of the rank asked for, typed into through a
pty (``hostname``, ``env | grep RANK``), while the ranks go on; the run then completes."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from clirun import checkout_env, cli, command
from ptydrive import drive
from slurmcluster import job_of, submit, wait_for

pytestmark = pytest.mark.slurm

WAIT_S = 300
WAITING = ("import os, pathlib, time\n"
           "stop = pathlib.Path(os.environ['CLUSTERJOB_RUN_DIR']).parent / 'stop'\n"
           "deadline = time.time() + 300\n"
           "while not stop.exists() and time.time() < deadline:\n"
           "    time.sleep(0.2)\n")
PROMPT = "] $ "  # the shell's prompt, [rank R on HOST] $


def two_nodes(folder: Path, nodes: int = 2, **extra) -> Path:
    (folder / "wait.py").write_text(WAITING)
    spec = {"name": "attach", "entrypoint": {"script": "wait.py"}, "output": {"root": str(folder / "results")},
            "resources": {"nodes": nodes, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10},
            **extra}
    path = folder / "attach.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text()) if (run / "run.json").exists() else {}


def completed(run: Path) -> bool:
    return info(run).get("status") == "completed"


def test_attach_runs_hostname_and_env_on_the_node_of_rank_1(slurm_cluster, tmp_path):
    (run,) = submit(slurm_cluster, two_nodes(tmp_path))
    try:
        wait_for(lambda: info(run).get("status") == "running" and (run / "logs" / "rank1.health.json").exists(),
                 WAIT_S, "both ranks running")
        node = json.loads((run / "logs" / "rank1.health.json").read_text())["node"]
        assert node != json.loads((run / "logs" / "rank0.health.json").read_text())["node"]
        screen = drive(command("attach", str(run), "--rank", "1"), tmp_path,
                       {**checkout_env(slurm_cluster.env()), "SHELL": "/bin/sh"},
                       [(PROMPT, "hostname\n"), (PROMPT, "env | grep RANK\n"), (PROMPT, "exit\n")], timeout=WAIT_S)
        assert screen.returncode == 0, screen.text
        lines = screen.lines()
        assert node in lines and "RANK=1" in lines and "NODE_RANK=1" in lines, screen.text
        assert info(run)["status"] == "running"  # the shell left, the ranks go on
    finally:
        (run.parent / "stop").write_text("")
    wait_for(lambda: info(run).get("status") == "completed", WAIT_S, f"job {job_of(run)} to complete")


def test_attach_reaches_a_run_of_an_array_through_its_tasks_own_job_id(slurm_cluster, tmp_path):
    runs = submit(slurm_cluster, two_nodes(tmp_path, nodes=1, params={"n": 0}, sweep={"params.n": [0, 1]}))
    assert len(runs) == 2 and job_of(runs[1]).endswith("_1")  # srun --jobid refuses 123_1: its own id is asked
    health = runs[1] / "logs" / "rank0.health.json"
    try:
        wait_for(lambda: health.exists() and info(runs[1]).get("status") == "running", WAIT_S,
                 "the second run's rank running")
        screen = drive(command("attach", str(runs[1])), tmp_path,
                       {**checkout_env(slurm_cluster.env()), "SHELL": "/bin/sh"},
                       [(PROMPT, "hostname\n"), (PROMPT, "echo task=$SLURM_ARRAY_TASK_ID run=$CLUSTERJOB_RUN_ID\n"),
                        (PROMPT, "exit\n")], timeout=WAIT_S)
        assert screen.returncode == 0, screen.text
        node = json.loads(health.read_text())["node"]
        assert node in screen.lines() and f"task=1 run={runs[1].name}" in screen.lines(), screen.text
        stacks = cli(tmp_path, "stack", str(runs[1]), env=slurm_cluster.env())  # through srun, the same own id
        assert stacks.returncode == 0 and "wait.py" in stacks.stdout, stacks.stdout + stacks.stderr
    finally:
        (runs[0].parent / "stop").write_text("")  # every run of the sweep stops waiting
    for run in runs:
        wait_for(functools.partial(completed, run), WAIT_S, f"job {job_of(run)} to complete")
