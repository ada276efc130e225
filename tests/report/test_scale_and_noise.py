"""The grouped table's one ``state`` column, curves scaled to the healthy groups, and a
best group that says when its lead is within the noise; read through the CLI on run
folders as the trainer leaves them."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from clirun import cli
from test_failed_runs import Page, failed_run, line, texts, ticks
from test_results import write_run

from clusterjob.report import build as report
from clusterjob.report import cells, plots

# (val_acc, val_loss, train_loss) per epoch: three healthy seeds, and a seed that peaked at
# 87.79 % and collapsed to 11.04 % (val_loss 2.306), as the lr 0.07 run of docs/report.md did.
HEALTHY = [[(0.9639, 0.1078, 1.2276), (0.972, 0.081, 0.2046), (0.9766, 0.0669, 0.0869)],
           [(0.9602, 0.0950, 1.2101), (0.981, 0.071, 0.2336), (0.9893, 0.0369, 0.1503)],
           [(0.9500, 0.1200, 1.3000), (0.968, 0.090, 0.2500), (0.9756, 0.0710, 0.0900)]]
COLLAPSED = [(0.85, 0.5, 1.5), (0.8779, 0.4, 0.6), (0.1104, 2.306, 2.3)]


def run(root: Path, run_id: str, lr: float, seed: int, epochs: list, **kw) -> Path:
    lines = [line(e + 1, *values) for e, values in enumerate(epochs)]
    return write_run(root, run_id, {"train.lr": lr, "train.seed": seed}, lines, wall_s=30, **kw)


@pytest.fixture
def collapsed(tmp_path: Path) -> Path:
    """lr 0.025: three healthy seeds; lr 0.07: two healthy, one collapsed (all completed);
    lr 0.01: two slower seeds."""
    for seed, epochs in enumerate(HEALTHY):
        run(tmp_path / "results", f"a{seed}", 0.025, seed, epochs)
        shifted = COLLAPSED if seed == 1 else [(a - 0.003, b + 0.01, c) for a, b, c in epochs]
        run(tmp_path / "results", f"b{seed}", 0.07, seed, shifted)
    for seed, epochs in enumerate(HEALTHY[:2]):
        run(tmp_path / "results", f"c{seed}", 0.01, seed, [(a - 0.02, b + 0.03, c + 0.1) for a, b, c in epochs])
    return tmp_path


def test_each_group_has_one_state_that_every_reader_goes_by(tmp_path):
    root = tmp_path / "results"
    run(root, "a", 0.1, 0, HEALTHY[0])  # complete
    run(root, "b", 0.2, 0, HEALTHY[1])  # partial: b completed, c failed
    failed_run(root, "c", {"train.lr": 0.2, "train.seed": 1}, [line(1, 0.5, 1.0, 1.0)])
    run(root, "d", 0.3, 0, HEALTHY[2][:1], status="running")  # unfinished
    failed_run(root, "e", {"train.lr": 0.4, "train.seed": 0}, [line(1, 0.5, 1.0, 1.0)])  # failed
    rep = report.build_report(root / "exp")
    groups = rep.groups
    assert groups["train.lr"].tolist() == [0.2, 0.1, 0.3, 0.4]  # completed first, then unfinished, then failed
    assert groups["state"].tolist() == ["partial", "complete", "unfinished", "failed"]
    assert cells.group_states(groups) == ["partial", "", "unfinished", "failed"]
    assert [c.cells for c in cells.group_display(rep.only) if c.header == "n"] == [["1/2", "1", "0/1", "0/1"]]
    assert [(look.failed, look.completed) for look in plots._looks(rep.only)] == \
        [(False, True), (False, True), (False, False), (True, False)]
    rep.only.groups.loc[0, "state"] = "failed"  # the readers take the state from the column, not the counts
    assert cells.group_states(rep.only.groups)[0] == "failed" and rep.best is None
    assert [c.cells for c in cells.group_display(rep.only) if c.header == "n"][0][0] == "1/2"
    page = Page(cli(tmp_path, "report", "results/exp", "--format", "html").stdout)
    assert [css for css, _ in page.rows("groups")] == ["best", "", "unfinished", "failed"]


def test_a_collapsed_run_does_not_flatten_the_healthy_curves(collapsed):
    done = cli(collapsed, "report", "results/exp", "--out", "r.html")
    assert done.returncode == 0, done.stderr
    page = Page((collapsed / "r.html").read_text())
    acc = page.panel("val_acc")
    # The healthy groups span 94-99 %: the axis is theirs, not 0-100 %.
    assert min(float(t) for t in ticks(acc, "y")) >= 90 and max(float(t) for t in ticks(acc, "y")) <= 100
    assert "68.553" in texts(acc)  # lr 0.07's mean of 97.33, 11.04 and 97.26 %, on the edge with its value
    loss = page.panel("val_loss")
    assert max(float(t) for t in ticks(loss, "y")) < 0.2  # not 0-2.3
    assert "0.8213" in texts(loss)
    markers = ET.tostring(loss, encoding="unicode")
    assert re.search(r'd="M 0 -[0-9.]+\s+L -[0-9.]+ [0-9.]+\s+L [0-9.]+ [0-9.]+\s+z', markers)  # the triangles
    assert page.legend == [["best", "train.lr=0.025 (best)"], ["", "train.lr=0.01"],
                           ["", f"train.lr=0.07 ({plots.DIVERGED_NOTE})"]]
    text = (collapsed / "r.html").read_text()
    assert plots.CLIPPED_NOTE in text.replace("&#x27;", "'")
    assert re.search(r'<div class="curvebox"><div class="panels">.*</div><ul class="curves">', text)


def test_healthy_groups_all_set_the_axes(tmp_path):
    """Slower learning rates are no divergence: every group is on the scale, nothing clipped."""
    for seed, epochs in enumerate(HEALTHY):
        run(tmp_path / "results", f"a{seed}", 0.025, seed, epochs)
        run(tmp_path / "results", f"b{seed}", 0.01, seed, [(a - 0.03, b + 0.04, c + 0.2) for a, b, c in epochs])
    page = Page(report.format_report(tmp_path / "results" / "exp", fmt="html"))
    for metric in ("val_acc", "val_loss", "train_loss"):
        drawn = page.panel(metric)
        assert not any(re.fullmatch(r"[0-9.]+", t or "") and "." in t and len(t) > 5 for t in texts(drawn))
    assert plots.CLIPPED_NOTE not in report.format_report(tmp_path / "results" / "exp", fmt="html")
    assert min(float(t) for t in ticks(page.panel("val_acc"), "y")) >= 90


def noisy(root: Path) -> Path:
    """lr 0.05: one seed survived (98.34 %); lr 0.025: 97.55 and 98.93 % (98.24 +- 0.98)."""
    run(root, "a0", 0.05, 0, [(0.9834, 0.06, 0.1)])
    failed_run(root, "a1", {"train.lr": 0.05, "train.seed": 1}, [line(1, 0.3, 9.0, 9.0)])
    run(root, "b0", 0.025, 0, [(0.9755, 0.07, 0.1)])
    run(root, "b1", 0.025, 1, [(0.9893, 0.05, 0.1)])
    return root / "exp"


def test_a_best_within_the_noise_says_so_beside_its_star(tmp_path):
    noisy(tmp_path / "results")
    md = cli(tmp_path, "report", "results/exp").stdout
    best = [row for row in md.splitlines() if row.startswith("|*")]
    assert len(best) == 1 and best[0].startswith("|*?|") and "0.05" in best[0] and "98.34" in best[0]
    said = " ".join(md.split())
    assert ("(* = best). *? = best by mean, but not clearly: it rests on 1 run and leads the next group by 0.10%, "
            "within one std (0.98%); more seeds would tell.") in said
    page = cli(tmp_path, "report", "results/exp", "--format", "html").stdout
    assert "it rests on 1 run and leads the next group by 0.10%, within one std (0.98%)" in page
    data = json.loads(cli(tmp_path, "report", "results/exp", "--format", "json").stdout)
    assert data["best"] == {"train.lr": 0.05} and "within one std" in data["experiments"][0]["best_note"]


def test_a_clear_best_has_a_plain_star(tmp_path):
    """Two seeds each and a lead of more than one std of either group: no note."""
    for lr, accs in ((0.05, (0.990, 0.992)), (0.025, (0.975, 0.977))):
        for seed, acc in enumerate(accs):
            run(tmp_path / "results", f"r{lr}-{seed}", lr, seed, [(acc, 0.06, 0.1)])
    clear = cli(tmp_path, "report", "results/exp").stdout
    assert [row[:3] for row in clear.splitlines() if row.startswith("|*")] == ["|*|"]
    assert "not clearly" not in clear
    assert json.loads(cli(tmp_path, "report", "results/exp", "--format", "json").stdout)[
        "experiments"][0]["best_note"] is None
