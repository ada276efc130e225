"""The report of failed runs: what counts, what is best, what is drawn, what is said.

``diverged_sweep`` writes the runs of a quickstart sweep train.lr x train.seed whose
two lr=0.1 runs diverged in epoch 2 (one epoch logged, losses in the thousands), as the
trainer leaves them; the rendered pages are parsed for the facts.
"""

from __future__ import annotations

import base64
import io
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from clirun import cli
from test_results import write_run
from trainutil import write_spec

from clusterjob.report import build as report
from clusterjob.report import plots

SVG = "{http://www.w3.org/2000/svg}"
DIVERGED = ("DivergedError: the loss is not finite (nan or inf) in any step of epoch 2 from step 37 to 42: "
            "training diverged; lower train.lr (now 0.1, 0.2 after lr_scaling: linear)")
TRACEBACK = """Traceback (most recent call last):
  File "/x/clusterjob/trainer/train.py", line 370, in progress_line
    loss_sum, finite = meter.take_window(t, line.epoch)
                       ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/clusterjob/trainer/train.py", line 279, in take_window
    raise DivergedError(
clusterjob.trainer.train.DivergedError: """ + DIVERGED.split(": ", 1)[1]


def line(epoch: int, val_acc: float, val_loss: float, train_loss: float) -> dict:
    return {"epoch": epoch, "step": 16 * epoch, "train_loss": train_loss, "train_acc": val_acc - 0.01,
            "val_loss": val_loss, "val_acc": val_acc, "lr": 0.05, "epoch_time_s": 10.0, "samples_per_s": 400.0}


HEALTHY = {0: [line(1, 0.9639, 0.1078, 1.2276), line(2, 0.972, 0.081, 0.2046), line(3, 0.9766, 0.0669, 0.0869)],
           1: [line(1, 0.9602, 0.0950, 1.2101), line(2, 0.981, 0.071, 0.2336), line(3, 0.9893, 0.0369, 0.1503)]}
BROKEN = {0: [line(1, 0.1084, 32613.2892, 30.1)], 1: [line(1, 0.0420, 5.7856, 13.9)]}


def spec_text(lr: float, seed: int, epochs: int = 3) -> str:
    return f"name: exp\ntrain:\n  lr: {lr}\n  seed: {seed}\n  epochs: {epochs}\nentrypoint: null\n"


def failed_run(root: Path, run_id: str, params: dict, lines: list, message: str = DIVERGED, **kw) -> Path:
    error = {"rank": 0, "message": message, "traceback": TRACEBACK, "at": "2026-11-22T00:01:00+00:00"}
    run = write_run(root, run_id, params, lines, status="failed", wall_s=16, error=error, **kw)
    (run / "spec.yaml").write_text(spec_text(params.get("train.lr", 0.1), params.get("train.seed", 0)))
    return run


def diverged_sweep(root: Path) -> Path:
    """lr 0.025 (2 seeds, completed in 3 epochs) and lr 0.1 (2 seeds, diverged in epoch 2)."""
    for seed in (0, 1):
        run = write_run(root, f"r{seed}", {"train.lr": 0.025, "train.seed": seed}, HEALTHY[seed], wall_s=36 + seed)
        (run / "spec.yaml").write_text(spec_text(0.025, seed))
    for seed in (0, 1):
        failed_run(root, f"r{2 + seed}", {"train.lr": 0.1, "train.seed": seed}, BROKEN[seed])
    return root / "exp"


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return diverged_sweep(tmp_path / "results")


# ---------------------------------------------------------------- reading the page


