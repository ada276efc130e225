"""Faults with real processes: signals to `submit --wait`, a supervisor killed with -9, a
rank killed with -9, cancel of local and hand-started runs, a stale pid. No run is left
"running" and no rank outlives the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clirun import WAIT_S, base_env, cli, start
from trainutil import free_port, write_spec

from clusterjob.core import procs, sweep

pytestmark = pytest.mark.slow

LONG = dict(train={"epochs": 40, "batch_size": 8, "log_every": 2}, data={"limit_train": 1024, "limit_val": 64})


def wait_for(predicate, timeout: float = WAIT_S, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def only_run(tmp_path: Path, name: str) -> Path:
    runs = [p for p in (tmp_path / "results" / name).iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1, runs
    return runs[0]


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def progressed(run_parent: Path) -> bool:
    return any("[progress]" in p.read_text(errors="replace") for p in run_parent.glob("*/logs/rank0.out"))


def rank_refs(run: Path) -> list:
    return [procs.ProcessRef.from_dict(json.loads(p.read_text())) for p in sorted((run / "logs").glob("rank*.proc.json"))]


def all_gone(refs: list) -> bool:
    return all(procs.check(ref) is not None for ref in refs)


def submit(tmp_path: Path, spec: Path, *extra: str, **kwargs) -> subprocess.Popen:
    return start(tmp_path, "submit", str(spec), "--executor", "local", *extra, **kwargs)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_submit_wait_stops_the_ranks_and_ends_the_run(tmp_path, sig, code):
    spec = write_spec(tmp_path, "sig", resources={"tasks_per_node": 2, "cpus_per_task": 1}, **LONG)
    proc = submit(tmp_path, spec, "--wait")
    wait_for(lambda: progressed(tmp_path / "results" / "sig"), what="a progress line")
    run = only_run(tmp_path, "sig")
    refs = rank_refs(run)
    assert len(refs) == 2 and not any(procs.check(r) for r in refs)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == code, out + err
    assert info(run)["status"] == "cancelled"  # the user's stop, after every rank checkpointed
    assert any((run / "checkpoints").glob("epoch-*.pt"))
    assert all_gone(refs)
    assert "cancelled" in out and "stopping 2 ranks (Ctrl-C again to kill them now)" in err


def test_a_killed_detached_supervisor_takes_its_ranks_with_it(tmp_path):
    spec = write_spec(tmp_path, "orphan", resources={"tasks_per_node": 2, "cpus_per_task": 1}, **LONG)
    done = submit(tmp_path, spec)
    out, err = done.communicate(timeout=WAIT_S)
    assert done.returncode == 0, err
    run = only_run(tmp_path, "orphan")
    launcher = sweep.resolved(run, sweep.read_record(run)[0]).launcher  # the supervisor, as status finds it
    assert launcher is not None and procs.check(launcher) is None
    wait_for(lambda: progressed(tmp_path / "results" / "orphan"), what="a progress line")
    refs = rank_refs(run)
    os.kill(launcher.pid, signal.SIGKILL)
    wait_for(lambda: all_gone(refs), what="the ranks to stop")
    assert info(run)["status"] == "preempted"  # they got SIGTERM, checkpointed, and said so


def test_a_rank_killed_by_a_signal_is_named_as_the_cause(tmp_path):
    spec = write_spec(tmp_path, "kill", resources={"tasks_per_node": 2, "cpus_per_task": 1}, **LONG)
    proc = submit(tmp_path, spec, "--wait")
    wait_for(lambda: progressed(tmp_path / "results" / "kill"), what="a progress line")
    run = only_run(tmp_path, "kill")
    refs = rank_refs(run)
    os.kill(refs[1].pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 1
    error = info(run)["error"]
    assert info(run)["status"] == "failed" and error["rank"] == 1
    assert error["message"] == "rank 1 was killed by SIGKILL (no traceback)"
    assert all_gone(refs)


def test_a_second_ctrl_c_does_not_wait_for_the_checkpoint(tmp_path):
    # No progress line in a long epoch: the first Ctrl-C could only be honoured at its end.
    spec = write_spec(tmp_path, "twice", resources={"tasks_per_node": 2, "cpus_per_task": 1},
                      model={"arch": "convnet"}, train={"epochs": 40, "batch_size": 8, "log_every": 10_000},
                      data={"limit_train": 8192})
    said = tmp_path.parent / f"{tmp_path.name}.err"  # submit's stderr, read while it runs
    with said.open("w") as err:
        proc = submit(tmp_path, spec, "--wait", stderr=err)
    # the experiment's folder is made before its run's folder: wait for the rank's file itself
    wait_for(lambda: any((tmp_path / "results" / "twice").glob("*/logs/rank1.proc.json")), what="the ranks")
    wait_for(lambda: info(only_run(tmp_path, "twice")).get("status") == "running", what="the ranks to train")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again to kill them now" in said.read_text(), what="the first Ctrl-C to be taken")
    proc.send_signal(signal.SIGINT)
    started = time.time()
    proc.communicate(timeout=WAIT_S)
    assert time.time() - started < 30 and proc.returncode == 130  # the ranks killed, not left to end their epoch
    run = only_run(tmp_path, "twice")
    assert info(run)["status"] == "cancelled" and all_gone(rank_refs(run))


def test_cancel_stops_a_run_started_by_hand(tmp_path):
    """No supervisor, no Slurm job: the rank is signalled after its identity is checked,
    and (on any host) rank 0 reads the cancel in run.json at its next progress line."""
    spec = write_spec(tmp_path, "hand", **LONG)
    run = tmp_path / "hand-run"
    env = {**base_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(spec), "--run-dir", str(run)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: (run / "logs" / "rank0.proc.json").exists() and info(run)["status"] == "running",
             what="the run to start")
    done = cli(tmp_path, "cancel", str(run))
    assert done.returncode == 0 and "rank 0: sent SIGTERM" in done.stdout, done.stdout + done.stderr
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out
    assert info(run)["status"] == "cancelled"


def test_rank_zero_stops_when_run_json_says_cancelled(tmp_path):
    spec = write_spec(tmp_path, "poll", **LONG)
    run, log = tmp_path / "poll-run", tmp_path / "rank0.out"
    env = {**base_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(spec), "--run-dir", str(run)],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: "[progress]" in log.read_text(), what="a progress line")
    from clusterjob.core.rundir import RunDir

    RunDir(run).update(status="cancelled")  # as `clusterjob cancel` on another host would
    assert proc.wait(timeout=WAIT_S) == 0, log.read_text()
    assert "stopped (cancelled)" in log.read_text()
    assert info(run)["status"] == "cancelled" and any((run / "checkpoints").glob("epoch-*.pt"))


def _hand_run(tmp_path: Path, spec: Path, run: Path) -> subprocess.CompletedProcess:
    env = {**base_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return subprocess.run([sys.executable, "-m", "clusterjob.run", str(spec), "--run-dir", str(run)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=WAIT_S)


def test_a_run_whose_every_checkpoint_is_corrupt_logs_each_epoch_once(tmp_path):
    spec = write_spec(tmp_path, "corrupt", train={"epochs": 2})
    run = tmp_path / "corrupt-run"
    assert _hand_run(tmp_path, spec, run).returncode == 0
    for ckpt in (run / "checkpoints").glob("*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:100])  # cut short, as by a full disk
    again = _hand_run(tmp_path, spec, run)
    assert again.returncode == 0 and "does not load" in again.stderr
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2] and info(run)["status"] == "completed"


def test_a_diverged_loss_fails_the_run_with_the_epoch_and_a_hint(tmp_path):
    spec = write_spec(tmp_path, "diverge", train={"lr": 1e30, "log_every": 2, "epochs": 3})
    run = tmp_path / "diverge-run"
    done = _hand_run(tmp_path, spec, run)
    assert done.returncode == 1
    error = info(run)["error"]
    assert info(run)["status"] == "failed" and error["rank"] == 0
    assert error["message"].startswith("DivergedError: the loss is not finite (nan or inf) in any step of epoch 1")
    assert "lower train.lr (now 1e+30)" in error["message"]
    assert "train.amp" not in error["message"]  # the run had AMP off: no bf16 hint


def test_a_cancel_before_the_ranks_start_is_never_reopened(tmp_path):
    """A run cancelled while its ranks were starting stays cancelled: the rank's start
    does not reopen it (only `resume` does), and it stops at its first progress line."""
    from trainutil import run_hand_set, write_spec

    from clusterjob.core.files import now_iso
    from clusterjob.core.rundir import RunDir, create_run

    spec = write_spec(tmp_path, train={"epochs": 20})
    run = create_run(tmp_path / "results", "t", "r1", spec.read_text(), {})
    run.update(status="cancelled", finished_at=now_iso())
    run_hand_set(run.spec_file, run.path, 1)
    info = RunDir(run.path).read()
    assert info.status == "cancelled"
    lines = (run.path / "metrics.jsonl").read_text().splitlines() if run.metrics_file.exists() else []
    assert len(lines) < 20
