"""``submit --wait`` of a search reads as a search (docs/design.md, "Search"), through the
real command line: its id, folder and how to follow it first, as a sweep's; each prune
said on one line with the trial, the rung and the cut in %, no blank line before it; no
trial's rank log says "received SIGTERM" for a prune; the report at the end a table of
the trials; ``status`` gives the best trial's values as the report writes them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from clirun import cli
from trainutil import TINY, merge

SEARCH = {"trials": 6, "parallel": 2, "seed": 0, "space": {"train.lr": {"log_uniform": [1.0e-5, 0.5]}},
          "prune": {"method": "asha", "min_epochs": 1, "reduction": 2}}


@pytest.mark.slow
def test_submit_wait_of_a_search_says_what_it_started_and_each_prune(tmp_path):
    spec = merge(TINY, {"name": "s", "output": {"root": str(tmp_path / "results")},
                        "train": {"epochs": 4, "log_every": 8}})
    spec["search"] = SEARCH
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = (tmp_path / "results" / "s").iterdir()
    lines = done.stdout.splitlines()
    assert lines[0] == (f"search {folder.name}: 6 trial(s), 2 at once (random, asha (min_epochs 1, reduction 2), "
                        f"val_acc max) in {folder}")
    assert lines[1] == f"follow with: clusterjob status {folder}"
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))  # its trials
    infos = {run.name: json.loads((run / "run.json").read_text()) for run in runs}
    pruned = {name: info["pruned"] for name, info in infos.items() if info["status"] == "pruned"}
    assert pruned  # the worst of 6 lrs over 5 decades is pruned at its first rung
    said = [i for i, line in enumerate(lines) if " pruned at rung " in line and "; stopping" in line]
    assert said  # the supervisor says each prune it stops ranks for (a trial may stop by itself first)
    for i in said:
        name = lines[i].split()[0]
        verdict = pruned[name]
        assert lines[i] == (f"{name}  pruned at rung {verdict['rung']} (epoch {verdict['at']:g}): val_acc "
                            f"{100 * verdict['value']:.2f}% < cut {100 * verdict['cut']:.2f}%; stopping 1 rank")
        assert lines[i - 1].strip()  # no blank line before it
    assert "pruned by its search: stopping" not in done.stdout + done.stderr
    for run in runs:
        log = (run / "logs" / "rank0.out").read_text()
        assert "received SIGTERM" not in log, run.name
    report = done.stdout[done.stdout.index("## s"):]
    assert "one row per trial of the search" in " ".join(report.split()) and "*?" not in report
    best = cli(tmp_path, "status", str(folder)).stdout.splitlines()[1]
    name = re.match(r"best so far: (\S+) val_acc [\d.]+% \(train\.lr=(\S+)\)$", best)
    assert name, best
    assert name.group(2) == f"{infos[name.group(1)]['params']['train.lr']:g}"


def test_the_prune_line_of_your_code_names_its_steps_and_its_metric(tmp_path):
    """A trial of your own code: its position in steps, a metric of no known unit as written."""
    from clusterjob.core.rundir import RunDir
    from clusterjob.launch.progress import prune_line

    folder = tmp_path / "s" / "20261122-000000-abcd"
    run = folder / "20261122-000000-abcd-003"
    run.mkdir(parents=True)
    (folder / "search.json").write_text(json.dumps({"id": folder.name, "metric": "loss", "mode": "min"}))
    (run / "run.json").write_text(json.dumps({
        "run_id": run.name, "name": "s", "status": "running", "entrypoint": {"script": "train.py"},
        "pruned": {"trial": 3, "rung": 2, "at": 40, "value": 0.91234, "cut": 0.5, "go": False}}))
    assert prune_line(RunDir(Path(run)), 2) == (f"{run.name}  pruned at rung 2 (step 40): loss 0.9123 > cut 0.5; "
                                                "stopping 2 ranks")
