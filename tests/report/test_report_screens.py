"""The HTML report on a wide (1400 px) and a narrow (420 px) screen, laid out by headless
Chromium: nothing cut at the right edge, tables whole (scrolling or as cards), curve
panels side by side or stacked with text that stays readable, failures visibly marked.

Runs when Chromium is installed (scripts/test installs Debian's package); skipped
without it, unless CLUSTERJOB_REQUIRE_CHROMIUM=1 (scripts/test sets it), which turns the
skip into a failure.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_failed_runs import diverged_sweep
from test_results import write_run

from clusterjob.report import build as report
from clusterjob.report import plots

FONT_PX = 11 * 96 / 72  # the panels' 11 pt text at their natural size, in CSS px
# Measured in the page once it has loaded: the layout facts the assertions need.
MEASURE = """<script>
addEventListener("load", () => {
  const box = e => e.getBoundingClientRect();
  const shown = e => e.offsetParent !== null;
  const out = {
    viewport: innerWidth, page: document.documentElement.scrollWidth,
    meta: (document.querySelector('meta[name="viewport"]') || {}).content,
    tables: [...document.querySelectorAll(".scroll")].map(d => d.scrollWidth - d.clientWidth),
    cells: [...document.querySelectorAll("td, th")].filter(shown).map(c => box(c).right),
    panels: [...document.querySelectorAll(".panels img")].map(i => (
      {width: box(i).width, natural: i.naturalWidth, top: box(i).top, right: box(i).right})),
    errors: [...document.querySelectorAll("td.error")].map(c => ({right: box(c).right, text: c.textContent})),
    legends: [...document.querySelectorAll("ul.curves")].map(u => (
      {left: box(u).left, top: box(u).top, right: box(u).right})),
  };
  parent.postMessage(JSON.stringify(out), "*");
});
</script>"""
# The frame that holds the page at the width under test: headless Chromium's window is
# at least 500 px wide, so a narrower screen is an iframe of that width.
FRAME = """<!doctype html><html><body style="margin:0">
<iframe src="{src}" style="border:0; display:block; width:{width}px; height:{height}px"></iframe>
<script>addEventListener("message", e => {{
  const pre = document.createElement("pre"); pre.id = "measured"; pre.textContent = e.data;
  document.body.appendChild(pre); }});</script></body></html>"""
HEIGHT = 3000


def chromium() -> str:
    found = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if found:
        return found
    if os.environ.get("CLUSTERJOB_REQUIRE_CHROMIUM") == "1":
        pytest.fail("CLUSTERJOB_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)", pytrace=False)
    pytest.skip("headless Chromium is not installed (scripts/test installs Debian's chromium)")


def headless(browser: str, tmp_path: Path, page: Path, width: int, *args: str) -> str:
    """Chromium's stdout for ``page`` framed at ``width`` CSS px (device scale 1)."""
    frame = tmp_path / f"frame-{page.stem}-{width}.html"
    frame.write_text(FRAME.format(src=page.as_uri(), width=width, height=HEIGHT))
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", "--force-device-scale-factor=1",
           f"--window-size={width},{HEIGHT}", "--virtual-time-budget=5000", *args, frame.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def measure(browser: str, page: str, tmp_path: Path, width: int) -> dict:
    path = tmp_path / "measure.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = headless(browser, tmp_path, path, width, "--dump-dom")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(browser: str, page: Path, tmp_path: Path, width: int) -> tuple:
    """(width, height, share of pixels in the failure red) of a screenshot of the page."""
    shot = tmp_path / f"report-{width}.png"
    headless(browser, tmp_path, page, width, f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    size = struct.unpack(">II", data[16:24])
    try:
        from PIL import Image  # matplotlib's dependency, there with the plots extra
    except ImportError:
        return (*size, None)
    rgb = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    red = (rgb[..., 0] > 150) & (rgb[..., 1] < 60) & (rgb[..., 2] < 70)  # the failed badges, #b31d28
    return (*size, float(red.mean()))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple:
    """(folder, page): the report page of a sweep with a diverged group, and its folder."""
    tmp = tmp_path_factory.mktemp("screens")
    text = report.format_report(diverged_sweep(tmp / "results"), fmt="html")
    (tmp / "report.html").write_text(text)
    return tmp, text


@pytest.mark.parametrize("width", [1400, 420])
def test_the_report_reads_on_a_wide_and_a_narrow_screen(rendered, width):
    browser = chromium()
    tmp, text = rendered
    facts = measure(browser, text, tmp, width)
    assert facts["viewport"] == width and facts["meta"] == "width=device-width, initial-scale=1"
    assert facts["page"] <= width  # the page never scrolls sideways
    assert all(hidden <= 1 for hidden in facts["tables"])  # no table cut: it fits or reflows
    assert max(facts["cells"]) <= width  # no cell past the right edge, mid-number
    assert len(facts["errors"]) == 2 and all("DivergedError" in e["text"] and e["right"] <= width
                                             for e in facts["errors"])
    panels = facts["panels"]
    assert len(panels) == 3 and all(p["right"] <= width for p in panels)
    text_px = [FONT_PX * p["width"] / p["natural"] for p in panels]
    assert min(text_px) >= 10, text_px  # the curves' labels stay readable (they were 5 px)
    tops = [round(p["top"]) for p in panels]
    (legend,) = facts["legends"]
    assert legend["right"] <= width
    if width == 1400:
        assert tops[0] == tops[1]  # side by side on a wide screen
        assert legend["left"] >= max(p["right"] for p in panels) and legend["top"] <= tops[0] + 40  # beside them
    else:
        assert tops == sorted(set(tops))  # stacked on a narrow one
        assert legend["top"] < tops[0]  # above them, not below all of them
    shot_width, shot_height, red = screenshot(browser, tmp / "report.html", tmp, width)
    assert (shot_width, shot_height) == (width, HEIGHT)
    assert red is None or red > 0.0005, red  # the failed group and runs are marked in red


def test_the_page_says_how_to_lay_it_out_on_a_small_screen(rendered):
    _, text = rendered
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    assert "@media (max-width: 640px)" in text and 'data-label="val_loss"' in text  # the cards' labels
    sizes = set(re.findall(r'<img alt="[^"]*" width="(\d+)" height="(\d+)"', text))
    assert sizes == {(str(plots.WIDTH_PX), str(plots.HEIGHT_PX))}  # panels at their own size, not one strip


def own_runs(root: Path) -> None:
    """An experiment of your own code beside the sweep: its own keys and metrics."""
    for i, (lr, optimizer) in enumerate([(0.001, "adamw"), (0.0003, "adamw"), (0.001, "sgd-nesterov")]):
        params = {"params.lr": lr, "params.optimizer": optimizer, "params.batch_size": 256,
                  "params.warmup_steps": 500, "params.seed": i}
        lines = [{"step": 100 * s, "train_loss_smoothed": 2.0 / s, "eval_top1_accuracy": 50 + 10 * s + i}
                 for s in (1, 2, 3)]
        write_run(root, f"20261122-000132-ae38-{i:03d}", params, lines, name="finetune-own-script")


def test_a_report_of_several_experiments_fits_a_wide_screen(tmp_path):
    browser = chromium()
    results = tmp_path / "results"
    diverged_sweep(results)
    own_runs(results)
    text = report.format_report(results, fmt="html")
    assert text.count('<h2 class="experiment">') == 2
    facts = measure(browser, text, tmp_path, 1400)
    assert facts["page"] <= 1400 and max(facts["cells"]) <= 1400
    assert len(facts["tables"]) == 4 and all(hidden <= 1 for hidden in facts["tables"])  # none scrolls sideways
    assert len(facts["legends"]) == 2
