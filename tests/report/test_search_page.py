"""The HTML page of a search (docs/design.md, "Search"), through ``clusterjob report``: its
optimization history (each trial's value in the order of the trials, the best so far as
a line), the metric against each key with points that do not hide each other and a
y-axis that fits the completed trials, pruned trials' curves dashed and ending at their
rung, no series in the colour the tables mark failures with; laid out by headless
Chromium at 1400 and 420 px as the report's screen test does."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from test_report_screens import FONT_PX, chromium, measure
from test_search_report import epochs, trial
from test_search_trials import folder_of, md, pruned, search_json

from clusterjob.report import plots

needs_plots = pytest.mark.skipif(not plots.available(), reason="the plots need matplotlib")
FAILURE_COLOURS = ("#d62728", "#b31d28", "#d73a49")  # matplotlib's red, the tables' failed badge and tint
OPTIMIZER = "train.optimizer"


def search_page(root: Path) -> str:
    """The page of 8 trials over lr (log) and an optimizer (sgd, adamw): 3 completed
    (85-90 %), 3 pruned far below them, one cancelled, one failed."""
    folder = folder_of(root)
    search_json(folder, 8, {"train.lr": {"log_uniform": [1e-4, 0.3]}, OPTIMIZER: {"choice": ["sgd", "adamw"]}})
    trial(folder, 0, 0.01, "completed", epochs(4, 0.9), 45, **{OPTIMIZER: "sgd"})
    pruned(folder, 1, 0.0002, 1, 0.8, 0.5, 0, **{OPTIMIZER: "sgd"})
    pruned(folder, 2, 0.2, 2, 0.9, 0.6, 1, **{OPTIMIZER: "adamw"})
    trial(folder, 3, 0.05, "completed", epochs(4, 0.85), 45, **{OPTIMIZER: "sgd"})
    trial(folder, 4, 0.02, "completed", epochs(4, 0.88), 45, **{OPTIMIZER: "adamw"})
    pruned(folder, 5, 0.0003, 1, 0.4, 0.5, 0, **{OPTIMIZER: "sgd"})
    trial(folder, 6, 0.03, "cancelled", epochs(2, 0.8), 25, **{OPTIMIZER: "adamw"})
    trial(folder, 7, 0.001, "failed", epochs(1, 0.3), 5, **{OPTIMIZER: "sgd"})
    return md(root, folder, "--format", "html")


def images(page: str) -> dict:
    """{data-key, data-plot or data-metric name: its SVG text} of the page's panels."""
    found = re.findall(r'data-(?:key|plot|metric)="([^"]+)" src="data:image/svg\+xml;base64,([^"]+)"', page)
    return {name: base64.b64decode(data).decode() for name, data in found}


def points(svg: str) -> list:
    """(x, y) of each trial's point (the half transparent markers, the legend's left out) of a
    search panel."""
    drawn = svg.split('<g id="legend_1">')[0]
    filled = re.findall(r'<use [^>]*x="([-\d.]+)" y="([-\d.]+)" style="[^"]*stroke-opacity: 0\.6', drawn)
    hollow = re.findall(r'<path d="M ([-\d.]+) ([-\d.]+) [^"]*" style="fill: none; stroke: #7f7f7f; stroke-opacity: 0\.6',
                        drawn)  # the pruned trials' circles and triangles (their outline: x is the centre's)
    return [(float(x), float(y)) for x, y in filled + hollow]


def y_ticks(svg: str) -> list:
    return [float(v) for v in re.findall(r'text-anchor: end"[^>]*>(-?[\d.]+)</text>', svg)]


@needs_plots
def test_the_history_and_the_keys_show_every_trial_on_an_axis_that_fits_the_completed_ones(tmp_path):
    page = search_page(tmp_path)
    assert page.index("Optimization history") < page.index("Metric against each searched key")
    svgs = images(page)
    assert [name for name in svgs if name in ("history", "train.lr", OPTIMIZER)] == ["history", "train.lr", OPTIMIZER]
    history = svgs["history"]
    assert "best so far" in history and "trial (in the order taken)" in history
    assert "completed" in history and "pruned (at its rung)" in history and "val_acc (%)" in history
    for name in ("history", "train.lr", OPTIMIZER):
        assert len(points(svgs[name])) == 8  # every trial with a value is drawn, half transparent
        ticks = y_ticks(svgs[name])
        assert ticks and 84 <= min(ticks) and max(ticks) <= 91  # the completed trials' 85-90 %, not 0-100
    # trials of one optimizer spread sideways around its tick: no two at one spot
    spread = points(svgs[OPTIMIZER])
    assert len({x for x, _ in spread}) == 8
    xs = sorted(x for x, _ in points(history))  # the history: one x per trial number, in order
    assert len(set(xs)) == 8 and all(b - a == pytest.approx(xs[1] - xs[0], rel=1e-3) for a, b in zip(xs, xs[1:]))


@needs_plots
def test_pruned_trials_are_dashed_in_their_own_colour_and_no_series_is_drawn_in_the_failure_red(tmp_path):
    page = search_page(tmp_path)
    pruned_colours = re.findall(r'<span class="swatch pruned" style="border-color: (#[0-9a-f]{6})">', page)
    assert len(pruned_colours) == 3 and not set(pruned_colours) & set(FAILURE_COLOURS)
    curves = images(page)["val_acc"]
    for colour in pruned_colours:  # dashed, ending at the rung: its last point is its last epoch
        assert re.search(r'stroke-dasharray[^"]*stroke: ' + colour + r'|stroke: ' + colour + r'[^"]*stroke-dasharray',
                         curves), colour
    assert page.count("(pruned at rung 0)") == 2 and "(pruned at rung 1)" in page and "(cancelled)" in page
    for svg in images(page).values():
        assert not any(colour in svg.lower() for colour in FAILURE_COLOURS)
    swatches = re.findall(r'class="swatch[^"]*" style="border-color: (#[0-9a-f]{6})"', page)
    assert swatches and not set(swatches) & set(FAILURE_COLOURS)
    assert not set(plots.COLORS) & set(FAILURE_COLOURS)


@needs_plots
@pytest.mark.parametrize("width", [1400, 420])
def test_a_search_page_reads_on_a_wide_and_a_narrow_screen(tmp_path, width):
    browser = chromium()
    page = search_page(tmp_path)
    facts = measure(browser, page, tmp_path, width)
    assert facts["viewport"] == width and facts["page"] <= width  # never scrolls sideways
    assert all(hidden <= 1 for hidden in facts["tables"]) and max(facts["cells"]) <= width
    panels = facts["panels"]
    assert len(panels) == 2 + 1 + 2  # the curves, the history, one per key
    assert all(p["right"] <= width for p in panels)
    assert min(FONT_PX * p["width"] / p["natural"] for p in panels) >= 10  # readable text
    tops = [round(p["top"]) for p in panels[2:]]
    if width == 1400:
        assert tops[1] == tops[2]  # the keys' panels side by side on a wide screen
    else:
        assert tops == sorted(set(tops))  # stacked on a narrow one
