"""clusterjob report: grouped and per-run tables in md, csv, json and html."""

import io
import json
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from test_results import FINAL, epoch_line, sweep, write_run

from clusterjob.core.errors import BadInput
from clusterjob.report import build as report
from clusterjob.report.build import ReportOptions
from clusterjob.report.results import ResultsWarning

GROUP_CSV = ["train.lr", "n", "val_acc_pct_mean", "val_acc_pct_std", "best_val_acc_pct_mean", "best_val_acc_pct_std",
             "val_loss_mean", "val_loss_std", "wall_time_s_mean", "wall_time_s_std", "completed", "counted"]
RUNS_CSV = ["run_id", "status", "train.lr", "train.seed", "epochs", "val_acc_pct", "best_val_acc_pct",
            "val_loss", "wall_time_s", "samples_per_s", "planned_epochs", "error"]


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    return sweep(tmp_path / "results")


def args(root, **kw) -> ReportOptions:
    """What the CLI's report subcommand hands to report.main."""
    return ReportOptions(**{"dir": str(root), **kw})


def quiet(root, **kw) -> str:
    """format_report, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return report.format_report(root, **kw)


def test_grouped_values_match_hand_computed(exp):
    groups = report.build_report(exp).groups
    # lr 0.1: val_acc 0.80 0.82 0.84 -> mean 0.82, sample std 0.02; wall 100 110 120 -> 110 +- 10
    # lr 0.05: val_acc 0.70 0.74 0.78 -> mean 0.74, std 0.04; wall from epoch times: 30 +- 0
    assert groups["train.lr"].tolist() == [0.1, 0.05]  # best first
    assert groups["n"].tolist() == [3, 3]
    assert groups["val_acc_mean"].tolist() == pytest.approx([0.82, 0.74])
    assert groups["val_acc_std"].tolist() == pytest.approx([0.02, 0.04])
    assert groups["best_val_acc_mean"].tolist() == pytest.approx([0.83, 0.75])
    assert groups["best_val_acc_std"].tolist() == pytest.approx([0.02, 0.04])
    assert groups["val_loss_mean"].tolist() == pytest.approx([0.6, 1.0])
    assert groups["val_loss_std"].tolist() == pytest.approx([0.1, 0.1])
    assert groups["wall_time_s_mean"].tolist() == pytest.approx([110, 30])
    assert groups["wall_time_s_std"].tolist() == pytest.approx([10, 0])
    assert report.build_report(exp).best == {"train.lr": 0.1}


def test_markdown_table_status_line_and_best_mark(exp):
    text = quiet(exp)
    assert "6 runs: 6 completed" in text and "ddof=1" in text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[2].startswith("|*|") and "0.1" in rows[2] and "82.00 ± 2.00" in rows[2]
    assert "74.00 ± 4.00" in rows[3] and not rows[3].startswith("|*")
    assert "1.8 ± 0.2 min" in rows[2] and "30.0 ± 0.0 s" in rows[3]
    headers = [cell.strip() for cell in rows[0].split("|")[2:-1]]
    assert headers == ["lr", "n", "val_acc%", "best_acc%", "val_loss", "wall_time"]  # 80 columns: short
    assert max(map(len, text.splitlines())) <= 80
    wide = [line for line in quiet(exp, width=120).splitlines() if line.startswith("|")]
    assert [cell.strip() for cell in wide[0].split("|")[2:-1]] == \
        ["train.lr", "n", "val_acc %", "best_val_acc %", "val_loss", "wall_time"]


def test_markdown_fits_narrow_terminals(tmp_path):
    for i, (lr, opt, wd) in enumerate([(0.1, "sgd", 5e-4), (0.05, "adamw", 1e-3), (0.2, "sgd", 0.0)]):
        params = {"train.lr": lr, "train.optimizer": opt, "train.weight_decay": wd, "train.seed": 0}
        write_run(tmp_path, f"20261122-000132-ae38-{i:03d}", params, [epoch_line(1, 0.5 + i / 10)])
    for width in (80, 60):
        for runs in (False, True):
            text = quiet(tmp_path / "exp", runs=runs, width=width)
            assert max(map(len, text.splitlines())) <= width, text
    assert "Run ids: 20261122-000132-ae38-<run>." in quiet(tmp_path / "exp", runs=True)


def test_csv_columns_exact_and_values(exp):
    frame = pd.read_csv(io.StringIO(quiet(exp, fmt="csv")))
    assert list(frame.columns) == GROUP_CSV
    assert frame["val_acc_pct_mean"].tolist() == [82.0, 74.0]  # in %, as the md table shows it
    runs = pd.read_csv(io.StringIO(quiet(exp, fmt="csv", runs=True)))
    assert list(runs.columns) == RUNS_CSV
    assert runs["val_acc_pct"].tolist() == pytest.approx([100 * a for a in sorted(FINAL[0.05]) + FINAL[0.1]])
    assert runs["best_val_acc_pct"].tolist() == pytest.approx([100 * a + 1 for a in FINAL[0.05] + FINAL[0.1]])
    assert runs["status"].tolist() == ["completed"] * 6 and runs["epochs"].tolist() == [3] * 6
    assert runs["planned_epochs"].tolist() == [3] * 6 and runs["error"].isna().all()


def test_json_parses(exp):
    data = json.loads(quiet(exp, fmt="json"))
    assert data["best"] == {"train.lr": 0.1} and data["group_by"] == ["train.lr"]
    assert data["status_counts"] == {"completed": 6} and data["warnings"] == []
    assert data["groups"][0]["val_acc_pct_std"] == pytest.approx(2.0)
    assert data["units"]["val_acc_pct_mean"] == "%" and data["units"]["wall_time_s_mean"] == "s"
    assert set(data["groups"][0]) == set(GROUP_CSV)
    runs = json.loads(quiet(exp, fmt="json", runs=True))["runs"]
    assert len(runs) == 6 and set(runs[0]) == set(RUNS_CSV)


def test_html_has_tables_and_embedded_curves(exp):
    page = quiet(exp, fmt="html")
    assert page.startswith("<!doctype html>") and page.count("<table") == 2
    assert "82.00 ± 2.00" in page and 'class="best"' in page and "r5" in page
    assert "data:image/svg+xml;base64," in page and "src=\"http" not in page


def test_html_without_matplotlib_still_has_tables(exp, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    page = quiet(exp, fmt="html")
    assert "pip install 'clusterjob[plots]'" in page and page.count("<table") == 2
    assert "data:image/svg" not in page


def test_group_by_choices(exp):
    assert report.build_report(exp, ["train.seed"]).groups["n"].tolist() == [2, 2, 2]
    assert report.build_report(exp, ["lr"]).keys == ["train.lr"]  # unique suffix
    assert report.build_report(exp, ["train.lr,train.seed"]).keys == ["train.lr", "train.seed"]
    assert report.build_report(exp, ["status"]).groups["n"].tolist() == [6]
    with pytest.raises(BadInput, match=r"did you mean 'train.lr'"):
        report.build_report(exp, ["train.lrr"])


def test_no_group_keys_gives_one_group(tmp_path):
    for seed in range(2):
        write_run(tmp_path, f"s{seed}", {"train.seed": seed}, [epoch_line(1, 0.5 + seed / 10)])
    groups = report.build_report(tmp_path / "exp").groups
    assert list(groups.columns[:2]) == ["n", "val_acc_mean"] and groups["n"].tolist() == [2]
    assert groups["val_acc_mean"].tolist() == pytest.approx([0.55])


def test_damaged_runs_counted_and_warned(exp, capsys):
    metrics = exp / "r0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"epoch": 4, "val_a')
    (exp / "r4" / "run.json").unlink()
    write_run(exp.parent, "r6", {"train.lr": 0.1, "train.seed": 3}, [epoch_line(1, 0.3)], status="running")
    assert report.main(args(exp)) == 0
    out, err = capsys.readouterr()
    assert "7 runs: 5 completed, 1 running, 1 unknown; 2 damaged (see warnings)" in out
    assert err.count("warning: ") == 2 and "r0: metrics.jsonl: last line is cut off" in err
    assert "r4: run.json is missing" in err
    assert "3/4" in out  # lr 0.1: 3 of its 4 runs completed
    with pytest.warns(ResultsWarning):
        data = json.loads(report.format_report(exp, fmt="json"))
    assert data["status_counts"] == {"completed": 5, "running": 1, "unknown": 1} and len(data["warnings"]) == 2


def test_several_names_are_sections_never_compared(tmp_path):
    sweep(tmp_path)
    write_run(tmp_path, "z", {"train.lr": 0.1}, [epoch_line(1, 0.9)], name="other")
    rep = report.build_report(tmp_path)
    assert [e.name for e in rep.experiments] == ["exp", "other"]
    assert [e.keys for e in rep.experiments] == [["train.lr"], ["train.lr"]]
    assert [e.best for e in rep.experiments] == [{"train.lr": 0.1}, {"train.lr": 0.1}]  # each its own best
    assert rep.experiments[0].groups["n"].tolist() == [3, 3]  # the other name's run is in no group of exp
    assert pd.read_csv(io.StringIO(report.render(rep, "csv", runs=True))).columns[0] == "name"


def test_main_out_infers_format_and_rejects_bad_input(exp, tmp_path, capsys):
    out = tmp_path / "report.csv"
    assert report.main(args(exp, out=str(out))) == 0
    assert out.read_text().splitlines()[0] == ",".join(GROUP_CSV)
    assert "wrote" in capsys.readouterr().err
    with pytest.raises(BadInput, match="format"):
        report.main(args(exp, out=str(tmp_path / "report.txt")))
    with pytest.raises(BadInput, match="no such results folder"):
        report.main(args(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no runs"):
        report.main(args(tmp_path / "empty"))


def test_report_of_a_list_of_run_folders(exp):
    text = quiet([exp / "r0", exp / "r1", exp / "r3"])
    assert "3 runs: 3 completed" in text and "## exp" in text
    assert not (exp / ".clusterjob-cache.npz").exists()  # a list of runs is never cached


# ---------------------------------------------------------------- a user's own metrics

# params.lr -> final (loss, accuracy) of seeds 0 and 1: loss ranks lr 0.1 first, accuracy lr 0.01.
USER_FINAL = {0.1: [(0.30, 0.80), (0.34, 0.84)], 0.01: [(0.50, 0.90), (0.54, 0.92)]}


def user_sweep(root: Path) -> Path:
    """Runs of a user's own code: step lines with loss, and accuracy on some of them."""
    for i, (lr, seed) in enumerate((lr, seed) for lr in USER_FINAL for seed in (0, 1)):
        loss, acc = USER_FINAL[lr][seed]
        lines = [{"step": 100, "loss": 1.0}, {"step": 150, "loss": 0.9, "accuracy": 0.5},
                 {"step": 200, "loss": loss, "accuracy": acc}]
        write_run(root, f"u{i}", {"params.lr": lr, "params.seed": seed}, lines, name="mine")
    return root / "mine"


