"""Links in a results folder (``latest -> <run>``, links to folders above, loops) through
the real ``status`` and ``report``: each run counts once, under its own name, and
discovery never hangs or crashes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clirun import cli
from test_hostile_results import good_run, snapshot


@pytest.fixture
def two_runs(tmp_path: Path, slurm_shims) -> Path:
    """results/exp/r1 and r2 (train.lr 0.1 and 0.2), and failing Slurm commands on PATH."""
    slurm_shims.fail("squeue", "sacct", stderr="")
    good_run(tmp_path / "results" / "exp", "r1", 0.1)
    good_run(tmp_path / "results" / "exp", "r2", 0.2)
    return tmp_path


def link(at: str, target: "str | Path"):
    def make(root: Path) -> None:
        os.symlink(str(target).replace("ROOT", str(root)), root / at)
    return make


# (case id, links to make, the folder to read)
LINKS = [
    ("latest -> run", [link("results/exp/latest", "r2")], "results/exp"),
    ("latest -> run, absolute", [link("results/exp/latest", "ROOT/results/exp/r1")], "results/exp"),
    ("a run's name before its own", [link("results/exp/a0", "r2"), link("results/exp/0", "r1")], "results/exp"),
    ("loop to the parent", [link("results/exp/loop", "..")], "results/exp"),
    ("loop to itself", [link("results/exp/self", "self")], "results/exp"),
    ("loop pair", [link("results/exp/a", "b"), link("results/exp/b", "a")], "results"),
    ("link to the results root", [link("results/exp/up", "ROOT/results")], "results"),
    ("alias of the experiment", [link("results/alias", "exp")], "results"),
    ("alias and latest", [link("results/alias", "exp"), link("results/exp/latest", "r1")], "results"),
    ("chain of links", [link("results/exp/c1", "c2"), link("results/exp/c2", "r1")], "results"),
    ("link inside a run", [link("results/exp/r1/back", "ROOT/results")], "results"),
    ("dangling link", [link("results/exp/gone", "nowhere")], "results/exp"),
]


@pytest.mark.parametrize("links, folder", [c[1:] for c in LINKS], ids=[c[0] for c in LINKS])
def test_each_run_counts_once_by_its_real_path(two_runs: Path, links: list, folder: str):
    for make in links:
        make(two_runs)
    before = snapshot(two_runs)
    status = cli(two_runs, "status", folder, errors="replace")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    rows = status.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["exp/r1", "exp/r2"], status.stdout
    report = cli(two_runs, "report", folder, "--format", "json", errors="replace")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    shown = json.loads(report.stdout)
    assert shown["status_line"] == "2 runs: 2 completed"
    assert [group["n"] for group in shown["groups"]] == [1, 1]
    after = snapshot(two_runs)
    after.pop(f"{folder}/.clusterjob-cache.npz", None)
    assert after == before


def test_a_link_named_as_the_folder_to_read_still_reads_its_runs(two_runs: Path):
    link("results/alias", "exp")(two_runs)
    status = cli(two_runs, "status", "results/alias", errors="replace")
    assert status.returncode == 0
    assert [row.split()[0] for row in status.stdout.splitlines()[1:]] == ["alias/r1", "alias/r2"]
