"""``clusterjob attach`` on a live local run: a shell through a pty, typed into, with the
rank's environment (its RANK, the spec's env and secrets, kept out of every file, its
working directory); bad values exit 2 with one line and change nothing."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import yaml
from clirun import checkout_env, cli, command, wait_for
from owncode import Project
from ptydrive import drive
from secretscan import files_holding

# Each rank waits until the test drops the run's `stop` file (at most 5 minutes).
WAITING = ("import os, pathlib, time\n"
           "stop = pathlib.Path(os.environ['CLUSTERJOB_RUN_DIR']) / 'stop'\n"
           "deadline = time.time() + 300\n"
           "while not stop.exists() and time.time() < deadline:\n"
           "    time.sleep(0.1)\n")
SECRET = "s3cret-0f-the-rank"
PROMPT = "] $ "  # the shell's prompt, [rank R on HOST] $


def waiting_project(folder: Path, tasks: int = 2) -> Project:
    own = Project(folder, "attach")
    path = own.spec(WAITING)
    spec = yaml.safe_load(path.read_text())
    spec["resources"]["tasks_per_node"] = tasks
    spec["env"] = {"ATTACH_MARK": "from-the-spec", "ATTACH_TOKEN": SECRET}
    path.write_text(yaml.safe_dump(spec))
    return own


def running(run: Path, ranks: int) -> bool:
    info = json.loads((run / "run.json").read_text())
    return info.get("status") == "running" and all((run / "logs" / f"rank{r}.proc.json").exists()
                                                    for r in range(ranks))


def shell_env() -> dict:
    return {**checkout_env(), "SHELL": "/bin/sh"}


def test_attach_opens_a_shell_with_the_ranks_environment_and_refuses_what_is_not_running(tmp_path):
    own = waiting_project(tmp_path)
    started = cli(tmp_path, "submit", f"{own.name}.yaml", "--executor", "local")
    assert started.returncode == 0, started.stderr
    run = wait_for(lambda: next(iter((tmp_path / "results" / own.name).glob("2*")), None), "the run folder")
    try:
        wait_for(lambda: running(run, 2), "both ranks running")
        screen = drive(command("attach", str(run), "--rank", "1"), tmp_path, shell_env(),
                       [(PROMPT, "hostname\n"), (PROMPT, "env | grep RANK\n"), (PROMPT, "echo \"$ATTACH_MARK\"\n"),
                        (PROMPT, "echo \"token=$ATTACH_TOKEN\"\n"), (PROMPT, "pwd\n"), (PROMPT, "exit\n")])
        assert screen.returncode == 0, screen.text
        lines = screen.lines()
        assert socket.gethostname() in lines
        assert "RANK=1" in lines and "LOCAL_RANK=1" in lines and "NODE_RANK=0" in lines, screen.text
        assert "from-the-spec" in lines and str(tmp_path) in lines, screen.text
        assert f"token={SECRET}" in lines  # the secret the rank holds, from its memory: in no file
        assert files_holding(SECRET, tmp_path / "results") == []

        out_of_range = cli(tmp_path, "attach", str(run), "--rank", "2")
        assert out_of_range.returncode == 2
        assert out_of_range.stderr == "clusterjob: error: --rank 2: the run has ranks 0..1\n"
    finally:
        (run / "stop").write_text("")
    wait_for(lambda: json.loads((run / "run.json").read_text()).get("status") == "completed", "the run's end")
    ended = cli(tmp_path, "attach", run.name)  # a run id, as the other commands take it
    assert ended.returncode == 2 and ended.stdout == ""
    assert ended.stderr == (f"clusterjob: error: results/attach/{run.name} is completed, not running; `clusterjob attach` opens a shell "
                            "on a running run's rank (`clusterjob logs` shows what an ended run printed)\n")