def test_default_metric_of_user_runs_is_the_first_logged(tmp_path):
    rep = report.build_report(user_sweep(tmp_path))
    assert (rep.primary.name, rep.primary.mode) == ("loss", "min")
    assert rep.keys == ["params.lr"]  # params.seed is a seed: never a group key
    groups = rep.groups
    assert list(groups.columns) == ["params.lr", "n", "loss_mean", "loss_std", "completed", "counted",
                                    "not_completed", "state"]
    assert groups["params.lr"].tolist() == [0.1, 0.01]  # lower loss first
    assert groups["loss_mean"].tolist() == pytest.approx([0.32, 0.52])
    assert groups["loss_std"].tolist() == pytest.approx([0.02 * 2 ** 0.5, 0.02 * 2 ** 0.5])
    assert rep.best == {"params.lr": 0.1}
    text = quiet(tmp_path / "mine")
    assert "sorted by mean loss, lowest first (mode min: the name says loss or err)" in " ".join(text.split())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[2].startswith("|*|") and "0.32 ± 0.02828" in rows[2]


def test_metric_and_mode_pick_the_ranking(tmp_path):
    root = user_sweep(tmp_path)
    rep = report.build_report(root, metric="accuracy")
    assert (rep.primary.mode, rep.groups["params.lr"].tolist()) == ("max", [0.01, 0.1])
    assert list(rep.groups.columns[:4]) == ["params.lr", "n", "accuracy_mean", "accuracy_std"]
    assert rep.groups["accuracy_mean"].tolist() == pytest.approx([0.91, 0.82])
    assert report.build_report(root, metric="accuracy", mode="min").groups["params.lr"].tolist() == [0.1, 0.01]
    data = json.loads(quiet(root, fmt="json", metric="loss", mode="max"))
    assert (data["metric"], data["mode"], data["best"]) == ("loss", "max", {"params.lr": 0.01})
    assert data["groups"][0]["loss_mean"] == pytest.approx(0.52)
    runs = pd.read_csv(io.StringIO(quiet(root, fmt="csv", runs=True, metric="accuracy")))
    assert list(runs.columns) == ["run_id", "status", "params.lr", "params.seed", "step", "accuracy", "error"]
    assert runs["accuracy"].tolist() == pytest.approx([0.90, 0.92, 0.80, 0.84])  # ordered by lr, seed
    assert runs["step"].tolist() == [200] * 4  # no epochs logged: the last step instead


