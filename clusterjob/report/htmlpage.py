"""The HTML report: one self-contained page (inline CSS, curves as an embedded PNG,
no script) with the status line, warnings, grouped table, curves and runs.
"""

from __future__ import annotations

import base64
import html
from typing import Optional

from clusterjob.report import loggerlinks
from clusterjob.report.cells import group_display, group_legend, runs_display
from clusterjob.report.stats import Report, status_line

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1150px; padding: 0 1em; color: #1d2330; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.status { font-size: 1.05em; } .legend { color: #555; }
table { border-collapse: collapse; margin: .5em 0; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
th, td { padding: .28em .6em; border-bottom: 1px solid #dde1e8; white-space: nowrap; }
table.runs { font-size: 13px; }
th { background: #f2f4f8; text-align: left; } td.r, th.r { text-align: right; }
tr.best td { background: #e6f4ea; font-weight: 600; }
.warnings { background: #fff6e0; border: 1px solid #f0c36d; padding: .5em 1em; border-radius: 4px; }
.warnings li { font-family: ui-monospace, monospace; font-size: 12.5px; }
.fold { display: none; } .fold:not(:checked) + .scroll tr.more { display: none; }
label { color: #1a5fb4; cursor: pointer; text-decoration: underline; font-size: 13px; }
.fold:checked ~ label .more-label, .fold:not(:checked) ~ label .less-label { display: none; }
img { max-width: 100%; } .note { background: #eef3fb; padding: .6em 1em; border-radius: 4px; }
"""


def _table(columns: list, best_row: Optional[int] = None, css: str = "", show: int = 0) -> str:
    """A display table as HTML (cells escaped), scrolling sideways when too wide.

    With ``show``, rows past the first ``show`` stay folded behind a "show all"
    toggle (a checkbox and CSS: the page has no script), so the curves below a
    100-group table are still in sight.
    """
    head = "".join(f'<th class="{"r" if c.right else ""}">{html.escape(c.header)}</th>' for c in columns)
    body = []
    for i, cells in enumerate(zip(*[c.cells for c in columns])):
        tds = "".join(f'<td class="{"r" if c.right else ""}">{html.escape(v)}</td>'
                      for v, c in zip(cells, columns))
        classes = ("best " if i == best_row else "") + ("more" if show and i >= show else "")
        body.append(f'<tr class="{classes.strip()}">{tds}</tr>')
    table = (f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(body)}</tbody></table></div>')
    if not show or len(body) <= show:
        return table
    toggle = f"fold-{css or 'table'}"
    label = (f'<label for="{toggle}"><span class="more-label">show all {len(body)} rows</span>'
             f'<span class="less-label">show the first {show} rows</span></label>')
    return f'<input type="checkbox" class="fold" id="{toggle}">{table}{label}'


def _curves(report: Report) -> str:
    """Learning curves as an embedded PNG, or how to get them."""
    from clusterjob.report import plots

    png = plots.curves_png(report.results, report.runs, report.groups, report.keys, report.primary)
    if png is None:
        return ('<p class="note">Learning curves need matplotlib: '
                "<code>pip install 'clusterjob[plots]'</code></p>")
    if not png:
        return '<p class="note">No epochs or steps logged yet: no curves to draw.</p>'
    data = base64.b64encode(png).decode("ascii")
    alt = html.escape(f"{report.primary.name} per epoch or step: mean per group with a band of one std")
    return f'<img alt="{alt}" src="data:image/png;base64,{data}">'


def _warnings(report: Report) -> str:
    """The problems found, as a list (empty string when none)."""
    if not report.warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings)
    return f'<div class="warnings"><b>Warnings</b><ul>{items}</ul></div>'


def page(report: Report, runs: bool) -> str:
    """One self-contained page: status, grouped table, curves, per-run table."""
    prefix = ""  # the page has room for whole run ids, and people copy them from it
    groups = _table(group_display(report)[1:], 0 if report.best is not None else None, "groups", 12)
    per_run = _table(runs_display(report, prefix), css="runs", show=25)
    last = ("val_acc and val_loss at the last epoch logged." if report.primary.name == "val_acc"
            else f"{report.primary.name} at the last value logged.")
    sections = [
        ("Groups", f'<p class="legend">{html.escape(group_legend(report, "best highlighted"))}</p>{groups}'),
        ("Learning curves", _curves(report)),
        ("Runs", f'<p class="legend">{html.escape(last)}</p>{per_run}'),
    ]
    if runs:
        sections = [sections[2], sections[0], sections[1]]
    body = "".join(f"<h2>{title}</h2>{content}" for title, content in sections) + loggerlinks.section(report)
    title = html.escape(f"clusterjob report: {report.title}")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body><h1>{title}</h1>"
            f'<p class="status">{html.escape(status_line(report))}</p>{_warnings(report)}'
            f"{body}</body></html>\n")
