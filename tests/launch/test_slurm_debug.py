"""``clusterjob submit --debug --executor slurm`` on the real local Slurm: the run in an
``salloc`` of two nodes (asked with --set), rank 0 in ``srun --pty`` on this terminal (a
pty driven by keystrokes) stops at the own script's ``breakpoint()``, continues on ``c``,
rank 1 runs past its own; the run completes as an ordinary Slurm run. A Ctrl-C at the pdb
prompt cancels it."""

from __future__ import annotations

import json

import pytest
from clirun import checkout_env, cli, command
from owncode import Project
from ptydrive import drive

pytestmark = pytest.mark.slurm

STOPPING = ("import os, socket\n"
            "x = 41\n"
            "breakpoint()\n"
            "print('after the breakpoint', x + 1, 'on rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'],\n"
            "      'on', socket.gethostname())\n")
PDB = "(Pdb) "


def test_debug_in_an_salloc_stops_rank_0_at_its_breakpoint_and_completes(slurm_cluster, tmp_path):
    own = Project(tmp_path, "dbg")
    own.spec(STOPPING)
    env = checkout_env(slurm_cluster.env())
    screen = drive(command("submit", "dbg.yaml", "--executor", "slurm", "--debug", "--set", "resources.nodes=2",
                           "--set", "resources.mem_gb=1", "--set", "resources.time_min=10"), tmp_path, env,
                   [(PDB, "p x\n"), (PDB, "c\n")], timeout=300)
    assert screen.returncode == 0, screen.text
    lines = screen.lines()
    assert lines[lines.index(f"{PDB}p x") + 1] == "41", screen.text
    assert "after the breakpoint 42 on rank 0 of 2 on node1" in lines, screen.text
    info = json.loads((own.run / "run.json").read_text())
    assert info["status"] == "completed" and info["hosts"] == ["node1", "node2"], info
    assert info["executor"] == "slurm" and info["slurm_job_id"]
    assert "on rank 1 of 2 on node2" in (own.run / "logs" / "rank1.out").read_text()
    shown = cli(tmp_path, "status", "results", env=env)
    assert f"dbg/{own.run.name}  completed" in shown.stdout


def test_ctrl_c_at_the_pdb_prompt_in_the_salloc_cancels_the_run(slurm_cluster, tmp_path):
    own = Project(tmp_path, "dbg")
    own.spec(STOPPING, stop_grace_s=1)
    env = checkout_env(slurm_cluster.env())
    screen = drive(command("submit", "dbg.yaml", "--executor", "slurm", "--debug", "--set", "resources.mem_gb=1",
                           "--set", "resources.time_min=10"), tmp_path, env,
                   [(PDB, "\x03")], timeout=300)  # Ctrl-C, as the terminal sends it: to rank 0 through srun --pty
    assert screen.returncode == 1, screen.text
    assert f"{own.run.name}  cancelled  -> {own.run}" in screen.lines(), screen.text
    info = json.loads((own.run / "run.json").read_text())
    assert info["status"] == "cancelled" and info["slurm_job_id"], info
    shown = cli(tmp_path, "status", "results", env=env)
    assert f"dbg/{own.run.name}  cancelled" in shown.stdout