def test_standard_runs_with_another_metric(exp):
    rep = report.build_report(exp, metric="val_loss")
    assert rep.primary.mode == "min" and rep.groups["train.lr"].tolist() == [0.1, 0.05]
    assert rep.metrics == ["val_loss", "val_acc", "best_val_acc", "wall_time_s"]
    assert report.build_report(exp, metric="best_val_acc").groups["best_val_acc_mean"].tolist() == \
        pytest.approx([0.83, 0.75])
    assert "sorted by mean val_acc, highest first (--mode max) (* = best)." in \
        " ".join(quiet(exp, metric="val_acc", mode="max").split())
    assert "sorted by mean val_acc, highest first (* = best)." in " ".join(quiet(exp).split())


def test_bad_metric_or_mode_is_bad_input_and_writes_nothing(tmp_path, capsys):
    root = user_sweep(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(BadInput, match=r"--metric: no run logged 'acc' \(did you mean 'accuracy'\?\); "
                                       r"metrics these runs logged: step, loss, accuracy"):
        report.main(args(root, metric="acc"))
    with pytest.raises(BadInput, match=r"--mode: 'best' is not max or min"):
        report.main(args(root, mode="best"))
    with pytest.raises(BadInput, match=r"--metric: no run logged 'status'"):
        report.main(args(root, metric="status"))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert report.main(args(root, metric="accuracy")) == 0
    assert (root / ".clusterjob-cache.npz").is_file()  # a report that succeeded caches


def test_user_runs_curves_are_drawn_over_steps(tmp_path):
    from clusterjob.report import plots

    rep = report.build_report(user_sweep(tmp_path), metric="accuracy")
    table = plots.curve_table(rep.results, rep.runs, rep.groups, rep.keys, "accuracy")
    assert table.index.names == ["group", "step"]
    assert [name for name, _, _ in plots.panels(rep.results, "accuracy")] == ["accuracy", "loss"]
    assert table.loc[(0, 200), ("accuracy", "mean")] == pytest.approx(0.91)  # the best group is 0
    assert table.loc[(1, 100), ("loss", "mean")] == pytest.approx(1.0)
    page = quiet(tmp_path / "mine", fmt="html", metric="accuracy")
    assert "data:image/svg+xml;base64," in page and "accuracy at the last value logged." in page


def test_each_metric_is_drawn_at_its_own_steps(tmp_path):
    """A loss every step and a val loss every second, on lines of their own: both curves
    have every point they logged and no gap filled in."""
    from clusterjob.report import plots

    lines = [{"step": s, "train_loss": 1.0 / s} for s in range(1, 5)] + [{"step": 2, "val_loss": 0.7},
                                                                      {"step": 4, "val_loss": 0.6}]
    write_run(tmp_path, "u", {}, lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lines of one step at two places are no problem
        rep = report.build_report(tmp_path / "exp", metric="val_loss")
    table = plots.curve_table(rep.results, rep.runs, rep.groups, rep.keys, "val_loss")
    drawn = {name: table[(name, "mean")].dropna() for name in ("val_loss", "train_loss")}
    assert drawn["val_loss"].index.get_level_values("step").tolist() == [2, 4]
    assert drawn["val_loss"].tolist() == [0.7, 0.6]
    assert drawn["train_loss"].index.get_level_values("step").tolist() == [1, 2, 3, 4]
    assert rep.runs["val_loss"].tolist() == [0.6]
