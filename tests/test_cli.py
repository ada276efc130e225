"""The command line: exit codes, clear messages, nothing written on bad input, no torch on
the login-node commands, and the local executor end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from clirun import REPO, WAIT_S, base_env, cli, ended, wait_for
from trainutil import epochs_of, run_info, write_spec


@pytest.mark.parametrize("body, message", [
    ("name: t\ntrain: {lrr: 0.1}\n", "train.lrr: unknown key (did you mean 'lr'?)"),
    ("name: t\ntrain:\n  lr: 0.1\n bad\n", "line 4, column 2: YAML syntax error"),
    ("name: t\nresources: {nodes: 2}\n", "resources.nodes: 2 nodes cannot run with the local executor"),
    ("name: t\nsweep: {train.lr: 0.1}\n", "sweep.train.lr: 0.1 is not a list"),
    ("name: t\nsweep: {train.lr: [0.1, -1]}\n", "sweep.train.lr: -1.0 is out of range"),
    ("name: t\nresources: {partition: 'gpu; rm -rf ~'}\n", "resources.partition: 'gpu; rm -rf ~' is not allowed"),
])
def test_bad_specs_exit_2_with_one_line_and_write_nothing(tmp_path, body, message):
    (tmp_path / "bad.yaml").write_text(body)
    done = cli(tmp_path, "submit", "bad.yaml", "--executor", "local", "--wait")
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_bad_override_and_flags_exit_2(tmp_path):
    spec = write_spec(tmp_path, "t")
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--set", "train.epochs=0")
    assert done.returncode == 2 and "train.epochs: 0 is out of range; it must be >= 1" in done.stderr
    assert cli(tmp_path, "submit", str(spec), "--executor", "nowhere").returncode == 2
    assert cli(tmp_path, "submit", "missing.yaml").returncode == 2
    assert not (tmp_path / "results").exists()


def test_slurm_executor_without_slurm_is_bad_input(tmp_path):
    env = {**base_env(), "PATH": "/usr/bin/nonexistent", "SLURM_CONF": "/nonexistent"}
    done = cli(tmp_path, "submit", str(write_spec(tmp_path, "t")), "--executor", "slurm", env=env)
    assert done.returncode == 2 and "Slurm is not reachable" in done.stderr


def test_login_node_commands_do_not_import_torch(tmp_path):
    spec = write_spec(tmp_path, "t")
    probe = ("import sys, runpy; sys.argv = ['clusterjob'] + sys.argv[1:]\n"
             "from clusterjob.cli import main\ncode = main()\n"
             "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(code)")
    for args in (["--help"], ["env", "--json"], ["validate", str(spec)], ["sbatch", str(spec)],
                 ["status", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, env=base_env(),
                              capture_output=True, text=True)
        assert "torch imported" not in done.stderr, args
        assert done.returncode in (0, 2), (args, done.stderr)


def test_env_json_under_a_slurm_step(tmp_path):
    env = {**base_env(), "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2",
           "SLURM_STEP_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "4242"}
    done = cli(tmp_path, "env", "--json", env=env)
    got = json.loads(done.stdout)
    assert {k: got[k] for k in ("source", "rank", "local_rank", "world_size", "local_world_size", "node_rank",
                                "num_nodes", "master_addr", "hosts")} == {
        "source": "slurm", "rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "node_rank": 1,
        "num_nodes": 2, "master_addr": "gpu07", "hosts": ["gpu07", "gpu08"]}
    assert 20000 <= got["master_port"] < 32768
    bad = cli(tmp_path, "env", env={**env, "SLURM_STEP_NODELIST": "gpu[08-07]"})
    assert bad.returncode == 2 and "SLURM_STEP_NODELIST" in bad.stderr


@pytest.mark.slow
def test_local_sweep_waits_and_reports(tmp_path):
    spec = write_spec(tmp_path, "sw", sweep={"train.lr": [0.02, 0.05]}, resources={"tasks_per_node": 2})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(p for p in (tmp_path / "results" / "sw").iterdir() if not p.name.startswith("."))
    assert [run_info(r)["status"] for r in runs] == ["completed", "completed"]
    assert [run_info(r)["params"] for r in runs] == [{"train.lr": 0.02}, {"train.lr": 0.05}]
    assert all((r / "logs" / "rank1.out").exists() and len(epochs_of(r)) == 1 for r in runs)
    assert done.stdout.count("completed  val_acc") == 2 and "train.lr" in done.stdout
    status = cli(tmp_path, "status", str(tmp_path / "results" / "sw"))
    assert status.stdout.count("completed") == 2
    logs = cli(tmp_path, "logs", runs[1].name, "--rank", "0")  # a run id, found under results/
    assert logs.returncode == 0 and "epoch 1/1 train_loss" in logs.stdout
    assert cli(tmp_path, "logs", str(runs[1]), "--rank", "5").returncode == 2


@pytest.mark.slow
def test_local_rank_failure_stops_every_rank_and_is_recorded(tmp_path):
    spec = write_spec(tmp_path, "f", train={"epochs": 3}, debug={"fail_at_epoch": 2, "fail_rank": 1},
                      resources={"tasks_per_node": 2})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 1
    (run,) = [p for p in (tmp_path / "results" / "f").iterdir() if not p.name.startswith(".")]
    info = run_info(run)
    assert info["status"] == "failed" and info["error"]["rank"] == 1
    assert "debug.fail_at_epoch" in info["error"]["message"] and "RuntimeError" in info["error"]["traceback"]
    assert [r["epoch"] for r in epochs_of(run)] == [1]
    assert "error (rank 1)" in done.stdout


@pytest.mark.slow
def test_local_cancel_ends_the_supervisor_and_workers(tmp_path):
    spec = write_spec(tmp_path, "c", train={"epochs": 50}, data={"limit_train": 2048},
                      resources={"tasks_per_node": 2})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local")
    assert done.returncode == 0 and "supervisor pid" in done.stdout
    (run,) = [p for p in (tmp_path / "results" / "c").iterdir() if not p.name.startswith(".")]
    wait_for(lambda: run_info(run).get("status") == "running", "the run to run")
    assert cli(tmp_path, "cancel", str(run)).returncode == 0
    pid = run_info(run)["launcher"]["pid"]
    wait_for(lambda: ended(pid), "the supervisor to end")
    assert run_info(run)["status"] == "cancelled"
    assert cli(tmp_path, "cancel", str(run), process=False).returncode == 2  # already cancelled: nothing to signal


@pytest.mark.slow
def test_quickstart_learns_past_90_percent(tmp_path):
    # about 4 minutes on a quiet CPU without native bf16; a loaded machine takes several times that
    done = cli(tmp_path, "submit", str(REPO / "jobs" / "quickstart.yaml"), "--executor", "local", "--wait",
               timeout=3 * WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in (tmp_path / "results" / "quickstart").iterdir() if not p.name.startswith(".")]
    final = run_info(run)["final"]
    assert final["epoch"] == 4 and final["val_acc"] > 0.9
    (summary,) = [line for line in done.stdout.splitlines() if line.startswith(run.name)]
    assert "completed" in summary and float(summary.split("val_acc ")[1].split()[0].rstrip("%")) > 90
    assert "1 run: 1 completed" in done.stdout  # the report after --wait
