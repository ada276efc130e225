"""The report and status of a search read as a search (docs/design.md, "Search"), through
the command line: one row per trial sorted by the metric, the best trial marked, its
values, each pruned trial's rung, epoch and cut, no "more seeds would tell" advice; a
search with a seed in its space grouped as a sweep is; a cancelled search's trials at
their latest epoch, and no saving claimed for them; a tie said as a tie; ``status``
naming a pending trial and the best one's values as the report writes them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clirun import cli
from test_results import write_run
from test_search_report import SID, epochs, trial

from clusterjob.core import procs

SPACE = {"train.lr": {"log_uniform": [1e-4, 0.3]}}


def search_json(folder: Path, trials: int, space: dict = SPACE) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "search.json").write_text(json.dumps({
        "id": SID, "name": "s", "method": "random", "trials": trials, "parallel": 2, "metric": "val_acc",
        "mode": "max", "space": space, "prune": {"method": "asha", "min_epochs": 1, "reduction": 2}}))


def pruned(folder: Path, number: int, lr: float, count: int, acc: float, cut: float, rung: int, **more) -> Path:
    """A trial pruned at ``rung`` after ``count`` epochs, its verdict in run.json."""
    run = trial(folder, number, lr, "pruned", epochs(count, acc), 10 * count + 5, **more)
    info = json.loads((run / "run.json").read_text())
    value = epochs(count, acc)[-1]["val_acc"]
    info["pruned"] = {"trial": number, "rung": rung, "at": count, "value": value, "cut": cut, "go": False,
                      "competing": 3}
    (run / "run.json").write_text(json.dumps(info))
    return run


def folder_of(root: Path) -> Path:
    return root / "results" / "s" / SID


def outcomes(text: str) -> list:
    """The outcome cells of the md table (as cards or as a table), in their order."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.strip().startswith("outcome "):
            found.append(line.strip()[len("outcome "):])
        elif line.startswith("|") and len(cells) > 1 and cells[-1] and not set(cells[-1]) <= set("-:"):
            found.append(cells[-1])
    return [cell for cell in found if cell != "outcome"]


