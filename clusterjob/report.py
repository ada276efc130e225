"""``clusterjob report DIR``: which config wins, and how sure that is.

The grouped table (DESIGN section 3) has one row per group of runs, sorted by
mean val_acc with the best group marked: the group keys by their dotted names,
``n``, then ``<metric>_mean`` and ``<metric>_std`` for val_acc, best_val_acc,
val_loss and wall_time_s. The std is pandas' sample std (ddof=1), so a group
of one run has none. Every run counts, whatever its status (a running run
counts with its latest epoch); the status line above the table says how many
runs are not completed, and the markdown table shows ``n`` as
``completed/all`` for groups that hold such runs.

Formats: ``md`` (the terminal default, fitted to the terminal's width), ``csv``
(data only), ``json``, ``html`` (one self-contained page with learning curves
when matplotlib is installed).

Problems with run folders are ``ResultsWarning``s in the Python API
(``format_report``); the CLI (``main``) prints them to stderr, the md status
line counts the damaged runs and the json and html outputs list them.
"""

from __future__ import annotations

import difflib
import html
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.errors import BadInput
from clusterjob.results import STATUSES, UNKNOWN, Results, ResultsWarning, collect, runs_frame

__all__ = ["GROUP_METRICS", "RUN_METRICS", "Report", "build_report", "format_report", "render", "main"]

GROUP_METRICS = ("val_acc", "best_val_acc", "val_loss", "wall_time_s")
RUN_METRICS = ("epochs", "val_acc", "best_val_acc", "val_loss", "wall_time_s", "samples_per_s")
FORMATS = ("md", "csv", "html", "json")
# Runs-table columns that make sense as group keys besides the swept keys.
_EXTRA_KEYS = ("name", "status", "world_size", "backend", "amp", "git_sha")
_SUFFIXES = {".md": "md", ".markdown": "md", ".csv": "csv", ".html": "html", ".htm": "html", ".json": "json"}
_MAX_STDERR_WARNINGS = 20


@dataclass
class Report:
    """The tables of one report, before formatting."""

    root: Path
    results: Results
    runs: pd.DataFrame  # load_runs' table
    swept: list  # the swept keys ("name" first when the root holds several names)
    keys: list  # the group keys
    groups: pd.DataFrame  # group_table(runs, keys)

    @property
    def warnings(self) -> list:
        """Problems found in the run folders, one line each."""
        return self.results.warnings

    @property
    def best(self) -> Optional[dict]:
        """Group keys and values of the best group (None when no run has a val_acc)."""
        if self.groups.empty or pd.isna(self.groups["val_acc_mean"].iloc[0]):
            return None
        return {key: _plain(self.groups[key].iloc[0]) for key in self.keys}

    @property
    def title(self) -> str:
        """The experiment name, or the folder when it holds several."""
        names = self.runs["name"].dropna().unique()
        return str(names[0]) if len(names) == 1 else str(self.root)


# ---------------------------------------------------------------- tables


def _swept_keys(results: Results, runs: pd.DataFrame) -> list:
    """Swept keys; "name" leads when the root holds runs of several names."""
    keys = results.param_keys
    return (["name"] if runs["name"].nunique() > 1 else []) + keys


def _resolve_key(key: str, swept: list, runs: pd.DataFrame) -> str:
    """A --group-by key as a runs-table column; a unique suffix such as "lr" works."""
    allowed = list(dict.fromkeys(swept + [k for k in _EXTRA_KEYS if k in runs.columns]))
    if key in allowed:
        return key
    by_suffix = [k for k in swept if k.endswith("." + key)]
    if len(by_suffix) == 1:
        return by_suffix[0]
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise BadInput(f"--group-by: unknown key {key!r}{hint}; keys of these runs: {', '.join(allowed)}")


