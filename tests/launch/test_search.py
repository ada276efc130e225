"""A search (docs/design.md, "Search"), through the real command line: hostile ``search:``
values refused in one line with exit 2 before anything exists; a local ASHA search of the
built-in trainer (synthetic data, the mlp, lr decides the quality) and of an unmodified
script whose metric comes from a regex: trials pruned, the best trial's lr in the good
range, no trial run twice, every trial folder complete, status and the report truthful;
cancel and resume of a search as a whole; a tpe search (Optuna's study, its journal read
by Optuna) and its resume, and tpe refused where Python cannot import Optuna."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, base_env, cli, start
from slurmcluster import wait_for
from trainutil import TINY, merge

GOOD_LR = (1e-3, 0.1)  # the mlp on the synthetic data learns in 4 epochs of 16 steps within this range
SEARCH = {"trials": 12, "parallel": 2, "seed": 0, "space": {"train.lr": {"log_uniform": [1.0e-5, 0.5]}},
          "prune": {"method": "asha", "min_epochs": 1, "reduction": 2}}


def write(folder: Path, search: dict, **extra) -> Path:
    spec = merge(TINY, {"name": "s", "output": {"root": str(folder / "results")},
                        "train": {"epochs": 4, "log_every": 8}, **extra})
    spec["search"] = search
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def search_folder(folder: Path) -> Path:
    (found,) = (folder / "results" / "s").iterdir()
    return found


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def trials(found: Path) -> list:
    return sorted(p for p in found.iterdir() if p.is_dir() and not p.name.startswith("."))  # its trials


# ----------------------------------------------------------------------------- hostile values

HOSTILE = [
    ({"space": {"train.lr": {"uniform": [0.5, 0.1]}}}, "search.space.train.lr.uniform: [0.5, 0.1] is an empty range"),
    ({"space": {"train.lr": {"log_uniform": [0, 0.1]}}}, "search.space.train.lr.log_uniform: [0, 0.1]: a log range "
                                                         "must be positive"),
    ({"space": {"train.lr": {"gauss": [0, 1]}}}, "search.space.train.lr: 'gauss' is no distribution"),
    ({"space": {"train.lr": {"uniform": [0.1]}}}, "search.space.train.lr.uniform: [0.1] has 1 value(s)"),
    ({"space": {"train.lr": {"uniform": [0.1, float("nan")]}}}, "must be a finite number"),
    ({"space": {"train.lr": {"choice": []}}}, "search.space.train.lr.choice: [] gives nothing to choose from"),
    ({"space": {"train.batch_size": {"uniform": [8, 64]}}}, "use int_uniform for a whole-number key"),
    ({"space": {"train.nosuch": {"uniform": [0, 1]}}}, "search.space.train.nosuch: 'train.nosuch' is not a spec key"),
    ({"space": {"resources.nodes": {"int_uniform": [1, 2]}}}, "per submission, not per trial"),
    ({"space": {}}, "search.space: is empty"),
    ({"trials": 0}, "search.trials"),
    ({"trials": 20000}, "search.trials: 20000 is more than 10000"),
    ({"parallel": 13}, "search.parallel: 13 slots for 12 trial(s)"),
    ({"method": "grid"}, "search.method"),
    ({"metric": "$(rm -rf ~)"}, "search.metric: '$(rm -rf ~)' is not a metric name"),
    ({"metric": "accuracy"}, "search.metric: 'accuracy' is not logged by the built-in trainer"),
    ({"prune": {"method": "asha", "min_epochs": 4, "reduction": 2}}, "search.prune.min_epochs: 4 is not below "
                                                                     "train.epochs (4)"),
    ({"prune": {"method": "asha", "min_epochs": 1, "reduction": 1}}, "search.prune.reduction"),
    ({"method": "tpe"}, "search.method: tpe needs Optuna"),
]


def without_optuna(folder: Path) -> dict:
    """An environment whose Python cannot import Optuna, installed or not: first on its
    PYTHONPATH, a package of that name whose import fails."""
    package = folder / "hidden" / "optuna"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'optuna' (hidden by the test)\")\n")
    return {**base_env(), "PYTHONPATH": str(folder / "hidden")}


@pytest.mark.parametrize("change,said", HOSTILE, ids=[said[:40] for _, said in HOSTILE])
def test_hostile_search_values_are_one_line_and_exit_2(tmp_path, change, said):
    """Each through validate (in this process; tpe in a process whose Python cannot
    import Optuna): one line naming the field and the value."""
    env = without_optuna(tmp_path) if change.get("method") == "tpe" else None
    write(tmp_path, {**SEARCH, **change})
    done = cli(tmp_path, "validate", "s.yaml", env=env)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line, line


def test_a_hostile_search_submits_nothing(tmp_path):
    """submit (a real process) refuses before any folder or process exists; a sweep beside
    a search too."""
    write(tmp_path, {**SEARCH, "space": {"train.lr": {"log_uniform": [-1, 0.1]}}})
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local")
    assert done.returncode == 2 and "a log range must be positive" in done.stderr
    write(tmp_path, SEARCH, sweep={"train.seed": [0, 1]})
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local")
    assert done.returncode == 2 and "search: a spec has a sweep or a search, not both" in done.stderr
    write(tmp_path, {**SEARCH, "method": "tpe"})
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", env=without_optuna(tmp_path))
    assert done.returncode == 2 and "search.method: tpe needs Optuna, which this Python cannot import" in done.stderr
    assert "hidden by the test" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "results").exists()


# ----------------------------------------------------------------------------- local ASHA


def check_search(found: Path, metric: str, count: int = 12) -> list:
    """What every finished search holds: each trial once in the study, every folder
    complete, pruned trials pruned at a rung by a recorded verdict; the trials' records."""
    study = lines(found / "study.jsonl")
    news = [entry["trial"] for entry in study if entry["op"] == "new"]
    ends = [entry["trial"] for entry in study if entry["op"] == "end"]
    assert sorted(news) == sorted(set(news)) == list(range(count))  # no trial taken twice
    assert sorted(ends) == list(range(count))  # each told once
    verdicts = lines(found / "rungs.jsonl")
    records = []
    for number, run in enumerate(trials(found)):
        record = info(run)
        records.append(record)
        assert run.name.endswith(f"-{number:03d}")
        assert {"run.json", "spec.yaml", "metrics.jsonl", "logs"} <= {p.name for p in run.iterdir()}
        assert record["search"]["trial"] == number and record["status"] in ("completed", "pruned")
        assert len(record["sessions"]) == 1  # started once, never again
        lr = record["params"].get("train.lr", record["params"].get("params.lr"))
        assert yaml.safe_load((run / "spec.yaml").read_text())["params" if "params.lr" in record["params"]
                                                                else "train"]["lr"] == pytest.approx(lr)
        mine = [v for v in verdicts if v["trial"] == number]
        if record["status"] == "pruned":
            assert record["pruned"]["go"] is False and not mine[-1]["go"]
            assert record["pruned"]["value"] == pytest.approx(mine[-1]["value"])
            assert record["pruned"]["value"] < record["pruned"]["cut"]  # max mode: below the cut
        else:
            assert all(v["go"] for v in mine) and metric in record["final"]
    return records


