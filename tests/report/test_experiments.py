"""What a report means, through the CLI on real runs: runs that differ by ``--set`` are
groups, never seeds; each experiment (spec name) of a results folder is a section of its
own with its own metric; ``status`` shows your code's metric the report ranks by.

One results folder (``mixed``, made once) holds what a researcher's first hour leaves:
three tiny trainer runs submitted with ``--set train.lr=`` 0.025, 0.5 and 0.01, a plain
script that prints ``Accuracy is 93.50%`` (metric accuracy_pct), one that logs through
the API (epoch first, then val_acc), and one that logs no metric at all.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from clirun import REPO, base_env, cli
from owncode import Project
from test_failed_runs import Page
from test_results import epoch_line, write_run
from trainutil import write_spec

LRS = ("0.025", "0.5", "0.01")
PRINTS = "for epoch in (1, 2):\n    print(f'epoch {epoch}: Accuracy is {91.5 + epoch:.2f}%', flush=True)\n"
LOGS = ("import clusterjob\nfor epoch in (1, 2, 3):\n"
        "    clusterjob.log(step=63 * epoch, epoch=epoch, train_loss=1.0 / epoch, val_acc=0.95 + epoch / 100)\n")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """The folder of the module docstring; returns its results/."""
    folder = tmp_path_factory.mktemp("mixed")
    spec = write_spec(folder, "t", train={"epochs": 2})
    for lr in LRS:
        done = cli(folder, "submit", str(spec), "--executor", "local", "--wait", "--set", f"train.lr={lr}")
        assert "completed" in done.stdout or "failed" in done.stdout, done.stdout + done.stderr
    for name, script, extra in (("own", PRINTS, {"metrics": {"accuracy_pct": r"Accuracy is ([0-9.]+)%"}}),
                                ("api", LOGS, {}), ("bare", "print('hello', flush=True)\n", {})):
        project = Project(folder, name)
        project.spec(script, **extra)
        done = project.submit()
        assert done.returncode == 0, done.stdout + done.stderr
    return folder / "results"


def sections(text: str) -> dict:
    """{experiment: its part of the md report} of a report with several experiments."""
    parts = re.split(r"^### (\S+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def table_rows(md: str) -> list:
    """The body rows of the (only) pipe table in ``md`` as lists of cells."""
    rows = [line for line in md.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]


@pytest.mark.slow
def test_runs_that_differ_by_set_are_groups_never_seeds(mixed):
    root = mixed.parent
    md = cli(root, "report", "results/t").stdout
    assert "Grouped by train.lr." in md and "Grouped by nothing" not in md
    rows = table_rows(md)
    assert sorted(row[1] for row in rows) == ["0.01", "0.025", "0.5"]  # one group per lr: none averaged
    assert all(row[2] in ("1", "0/1") for row in rows)
    explicit = cli(root, "report", "results/t", "--group-by", "train.lr")
    assert explicit.returncode == 0 and explicit.stdout == md
    assert cli(root, "report", "results/t", "--group-by", "lr").stdout == md  # a unique suffix
    runs = pd.read_csv(io.StringIO(cli(root, "report", "results/t", "--runs", "--format", "csv").stdout))
    assert sorted(runs["train.lr"]) == [0.01, 0.025, 0.5] and "train.seed" not in runs.columns  # no seed differs
    # Any key of the resolved spec groups, also one that is the same in every run.
    same = cli(root, "report", "results/t", "--group-by", "train.epochs", "--format", "json")
    data = json.loads(same.stdout)
    assert data["group_by"] == ["train.epochs"] and [g["train.epochs"] for g in data["groups"]] == [2]
    page = Page(cli(root, "report", "results/t", "--format", "html").stdout)
    assert page.tables["groups"][0][1][0][2] == "train.lr" and len(page.rows("groups")) == 3
    unknown = cli(root, "report", "results/t", "--group-by", "train.lrr")
    assert unknown.returncode == 2 and "did you mean 'train.lr'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_each_experiment_is_a_section_with_its_own_metric(mixed):
    root = mixed.parent
    md = cli(root, "report", "results").stdout
    assert md.startswith("## results\n\n6 runs: ")
    parts = sections(md)
    assert sorted(parts) == ["api", "bare", "own", "t"]
    assert "sorted by mean accuracy_pct" in " ".join(parts["own"].split())
    assert table_rows(parts["own"])[0][1:3] == ["1", "93.5"]  # n, accuracy_pct: shown, not "-"
    assert "sorted by mean val_acc" in " ".join(parts["api"].split()) and "98.00" in parts["api"]
    # A run of your code that logged no metric completed: no "no group has a completed run".
    bare = " ".join(parts["bare"].split())
    assert "1 run: 1 completed" in bare and "No group has a completed run" not in bare
    assert "No completed run logged val_acc, so none is best." in bare
    assert "Grouped by train.lr." in parts["t"] and "accuracy_pct" not in parts["t"]
    runs = " ".join(cli(root, "report", "results", "--runs").stdout.split())
    assert "accuracy_pct at the last value logged" in runs


@pytest.mark.slow
def test_csv_json_and_html_carry_every_experiment(mixed):
    root = mixed.parent
    groups = pd.read_csv(io.StringIO(cli(root, "report", "results", "--format", "csv").stdout))
    assert list(groups.columns[:3]) == ["name", "train.lr", "n"]
    assert groups.set_index("name").loc["own", "accuracy_pct_mean"] == pytest.approx(93.5)
    assert sorted(groups.loc[groups["name"] == "t", "train.lr"]) == [0.01, 0.025, 0.5]
    runs = pd.read_csv(io.StringIO(cli(root, "report", "results", "--format", "csv", "--runs").stdout))
    assert runs["name"].tolist().count("t") == 3 and list(runs.columns[:3]) == ["name", "run_id", "status"]
    data = json.loads(cli(root, "report", "results", "--format", "json").stdout)
    described = {e["name"]: e for e in data["experiments"]}
    assert (described["own"]["metric"], described["api"]["metric"], described["t"]["metric"]) == \
        ("accuracy_pct", "val_acc", "val_acc")
    assert described["t"]["group_by"] == ["train.lr"] and data["metric"] is None and data["best"] is None
    assert {row["name"] for row in data["groups"]} == {"own", "api", "bare", "t"}
    page = cli(root, "report", "results", "--format", "html").stdout
    own = Page(page.split('<h2 class="experiment">own</h2>')[1].split('<h2 class="experiment">')[0])
    assert [i["data-metric"] for i in own.images] == ["accuracy_pct"]
    assert own.rows("groups")[0][1]["accuracy_pct"] == "93.5"


@pytest.mark.slow
def test_status_shows_the_metric_the_report_ranks_by(mixed):
    root = mixed.parent
    lines = cli(root, "status", "results/api").stdout.splitlines()
    assert lines[1].split()[1:5] == ["completed", "189", "val_acc", "98.00%"], lines  # not "epoch 3"
    legend = " ".join(cli(root, "report", "results/api").stdout.split())
    assert "sorted by mean val_acc" in legend
    own = cli(root, "status", "results/own").stdout.splitlines()
    assert own[1].split()[3:5] == ["accuracy_pct", "93.5"], own


@pytest.mark.slow
def test_the_best_of_one_run_says_it_is_not_clear(mixed):
    md = " ".join(cli(mixed.parent, "report", "results/t").stdout.split())
    assert "|*?|" in md.replace(" ", "")  # every lr ran once: the best rests on one run
    assert "*? = best by mean, but not clearly: it rests on 1 run" in md


def test_report_help_says_how_runs_group():
    done = cli(REPO, "report", "--help")
    text = " ".join(done.stdout.split())
    assert "every key of the runs' params and every spec key whose value differs" in text
    assert "any key of the runs' resolved spec" in text and "swept" not in text


def test_an_html_report_without_matplotlib_says_so_on_stderr(tmp_path):
    write_run(tmp_path / "results", "r0", {}, [epoch_line(1, 0.5)])
    blocked = tmp_path / "blocked" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = {**base_env(), "PYTHONPATH": f"{blocked.parent}:{base_env()['PYTHONPATH']}"}
    done = cli(tmp_path, "report", "results/exp", "--out", "r.html", env=env)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert notes == ["note: the page has no learning curves: they need matplotlib (pip install 'clusterjob[plots]')"]
    assert "pip install 'clusterjob[plots]'" in (tmp_path / "r.html").read_text()
    assert not [line for line in cli(tmp_path, "report", "results/exp", "--out", "r.html").stderr.splitlines()
                if line.startswith("note:")]  # with matplotlib: no note
