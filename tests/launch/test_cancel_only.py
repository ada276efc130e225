"""``cancel --only STATE`` offers the states a run can be cancelled in, and only those,
through the real command line: its help lists them, a state a run has ended in says there
is nothing to cancel (and how many runs are in it), a word that is no state names the
choices; ``--only pending`` cancels a local sweep's waiting run and leaves its running one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from clirun import cli
from slurmcluster import wait_for

from clusterjob.core.files import now_iso
from clusterjob.core.rundir import make_runs
from clusterjob.launch.control import CANCELLABLE

# Every point runs until it is stopped.
SCRIPT = "import time\nwhile True:\n    time.sleep(0.1)\n"


def ended_sweep(tmp_path: Path) -> str:
    points = [(i, "name: exp\n", {"train.lr": lr}) for i, lr in enumerate([0.1, 0.2, 0.3])]
    runs = make_runs(tmp_path / "results", "exp", points, executor="local")
    for run, status in zip(runs, ("failed", "completed", "failed")):
        run.update(status=status, started_at=now_iso(), finished_at=now_iso())
    return f"exp-{runs[0].path.name.rsplit('-', 1)[0]}"


def test_the_help_offers_the_states_a_run_can_be_cancelled_in(tmp_path):
    done = cli(tmp_path, "cancel", "--help")
    assert done.returncode == 0
    assert re.search(r"--only ([a-z|]+)", done.stdout).group(1) == "|".join(CANCELLABLE)
    assert CANCELLABLE == ("pending", "running", "timeout", "preempted")


@pytest.mark.parametrize("state", ["failed", "completed", "cancelled", "pruned"])
def test_an_ended_state_has_nothing_to_cancel(tmp_path, state):
    named = ended_sweep(tmp_path)
    done = cli(tmp_path, "cancel", named, "--only", state)
    assert done.returncode == 2 and done.stdout == ""
    counted = {"failed": "2 runs: 2 failed", "completed": "1 run: 1 completed"}.get(state, "0 runs")
    assert done.stderr.splitlines() == [
        f"clusterjob: error: {named}: nothing to cancel: {counted} (--only {state}); a {state} run has ended: "
        "cancel --only takes pending, running, timeout, preempted"]


def test_a_word_that_is_no_cancellable_state_names_the_choices(tmp_path):
    named = ended_sweep(tmp_path)
    done = cli(tmp_path, "cancel", named, "--only", "done")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "clusterjob: error: --only 'done': choose one of: pending, running, timeout, preempted"]


@pytest.mark.slow
def test_only_pending_cancels_the_waiting_run_and_leaves_the_running_one(tmp_path):
    (tmp_path / "point.py").write_text(SCRIPT)
    (tmp_path / "sw.yaml").write_text(yaml.safe_dump({
        "name": "sw", "output": {"root": str(tmp_path / "results")},
        "resources": {"cpus_per_task": 1, "array_parallelism": 1},
        "entrypoint": {"script": str(tmp_path / "point.py"), "stop_grace_s": 2},
        "params": {"i": 0}, "sweep": {"params.i": [0, 1]}}))
    done = cli(tmp_path, "submit", "sw.yaml", "--executor", "local")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("sweep ")]
    named = line.split()[1].rstrip(":")

    def states() -> list[str]:
        """Each run's state as status shows it, point 0 first."""
        rows = cli(tmp_path, "status", named).stdout.splitlines()[1:3]
        return [re.split(r"\s{2,}", row)[1] for row in rows]

    try:
        wait_for(lambda: states() == ["running", "pending"], 180, "point 0 running, point 1 waiting")
        cancelled = cli(tmp_path, "cancel", named, "--only", "pending")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert cancelled.stdout.splitlines()[-1] == f"{named}: 2 runs: 1 pending, 1 running"
        assert states() == ["running", "pending (cancel requested)"]  # its supervisor will not start it
    finally:
        cli(tmp_path, "cancel", named, timeout=180)
    wait_for(lambda: states() == ["cancelled", "cancelled"], 120, "both points cancelled")