def check_outcome(tmp_path: Path, found: Path, records: list, metric: str, best_lr_key: str) -> None:
    pruned = [r for r in records if r["status"] == "pruned"]
    assert len(pruned) >= 4  # at least a third of 12
    completed = [r for r in records if r["status"] == "completed"]
    best = max(completed, key=lambda r: r["final"][metric])
    assert GOOD_LR[0] <= best["params"][best_lr_key] <= GOOD_LR[1]
    status = cli(tmp_path, "status", str(found))
    assert status.returncode == 0
    head = status.stdout.splitlines()[0]
    assert f"12 of 12 trial(s) taken ({len(completed)} completed, {len(pruned)} pruned)" in head
    assert f"best so far: {best['run_id']} {metric}" in status.stdout
    assert sum(" pruned " in line for line in status.stdout.splitlines()) == len(pruned)
    report = cli(tmp_path, "report", str(found))
    assert report.returncode == 0 and f"12 runs: {len(completed)} completed, {len(pruned)} pruned" in report.stdout
    hours = json.loads(cli(tmp_path, "report", str(found), "--format", "json").stdout)["search_hours"]
    assert hours["source"] == "run time" and hours["unit"] == "CPU-hours" and hours["trials"] == 12
    assert hours["pruned"] == len(pruned) and hours["hours_if_run_to_end"] > hours["hours_spent"] > 0
    assert f"search {found.name}: " in report.stdout and "saved by pruning" in " ".join(report.stdout.split())
    marked = [line for line in report.stdout.splitlines() if "pruned at rung" in line]
    assert sorted(int(line.split("pruned at rung ")[1].split()[0].strip("|")) for line in marked) == \
        sorted(r["pruned"]["rung"] for r in pruned)  # each pruned trial's group says its rung


