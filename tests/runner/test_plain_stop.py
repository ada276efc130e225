"""A plain script (one that never imports clusterjob) is stopped as torchrun stops it:
cancel, Ctrl-C, USR2 and a dead supervisor reach its process, and it is killed after
``entrypoint.stop_grace_s``; the run is marked cancelled only once no rank is alive.
Also: metrics from stderr, ``{run_dir}`` and ``workdir: run``. Real processes, local."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from clirun import REPO, WAIT_S, cli, start, wait_for

from clusterjob.core import procs

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "scripts" / "plain_loop.py"


def spec_file(folder: Path, name: str, args: list, **entry) -> Path:
    spec = {"name": name, "output": {"root": str(folder / "results")},
            "resources": {"tasks_per_node": 2, "cpus_per_task": 1},
            "entrypoint": {"script": str(SCRIPT), "args": args,
                           "metrics": {"loss": r"loss ([0-9.]+)", "top1": r"top1 ([0-9.]+)"}, **entry}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def the_run(folder: Path, name: str) -> Path:
    found = wait_for(lambda: [p for p in (folder / "results" / name).glob("*") if (p / "run.json").exists()],
                     "the run folder")
    return found[0]


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def refs(run: Path) -> list:
    return [procs.ProcessRef.from_dict(json.loads(p.read_text())) for p in sorted((run / "logs").glob("rank*.proc.json"))]


def alive(run: Path) -> list:
    return [ref for ref in refs(run) if procs.check(ref) is None]


def training(run: Path, at_least: int = 3) -> None:
    """Until both ranks recorded themselves and rank 0 printed ``at_least`` steps."""
    log = run / "logs" / "rank0.out"
    wait_for(lambda: len(refs(run)) == 2 and log.exists() and log.read_text().count("iter ") >= at_least,
             f"the script to train {at_least} steps")


def watch_status(run: Path, stop_at: float) -> list:
    """(status, ranks alive) samples until ``stop_at``: a run is never `cancelled` while a rank lives."""
    seen = []
    while time.time() < stop_at:
        seen.append((info(run).get("status"), len(alive(run))))
        time.sleep(0.05)
    return seen


def test_cancel_stops_a_plain_script_and_marks_it_cancelled_once_its_ranks_are_gone(tmp_path):
    spec = spec_file(tmp_path, "cancel", ["--ckpt", "{run_dir}/ckpt.pt"])
    assert start(tmp_path, "submit", str(spec), "--executor", "local").communicate(timeout=WAIT_S)[0]
    run = the_run(tmp_path, "cancel")
    training(run)
    started = time.time()
    done = start(tmp_path, "cancel", str(run))
    samples = []
    while done.poll() is None:
        samples.append((info(run).get("status"), len(alive(run))))
        time.sleep(0.05)
    out, err = done.communicate()
    assert done.returncode == 0, out + err
    assert time.time() - started < 60, out  # stopped at once: not at a progress line it never prints
    assert not alive(run) and info(run)["status"] == "cancelled" and info(run)["finished_at"]
    assert all(status != "cancelled" for status, living in samples if living)
    assert "sent SIGTERM" in out and "all 2 rank(s) here ended" in out
    count = (run / "metrics.jsonl").read_text().count("\n")
    time.sleep(2)
    assert (run / "metrics.jsonl").read_text().count("\n") == count  # nothing trains on
    again = cli(tmp_path, "cancel", str(run), process=False)  # the run ended: nothing to signal
    assert again.returncode == 2 and "already cancelled" in again.stderr


def test_ctrl_c_on_submit_wait_stops_a_plain_script_within_seconds(tmp_path):
    spec = spec_file(tmp_path, "ctrlc", ["--ckpt", "{run_dir}/ckpt.pt"])
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = the_run(tmp_path, "ctrlc")
    training(run)
    ranks = refs(run)
    proc.send_signal(signal.SIGINT)
    started = time.time()
    out, err = proc.communicate(timeout=WAIT_S)
    assert time.time() - started < 60 and proc.returncode == 130, out + err  # within seconds: not at the end
    assert "stopping 2 ranks (Ctrl-C again to kill them now)" in err
    assert info(run)["status"] == "cancelled" and info(run)["finished_at"]
    assert not any(procs.check(ref) is None for ref in ranks)


def test_a_script_that_ignores_the_stop_is_killed_after_its_grace_period(tmp_path):
    spec = spec_file(tmp_path, "stubborn", ["--stubborn", "--ckpt", "{run_dir}/ckpt.pt"], stop_grace_s=2)
    assert start(tmp_path, "submit", str(spec), "--executor", "local").communicate(timeout=WAIT_S)[0]
    run = the_run(tmp_path, "stubborn")
    training(run)
    started = time.time()
    done = cli(tmp_path, "cancel", str(run))
    took = time.time() - started
    assert done.returncode == 0 and 1.5 < took < 60, (took, done.stdout, done.stderr)  # the grace, then the kill
    assert not alive(run) and info(run)["status"] == "cancelled"
    assert "did not stop within entrypoint.stop_grace_s=2 s" in (run / "logs" / "rank0.err").read_text()


def test_a_killed_supervisor_leaves_no_plain_script_running(tmp_path):
    spec = spec_file(tmp_path, "orphan", ["--steps", "200", "--ckpt", "{run_dir}/ckpt.pt"])
    assert start(tmp_path, "submit", str(spec), "--executor", "local").communicate(timeout=WAIT_S)[0]
    run = the_run(tmp_path, "orphan")
    training(run)
    os.kill(info(run)["launcher"]["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(run), "the ranks to end with their supervisor")
    assert info(run)["status"] == "preempted"  # resumable: `clusterjob resume` continues it
    resumed = cli(tmp_path, "resume", str(run), "--wait")
    assert resumed.returncode == 0 and info(run)["status"] == "completed", resumed.stdout + resumed.stderr


def test_usr2_stops_a_plain_script_which_resumes_from_its_own_checkpoint(tmp_path):
    # steps enough that a loaded machine still trains when the test has seen 8 and sends USR2
    spec = spec_file(tmp_path, "usr2", ["--steps", "100", "--ckpt", "ckpt.pt"], workdir="run")
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    run = the_run(tmp_path, "usr2")
    training(run, at_least=8)
    for ref in refs(run):
        os.kill(ref.pid, signal.SIGUSR2)
    out, err = proc.communicate(timeout=WAIT_S)
    assert info(run)["status"] == "preempted" and not alive(run), out + err
    assert (run / "ckpt.pt").exists()  # workdir: run: the script's ./ckpt.pt is the run's own
    resumed = cli(tmp_path, "resume", str(run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log = (run / "logs" / "rank0.out").read_text()
    starts = [int(line.split("at step ")[1].split()[0]) for line in log.splitlines() if line.startswith("starting at")]
    assert starts[0] == 0 and starts[-1] >= 5 and f"in {run.resolve()}" in log
    assert info(run)["status"] == "completed"


def test_metrics_logged_to_stderr_and_run_dir_in_args(tmp_path):
    spec = spec_file(tmp_path, "stderr", ["--steps", "12", "--sleep", "0", "--ckpt", "{run_dir}/ckpt.pt"])
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    run = the_run(tmp_path, "stderr")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["top1"] for r in rows if "top1" in r] == [50.5, 51.0]  # logging.info, on stderr
    assert len([r for r in rows if "loss" in r]) == 12
    assert (run / "ckpt.pt").exists() and not (tmp_path / "ckpt.pt").exists()
    assert "top1" in (run / "logs" / "rank0.err").read_text()  # still in the log, as printed