def marks(text: str) -> list:
    """(marker, trial) of each row of the md table (as cards or as a table), in order."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("|") and len(cells) > 1 and re.fullmatch(r"\d{3}", cells[1]):
            found.append((cells[0], cells[1]))
        elif line.startswith("- "):
            mark, number = re.match(r"- (\*?) ?trial=(\d{3})", line).groups()
            found.append((mark, number))
    return found


def md(root: Path, folder: Path, *extra: str) -> str:
    done = cli(root, "report", str(folder), *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def report_json(root: Path, folder: Path) -> dict:
    return json.loads(md(root, folder, "--format", "json"))


def test_a_searchs_report_is_its_trials_sorted_by_the_metric_with_the_best_marked(tmp_path):
    folder = folder_of(tmp_path)
    search_json(folder, 4)
    trial(folder, 0, 0.01, "completed", epochs(4, 0.9), 45)
    pruned(folder, 1, 0.0002, 1, 0.8, 0.5, 0)  # val_acc 0.2 at epoch 1
    pruned(folder, 2, 0.2, 2, 0.9, 0.6, 1)  # 0.45 at epoch 2
    trial(folder, 3, 0.05, "completed", epochs(4, 0.7), 45)
    text = md(tmp_path, folder)
    flat = " ".join(text.split())
    assert "*?" not in text and "more seeds would tell" not in flat and "leads the next" not in flat
    assert "Grouped by train.lr: one row per trial of the search" in flat and "sorted by val_acc, highest" in flat
    assert outcomes(text) == ["completed", "completed", "pruned at rung 1 (epoch 2): val_acc 45.00% < cut 60.00%",
                              "pruned at rung 0 (epoch 1): val_acc 20.00% < cut 50.00%"]
    assert "| n |" not in text and "0/1" not in text  # a trial is one run: no counts
    assert marks(text) == [("*", "000"), ("", "003"), ("", "002"), ("", "001")]
    data = report_json(tmp_path, folder)
    assert data["group_by"] == ["trial", "train.lr"] and data["best"] == {"trial": 0, "train.lr": 0.01}
    assert data["experiments"][0]["best_note"] is None
    assert [g["trial"] for g in data["groups"]] == [0, 3, 2, 1] and {g["n"] for g in data["groups"]} == {1}
    assert [g["val_acc_pct_mean"] for g in data["groups"]] == [90.0, 70.0, 45.0, 20.0]
    page = md(tmp_path, folder, "--format", "html")
    assert "pruned at rung 1 (epoch 2): val_acc 45.00% &lt; cut 60.00%" in page
    assert page.count('<tr class="best">') == 1 and page.count('<tr class="pruned">') == 2


def test_a_search_with_a_seed_in_its_space_groups_by_the_other_keys_as_a_sweep(tmp_path):
    folder = folder_of(tmp_path)
    search_json(folder, 4, {"train.lr": {"choice": [0.01, 0.1]}, "train.seed": {"choice": [0, 1]}})
    for number, (lr, seed, acc) in enumerate([(0.01, 0, 0.9), (0.1, 0, 0.6), (0.01, 1, 0.8), (0.1, 1, 0.7)]):
        trial(folder, number, lr, "completed", epochs(4, acc), 45, **{"train.seed": seed})
    data = report_json(tmp_path, folder)
    assert data["group_by"] == ["train.lr"] and data["best"] == {"train.lr": 0.01}
    assert [(g["train.lr"], g["n"]) for g in data["groups"]] == [(0.01, 2), (0.1, 2)]
    flat = " ".join(md(tmp_path, folder).split())
    assert "Grouped by train.lr. Cells: mean ± std" in flat and "one row per trial" not in flat


def test_a_cancelled_search_reports_its_trials_at_their_latest_epoch_and_claims_no_saving(tmp_path):
    folder = folder_of(tmp_path)
    search_json(folder, 3)
    trial(folder, 0, 0.01, "cancelled", epochs(3, 0.9), 35)  # 3 of 4 epochs when it was cancelled
    trial(folder, 1, 0.05, "cancelled", epochs(1, 0.8), 15)
    trial(folder, 2, 0.1, "cancelled", [], 2)  # cancelled before its first epoch
    text = md(tmp_path, folder)
    flat = " ".join(text.split())
    assert "saved by pruning" not in flat and "0% saved" not in flat
    assert f"search {SID}: " in flat and "no trial pruned" in flat
    assert "3 trial(s) not ended by the search (cancelled, running) counted as far as they ran" in flat
    assert outcomes(text) == ["cancelled at epoch 3 of 4", "cancelled at epoch 1 of 4", "cancelled"]
    data = report_json(tmp_path, folder)
    assert [g["val_acc_pct_mean"] for g in data["groups"]] == [67.5, 20.0, None]  # at their latest epoch
    assert data["best"] is None and data["search_hours"]["not_ended"] == 3
    assert "No trial completed with a value, so none is best." in flat


def test_trials_that_tie_are_a_tie_not_a_winner(tmp_path):
    folder = folder_of(tmp_path)
    search_json(folder, 3)
    trial(folder, 0, 0.01, "completed", epochs(4, 0.9), 45)
    trial(folder, 1, 0.02, "completed", epochs(4, 0.9), 45)
    trial(folder, 2, 0.05, "completed", epochs(4, 0.7), 45)
    text = md(tmp_path, folder)
    flat = " ".join(text.split())
    assert "leads" not in flat and "by 0.00%" not in flat
    assert "Trials 000 and 001 tie for best: val_acc 90.00% each; all of them are marked." in flat
    assert marks(text) == [("*", "000"), ("*", "001"), ("", "002")]
    note = report_json(tmp_path, folder)["experiments"][0]["best_note"]
    assert note.startswith("Trials 000 and 001 tie for best")
    page = md(tmp_path, folder, "--format", "html")
    assert page.count('<tr class="best">') == 2


def test_groups_of_a_sweep_that_tie_are_said_to_tie(tmp_path):
    root = tmp_path / "results"
    for i, (lr, acc) in enumerate([(0.1, 0.8), (0.05, 0.8)]):
        write_run(root, f"20261122-000132-ae38-{i:03d}", {"train.lr": lr}, epochs(4, acc))
    flat = " ".join(md(tmp_path, root / "exp").split())
    assert "ties with the next group: their means are the same as written" in flat and "leads" not in flat


def test_status_of_a_search_names_a_pending_trial_and_rounds_the_best_ones_values(tmp_path):
    folder = folder_of(tmp_path)
    search_json(folder, 3, {"train.lr": {"log_uniform": [1e-4, 0.3]}})
    trial(folder, 0, 0.009323258432555135, "completed", epochs(4, 0.9), 45)
    pruned(folder, 1, 0.0002, 1, 0.8, 0.5, 0)
    waiting = trial(folder, 2, 0.05, "pending", [], 0)  # its supervisor (this process) alive: it stays pending
    info = json.loads((waiting / "run.json").read_text())
    info.update(executor="local", launcher=procs.current().to_dict(), started_at=None, finished_at=None, sessions=[])
    (waiting / "run.json").write_text(json.dumps(info))
    done = cli(tmp_path, "status", str(folder))
    assert done.returncode == 0, done.stderr
    head, best = done.stdout.splitlines()[:2]
    assert f"search {SID}: 3 of 3 trial(s) taken (1 completed, 1 pruned, 1 pending); random" in head
    assert best == f"best so far: {SID}-000 val_acc 90.00% (train.lr=0.00932326)"
