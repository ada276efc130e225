"""Ctrl-C of a local ``submit --wait`` reaches a plain script as Ctrl-C, as under torchrun:
the terminal sends SIGINT to the foreground process group (the command; the ranks are in
sessions of their own), the supervisor passes SIGINT on to every rank, and the script
sees KeyboardInterrupt. A script shaped like pytorch/examples' word_language_model
(tests/scripts/early_exit.py) catches it, tests its best model and prints its test loss:
that metric is taken, and the run ends cancelled although the script exited 0. A script
that exits at once ends cancelled too; one that ignores it is killed after
``entrypoint.stop_grace_s``. SIGTERM stays the stop it was: StopRequested, not
KeyboardInterrupt, so the script never tests its model. Real processes, local."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import clirun
import pytest
import yaml
from clirun import REPO, WAIT_S, base_env
from slurmcluster import wait_for

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "scripts" / "early_exit.py"
METRICS = {"valid_loss": r"valid loss +([0-9.]+)", "test_loss": r"test loss +([0-9.]+)"}


def spec_file(folder: Path, name: str, mode: str, grace_s: float) -> Path:
    spec = {"name": name, "output": {"root": str(folder / "results")},
            "resources": {"tasks_per_node": 2, "cpus_per_task": 1},
            "entrypoint": {"script": str(SCRIPT), "args": ["--on-interrupt", mode], "metrics": METRICS,
                           "stop_grace_s": grace_s}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def epochs_logged(run: Path) -> int:
    log = run / "logs" / "rank0.out"
    return log.read_text().count("| end of epoch") if log.exists() else 0


def only_run(folder: Path, name: str) -> Path:
    found = [p for p in (folder / "results" / name).glob("*") if (p / "run.json").exists()]
    return found[0] if len(found) == 1 else Path("/nonexistent")


@pytest.mark.parametrize("mode, sig", [("test", signal.SIGINT), ("exit0", signal.SIGINT), ("ignore", signal.SIGINT),
                                       ("test", signal.SIGTERM)], ids=["test", "exit0", "ignore", "sigterm"])
def test_ctrl_c_reaches_a_plain_script_as_keyboard_interrupt(tmp_path, mode, sig):
    # the grace is what the ignoring script is killed after; the others stop by themselves,
    # for which a loaded machine may need more than 3 s (a rank killed at 3 s never prints)
    spec = spec_file(tmp_path, "wlm", mode, grace_s=3 if mode == "ignore" else 120)
    # its own session, as a shell runs a foreground job: the test signals its group as a terminal would
    proc = clirun.start(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=base_env(),
                        start_new_session=True)
    try:
        wait_for(lambda: epochs_logged(only_run(tmp_path, "wlm")) >= 2, WAIT_S, "two epochs")
        os.killpg(proc.pid, sig)
        sent = time.time()
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.time() - sent
    run = only_run(tmp_path, "wlm")
    info = json.loads((run / "run.json").read_text())
    logs = {rank: (run / "logs" / f"rank{rank}.out").read_text() for rank in (0, 1)}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tested = [row["test_loss"] for row in rows if "test_loss" in row]
    assert proc.returncode == 128 + sig and info["status"] == "cancelled", out + err
    assert info.get("error") is None and f"{run.name}  cancelled" in out
    assert "stopping 2 ranks (Ctrl-C again to kill them now)" in err
    assert len([row for row in rows if "valid_loss" in row]) >= 2
    if sig == signal.SIGTERM:  # not Ctrl-C: StopRequested, which `except KeyboardInterrupt` does not catch
        assert "Exiting from training early" not in logs[0] and tested == []
        return
    assert all("received SIGINT: stopping the script" in log for log in logs.values())
    if mode == "ignore":
        assert all("ignoring Ctrl-C" in log for log in logs.values()) and tested == []
        assert "did not stop within entrypoint.stop_grace_s=3 s" in (run / "logs" / "rank0.err").read_text()
        assert 2.5 < took < 60, took  # the grace, then the kill
        return
    errs = {rank: (run / "logs" / f"rank{rank}.err").read_text()[-3000:] for rank in (0, 1)}
    assert all("Exiting from training early" in log for log in logs.values()), (logs, errs, took)
    assert not list((run / "logs").glob("rank*.error.json")) and took < 90  # by itself, before the kill at 120 s
    if mode == "exit0":
        assert tested == [] and "End of training" not in logs[0]
        return
    printed = [line for line in logs[0].splitlines() if line.startswith("| End of training | test loss")]
    assert len(printed) == 1 and tested == [float(printed[0].split("test loss")[1].split("|")[0])]