@pytest.mark.slow
def test_local_asha_search_of_the_trainer(tmp_path):
    write(tmp_path, SEARCH)
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    found = search_folder(tmp_path)
    records = check_search(found, "val_acc")
    check_outcome(tmp_path, found, records, "val_acc", "train.lr")
    for record in records:  # a pruned trial stopped at the rung that pruned it
        epochs = [json.loads(line)["epoch"] for line in (found / record["run_id"] / "metrics.jsonl").read_text()
                  .splitlines() if "val_acc" in line]
        if record["status"] == "pruned":
            assert epochs[-1] == record["pruned"]["at"] < 4
        else:
            assert epochs[-1] == 4


OWN_SCRIPT = """\
import argparse, math, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
lr = parser.parse_args().lr
# quality peaks at lr 0.01 (log scale); the score climbs with the steps
for step in range(1, 9):
    score = step / 8 * math.exp(-(math.log10(lr) + 2) ** 2)
    print(f"step {step} score={score:.6f}", flush=True)
    time.sleep(0.4)  # the prune acts within a step even on a loaded machine
"""


@pytest.mark.slow
def test_local_asha_search_of_an_unmodified_script(tmp_path):
    (tmp_path / "train.py").write_text(OWN_SCRIPT)
    search = {**SEARCH, "metric": "score", "mode": "max", "space": {"params.lr": {"log_uniform": [1.0e-5, 0.5]}},
              "prune": {"method": "asha", "min_epochs": 2, "reduction": 2}}
    spec = {"name": "s", "output": {"root": str(tmp_path / "results")},
            "resources": {"cpus_per_task": 1, "gpus_per_node": 0},
            "entrypoint": {"script": "train.py", "args": ["--lr", "{params.lr}"], "stop_grace_s": 2,
                           "metrics": {"score": r"step (?P<step>\d+) score=([0-9.]+)"}},
            "search": search}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    found = search_folder(tmp_path)
    records = check_search(found, "score")
    check_outcome(tmp_path, found, records, "score", "params.lr")
    for record in records:
        if record["status"] == "pruned":  # it stopped at the rung that pruned it (a step later at most)
            steps = [json.loads(line).get("step") for line in (found / record["run_id"] / "metrics.jsonl")
                     .read_text().splitlines()]
            assert record["pruned"]["at"] <= max(steps) <= record["pruned"]["at"] + 1