class Page(HTMLParser):
    """The facts of a report page: its tables (rows of (class, cells)), images, legend."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict = {}
        self.images: list = []
        self.legend: list = []
        self.metas: list = []
        self._table = self._row = self._cell = self._li = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = (a.get("class", ""), [])
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = [a.get("class", ""), a.get("data-label"), ""]
            self._row[1].append(self._cell)
        elif tag == "img":
            self.images.append(a)
        elif tag == "li" and a.get("class") is not None:
            self._li = [a.get("class", ""), ""]
            self.legend.append(self._li)
        elif tag == "meta":
            self.metas.append(a)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None
        elif tag == "li":
            self._li = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[2] += data
        if self._li is not None:
            self._li[1] += data

    def rows(self, table: str) -> list:
        """[(row class, {label: text})] of the body rows; an error row is {"error": text}."""
        out = []
        for css, cells in self.tables[table][1:]:
            out.append((css, {(label or cls): text for cls, label, text in cells}))
        return out

    def panel(self, metric: str) -> ET.Element:
        (img,) = [i for i in self.images if i.get("data-metric") == metric]
        return ET.fromstring(base64.b64decode(img["src"].split(",", 1)[1]))


def ticks(svg: ET.Element, axis: str) -> list:
    """The tick labels of the x or y axis."""
    return [t.text for g in svg.iter(f"{SVG}g") if g.get("id", "").startswith(f"{axis}tick_")
            for t in g.iter(f"{SVG}text")]


def texts(svg: ET.Element) -> list:
    return [t.text for t in svg.iter(f"{SVG}text")]


def html_page(root, **kw) -> Page:
    return Page(report.format_report(root, fmt="html", **kw))


# ---------------------------------------------------------------- 1, 2, 3: failed groups


def test_a_failed_group_is_drawn_marked_and_never_best(sweep):
    rep = report.build_report(sweep)
    groups = rep.groups
    assert groups["train.lr"].tolist() == [0.025, 0.1] and rep.best == {"train.lr": 0.025}
    assert groups["completed"].tolist() == [2, 0] and groups["counted"].tolist() == [2, 0]
    assert groups["not_completed"].tolist() == ["", "2 failed"]
    page = html_page(sweep)
    rows = page.rows("groups")
    assert [css for css, _ in rows] == ["best", "failed"]
    assert rows[1][1]["not completed"] == "2 failed" and rows[1][1]["n"] == "0/2"
    assert rows[1][1]["val_loss"] == "-"  # no mean of 32613 and 5.786
    # Plot what the tables rank (val_acc, val_loss) and the train curve; the failed group
    # (colour 2, dashed) is in every panel, though it logged one epoch.
    assert [i["data-metric"] for i in page.images] == ["val_acc", "val_loss", "train_loss"]
    failed_colour = plots.COLORS[1]
    for metric in ("val_acc", "val_loss", "train_loss"):
        assert failed_colour in ET.tostring(page.panel(metric), encoding="unicode"), metric
    assert [(css, text) for css, text in page.legend] == [
        ("best", "train.lr=0.025 (best)"), ("failed", "train.lr=0.1 (failed: no run completed)")]
    # Its train_loss of 22 +- 11.5 does not flatten the healthy curve (1.2 to 0.1): the axis
    # ends near 1.3, and the failed point sits on the edge with its value.
    train = page.panel("train_loss")
    assert max(float(t) for t in ticks(train, "y")) < 1.6
    assert "22" in texts(train)


def test_each_failed_run_shows_its_error_escaped(sweep):
    failed_run(sweep.parent, "r4", {"train.lr": 0.05, "train.seed": 0}, [line(1, 0.5, 1.0, 1.0)],
               message="RuntimeError: bad <b>tag</b> & more")
    text = report.format_report(sweep, fmt="html")
    assert "DivergedError" in text and "<b>tag</b>" not in text and "bad &lt;b&gt;tag&lt;/b&gt; &amp; more" in text
    rows = Page(text).rows("runs")
    errors = [cells["error"] for _, cells in rows if "error" in cells]
    assert errors == ["RuntimeError: bad <b>tag</b> & more", DIVERGED, DIVERGED]  # by lr; parsed: the text itself
    statuses = [(css, cells["status"]) for css, cells in rows if "status" in cells]
    assert statuses == [("st-completed", "completed")] * 2 + [("st-failed noted", "failed")] * 3
    md = report.format_report(sweep, runs=True, width=100)
    assert "Errors:\n- r4 (failed): RuntimeError: bad <b>tag</b> & more\n- r2 (failed): DivergedError: the loss" in md


def test_an_error_of_several_lines_is_one_line_of_its_lines(sweep):
    failed_run(sweep.parent, "r4", {"train.lr": 0.05, "train.seed": 0}, [line(1, 0.5, 1.0, 1.0)],
               message="RuntimeError: Error downloading train.gz:\nTried https://a/train.gz\n\nTried https://b/train.gz")
    said = "RuntimeError: Error downloading train.gz: / Tried https://a/train.gz / Tried https://b/train.gz"
    md = report.format_report(sweep, runs=True, width=300)
    assert f"- r4 (failed): {said}" in md and "\\n" not in md
    errors = [cells["error"] for _, cells in Page(report.format_report(sweep, fmt="html")).rows("runs") if "error" in cells]
    assert errors[0] == said


def test_only_a_group_with_completed_runs_can_be_best(tmp_path):
    # The failed runs logged a better val_acc than the completed ones ever reached.
    for seed in (0, 1):
        failed_run(tmp_path, f"f{seed}", {"train.lr": 0.1, "train.seed": seed}, [line(1, 0.99, 0.1, 0.1)])
        write_run(tmp_path, f"c{seed}", {"train.lr": 0.05, "train.seed": seed}, [line(1, 0.9, 0.3, 0.3)])
    rep = report.build_report(tmp_path / "exp")
    assert rep.best == {"train.lr": 0.05} and rep.groups["train.lr"].tolist() == [0.05, 0.1]
    md = report.format_report(tmp_path / "exp")
    assert [r[:3] for r in md.splitlines() if r.startswith("|")][2:] == ["|*|", "| |"]

    only_failed = tmp_path / "failed"
    failed_run(only_failed, "f0", {"train.lr": 0.1, "train.seed": 0}, [line(1, 0.99, 0.1, 0.1)])
    failed_run(only_failed, "f1", {"train.lr": 0.2, "train.seed": 0}, [line(1, 0.5, 0.1, 0.1)])
    rep = report.build_report(only_failed / "exp")
    assert rep.best is None
    md = report.format_report(only_failed / "exp")
    assert "No group has a completed run, so none is best." in " ".join(md.split())
    assert not any(r.startswith("|*") for r in md.splitlines())
    assert json.loads(report.format_report(only_failed / "exp", fmt="json"))["best"] is None
    page = html_page(only_failed / "exp")
    assert [css for css, _ in page.rows("groups")] == ["failed", "failed"]
    assert all(css == "failed" for css, _ in page.legend)


# ---------------------------------------------------------------- 4: what counts, bands


def test_groups_count_their_completed_runs_only(sweep):
    rep = report.build_report(sweep, ["train.seed"])
    groups = rep.groups.set_index("train.seed").loc[[0, 1]]
    assert groups["n"].tolist() == [2, 2] and groups["completed"].tolist() == [1, 1]
    assert groups["val_acc_mean"].tolist() == pytest.approx([0.9766, 0.9893])  # not 54.15 +- 61.25
    assert groups["val_loss_mean"].tolist() == pytest.approx([0.0669, 0.0369])  # not 16309.537
    assert groups["val_acc_std"].isna().all()  # one counted run: no std
    md = report.format_report(sweep, group_by=["train.seed"], width=120)
    rows = [r for r in md.splitlines() if r.startswith("|")][2:]
    assert all("1/2" in r and "1 failed" in r for r in rows)
    assert "98.93" in rows[0] and "±" not in rows[0]
    page = html_page(sweep, group_by=["train.seed"])
    assert [css for css, _ in page.rows("groups")] == ["best", "partial"]
    assert page.legend == [["best", "train.seed=1 (best)"], ["", "train.seed=0 (1 of 2 completed)"]]


def test_a_group_without_completed_runs_counts_its_unfinished_ones_below_the_others(tmp_path):
    write_run(tmp_path, "a", {"train.lr": 0.1}, [line(1, 0.95, 0.1, 0.1)], status="running")
    failed_run(tmp_path, "b", {"train.lr": 0.1}, [line(1, 0.05, 9.0, 9.0)])
    write_run(tmp_path, "c", {"train.lr": 0.2}, [line(3, 0.6, 0.1, 0.1)])
    groups = report.build_report(tmp_path / "exp").groups
    assert groups["train.lr"].tolist() == [0.2, 0.1]  # completed first, though 95% > 60%
    assert groups["val_acc_mean"].tolist() == pytest.approx([0.6, 0.95])  # the running run, not the failed
    assert groups["not_completed"].tolist() == ["", "1 running, 1 failed"]
    assert [css for css, _ in html_page(tmp_path / "exp").rows("groups")] == ["best", "unfinished"]


def test_bands_are_clipped_to_the_metric_range():
    # val_acc 54.15 +- 61.25 %: a band to 115 %; a loss 0.2 +- 0.5 below 0.
    acc_low, acc_high = plots.band(np.array([54.15]), np.array([61.25]), plots.value_range("val_acc", np.array([])))
    assert (acc_low[0], acc_high[0]) == (0.0, 100.0)
    loss_low, loss_high = plots.band(np.array([0.2]), np.array([0.5]), plots.value_range("val_loss", np.array([0.2])))
    assert (loss_low[0], loss_high[0]) == (0.0, pytest.approx(0.7))
    assert plots.value_range("score", np.array([-1.0, 2.0])) == (-np.inf, np.inf)
    assert plots.band(np.array([1.0]), np.array([np.nan]), (0.0, np.inf)) == (1.0, 1.0)


def test_the_page_axes_stay_in_the_metric_range(tmp_path):
    write_run(tmp_path, "a", {"train.seed": 0}, HEALTHY[0])
    failed_run(tmp_path, "b", {"train.seed": 1}, BROKEN[0])
    page = html_page(tmp_path / "exp", group_by=["train.seed"])
    acc = [float(t) for t in ticks(page.panel("val_acc"), "y")]
    assert min(acc) >= 0 and max(acc) <= 100
    loss = page.panel("val_loss")
    assert min(float(t) for t in ticks(loss, "y")) >= 0 and max(float(t) for t in ticks(loss, "y")) < 1


# ---------------------------------------------------------------- 5: one failed run


def test_a_single_failed_run_draws_its_point_on_fixed_axes(tmp_path):
    failed_run(tmp_path, "only", {}, [line(1, 0.9512, 0.153, 0.4)], message="RuntimeError: debug.fail_at_epoch")
    page = html_page(tmp_path / "exp")
    assert [i["data-metric"] for i in page.images] == ["val_acc", "val_loss", "train_loss"]
    acc = page.panel("val_acc")
    assert ticks(acc, "y") == ["0", "20", "40", "60", "80", "100"]
    assert ticks(acc, "x") == ["0", "1", "2"]  # not 0.945 ... 1.050
    drawn = ET.tostring(acc, encoding="unicode")
    assert re.search(r"<(\w+:)?use [^>]*" + re.escape(plots.COLORS[0]), drawn)  # the point's marker
    assert min(float(t) for t in ticks(page.panel("val_loss"), "y")) == 0


# ---------------------------------------------------------------- 7, 8, 9: units, epochs, headers


def test_one_unit_per_quantity_in_every_table(sweep):
    page = html_page(sweep)
    groups, runs = page.rows("groups"), page.rows("runs")
    heads = [text for _, _, text in page.tables["groups"][0][1]]
    assert heads == ["train.lr", "n", "val_acc %", "best_val_acc %", "val_loss", "wall_time", "not completed"]
    assert groups[0][1]["val_acc %"] == "98.30 ± 0.90" and groups[0][1]["wall_time"] == "36.5 ± 0.7 s"
    run_rows = [cells for _, cells in runs if "run_id" in cells]
    assert [r["wall_time"] for r in run_rows] == ["36.0 s", "37.0 s", "16.0 s", "16.0 s"]  # as in Groups
    assert [r["val_acc %"] for r in run_rows] == ["97.66", "98.93", "10.84", "4.20"]
    assert [r["samples/s"] for r in run_rows] == ["400"] * 4
    md = report.format_report(sweep, width=120)
    assert "36.5 ± 0.7 s" in md and "val_acc %" in md


def test_the_epoch_column_says_which_of_the_planned_epochs(sweep):
    runs = [cells for _, cells in html_page(sweep).rows("runs") if "run_id" in cells]
    assert [r["epoch"] for r in runs] == ["3/3", "3/3", "1/3", "1/3"]
    md = report.format_report(sweep, runs=True, width=120)
    assert [r.split("|")[5].strip() for r in md.splitlines() if re.match(r"\| r\d", r)] == ["3/3", "3/3", "1/3", "1/3"]
    csv = pd.read_csv(io.StringIO(report.format_report(sweep, fmt="csv", runs=True)))
    assert csv["epochs"].tolist() == [3, 3, 1, 1] and csv["planned_epochs"].tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("width", [200, 80, 60, 40])
def test_markdown_headers_never_abbreviate_to_an_ambiguous_word(sweep, width):
    ambiguous = {"acc", "loss", "best", "time", "ep", "smp/s", "acc%"}
    for runs in (False, True):
        text = report.format_report(sweep, runs=runs, width=width)
        assert max(map(len, text.splitlines())) <= width
        heads = [c.strip() for r in text.splitlines() if r.startswith("|") for c in r.split("|")][:16]
        items = re.findall(r"(?:^ {4}|· )([a-z_/%]+) ", text, flags=re.M)  # the narrow blocks' names
        assert not ambiguous & set(heads + items), (width, heads + items)
        assert "val_loss" in text


# ---------------------------------------------------------------- through the CLI, real runs


@pytest.mark.slow
def test_real_sweep_with_a_failed_run_through_the_cli(tmp_path):
    """A sweep where one run raises at the start of epoch 2: report, report --runs, the
    html page and status all say so, and the completed run is the best."""
    spec = write_spec(tmp_path, "fx", train={"epochs": 2}, sweep={"debug.fail_at_epoch": [2, 9]})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    root = tmp_path / "results" / "fx"
    md = cli(tmp_path, "report", str(root), "--runs").stdout
    assert "2 runs: 1 completed, 1 failed" in md
    assert "(failed): RuntimeError: debug.fail_at_epoch: rank 0 fails at epoch 2 on purpose" in " ".join(md.split())
    assert re.findall(r"(failed|completed) fail_at_epoch=\d\n +epoch (\d/2)", md) == [("failed", "1/2"),
                                                                                     ("completed", "2/2")]
    grouped = cli(tmp_path, "report", str(root)).stdout
    best = [r for r in grouped.splitlines() if r.startswith("|*")]
    assert len(best) == 1 and best[0].split("|")[2].strip() == "9"  # fail_at_epoch 9: the completed run
    assert cli(tmp_path, "report", str(root), "--out", str(tmp_path / "r.html")).returncode == 0
    page = Page((tmp_path / "r.html").read_text())
    assert [css for css, _ in page.rows("groups")] == ["best", "failed"]
    errors = [cells["error"] for _, cells in page.rows("runs") if "error" in cells]
    assert errors == ["RuntimeError: debug.fail_at_epoch: rank 0 fails at epoch 2 on purpose"]
    assert [i["data-metric"] for i in page.images] == ["val_acc", "val_loss", "train_loss"]
    assert plots.COLORS[1] in ET.tostring(page.panel("val_acc"), encoding="unicode")  # the failed run's epoch
    log = "".join(p.read_text() for p in sorted(root.glob("*/logs/rank0.out")))
    assert "img/s" not in log and re.search(r"\[progress\] epoch 1/2 step 4/16 loss [0-9.]+ \d+ samples/s", log)
    assert re.search(r"epoch 1/2 train_loss [0-9.]+ train_acc \d+\.\d\d% val_loss [0-9.]+ val_acc \d+\.\d\d% "
                     r"lr [0-9.e-]+ [0-9.]+ s \d+ samples/s", log)
    status = cli(tmp_path, "status", str(root)).stdout.splitlines()
    at = next(i for i, s in enumerate(status) if "failed on rank 0" in s)
    assert re.fullmatch(r'    File ".*worker\.py", line \d+, in _debug_fail', status[at + 1])
    assert status[at + 2].startswith("      raise RuntimeError(")
    assert status[at].endswith(": failed on rank 0: RuntimeError: debug.fail_at_epoch: rank 0 fails at epoch 2 on purpose")
    assert status[at + 3:at + 4] != ["    RuntimeError: debug.fail_at_epoch: rank 0 fails at epoch 2 on purpose"]  # once
    assert not any(set(s.strip()) <= set("^~") for s in status[at + 1:at + 3])