def group_keys(runs: pd.DataFrame, swept: list, group_by: Optional[list] = None) -> list:
    """The group keys: ``group_by`` (comma lists allowed), else every swept key but train.seed."""
    if group_by is None:
        return [key for key in swept if key != "train.seed"]
    wanted = [part.strip() for item in group_by for part in item.split(",") if part.strip()]
    return list(dict.fromkeys(_resolve_key(key, swept, runs) for key in wanted))


def group_table(runs: pd.DataFrame, keys: list) -> pd.DataFrame:
    """One row per group: keys, n, <metric>_mean/_std (ddof=1), completed; best first."""
    frame = runs.assign(_completed=runs["status"].astype(object) == "completed", _all=0)
    grouped = frame.groupby(keys or ["_all"], dropna=False, sort=False, observed=True)
    table = grouped.size().rename("n").to_frame()
    for metric in GROUP_METRICS:
        table[f"{metric}_mean"] = grouped[metric].mean()
        table[f"{metric}_std"] = grouped[metric].std(ddof=1)
    table["completed"] = grouped["_completed"].sum().astype(np.int64)
    table = table.reset_index().drop(columns=["_all"], errors="ignore")
    order = table["val_acc_mean"].sort_values(ascending=False, na_position="last", kind="stable").index
    return table.loc[order].reset_index(drop=True)


def _sorted_runs(runs: pd.DataFrame, keys: list) -> pd.DataFrame:
    """Runs ordered by their swept keys (seeds of one config together), then folder order."""
    try:
        return runs.sort_values(keys, kind="stable", na_position="last") if keys else runs
    except TypeError:  # a key mixing numbers and text cannot be ordered: keep folder order
        return runs


def build_report(root: "str | Path | Sequence", group_by: Optional[list] = None, cache: bool = True) -> Report:
    """Read the runs under ``root`` (or a list of run folders) and group them;
    BadInput for a bad DIR or key."""
    try:
        results = collect(root, cache=cache)
    except FileNotFoundError as err:
        raise BadInput(f"{err}; give results/<name>, results/ or one run folder") from None
    if not results.infos:
        raise BadInput(f"no runs under {root}: a run folder holds run.json or metrics.jsonl")
    runs = runs_frame(results)
    swept = _swept_keys(results, runs)
    keys = group_keys(runs, swept, group_by)
    return Report(results.root, results, _sorted_runs(runs, swept), swept, keys, group_table(runs, keys))


def status_counts(runs: pd.DataFrame) -> dict:
    """{status: runs}, nonzero only, completed first, then the other DESIGN states."""
    counts = runs["status"].astype(object).value_counts()
    order = ["completed", *[s for s in STATUSES if s != "completed"], UNKNOWN]
    order += sorted(set(counts.index) - set(order))
    return {status: int(counts[status]) for status in order if status in counts.index}


def status_line(report: Report) -> str:
    """"12 runs: 9 completed, 2 running, 1 unknown; 1 damaged (see warnings)"."""
    counts = status_counts(report.runs)
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    line = f"{len(report.runs)} run{'s' if len(report.runs) != 1 else ''}: {parts}"
    damaged = sum(1 for problems in report.results.problems if problems)
    return line + (f"; {damaged} damaged (see warnings)" if damaged else "")


def _runs_columns(report: Report) -> list:
    """Columns of the per-run table: run_id, status, swept keys, RUN_METRICS."""
    keys = [k for k in report.swept if k != "name"]
    lead = ["name"] if "name" in report.swept else []
    return lead + ["run_id", "status", *keys, *RUN_METRICS]


def _group_columns(report: Report) -> list:
    """Columns of the grouped table (DESIGN section 3): keys, n, metric mean/std."""
    stats = [f"{m}_{s}" for m in GROUP_METRICS for s in ("mean", "std")]
    return [*report.keys, "n", *stats]


# ---------------------------------------------------------------- cell text


