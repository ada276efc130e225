"""``clusterjob report DIR``: which config wins, and how sure that is.

Each experiment (the runs of one spec name) is reported on its own: a section under its
name when the folder holds several, in csv and json one table with a ``name`` column
first (and in json an ``experiments`` list: each one's metric, mode, keys and best).
The grouped table has one row per group of runs, ranked by the primary metric's
mean with the best group marked (stats.py says how the metric, the groups, the
runs that count and the numbers are chosen): the group keys by their dotted names,
``n``, then ``<metric>_mean`` and ``<metric>_std`` for the primary metric and the
standard ones (val_acc, best_val_acc, val_loss, wall_time_s) that exist, then
``completed`` and ``counted`` (runs); the best one is marked ``*``, ``*?`` when its lead
is within the noise (``cells.lead_text``). The status line above the table
says how many runs are not completed; the markdown table shows ``n`` as
``completed/all`` for groups that hold such runs, and which ones they are. Numbers
are written in one unit per quantity (``clusterjob.core.units``), in every format: the
accuracies, which runs log as fractions, in % (csv and json name their columns so:
``val_acc_pct``, ``val_acc_pct_mean``; json's ``units`` gives each column's unit).

Formats: ``md`` (the terminal default, fitted to the terminal's width), ``csv``
(data only), ``json``, ``html`` (one self-contained page with learning curves
when matplotlib is installed; without it the CLI says so in one line on stderr). The
per-run table also lists each run's error: under the markdown table, in a column of
csv, json and html.

Problems with run folders are ``ResultsWarning``s in the Python API
(``format_report``); the CLI (``main``) prints them to stderr, the md status
line counts the damaged runs and the json and html outputs list them. The CLI
checks every argument before it reads a run, and writes (the --out file, the
results cache) only once the report is made.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from clusterjob.core import units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.files import atomic_open
from clusterjob.report import htmlpage, plots, termtable
from clusterjob.report.assemble import build_report
from clusterjob.report.cells import (
    error_lines,
    group_display,
    group_legend,
    id_prefix,
    lead_text,
    note_lines,
    runs_display,
    runs_legend,
)
from clusterjob.report.reading import RunStates
from clusterjob.report.results import ResultsWarning
from clusterjob.report.stats import (
    GROUP_METRICS,
    RUN_METRICS,
    STATS,
    Experiment,
    Report,
    check_mode,
    json_value,
    run_metrics,
    status_counts,
    status_line,
)

__all__ = ["GROUP_METRICS", "RUN_METRICS", "Report", "ReportOptions", "build_report", "format_report", "render",
           "main"]

FORMATS = ("md", "csv", "html", "json")
_SUFFIXES = {".md": "md", ".markdown": "md", ".csv": "csv", ".html": "html", ".htm": "html", ".json": "json"}
_MAX_STDERR_WARNINGS = 20


# ---------------------------------------------------------------- md, csv, json


def _markdown(report: Report, runs: bool, width: int) -> str:
    """The markdown report: title, status line, then per experiment its legend and table
    (and the runs' errors), each under its name when the folder holds several."""
    lines = [f"## {report.title}", "", *termtable.wrap(status_line(report), width), ""]
    several = len(report.experiments) > 1
    for experiment in report.experiments:
        if several:
            lines += [f"### {experiment.name}", "", *termtable.wrap(status_line(experiment), width), ""]
        for summary in filter(None, experiment.summaries.values()):
            lines += [*termtable.wrap(summary.line(), width), ""]
        lines += [*_experiment_lines(experiment, runs, width), ""]
    return "\n".join(lines[:-1]) + "\n"


def _experiment_lines(experiment: Experiment, runs: bool, width: int) -> list:
    """One experiment's legend and table (and its runs' errors)."""
    errors: list = []
    if runs:
        prefix = id_prefix([str(r) for r in experiment.runs["run_id"]])
        legend = runs_legend(experiment, prefix)
        columns, heading = runs_display(experiment, prefix), 2 + len(experiment.swept)
        errors = error_lines(experiment, prefix, width) + note_lines(experiment, prefix, width)
    else:
        legend, columns, heading = group_legend(experiment), group_display(experiment), 1 + len(experiment.keys)
    lines = [*termtable.wrap(legend, width), "", *termtable.fit(columns, heading, width)]
    return lines + (["", *errors] if errors else [])


def _family_columns(experiment: Experiment, grouped: bool) -> list:
    """A part per provider of the report: its columns of the per-run (``grouped``: the
    grouped) data where the experiment's tables show it, else none; so that the parts of
    several experiments line up."""
    shown = experiment.families
    return [list(p.group_columns if grouped else p.run_columns) if p in shown else [] for p in experiment.providers]


def _runs_columns(experiment: Experiment) -> list:
    """Columns of the per-run table, in parts: run_id and status, key columns, the run
    metrics, then (last, so that the columns before keep their places) the epochs the
    spec asked for, the error, each family's columns (the cost when some run ran on Slurm,
    the GPUs' use when some run sampled them), and when some run recorded one, the rank
    its others waited for."""
    metrics = run_metrics(experiment)
    planned = ["planned_epochs"] if "epochs" in metrics else []
    stragglers = ["straggler"] if experiment.runs["straggler"].notna().any() else []
    return [["run_id", "status"], experiment.swept, metrics, [*planned, "error"], *_family_columns(experiment, False),
            stragglers]


def _group_columns(experiment: Experiment) -> list:
    """Columns of the grouped table, in parts: keys, n, metric mean/std, then completed
    and counted (last, so that the columns before keep their places), and each family's
    columns (the summed cost when some run ran on Slurm, the GPUs' use when some run
    sampled them)."""
    stats = [f"{m}_{s}" for m in experiment.metrics for s in ("mean", "std")]
    return [experiment.keys, ["n"], stats, ["completed", "counted"], *_family_columns(experiment, True)]


def _data_frame(report: Report, runs: bool) -> pd.DataFrame:
    """The rows and columns that csv and json carry: one table; with several experiments
    theirs one below the other, a ``name`` column first and each part of the columns
    (keys, metrics, ...) the union of theirs (a column one lacks is empty in its rows)."""
    parts = [_runs_columns(e) if runs else _group_columns(e) for e in report.experiments]
    frames = [(e.runs.reset_index(drop=True) if runs else e.groups)[[c for part in p for c in part]]
              for e, p in zip(report.experiments, parts)]
    if len(frames) == 1:
        return _in_percent(frames[0])
    columns = list(dict.fromkeys(["name", *(c for at in zip(*parts) for part in at for c in part)]))
    named = [frame.astype(object).assign(name=e.name) for frame, e in zip(frames, report.experiments)]
    return _in_percent(pd.concat(named, ignore_index=True).reindex(columns=columns))




def _metric_of(column: str) -> tuple:
    """(metric, statistic) of a data column: ("val_acc", "_mean") of val_acc_mean."""
    for statistic in STATS:
        if column.endswith(statistic) and column[:-len(statistic)] in units.PERCENT:
            return column[:-len(statistic)], statistic
    return column, ""


def _in_percent(frame: pd.DataFrame) -> pd.DataFrame:
    """The accuracies (logged as fractions) in %, as the md and html tables show them, each
    column named with its unit: val_acc_pct, val_acc_pct_mean. Rounded to 12 decimals, so
    that 0.82 is 82.0 and not 82.00000000000001."""
    renamed = {c: f"{m}_pct{s}" for c, (m, s) in zip(frame.columns, map(_metric_of, frame.columns))
               if m in units.PERCENT}
    if not renamed:
        return frame
    scaled = {c: (pd.to_numeric(frame[c], errors="coerce") * 100).round(12) for c in renamed}
    return frame.assign(**scaled).rename(columns=renamed)


def _units(columns: list) -> dict:
    """{data column: its unit} of the columns that have one ("%", "s", "samples/s")."""
    found = {}
    for column in columns:
        if column.endswith("_pct") or "_pct_" in column:
            found[column] = "%"
            continue
        unit = units.unit(column) or units.unit(column.rsplit("_", 1)[0])  # wall_time_s, wall_time_s_mean
        if unit and unit != "%":
            found[column] = unit
    return found


def _csv(report: Report, runs: bool) -> str:
    """The grouped (or per-run) table as CSV, full precision."""
    return _data_frame(report, runs).to_csv(index=False)


def _records(frame: pd.DataFrame) -> list:
    """Rows as dicts of JSON-ready values."""
    columns = list(frame.columns)
    return [{c: json_value(v) for c, v in zip(columns, row)} for row in frame.itertuples(index=False)]


def _described(experiment: Experiment) -> dict:
    """What an experiment's rows mean: its metric, mode, group keys, best group, why its
    best is not clear (null when it is), and each provider's line (a search's hours, under
    ``search_hours``; null for a grid sweep)."""
    return {"name": experiment.name, "metric": experiment.primary.name, "mode": experiment.primary.mode,
            "group_by": experiment.keys, "best": experiment.best, "best_note": lead_text(experiment).strip() or None,
            **{key: None if line is None else line.as_json() for key, line in experiment.summaries.items()}}


def _json(report: Report, runs: bool) -> str:
    """The report as one JSON object; NaN becomes null. ``metric``, ``mode``, ``group_by``,
    ``best`` and the providers' lines (``search_hours``) are those of its only experiment
    (null with several: see ``experiments``)."""
    described = [_described(e) for e in report.experiments]
    only = described[0] if len(described) == 1 else dict.fromkeys(described[0])
    frame = _data_frame(report, runs)
    data = {
        "title": report.title,
        "root": str(report.root),
        "status_line": status_line(report),
        "status_counts": status_counts(report.runs),
        "group_by": only["group_by"],
        "metric": only["metric"],
        "mode": only["mode"],
        "std": "sample standard deviation (ddof=1)",
        "best": only["best"],
        **{key: only[key] for key in report.experiments[0].summaries},
        "experiments": described,
        "runs" if runs else "groups": _records(frame),
        "units": _units(list(frame.columns)),
        "warnings": report.warnings,
    }
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


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
        return htmlpage.page(report, runs)
    raise BadInput(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")


def format_report(root: "str | Path | Sequence", group_by: Optional[list] = None, fmt: str = "md",
                  runs: bool = False, width: int = 80, metric: Optional[str] = None,
                  mode: Optional[str] = None, states: Optional[RunStates] = None) -> str:
    """The report of the runs under ``root`` as text; problems become ResultsWarnings.

    ``root`` is a results folder (as for ``clusterjob report``) or a list of run
    folders, e.g. the runs one ``submit --wait`` launched. ``states`` derives the
    state of runs whose run.json does not say they ended (``reading.RunStates``;
    None: as run.json says). Writes the results cache once the report is made.
    """
    report = build_report(root, group_by, metric=metric, mode=mode, states=states)
    for message in report.warnings:
        warnings.warn(message, ResultsWarning, stacklevel=2)
    text = render(report, fmt, runs, width)
    report.save_cache()
    return text


def _format_of(fmt: Optional[str], out: Optional[str]) -> str:
    """--format, else the suffix of --out, else md."""
    if fmt:
        if fmt not in FORMATS:
            raise BadInput(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    if not out:
        return "md"
    suffix = Path(out).suffix.lower()
    if suffix not in _SUFFIXES:
        raise BadInput(f"--out {out}: cannot tell the format from {suffix or 'no suffix'!r}; "
                       f"pass --format ({', '.join(FORMATS)})")
    return _SUFFIXES[suffix]


def _check_out(out: str) -> None:
    """BadInput unless ``out`` can be written: a regular file or a new name (a link counts
    as its target) in a folder that exists and is writable. Checked without opening it:
    opening a FIFO for writing blocks until a reader comes, and a device is no report."""
    path = Path(os.path.realpath(out))
    folder = path.parent
    if path.is_dir():
        raise BadInput(f"--out {out}: is a folder; give a file name such as {Path(out) / 'report.html'}")
    if not folder.is_dir():
        raise BadInput(f"--out {out}: folder {str(Path(out).parent)!r} does not exist; create it first")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise BadInput(f"--out {out}: cannot be checked ({err.strerror}); choose another file") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise BadInput(f"--out {out}: is not a regular file (a FIFO, device or socket); give a file name")
    if not os.access(folder, os.W_OK | os.X_OK) or (mode is not None and not os.access(path, os.W_OK)):
        raise BadInput(f"--out {out}: {'file' if mode is not None else 'folder'} "
                       f"{str(path if mode is not None else folder)!r} is not writable; choose another place")


def _write_out(out: str, text: str) -> None:
    """The report into ``out`` whole or not at all: a temp file beside it, renamed over it
    once every byte is on disk (a full disk or a lost permission leaves no empty or
    partial report, and an old report stays as it was). A link keeps pointing at it."""
    try:
        with atomic_open(Path(os.path.realpath(out)), "wb") as f:
            f.write(text.encode("utf-8"))
    except OSError as err:
        raise BadInput(f"--out {out}: cannot be written ({err.strerror or err}); nothing was written, "
                       "free space or choose another place") from None


@dataclass(frozen=True)
class ReportOptions:
    """What ``clusterjob report`` is asked: the folder and its flags (--watch's interval too)."""

    dir: str
    group_by: Optional[list[str]] = None
    format: Optional[str] = None
    metric: Optional[str] = None
    mode: Optional[str] = None
    out: Optional[str] = None
    runs: bool = False
    interval: Optional[float] = None
    folders: tuple[str, ...] = ()  # the run folders of the sweep whose id ``dir`` is (the command line finds them)

    @property
    def source(self) -> "str | list[str]":
        """What the report reads: the sweep's run folders, else the folder ``dir``."""
        return list(self.folders) or self.dir


def _check_args(args: ReportOptions) -> tuple:
    """(format, metric, mode) once every argument that needs no run is checked."""
    fmt = _format_of(args.format, args.out)
    if args.out:
        _check_out(args.out)
    metric, mode = args.metric, args.mode
    check_mode(mode)
    if metric is not None and not metric.strip():
        raise BadInput("--metric: empty name; give a metric the runs logged, e.g. --metric val_acc")
    return fmt, metric, mode


def _print_warnings(messages: list) -> None:
    """The problems on stderr, at most _MAX_STDERR_WARNINGS of them."""
    for message in messages[:_MAX_STDERR_WARNINGS]:
        print(f"warning: {escape(message)}", file=sys.stderr)
    if len(messages) > _MAX_STDERR_WARNINGS:
        print(f"warning: ... and {len(messages) - _MAX_STDERR_WARNINGS} more", file=sys.stderr)


def _encodable(text: str) -> str:
    """Text any terminal or file takes as UTF-8: undecodable bytes of folder names (which
    come as lone surrogates) as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def main(args: ReportOptions, states: Optional[RunStates] = None) -> int:
    """``clusterjob report``: print the report of ``args.dir``, or write it to ``args.out``;
    ``states`` derives the runs' states as ``status`` does (the command line hands it in)."""
    fmt, metric, mode = _check_args(args)
    report = build_report(args.source, args.group_by, metric=metric, mode=mode, states=states)
    width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() and not args.out else 80
    text = _encodable(render(report, fmt, args.runs, width))
    _print_warnings(report.warnings)  # before the report, so a terminal shows them above it
    if fmt == "html" and not plots.available():
        print(f"note: {htmlpage.NO_CURVES}", file=sys.stderr)
    sys.stderr.flush()
    if not args.out:
        sys.stdout.write(text)
        sys.stdout.flush()
        report.save_cache()
        return 0
    _write_out(args.out, text)
    report.save_cache()
    print(f"wrote {args.out} ({_encodable(status_line(report))})", file=sys.stderr)
    return 0
