"""``clusterjob submit --debug`` with the local executor: rank 0 of an own script runs on
the terminal (a pty here, driven by keystrokes), stops at its ``breakpoint()``, answers
pdb and continues on ``c``; the run is an ordinary one (run.json, status). World size 1
unless --set asks for more, the other ranks then run past their breakpoint. Flags that do
not go with it exit 2 with one line and write nothing."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from clirun import checkout_env, cli, command
from owncode import Project
from ptydrive import drive

from clusterjob.core.rundir import RunDir
from clusterjob.launch.executors.slurm import salloc_command
from clusterjob.spec.schema import spec_from_dict

STOPPING = ("import os\n"
            "x = 41\n"
            "breakpoint()\n"
            "print('after the breakpoint', x + 1, 'on rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
PDB = "(Pdb) "


def debugged(tmp_path, *extra: str):
    own = Project(tmp_path, "dbg")
    own.spec(STOPPING)
    screen = drive(command("submit", f"{own.name}.yaml", "--executor", "local", "--debug", *extra), tmp_path,
                   checkout_env(), [(PDB, "p x\n"), (PDB, "c\n")])
    return own, screen


def test_debug_stops_at_the_breakpoint_and_continues_on_c(tmp_path):
    own, screen = debugged(tmp_path)
    assert screen.returncode == 0, screen.text
    lines = screen.lines()
    assert lines[lines.index(f"{PDB}p x") + 1] == "41", screen.text
    assert "after the breakpoint 42 on rank 0 of 1" in lines
    info = json.loads((own.run / "run.json").read_text())
    assert info["status"] == "completed" and info["world_size"] == 1 and info["executor"] == "local"
    shown = cli(tmp_path, "status", "results")
    assert f"dbg/{own.run.name}  completed" in shown.stdout


def test_debug_runs_more_ranks_when_asked_and_only_rank_0_stops(tmp_path):
    own, screen = debugged(tmp_path, "--set", "resources.tasks_per_node=2")
    assert screen.returncode == 0, screen.text
    assert "after the breakpoint 42 on rank 0 of 2" in screen.lines()
    assert screen.text.count(PDB) == 2  # rank 0's two prompts; rank 1 ran past its breakpoint
    assert "after the breakpoint 42 on rank 1 of 2" in (own.run / "logs" / "rank1.out").read_text()
    assert json.loads((own.run / "run.json").read_text())["status"] == "completed"


def test_ctrl_c_at_the_pdb_prompt_cancels_the_run(tmp_path):
    own = Project(tmp_path, "dbg")
    own.spec(STOPPING, stop_grace_s=1)
    screen = drive(command("submit", "dbg.yaml", "--executor", "local", "--debug"), tmp_path, checkout_env(),
                   [(PDB, "\x03")])  # Ctrl-C, as the terminal sends it
    assert screen.returncode == 1, screen.text
    assert "stopping 1 rank (Ctrl-C again to kill them now)" in screen.lines()
    assert f"{own.run.name}  cancelled  -> {own.run}" in screen.lines()
    assert json.loads((own.run / "run.json").read_text())["status"] == "cancelled"


@pytest.mark.parametrize("extra, said", [
    (["--dry-run"], "--debug and --dry-run do not go together: --debug runs the run now, in the foreground; "
                    "leave one out"),
    (["--after", "results/x"], "--debug and --after do not go together: --debug runs the run now, in the "
                               "foreground; leave one out"),
    (["--set", "sweep={params.lr: [0.1, 0.2]}"], "--debug runs one run, and this spec makes 2; pick one point, "
                                                 "e.g. --set sweep={} --set params.KEY=VALUE"),
])
def test_what_does_not_go_with_debug_is_one_line_and_writes_nothing(tmp_path, extra, said):
    own = Project(tmp_path, "dbg")
    spec = yaml.safe_load(own.spec(STOPPING).read_text())
    spec["params"] = {"lr": 0.1}
    (tmp_path / "dbg.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "dbg.yaml", "--executor", "local", "--debug", *extra)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"clusterjob: error: {said}\n")
    assert not (tmp_path / "results").exists()


def test_the_salloc_of_debug_asks_the_specs_resources_and_quotes_every_value():
    spec = spec_from_dict({"name": "dbg",
                           "resources": {"nodes": 2, "tasks_per_node": 1, "gpus_per_node": 2, "cpus_per_task": 3,
                                         "mem_gb": 1.5, "time_min": 90, "partition": "gpu",
                                         "setup": ["module load cuda; echo 'set up'"]}})
    run = RunDir(Path("/scratch/my runs/dbg/$(id)"))
    command = salloc_command(spec, run)
    assert command[:-3] == ["salloc", "--job-name=dbg", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2",
                            "--cpus-per-task=3", "--mem=1536M", "--time=01:30:00", "--partition=gpu"]
    assert command[-3:-1] == ["bash", "-c"]
    setup, cpus, ranks = command[-1].split("\n")
    assert (setup, cpus) == ("module load cuda; echo 'set up'", "export SRUN_CPUS_PER_TASK=3")
    srun = shlex.split(ranks)
    assert srun[:6] == ["exec", "srun", "--pty", "--kill-on-bad-exit=1", "bash", "-c"]
    logs, task = shlex.quote(str(run.logs)), shlex.join([sys.executable, "-u", "-m", "clusterjob.run",
                                                         str(run.spec_file)])
    assert srun[6] == (f'if [ "$SLURM_PROCID" != 0 ]; then export PYTHONBREAKPOINT=0; mkdir -p {logs}; exec '
                       f'>>{logs}/"rank$SLURM_PROCID.out" 2>>{logs}/"rank$SLURM_PROCID.err"; fi; exec {task}')
