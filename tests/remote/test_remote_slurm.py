"""From a "laptop" (this machine under another HOME) through a real sshd to the real
local Slurm: the quickstart on 2 nodes with ``--wait``, then status, logs, cancel,
report and pull through the same connection, one login in all."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from clirun import REPO, cli, start, wait_for
from sshserver import cancel_left_runs, make

from clusterjob.core.provenance import VERSION

pytestmark = pytest.mark.slurm


@pytest.fixture
def ssh_slurm(slurm_cluster):
    cluster = make(slurm_conf=slurm_cluster.conf)
    cluster.start()
    yield cluster
    cancel_left_runs(cluster.workdir, dict(slurm_cluster.env(), PYTHONPATH=str(REPO)))
    cluster.close_connections()
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


def test_the_quickstart_on_two_nodes_from_a_laptop_then_five_commands_in_one_login(ssh_slurm):
    here = ssh_slurm.root / "proj"
    (here / "jobs").mkdir(parents=True)
    shutil.copy(REPO / "jobs" / "quickstart.yaml", here / "jobs" / "quickstart.yaml")

    def remote(*argv: str):
        return cli(here, *argv, "--cluster", "test", env=ssh_slurm.env(), process=True)

    done = remote("submit", "jobs/quickstart.yaml", "--set", "resources.nodes=2", "--set", "train.epochs=2", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    there = ssh_slurm.workdir / "proj"
    (run,) = [path.parent for path in (there / "results" / "quickstart").glob("*/run.json")]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["executor"] == "slurm" and info["world_size"] == 4
    assert info["hosts"] == ["node1", "node2"] and run.name in done.stdout
    sweep = f"quickstart-{run.name}"

    status = remote("status")
    assert status.returncode == 0 and run.name in status.stdout and "completed" in status.stdout
    logs = remote("logs", f"results/quickstart/{run.name}", "--rank", "3")
    assert logs.returncode == 0 and "rank3.out <==" in logs.stdout
    cancel = remote("cancel", sweep)  # nothing left to cancel: said there, passed through here
    assert cancel.returncode in (0, 2) and cancel.stdout + cancel.stderr
    report = remote("report", "results/quickstart", "--out", "report.html")
    assert report.returncode == 0 and "quickstart" in (here / "report.html").read_text()
    pull = remote("pull", sweep)
    assert pull.returncode == 0, pull.stderr
    pulled = here / "results" / "quickstart" / run.name
    assert json.loads((pulled / "run.json").read_text())["status"] == "completed"
    assert (pulled / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert (run / "checkpoints").is_dir() and not (pulled / "checkpoints").exists()
    assert ssh_slurm.logins() == 1, ssh_slurm.log.read_text()[-3000:]
    listed = cli(here, "clusters", env=ssh_slurm.env(), process=True)
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith("test ")]
    assert listed.returncode == 0 and f"reachable, clusterjob {VERSION}, Slurm " in line, listed.stdout


def test_sshd_stopped_during_wait_the_slurm_job_completes_and_the_command_reconnects(ssh_slurm):
    here = ssh_slurm.root / "proj"
    here.mkdir()
    shutil.copy(REPO / "jobs" / "quickstart.yaml", here / "q.yaml")
    proc = start(here, "submit", "q.yaml", "--cluster", "test", "--set", "train.epochs=2", "--wait",
                 env=ssh_slurm.env())
    err: list = []
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        runs = ssh_slurm.workdir / "proj" / "results" / "quickstart"
        (record,) = wait_for(lambda: list(runs.glob("*/run.json")), "the run folder there")
        wait_for(lambda: json.loads(record.read_text())["status"] == "running", "the job to run")
        ssh_slurm.stop()
        wait_for(lambda: any("lost the connection to test" in line for line in err), "the command to say so")
        ssh_slurm.start()
        out = proc.stdout.read()
        assert proc.wait(timeout=600) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=60)
    assert any("reconnected to test" in line for line in err)
    info = json.loads(record.read_text())
    assert info["status"] == "completed" and info["executor"] == "slurm" and record.parent.name in out
