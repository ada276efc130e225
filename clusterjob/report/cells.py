"""What the report's tables show: cell text, display columns and legends, shared by
the terminal (markdown) and the HTML report.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pandas as pd

from clusterjob.core.errors import escape
from clusterjob.report.stats import Report, plain, run_metrics
from clusterjob.report.termtable import Column


def key_text(value: Any) -> str:
    """A group key value: 0.1, sgd, 3; "-" when the run has none."""
    value = plain(value)
    if value is None:
        return "-"
    return escape(f"{value:g}" if isinstance(value, float) else str(value))


def _pct(value: float) -> str:
    """A fraction as a percentage with two decimals."""
    return f"{100 * value:.2f}"


def _loss(value: float) -> str:
    """A loss with three decimals."""
    return f"{value:.3f}"


def _general(value: float) -> str:
    """A metric of unknown scale (a user's own): four significant digits."""
    return f"{value:.4g}"


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
    "step": ("step", "step", lambda v: f"{v:.0f}"),
}
_PERCENT = ("val_acc", "best_val_acc")  # shown in %


def metric_text(metric: str) -> tuple:
    """(full header, short header, formatter) of a metric column."""
    if metric in _METRIC_TEXT:
        return _METRIC_TEXT[metric]
    name = escape(metric)
    return name, name if len(name) <= 12 else name[:11] + "…", _general


def _key_header(key: str, keys: list) -> str:
    """"lr" for "train.lr" when no other key ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return escape(last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key)


def _key_columns(frame: pd.DataFrame, keys: list) -> list:
    """Display columns of the key values."""
    columns = []
    for key in keys:
        cells = [key_text(v) for v in frame[key]]
        numeric = pd.api.types.is_numeric_dtype(frame[key])
        columns.append(Column(escape(key), _key_header(key, keys), cells, cells, right=numeric, key=True))
    return columns


def _n_cells(groups: pd.DataFrame) -> list:
    """"3", or "2/3" when only 2 of the group's 3 runs are completed."""
    return [str(n) if done == n else f"{done}/{n}" for n, done in zip(groups["n"], groups["completed"])]


def group_display(report: Report) -> list:
    """Display columns of the grouped table, the best-group marker first."""
    groups = report.groups
    marks = ["*" if i == 0 and report.best is not None else "" for i in range(len(groups))]
    columns = [Column("", "", marks, marks, right=False, tight=True), *_key_columns(groups, report.keys)]
    n = _n_cells(groups)
    columns.append(Column("n", "n", n, n))
    for metric in report.metrics:
        header, short, fmt = metric_text(metric)
        pairs = list(zip(groups[f"{metric}_mean"], groups[f"{metric}_std"]))
        full = [_mean_std(m, s, fmt, True) for m, s in pairs]
        compact = [_mean_std(m, s, fmt, False) for m, s in pairs]
        columns.append(Column(header, short, full, compact))
    return columns


def id_prefix(ids: list) -> str:
    """The common start of the run ids up to a "-" or "_", when worth cutting.

    Sweep run ids share the submission's stamp ("20261122-000132-ae38-003"); a
    narrow terminal shows only what differs.
    """
    if len(ids) < 2:
        return ""
    common = os.path.commonprefix(ids)
    cut = max(common.rfind("-"), common.rfind("_")) + 1
    return common[:cut] if cut >= 6 else ""


def runs_display(report: Report, prefix: str) -> list:
    """Display columns of the per-run table; run ids lose ``prefix``."""
    runs = report.runs
    keys = [k for k in report.swept if k != "name"]
    columns = _key_columns(runs, ["name"] if "name" in report.swept else [])
    ids = [escape(str(r)[len(prefix):]) for r in runs["run_id"]]
    columns.append(Column("run_id", "run", ids, ids, right=False))
    status = [escape(str(s)) for s in runs["status"]]
    columns.append(Column("status", "status", status, status, right=False))
    columns += _key_columns(runs, keys)
    for metric in run_metrics(report):
        header, short, fmt = metric_text(metric)
        cells = [_number(fmt)(v) for v in runs[metric]]
        columns.append(Column(header, short, cells, cells))
    return columns


def _percent(metrics: list) -> str:
    """" accuracies in %;" when some of ``metrics`` are shown in %, else ""."""
    return " accuracies in %;" if any(m in _PERCENT for m in metrics) else ""


def ranking_text(report: Report) -> str:
    """"sorted by mean loss, lowest first (mode min: the name says loss or err)"."""
    primary = report.primary
    text = f"sorted by mean {escape(primary.name)}, {'lowest' if primary.ascending else 'highest'} first"
    if primary.why == "--mode":
        return f"{text} (--mode {primary.mode})"
    return text if primary.name == "val_acc" else f"{text} (mode {primary.mode}: {primary.why})"


def group_legend(report: Report, marker: str = "* = best") -> str:
    """What the grouped table's numbers mean; ``marker`` says how the best group shows."""
    by = ", ".join(map(escape, report.keys)) if report.keys else "nothing (one group of all runs)"
    text = (f"Grouped by {by}. Cells: mean ± std over the group's runs (sample std, ddof=1; "
            f"none for one run);{_percent(report.metrics)} {ranking_text(report)}")
    text += f" ({marker})." if report.best is not None else "."
    if (report.groups["completed"] < report.groups["n"]).any():
        text += (" An n like 2/3: 2 of the group's 3 runs completed; the others count"
                 " at their latest epoch.")
    return text


def runs_legend(report: Report, prefix: str) -> str:
    """What the per-run table's numbers mean."""
    if report.primary.name == "val_acc":
        legend = "One row per run; accuracies in %; val_acc and val_loss at the last epoch logged."
    else:
        legend = (f"One row per run;{_percent(run_metrics(report))} {escape(report.primary.name)} "
                  "at the last value logged.")
    return legend + (f" Run ids: {escape(prefix)}<run>." if prefix else "")
