"""``resume SEARCH`` of a search with nothing left to run says how many trials it asked
for and took, and how they ended, through the real command line (a local search of the
built-in trainer, two short trials); it suggests no number of its own."""

from __future__ import annotations

import pytest
import yaml
from clirun import cli
from trainutil import TINY, merge

pytestmark = pytest.mark.slow

SEARCH = {"trials": 2, "parallel": 1, "seed": 0, "space": {"train.lr": {"log_uniform": [1.0e-3, 0.1]}}}


def test_resume_of_a_finished_search_says_what_it_asked_and_took(tmp_path):
    spec = merge(TINY, {"name": "s", "output": {"root": str(tmp_path / "results")}, "search": SEARCH})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (found,) = (tmp_path / "results" / "s").iterdir()
    again = cli(tmp_path, "resume", str(found))
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.splitlines() == [
        f"clusterjob: error: {found}: the search asked for 2 trial(s) and took 2; every one of its 2 trial(s) "
        f"ended (2 completed); to run more, raise search.trials above 2: clusterjob resume {found} "
        "--set search.trials=N"]