@pytest.mark.slow
def test_cancel_and_resume_a_local_search(tmp_path):
    """A cancelled search takes no trial after the cancel; resume continues each stopped
    trial from its checkpoint (the same folder, the same values) and takes the rest;
    ``--set search.trials`` raises the count."""
    write(tmp_path, {**SEARCH, "trials": 4, "prune": None}, train={"epochs": 20, "log_every": 64},
          data={"limit_train": 1024})
    proc = start(tmp_path, "submit", "s.yaml", "--executor", "local")
    assert proc.wait(timeout=WAIT_S) == 0
    wait_for(lambda: (tmp_path / "results" / "s").is_dir() and any((tmp_path / "results" / "s").iterdir()), 30,
             "the search's folder")
    found = search_folder(tmp_path)
    wait_for(lambda: len(trials(found)) == 2 and all(
        (run / "checkpoints").exists() and any((run / "checkpoints").iterdir()) for run in trials(found)), 120,
        "both trials' first checkpoints")
    done = cli(tmp_path, "cancel", str(found))
    assert done.returncode == 0, done.stderr
    # a trial may complete while the other one's ranks are being stopped: it stays completed
    wait_for(lambda: all(info(run)["status"] in ("cancelled", "completed") for run in trials(found)), 60,
             "both trials cancelled (or completed first)")
    before = {run.name: (info(run)["params"], info(run)["status"]) for run in trials(found)}
    assert len(before) == 2 and "cancelled" in [status for _, status in before.values()]  # none taken after it
    done = cli(tmp_path, "resume", str(found), "--set", "search.trials=5", "--wait", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = trials(found)
    assert len(runs) == 5 and all(info(run)["status"] == "completed" for run in runs)
    for run in runs[:2]:
        params, status = before[run.name]
        assert info(run)["params"] == params
        assert len(info(run)["sessions"]) == (2 if status == "cancelled" else 1)
        assert ("resuming" in (run / "logs" / "rank0.out").read_text()) == (status == "cancelled")
    assert sorted(e["trial"] for e in lines(found / "study.jsonl") if e["op"] == "new") == list(range(5))
    assert math.isclose(yaml.safe_load((found / "spec.yaml").read_text())["search"]["trials"], 5)
    again = cli(tmp_path, "resume", str(found))
    assert again.returncode == 2 and "every one of its 5 trial(s) ended" in again.stderr
    alone = cli(tmp_path, "resume", str(runs[0]))
    assert alone.returncode == 2 and "is a trial of a search" in alone.stderr
    lower = cli(tmp_path, "resume", str(found), "--set", "search.trials=3")
    assert lower.returncode == 2 and "resume can only raise it" in lower.stderr


# ----------------------------------------------------------------------------- tpe (Optuna)

TPE = {"method": "tpe", "trials": 6, "parallel": 2, "seed": 7,
       "space": {"train.lr": {"log_uniform": [1.0e-4, 0.5]}, "train.weight_decay": {"choice": [0.0, 5.0e-4]}},
       "prune": {"method": "asha", "min_epochs": 1, "reduction": 2}}


def optuna_journal(found: Path, scratch: Path) -> list:
    """The trials of the search's study as Optuna reads them (study.jsonl, the one store,
    as an Optuna study in memory: what TPE draws from)."""
    pytest.importorskip("optuna")
    from clusterjob.search.study import optuna_study

    return optuna_study(found).get_trials()


def tpe_proposal(number: int) -> dict:
    """What Optuna's TPESampler seeded for trial ``number`` proposes first: TPE draws its
    first 10 trials at random whatever the others gave, so these are trial ``number``'s
    values whichever slot took it."""
    optuna = pytest.importorskip("optuna")
    from clusterjob.search.record import space_of, trial_seed
    from clusterjob.search.study import distributions

    sampler = optuna.samplers.TPESampler(seed=trial_seed(TPE["seed"], number))
    return optuna.create_study(sampler=sampler).ask(distributions(space_of(TPE["space"]))).params


def check_tpe(found: Path, scratch: Path, count: int) -> list:
    """Every trial of a finished tpe search run once, its values within the space, drawn
    by Optuna for its number and none twice; the study holds each trial with its
    run's end (the metric, or the rung values it was pruned by). The runs' records."""
    optuna = pytest.importorskip("optuna")
    held, runs = optuna_journal(found, scratch), trials(found)
    assert [t.number for t in held] == list(range(count)) and len(runs) == count
    assert len({tuple(sorted(t.params.items())) for t in held}) == count
    states = {"completed": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED}
    verdicts = lines(found / "rungs.jsonl")
    records = []
    for number, (trial, run) in enumerate(zip(held, runs)):
        record = info(run)
        records.append(record)
        assert run.name == f"{found.name}-{number:03d}" and record["search"]["trial"] == number
        assert len(record["sessions"]) == 1  # started once, never again
        assert record["status"] in states and trial.state == states[record["status"]]
        assert record["params"] == trial.params == pytest.approx(tpe_proposal(number))
        assert 1.0e-4 <= trial.params["train.lr"] <= 0.5 and trial.params["train.weight_decay"] in (0.0, 5.0e-4)
        assert yaml.safe_load((run / "spec.yaml").read_text())["train"]["lr"] == trial.params["train.lr"]
        assert trial.system_attrs["clusterjob_slot"] in (0, 1)
        assert trial.intermediate_values == {int(v["at"]): pytest.approx(v["value"]) for v in verdicts
                                             if v["trial"] == number} != {}  # every trial reached rung 0
        if record["status"] == "completed":
            assert trial.value == pytest.approx(record["final"]["val_acc"])
    return records


@pytest.mark.slow
def test_local_tpe_search_and_its_resume(tmp_path):
    """6 trials of 2 epochs, 2 slots, ASHA: Optuna's study holds what ran; resume with
    ``--set search.trials=8`` continues that study with trials 6 and 7 (drawn for their
    numbers, not the first trials' values again)."""
    pytest.importorskip("optuna", reason="Optuna is not installed here (scripts/setup-venv installs it)")
    write(tmp_path, TPE, train={"epochs": 2, "log_every": 8})
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = search_folder(tmp_path)
    assert (found / "study.jsonl").is_file() and not (found / "study.optuna.log").exists()
    records = check_tpe(found, tmp_path, 6)
    counts = {status: sum(r["status"] == status for r in records) for status in ("completed", "pruned")}
    status = cli(tmp_path, "status", str(found))
    assert status.returncode == 0
    assert f"6 of 6 trial(s) taken ({counts['completed']} completed, {counts['pruned']} pruned)" in status.stdout
    report = cli(tmp_path, "report", str(found), "--runs", "--format", "json")
    assert report.returncode == 0
    assert sorted(row["run_id"] for row in json.loads(report.stdout)["runs"]) == [r["run_id"] for r in records]

    done = cli(tmp_path, "resume", str(found), "--set", "search.trials=8", "--wait", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    again = check_tpe(found, tmp_path, 8)
    assert again[:6] == records  # the first six untouched