def _plain(value: Any) -> Any:
    """A numpy/pandas scalar as a JSON-ready Python value (NaN/NA as None)."""
    if value is None or (not isinstance(value, (str, list, dict)) and pd.isna(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


def _key_text(value: Any) -> str:
    """A group key value: 0.1, sgd, 3; "-" when the run has none."""
    value = _plain(value)
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _pct(value: float) -> str:
    """A fraction as a percentage with two decimals."""
    return f"{100 * value:.2f}"


def _loss(value: float) -> str:
    """A loss with three decimals."""
    return f"{value:.3f}"


def _duration(seconds: float) -> str:
    """Seconds as 42s, 7m05s or 3h12m."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _duration_pair(mean: float, std: float, spaced: bool) -> str:
    """Mean and std of durations in the mean's unit: "31.1 ± 4.6 m" ("31.1±4.6m")."""
    unit, scale = ("h", 3600.0) if mean >= 3600 else ("m", 60.0) if mean >= 60 else ("s", 1.0)
    digits = 2 if unit == "h" else 1  # 1.1 h would hide a 6-minute difference
    if spaced:
        unit = " " + unit
    if pd.isna(std):
        return f"{mean / scale:.{digits}f}{unit}"
    sep = " ± " if spaced else "±"
    return f"{mean / scale:.{digits}f}{sep}{std / scale:.{digits}f}{unit}"


def _number(fmt: Callable) -> Callable:
    """``fmt`` that shows "-" for a missing value."""
    return lambda value: "-" if pd.isna(value) else fmt(value)


def _mean_std(mean: float, std: float, fmt: Callable, spaced: bool) -> str:
    """"81.23 ± 0.42" ("81.23±0.42" compact); the mean alone when std is undefined."""
    if pd.isna(mean):
        return "-"
    if fmt is _duration:
        return _duration_pair(mean, std, spaced)
    if pd.isna(std):
        return fmt(mean)
    return f"{fmt(mean)} ± {fmt(std)}" if spaced else f"{fmt(mean)}±{fmt(std)}"


_METRIC_TEXT = {  # metric: (full header, short header, formatter)
    "val_acc": ("val_acc", "acc", _pct),  # the legends say "accuracies in %"
    "best_val_acc": ("best_val_acc", "best", _pct),
    "val_loss": ("val_loss", "loss", _loss),
    "wall_time_s": ("wall_time", "time", _duration),
    "samples_per_s": ("samples/s", "smp/s", lambda v: f"{v:.0f}"),
    "epochs": ("epochs", "ep", lambda v: f"{v:.0f}"),
}


@dataclass
class Column:
    """One displayed column: headers and cells in the full and the compact style."""

    header: str
    short: str
    cells: list
    compact: list
    right: bool = True
    key: bool = False  # shown as "header=value" in the block layout
    tight: bool = False  # no padding: the one-character best-group marker


def _key_header(key: str, keys: list) -> str:
    """"lr" for "train.lr" when no other key ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def _key_columns(frame: pd.DataFrame, keys: list) -> list:
    """Display columns of the key values."""
    columns = []
    for key in keys:
        cells = [_key_text(v) for v in frame[key]]
        numeric = pd.api.types.is_numeric_dtype(frame[key])
        columns.append(Column(key, _key_header(key, keys), cells, cells, right=numeric, key=True))
    return columns


def _n_cells(groups: pd.DataFrame) -> list:
    """"3", or "2/3" when only 2 of the group's 3 runs are completed."""
    return [str(n) if done == n else f"{done}/{n}" for n, done in zip(groups["n"], groups["completed"])]


def _group_display(report: Report) -> list:
    """Display columns of the grouped table, the best-group marker first."""
    groups = report.groups
    marks = ["*" if i == 0 and report.best is not None else "" for i in range(len(groups))]
    columns = [Column("", "", marks, marks, right=False, tight=True), *_key_columns(groups, report.keys)]
    n = _n_cells(groups)
    columns.append(Column("n", "n", n, n))
    for metric in GROUP_METRICS:
        header, short, fmt = _METRIC_TEXT[metric]
        pairs = list(zip(groups[f"{metric}_mean"], groups[f"{metric}_std"]))
        full = [_mean_std(m, s, fmt, True) for m, s in pairs]
        compact = [_mean_std(m, s, fmt, False) for m, s in pairs]
        columns.append(Column(header, short, full, compact))
    return columns


def _id_prefix(ids: list) -> str:
    """The common start of the run ids up to a "-" or "_", when worth cutting.

    Sweep run ids share the submission's stamp ("20261122-000132-ae38-003"); a
    narrow terminal shows only what differs.
    """
    if len(ids) < 2:
        return ""
    common = os.path.commonprefix(ids)
    cut = max(common.rfind("-"), common.rfind("_")) + 1
    return common[:cut] if cut >= 6 else ""


def _runs_display(report: Report, prefix: str) -> list:
    """Display columns of the per-run table; run ids lose ``prefix``."""
    runs = report.runs
    keys = [k for k in report.swept if k != "name"]
    columns = _key_columns(runs, ["name"] if "name" in report.swept else [])
    ids = [str(r)[len(prefix):] for r in runs["run_id"]]
    columns.append(Column("run_id", "run", ids, ids, right=False))
    status = [str(s) for s in runs["status"]]
    columns.append(Column("status", "status", status, status, right=False))
    columns += _key_columns(runs, keys)
    for metric in RUN_METRICS:
        header, short, fmt = _METRIC_TEXT[metric]
        cells = [_number(fmt)(v) for v in runs[metric]]
        columns.append(Column(header, short, cells, cells))
    return columns


# ---------------------------------------------------------------- markdown


def _pipe_table(columns: list, compact: bool, pad: tuple) -> list:
    """A GitHub-style pipe table as lines; ``pad`` is the (left, right) padding of
    a cell, which a ``tight`` column never gets."""
    headers = [c.short if compact else c.header for c in columns]
    rows = list(zip(*[c.compact if compact else c.cells for c in columns]))
    pads = [("", "") if c.tight else pad for c in columns]
    # A right-aligned rule cell needs two characters ("-:"), padding included.
    widths = [max([len(h), 1 + (c.right and not (left or right)), *(len(r[i]) for r in rows)])
              for i, (h, c, (left, right)) in enumerate(zip(headers, columns, pads))]

    def line(cells: list) -> str:
        text = [left + (cell.rjust(w) if c.right else cell.ljust(w)) + right
                for cell, w, c, (left, right) in zip(cells, widths, columns, pads)]
        return "|" + "|".join(text) + "|"

    spans = [w + len(left) + len(right) for w, (left, right) in zip(widths, pads)]
    rule = ["-" * (n - 1) + ":" if c.right else "-" * n for n, c in zip(spans, columns)]
    return [line(headers), "|" + "|".join(rule) + "|"] + [line(list(r)) for r in rows]


def _pack(items: list, width: int, indent: str, sep: str = " · ") -> list:
    """Items joined with ``sep`` into lines of at most ``width`` (an item is never split)."""
    lines, current = [], ""
    for item in items:
        candidate = f"{current}{sep}{item}" if current else item
        if current and len(indent + candidate) > width:
            lines.append(indent + current)
            candidate = item
        current = candidate
    return lines + ([indent + current] if current else [])


def _blocks(columns: list, heading: int, width: int) -> list:
    """Fallback for a narrow terminal: one block per row, "header value" items."""
    lines = []
    for i in range(len(columns[0].cells)):
        head = [f"{c.short}={c.compact[i]}" if c.key else c.compact[i] for c in columns[:heading]]
        head_lines = _pack([part for part in head if part], width, "  ", " ")
        lines += ["- " + head_lines[0][2:], *head_lines[1:]]
        lines += _pack([f"{c.short} {c.compact[i]}" for c in columns[heading:]], width, "    ")
    return lines


def _fit(columns: list, heading: int, width: int) -> list:
    """The roomiest layout that fits ``width``: padded table, compact table,
    left-padded, bare, else blocks (which wrap to any width)."""
    for compact, pad in ((False, (" ", " ")), (True, (" ", " ")), (True, (" ", "")), (True, ("", ""))):
        lines = _pipe_table(columns, compact, pad)
        if max(map(len, lines)) <= width:
            return lines
    return _blocks(columns, heading, width)


def _wrap(text: str, width: int) -> list:
    """Prose wrapped to ``width``."""
    import textwrap

    return textwrap.wrap(text, width=width, break_on_hyphens=False) or [""]


def _group_legend(report: Report, marker: str = "* = best") -> str:
    """What the grouped table's numbers mean; ``marker`` says how the best group shows."""
    by = ", ".join(report.keys) if report.keys else "nothing (one group of all runs)"
    text = (f"Grouped by {by}. Cells: mean ± std over the group's runs (sample std, ddof=1; "
            "none for one run); accuracies in %; sorted by mean val_acc")
    text += f" ({marker})." if report.best is not None else "."
    if (report.groups["completed"] < report.groups["n"]).any():
        text += (" An n like 2/3: 2 of the group's 3 runs completed; the others count"
                 " at their latest epoch.")
    return text


def _markdown(report: Report, runs: bool, width: int) -> str:
    """The markdown report: title, status line, legend, table."""
    lines = [f"## {report.title}", "", *_wrap(status_line(report), width), ""]
    if runs:
        prefix = _id_prefix([str(r) for r in report.runs["run_id"]])
        legend = "One row per run; accuracies in %; val_acc and val_loss at the last epoch logged."
        legend += f" Run ids: {prefix}<run>." if prefix else ""
        columns, heading = _runs_display(report, prefix), 2 + len(report.swept)
    else:
        legend, columns, heading = _group_legend(report), _group_display(report), 1 + len(report.keys)
    lines += [*_wrap(legend, width), "", *_fit(columns, heading, width)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- csv / json


def _data_frame(report: Report, runs: bool) -> pd.DataFrame:
    """The rows and columns that csv and json carry."""
    if runs:
        return report.runs[_runs_columns(report)].reset_index(drop=True)
    return report.groups[_group_columns(report)]


def _csv(report: Report, runs: bool) -> str:
    """The grouped (or per-run) table as CSV, full precision."""
    return _data_frame(report, runs).to_csv(index=False)


def _records(frame: pd.DataFrame) -> list:
    """Rows as dicts of JSON-ready values."""
    columns = list(frame.columns)
    return [{c: _plain(v) for c, v in zip(columns, row)} for row in frame.itertuples(index=False)]


def _json(report: Report, runs: bool) -> str:
    """The report as one JSON object; NaN becomes null."""
    data = {
        "title": report.title,
        "root": str(report.root),
        "status_line": status_line(report),
        "status_counts": status_counts(report.runs),
        "group_by": report.keys,
        "std": "sample standard deviation (ddof=1)",
        "best": report.best,
        "runs" if runs else "groups": _records(_data_frame(report, runs)),
        "warnings": report.warnings,
    }
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------- html

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


def _html_table(columns: list, best_row: Optional[int] = None, css: str = "", show: int = 0) -> str:
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


def _html_curves(report: Report) -> str:
    """Learning curves as an embedded PNG, or how to get them."""
    from clusterjob import plots

    png = plots.curves_png(report.results, report.runs, report.groups, report.keys)
    if png is None:
        return ('<p class="note">Learning curves need matplotlib: '
                "<code>pip install 'clusterjob[plots]'</code></p>")
    if not png:
        return '<p class="note">No epochs logged yet: no curves to draw.</p>'
    import base64

    data = base64.b64encode(png).decode("ascii")
    alt = "val_acc and train_loss per epoch: mean per group with a band of one std"
    return f'<img alt="{alt}" src="data:image/png;base64,{data}">'


def _html_warnings(report: Report) -> str:
    """The problems found, as a list (empty string when none)."""
    if not report.warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings)
    return f'<div class="warnings"><b>Warnings</b><ul>{items}</ul></div>'


def _html(report: Report, runs: bool) -> str:
    """One self-contained page: status, grouped table, curves, per-run table."""
    prefix = ""  # the page has room for whole run ids, and people copy them from it
    groups = _html_table(_group_display(report)[1:], 0 if report.best is not None else None, "groups", 12)
    per_run = _html_table(_runs_display(report, prefix), css="runs", show=25)
    sections = [
        ("Groups", f'<p class="legend">{html.escape(_group_legend(report, "best highlighted"))}</p>{groups}'),
        ("Learning curves", _html_curves(report)),
        ("Runs", f'<p class="legend">val_acc and val_loss at the last epoch logged.</p>{per_run}'),
    ]
    if runs:
        sections = [sections[2], sections[0], sections[1]]
    body = "".join(f"<h2>{title}</h2>{content}" for title, content in sections)
    title = html.escape(f"clusterjob report: {report.title}")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body><h1>{title}</h1>"
            f'<p class="status">{html.escape(status_line(report))}</p>{_html_warnings(report)}'
            f"{body}</body></html>\n")


# ---------------------------------------------------------------- entry points


def render(report: Report, fmt: str = "md", runs: bool = False, width: int = 80) -> str:
    """The report as text in ``fmt`` (md, csv, html or json)."""
    if fmt == "md":
        return _markdown(report, runs, width)
    if fmt == "csv":
        return _csv(report, runs)
    if fmt == "json":
        return _json(report, runs)
    if fmt == "html":
        return _html(report, runs)
    raise BadInput(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")


def format_report(root: "str | Path | Sequence", group_by: Optional[list] = None, fmt: str = "md",
                  runs: bool = False, width: int = 80) -> str:
    """The report of the runs under ``root`` as text; problems become ResultsWarnings.

    ``root`` is a results folder (as for ``clusterjob report``) or a list of run
    folders, e.g. the runs one ``submit --wait`` launched.
    """
    report = build_report(root, group_by)
    for message in report.warnings:
        warnings.warn(message, ResultsWarning, stacklevel=2)
    return render(report, fmt, runs, width)


def _format_of(fmt: Optional[str], out: Optional[str]) -> str:
    """--format, else the suffix of --out, else md."""
    if fmt:
        return fmt
    if not out:
        return "md"
    suffix = Path(out).suffix.lower()
    if suffix not in _SUFFIXES:
        raise BadInput(f"--out {out}: cannot tell the format from {suffix or 'no suffix'!r}; "
                       f"pass --format ({', '.join(FORMATS)})")
    return _SUFFIXES[suffix]


def _print_warnings(messages: list) -> None:
    """The problems on stderr, at most _MAX_STDERR_WARNINGS of them."""
    for message in messages[:_MAX_STDERR_WARNINGS]:
        print(f"warning: {message}", file=sys.stderr)
    if len(messages) > _MAX_STDERR_WARNINGS:
        print(f"warning: ... and {len(messages) - _MAX_STDERR_WARNINGS} more", file=sys.stderr)


def main(args: Any) -> int:
    """``clusterjob report``: args has dir, group_by, format, out, runs."""
    fmt = _format_of(args.format, args.out)
    report = build_report(args.dir, args.group_by)
    width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() and not args.out else 80
    text = render(report, fmt, args.runs, width)
    _print_warnings(report.warnings)  # before the report, so a terminal shows them above it
    sys.stderr.flush()
    if not args.out:
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as err:
        raise BadInput(f"--out {args.out}: {err.strerror}") from None
    print(f"wrote {args.out} ({status_line(report)})", file=sys.stderr)
    return 0
