"""The HTML report: one self-contained page (inline CSS, curves as embedded SVG images,
no script) with the status line, warnings, and per experiment (spec name) its grouped
table, curves and runs: one section each when the folder holds several.

It reads on any screen: a viewport meta, tables that scroll sideways inside their
box with a shadow on the side that has more, curve panels side by side on a wide
screen and stacked on a narrow one (each an SVG whose text stays readable), and
the legend as text beside them (above them on a narrow screen). Failures show: failed
and partial groups are tinted and say which runs did not complete, failed runs are
marked and carry their error line.
"""

from __future__ import annotations

import base64
import html

from clusterjob.report import loggerlinks, plots, searchplots
from clusterjob.report.cells import (
    group_display,
    group_legend,
    group_states,
    run_notes,
    runs_display,
    runs_legend,
)
from clusterjob.report.provider import RunCurves
from clusterjob.report.stats import Experiment, Report, status_line

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1340px; padding: 0 1em; color: #1d2330; }
h1 { font-size: 1.5em; margin-bottom: .2em; overflow-wrap: anywhere; } h2 { font-size: 1.15em; margin-top: 1.6em; }
h2.experiment { font-size: 1.3em; border-bottom: 2px solid #c3c9d4; overflow-wrap: anywhere; } h3 { font-size: 1.05em; }
.status { font-size: 1.05em; } .legend { color: #555; }
table { border-collapse: collapse; margin: .5em 0; font-variant-numeric: tabular-nums; }
/* A table wider than the screen scrolls inside its box; a shadow on a side says there is
   more that way (white covers scroll with the table and hide the shadow at its ends). */
.scroll { overflow-x: auto; max-width: 100%;
  background: linear-gradient(to right, #fff 30%, rgba(255,255,255,0)) left / 40px 100% no-repeat local,
    linear-gradient(to left, #fff 30%, rgba(255,255,255,0)) right / 40px 100% no-repeat local,
    radial-gradient(farthest-side at 0 50%, rgba(0,0,0,.35), rgba(0,0,0,0)) left / 16px 100% no-repeat scroll,
    radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,.35), rgba(0,0,0,0)) right / 16px 100% no-repeat scroll; }
th, td { padding: .28em .6em; border-bottom: 1px solid #dde1e8; white-space: nowrap; }
table.runs { font-size: 13px; }
th { background: rgba(29,35,48,.06); text-align: left; } td.r, th.r { text-align: right; }
tr.best td { background: rgba(46,160,67,.14); font-weight: 600; }
tr.partial td { background: rgba(240,180,40,.16); } tr.unfinished td { background: rgba(80,120,200,.10); }
tr.failed td, tr.st-failed td { background: rgba(215,58,73,.09); } tr.pruned td { color: #4a5160; }
td.state { font-weight: 600; }
tr.failed td.state, tr.st-failed td.status { background: #b31d28; color: #fff; font-weight: 700; }
tr.noted td { border-bottom: none; }
td.error { white-space: normal; font: 12px/1.4 ui-monospace, monospace; color: #8a1420; padding-top: 0; }
td.error > div { position: sticky; left: .6em; max-width: calc(100vw - 4em); overflow-wrap: anywhere; }
.warnings { background: #fff6e0; border: 1px solid #f0c36d; padding: .5em 1em; border-radius: 4px; }
.warnings li { font-family: ui-monospace, monospace; font-size: 12.5px; overflow-wrap: anywhere; }
.fold { display: none; } .fold:not(:checked) + .scroll tr.more { display: none; }
label { color: #1a5fb4; cursor: pointer; text-decoration: underline; font-size: 13px; }
.fold:checked ~ label .more-label, .fold:not(:checked) ~ label .less-label { display: none; }
/* The legend beside the panels on a wide screen, above them on a narrow one. */
.curvebox { display: flex; gap: .5em 1.2em; align-items: flex-start; }
.curvebox .panels { flex: 1 1 auto; min-width: 0; }
.panels { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(440px, 100%), 1fr)); gap: .5em 1.2em; }
.panels figure { margin: 0; } .panels img { width: 100%; max-width: 600px; height: auto; display: block; }
.panels.keys { grid-template-columns: repeat(auto-fill, minmax(min(340px, 100%), 1fr)); }
ul.curves { list-style: none; padding: 0; margin: .5em 0; flex: 0 0 15em; display: flex; flex-direction: column;
            gap: .4em; overflow-wrap: anywhere; }
@media (max-width: 900px) { .curvebox { flex-direction: column-reverse; } ul.curves { flex: none; } }
ul.curves li { display: flex; align-items: center; gap: .45em; }
.swatch { display: inline-block; width: 2em; border-top: 3px solid; }
.swatch.failed, .swatch.pruned { border-top-style: dashed; }
li.best { font-weight: 600; } li.best .swatch { border-top-width: 5px; }
.note { background: #eef3fb; padding: .6em 1em; border-radius: 4px; }
/* A narrow screen: each row becomes a card of "header value" lines. */
@media (max-width: 640px) {
  .scroll table, .scroll tbody, .scroll tr, .scroll td { display: block; }
  .scroll thead { display: none; } .scroll tr { border-bottom: 2px solid #c3c9d4; padding: .25em 0; }
  .scroll tr.noted { border-bottom: none; padding-bottom: 0; }
  .scroll td { display: flex; justify-content: space-between; gap: 1em; border: none; padding: .1em .6em;
               white-space: normal; text-align: right; overflow-wrap: anywhere; }
  .scroll td[data-label]::before { content: attr(data-label); font-weight: 600; color: #555; text-align: left;
                                   flex: none; }
  .scroll tr.failed td.state::before, .scroll tr.st-failed td.status::before { color: #fff; }
  .scroll td:empty, .scroll td.error::before { display: none; } .scroll td.error { display: block; text-align: left; }
}
"""


SEARCH_PLOTS = "Metric against each searched key"
HISTORY_PLOT = "Optimization history"
NO_CURVES = "the page has no learning curves: they need matplotlib (pip install 'clusterjob[plots]')"


def _cell(tag: str, text: str, column) -> str:
    """One cell, escaped, with its column's classes (and its header, for the cards)."""
    classes = " ".join(c for c in ("r" if column.right else "", column.css) if c)
    label = f' data-label="{html.escape(column.header, quote=True)}"' if tag == "td" and column.header else ""
    return f'<{tag} class="{classes}"{label}>{html.escape(text)}</{tag}>'


def _rows(columns: list, row_classes: list, notes: list, show: int) -> list:
    """The body's rows; a row with a note (an error line) is followed by a row holding it."""
    body = []
    for i, cells in enumerate(zip(*[c.cells for c in columns])):
        tds = "".join(_cell("td", v, c) for v, c in zip(cells, columns))
        classes = f"{row_classes[i]} {'more' if show and i >= show else ''}".strip()
        if not notes or not notes[i]:
            body.append(f'<tr class="{classes}">{tds}</tr>')
            continue
        body.append(f'<tr class="{classes} noted">{tds}</tr><tr class="{classes}"><td class="error" '
                    f'colspan="{len(columns)}"><div>{html.escape(notes[i])}</div></td></tr>')
    return body


def _table(columns: list, row_classes: list, css: str = "", show: int = 0, notes: tuple = (), fold: str = "") -> str:
    """A display table as HTML (cells escaped), scrolling sideways when too wide; a
    row's ``notes`` entry (an error) goes in a full-width row under it.

    With ``show``, rows past the first ``show`` stay folded behind a "show all"
    toggle (a checkbox and CSS: the page has no script), so the curves below a
    100-group table are still in sight.
    """
    head = "".join(_cell("th", c.header, c) for c in columns)
    body = _rows(columns, row_classes, list(notes), show)
    table = (f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(body)}</tbody></table></div>')
    count = len(row_classes)
    if not show or count <= show:
        return table
    toggle = f"fold-{css or 'table'}{fold}"
    label = (f'<label for="{toggle}"><span class="more-label">show all {count} rows</span>'
             f'<span class="less-label">show the first {show} rows</span></label>')
    return f'<input type="checkbox" class="fold" id="{toggle}">{table}{label}'


def _group_rows(experiment: Experiment) -> list:
    """Row classes of the grouped table: best, partial, unfinished, failed; a search's
    trials that tie for best are all best, its pruned trials "pruned"."""
    states = group_states(experiment.groups)
    if experiment.trials:
        pruned = experiment.groups["not_completed"].astype(str).str.contains("pruned").to_numpy()
        states = ["pruned" if cut else state for cut, state in zip(pruned, states)]
    best = {0, *experiment.tied} if experiment.best is not None else set()
    return ["best" if i in best else state for i, state in enumerate(states)]


def _panel(metric: str, title: str, svg: bytes, x: str) -> str:
    """One curve panel: an SVG image with a text alternative."""
    data = base64.b64encode(svg).decode("ascii")
    alt = html.escape(f"{title} per {x}: mean per group, a band of one std", quote=True)
    size = f'width="{plots.WIDTH_PX}" height="{plots.HEIGHT_PX}"'
    return (f'<figure><img alt="{alt}" {size} data-metric="{html.escape(metric, quote=True)}" '
            f'src="data:image/svg+xml;base64,{data}"></figure>')


def _legend_item(look) -> str:
    """A group's colour, line and name; failed groups say so."""
    classes = " ".join(c for c in ("best" if look.best else "", "failed" if look.failed else "") if c)
    tail = f" ({look.note})" if look.note else ""
    dashed = " failed" if look.failed else " pruned" if look.pruned else ""
    return (f'<li class="{classes}"><span class="swatch{dashed}" '
            f'style="border-color: {look.color}"></span>{html.escape(look.label + tail)}</li>')


def _curves(experiment: Experiment) -> str:
    """Learning curves as embedded SVG panels with their legend beside, or why there are none."""
    curves = plots.draw(experiment)
    if curves is None:
        return ('<p class="note">Learning curves need matplotlib: '
                "<code>pip install 'clusterjob[plots]'</code></p>")
    if not curves.panels:
        return '<p class="note">No epochs or steps logged yet: no curves to draw.</p>'
    x = plots.x_axis(experiment.results) or "epoch"
    figures = "".join(_panel(metric, title, svg, x) for metric, title, svg in curves.panels)
    legend = "".join(_legend_item(look) for look in curves.looks)
    note = f'<p class="legend">{html.escape(curves.note)}</p>' if curves.note else ""
    return f'<div class="curvebox"><div class="panels">{figures}</div><ul class="curves">{legend}</ul></div>{note}'


def _search_plots(experiment: Experiment) -> str:
    """A search's optimization history, then its metric against each searched key, one
    small panel per key ("" for a grid sweep), or why there are none."""
    drawn = searchplots.draw(experiment)
    if drawn is None:
        return f"<h3>{SEARCH_PLOTS}</h3>" + ('<p class="note">These plots need matplotlib: '
                                             "<code>pip install 'clusterjob[plots]'</code></p>")
    if not drawn:
        return ""
    past = searchplots.history(experiment)
    said = "" if past is None else (
        f'<h3>{HISTORY_PLOT}</h3><div class="panels keys">'
        f'{_search_figure(searchplots.history_alt(experiment.primary.name), "data-plot", searchplots.HISTORY, past)}'
        "</div>")
    figures = "".join(_search_figure(searchplots.alt_text(p, experiment.primary.name), "data-key", p.key, p.svg)
                      for p in drawn)
    return f'{said}<h3>{SEARCH_PLOTS}</h3><div class="panels keys">{figures}</div>'


def _search_figure(alt: str, attribute: str, name: str, svg: bytes) -> str:
    """One of a search's panels: its SVG with a text alternative, named by ``attribute``."""
    size = f'width="{searchplots.WIDTH_PX}" height="{searchplots.HEIGHT_PX}"'
    return (f'<figure><img alt="{html.escape(alt, quote=True)}" {size} {attribute}="{html.escape(name, quote=True)}" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(svg).decode("ascii")}"></figure>')


def _run_curves(experiment: Experiment, curves: RunCurves) -> str:
    """A family's curve of each run over time (the first runs of the table)."""
    if not plots.available():
        return (f'<p class="note">The {html.escape(curves.heading)} curves need matplotlib: '
                "<code>pip install 'clusterjob[plots]'</code></p>")
    paths = [p for p in experiment.runs["path"] if p in curves.series][:plots.MAX_GPU_RUNS]
    ids = dict(zip(experiment.runs["path"], experiment.runs["run_id"]))
    figures = "".join(_panel(curves.metric, f"{ids[path]}: {curves.heading}", curves.draw(
        f"{ids[path]}: {curves.heading}", curves.series[path]), curves.x) for path in paths)
    more = len(curves.series) - len(paths)
    note = f'<p class="legend">The first {len(paths)} runs are drawn; {more} more {html.escape(curves.having)}.</p>' \
        if more else ""
    return f'<div class="curvebox"><div class="panels">{figures}</div></div>{note}'


def _warnings(report: Report) -> str:
    """The problems found, as a list (empty string when none)."""
    if not report.warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings)
    return f'<div class="warnings"><b>Warnings</b><ul>{items}</ul></div>'


def _runs_section(experiment: Experiment, fold: str) -> str:
    """The per-run table with each run's error, failed runs marked."""
    prefix = ""  # the page has room for whole run ids, and people copy them from it
    rows = [f"st-{status}" for status in experiment.runs["status"].astype(str)]
    table = _table(runs_display(experiment, prefix), rows, "runs", 25, run_notes(experiment), fold)
    return f'<p class="legend">{html.escape(runs_legend(experiment, prefix))}</p>{table}'


def _experiment(experiment: Experiment, runs: bool, heading: str, fold: str) -> str:
    """One experiment's grouped table, curves and per-run table (``runs``: that first),
    each under a ``heading`` (h2 or h3); ``fold`` tells its toggles from another's."""
    said = "".join(f'<p class="status">{html.escape(summary.line())}</p>'
                   for summary in experiment.summaries.values() if summary is not None)
    groups = _table(group_display(experiment)[1:], _group_rows(experiment), "groups", 12, (), fold)
    legend = group_legend(experiment, "best highlighted")
    sections = [
        ("Groups", f'<p class="legend">{html.escape(legend)}</p>{groups}'),
        ("Learning curves", _curves(experiment) + _search_plots(experiment)),
        ("Runs", _runs_section(experiment, fold)),
    ]
    if runs:
        sections = [sections[2], sections[0], sections[1]]
    for provider in experiment.providers:
        curves = provider.curves(experiment.runs)
        if curves is not None:
            sections.append((curves.heading, _run_curves(experiment, curves)))
    return said + "".join(f"<{heading}>{name}</{heading}>{content}" for name, content in sections)


def _sections(report: Report, runs: bool) -> str:
    """The experiments: as the page's sections when it has one, else each under its name."""
    if len(report.experiments) == 1:
        return _experiment(report.experiments[0], runs, "h2", "")
    return "".join(f'<h2 class="experiment">{html.escape(e.name)}</h2>'
                   f'<p class="status">{html.escape(status_line(e))}</p>{_experiment(e, runs, "h3", f"-{i}")}'
                   for i, e in enumerate(report.experiments))


def page(report: Report, runs: bool) -> str:
    """One self-contained page: status, then per experiment its grouped table, curves and
    per-run table, then the logger runs."""
    body = _sections(report, runs) + loggerlinks.section(report)
    heading = html.escape(f"clusterjob report: {report.title}")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{heading}</title><style>{_CSS}</style></head><body><h1>{heading}</h1>"
            f'<p class="status">{html.escape(status_line(report))}</p>{_warnings(report)}'
            f"{body}</body></html>\n")
