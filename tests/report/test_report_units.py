"""What csv and json carry and what a report ranks by, through the CLI: accuracies in %
under names that say so (val_acc_pct, val_acc_pct_mean) with json's ``units``; your own
code's report ranks by the metric its spec names and shows only the columns it logged."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from clirun import cli
from test_results import sweep, write_run

OWN_SPEC = ("name: mine\nentrypoint:\n  script: train.py\n  metrics:\n    score: 'score=([0-9.]+)'\n"
            "params:\n  lr: {lr}\n")


def test_csv_and_json_give_accuracies_in_percent_under_names_that_say_so(tmp_path):
    sweep(tmp_path / "results")
    groups = list(csv.DictReader(io.StringIO(cli(tmp_path, "report", "results/exp", "--format", "csv").stdout)))
    assert [(g["train.lr"], float(g["val_acc_pct_mean"]), float(g["best_val_acc_pct_mean"])) for g in groups] == \
        [("0.1", 82.0, 83.0), ("0.05", 74.0, 75.0)]  # as the md table shows them: 82.00 %
    assert "val_acc_mean" not in groups[0] and float(groups[0]["val_loss_mean"]) == 0.6  # a loss stays as logged
    data = json.loads(cli(tmp_path, "report", "results/exp", "--format", "json", "--runs").stdout)
    assert sorted(run["val_acc_pct"] for run in data["runs"]) == [70.0, 74.0, 78.0, 80.0, 82.0, 84.0]
    assert data["metric"] == "val_acc"  # the metric's own name, as --metric takes it
    assert {c: data["units"][c] for c in ("val_acc_pct", "best_val_acc_pct", "wall_time_s", "samples_per_s")} == \
        {"val_acc_pct": "%", "best_val_acc_pct": "%", "wall_time_s": "s", "samples_per_s": "samples/s"}
    assert "val_loss" not in data["units"]


def own_runs(root: Path) -> Path:
    """Runs of your own code whose spec names score; they log val_acc too."""
    for i, (lr, score) in enumerate(((0.1, 0.3), (0.2, 0.9))):
        lines = [{"step": 10, "score": score - 0.1, "val_acc": 0.99}, {"step": 20, "score": score, "val_acc": 0.5 + i}]
        run = write_run(root, f"u{i}", {"params.lr": lr}, lines, name="mine", amp=None,
                        entrypoint={"script": "train.py", "args": [], "metrics": ["score"], "metrics_file": None})
        (run / "spec.yaml").write_text(OWN_SPEC.format(lr=lr))
    return root / "mine"


def test_own_code_ranks_by_the_metric_its_spec_names_with_only_its_columns(tmp_path):
    own_runs(tmp_path / "results")
    text = cli(tmp_path, "report", "results/mine").stdout
    assert ("sorted by mean score, highest first (mode max: the default for a name without loss or err; the "
            "metric the spec's entrypoint.metrics names)") in " ".join(text.split())
    groups = list(csv.DictReader(io.StringIO(cli(tmp_path, "report", "results/mine", "--format", "csv").stdout)))
    assert [(g["params.lr"], g["score_mean"]) for g in groups] == [("0.2", "0.9"), ("0.1", "0.3")]
    assert list(groups[0])[:4] == ["params.lr", "n", "score_mean", "score_std"]
    assert "val_loss_mean" not in groups[0]  # never logged: not the built-in trainer's columns
    runs = json.loads(cli(tmp_path, "report", "results/mine", "--runs", "--format", "json").stdout)["runs"]
    assert [(run["run_id"], run["score"]) for run in runs] == [("u0", 0.3), ("u1", 0.9)]
    assert "samples_per_s" not in runs[0] and "val_loss" not in runs[0]
    asked = json.loads(cli(tmp_path, "report", "results/mine", "--metric", "val_acc", "--format", "json").stdout)
    assert asked["metric"] == "val_acc"  # --metric still decides
    status = cli(tmp_path, "status", "results/mine").stdout.splitlines()
    assert [line.split()[3:5] for line in status[1:3]] == [["score", "0.3"], ["score", "0.9"]], status
