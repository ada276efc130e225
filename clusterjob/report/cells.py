"""What the report's tables show: cell text, display columns and legends, shared by
the terminal (markdown) and the HTML report.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pandas as pd

from clusterjob.core import units
from clusterjob.core.errors import escape
from clusterjob.report.stats import COMPLETE, PARTIAL, UNFINISHED, Experiment, json_value, run_metrics
from clusterjob.report.termtable import Column


def group_value(value: Any) -> str:
    """A group key value: 0.1, sgd, 3; "-" when the run has none."""
    value = json_value(value)
    if value is None:
        return "-"
    return escape(f"{value:g}" if isinstance(value, float) else str(value))


def _mean_std(metric: str, mean: float, std: float, spaced: bool) -> str:
    """"81.23 ± 0.42" ("81.23±0.42" compact) in the metric's unit (units.number); the mean
    alone when std is undefined; durations carry their unit: "36.3 ± 5.9 s"."""
    if pd.isna(mean):
        return "-"
    if metric in units.DURATIONS:
        return units.duration(mean, None if pd.isna(std) else std, compact=not spaced)
    if pd.isna(std):
        return units.number(metric, mean)
    sep = " ± " if spaced else "±"
    return f"{units.number(metric, mean)}{sep}{units.number(metric, std)}"


def _value(metric: str, value: Any) -> str:
    """One run's value in the metric's unit; "-" when missing."""
    return "-" if pd.isna(value) else units.number(metric, value)


_HEADERS = {  # metric: (header, compact header); never cut to a word another metric could claim
    "best_val_acc": ("best_val_acc", "best_acc"),  # the legends say what it is
    "wall_time_s": ("wall_time", "wall_time"),
    "samples_per_s": (units.THROUGHPUT_UNIT, units.THROUGHPUT_UNIT),
    "epochs": ("epoch", "epoch"),
}


def metric_text(metric: str) -> tuple:
    """(header, compact header) of a metric column; a metric shown in % says so in both:
    "val_acc %" and "val_acc%"."""
    header, short = _HEADERS.get(metric, (escape(metric), escape(metric)))
    if units.unit(metric) == "%":
        return f"{header} %", f"{short}%"
    return header, short


def _key_header(key: str, keys: list) -> str:
    """"lr" for "train.lr" when no other key ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return escape(last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key)


def _key_columns(frame: pd.DataFrame, keys: list) -> list:
    """Display columns of the key values."""
    columns = []
    for key in keys:
        cells = [group_value(v) for v in frame[key]]
        numeric = pd.api.types.is_numeric_dtype(frame[key])
        columns.append(Column(escape(key), _key_header(key, keys), cells, cells, right=numeric, key=True))
    return columns


def _n_cells(groups: pd.DataFrame) -> list:
    """"3", or "2/3" when only 2 of the group's 3 runs are completed."""
    return [str(n) if state == COMPLETE else f"{done}/{n}"
            for n, done, state in zip(groups["n"], groups["completed"], groups["state"])]


def group_states(groups: pd.DataFrame) -> list:
    """Per group, its state as the pages mark it: "" (every run completed), "partial",
    "unfinished" or "failed" (the ``state`` column)."""
    return ["" if state == COMPLETE else str(state) for state in groups["state"]]


def best_marker(experiment: Experiment) -> str:
    """"*" for the best group, "*?" when its lead says little (``lead_text``); "" for none."""
    if experiment.best is None:
        return ""
    return "*?" if experiment.lead is not None else "*"


def group_display(experiment: Experiment) -> list:
    """Display columns of the grouped table: the best-group marker, keys, n, the metrics,
    and which runs did not complete (when some did not)."""
    groups = experiment.groups
    marks = [best_marker(experiment) if i == 0 else "" for i in range(len(groups))]
    columns = [Column("", "", marks, marks, right=False, tight=True), *_key_columns(groups, experiment.keys)]
    n = _n_cells(groups)
    columns.append(Column("n", "n", n, n))
    for metric in experiment.metrics:
        header, short = metric_text(metric)
        pairs = list(zip(groups[f"{metric}_mean"], groups[f"{metric}_std"]))
        full = [_mean_std(metric, m, s, True) for m, s in pairs]
        compact = [_mean_std(metric, m, s, False) for m, s in pairs]
        columns.append(Column(header, short, full, compact))
    if experiment.shows_cost:
        columns += cost_columns(groups, "_sum")
    if experiment.shows_gpu:
        columns += gpu_columns(groups)
    others = [escape(text) for text in groups["not_completed"]]
    if any(others):
        columns.append(Column("not completed", "not completed", others, others, right=False, css="state"))
    return columns


def cost_columns(frame: pd.DataFrame, suffix: str = "") -> list:
    """Display columns of what runs (``suffix`` "_sum": groups) cost on Slurm: compute in
    GPU-hours (CPU-hours without a GPU), time queued, work lost to stops."""
    compute = [units.compute_hours(g, c) for g, c in zip(frame[f"gpu_hours{suffix}"], frame[f"cpu_hours{suffix}"])]
    columns = [Column("compute", "compute", compute, compute)]
    for name, header in (("queue_wait_s", "queued"), ("lost_s", "lost")):
        cells = [_value(name, v) for v in frame[f"{name}{suffix}"]]
        columns.append(Column(header, header, cells, cells))
    return columns


def gpu_columns(frame: pd.DataFrame) -> list:
    """Display columns of how runs (or groups) used their GPUs: the mean utilisation, the
    peak memory, the idle GPU-hours."""
    cells = [[units.gpu_cell(name, value) for value in frame[name]] for name in
             ("gpu_util_pct", "gpu_mem_peak_gib", "idle_gpu_hours")]
    return [Column(header, header, column, column) for header, column in
            zip(("gpu_util", "gpu_mem_peak", "idle GPU-h"), cells)]


def gpu_warnings(experiment: Experiment) -> list:
    """Each run's low-utilisation warning ("" when none), in the runs table's order."""
    if not experiment.shows_gpu:
        return [""] * len(experiment.runs)
    return ["" if not isinstance(w, str) else escape(w) for w in experiment.runs["gpu_warning"]]


def gpu_warning_lines(experiment: Experiment, prefix: str, width: int) -> list:
    """"GPU warnings:" and one wrapped item per run whose GPUs stayed idle (none: [])."""
    lines = []
    for run_id, warning in zip(experiment.runs["run_id"], gpu_warnings(experiment)):
        if warning:
            item = f"- {escape(str(run_id)[len(prefix):])}: {warning}"
            lines += textwrap.wrap(item, width=width, subsequent_indent="  ", break_on_hyphens=False)
    return ["GPU warnings:", *lines] if lines else []


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


def _epoch_cells(runs: pd.DataFrame) -> list:
    """"1/3": the last epoch logged of the epochs the spec asked for ("7" when unknown)."""
    planned = runs["planned_epochs"] if "planned_epochs" in runs.columns else [pd.NA] * len(runs)
    return [_value("epochs", last) if pd.isna(total) else f"{_value('epochs', last)}/{total}"
            for last, total in zip(runs["epochs"], planned)]


def runs_display(experiment: Experiment, prefix: str) -> list:
    """Display columns of the per-run table; run ids lose ``prefix``."""
    runs = experiment.runs
    ids = [escape(str(r)[len(prefix):]) for r in runs["run_id"]]
    columns = [Column("run_id", "run", ids, ids, right=False)]
    status = [escape(str(s)) for s in runs["status"]]
    columns.append(Column("status", "status", status, status, right=False, css="status"))
    columns += _key_columns(runs, experiment.swept)
    for metric in run_metrics(experiment):
        header, short = metric_text(metric)
        cells = _epoch_cells(runs) if metric == "epochs" else [_value(metric, v) for v in runs[metric]]
        columns.append(Column(header, short, cells, cells))
    columns += cost_columns(runs) if experiment.shows_cost else []
    columns += gpu_columns(runs) if experiment.shows_gpu else []
    if runs["straggler"].notna().any():  # the rank the others waited for (health, several ranks)
        stragglers = ["-" if pd.isna(s) else escape(str(s)) for s in runs["straggler"]]
        columns.append(Column("straggler", "straggler", stragglers, stragglers, right=False))
    return columns


def run_errors(experiment: Experiment) -> list:
    """Each run's recorded error as one line ("" when none), in the runs table's order: the
    lines of a message that has several (a download's tries) joined by " / ", each escaped,
    so no literal \\n shows."""
    return ["" if pd.isna(e) else " / ".join(escape(line.strip()) for line in str(e).splitlines() if line.strip())
            for e in experiment.runs["error"]]


def error_lines(experiment: Experiment, prefix: str, width: int) -> list:
    """"Errors:" and one wrapped item per run that recorded one (none: [])."""
    runs = experiment.runs
    lines = []
    for run_id, status, error in zip(runs["run_id"], runs["status"], run_errors(experiment)):
        if error:
            item = f"- {escape(str(run_id)[len(prefix):])} ({escape(str(status))}): {error}"
            lines += textwrap.wrap(item, width=width, subsequent_indent="  ", break_on_hyphens=False)
    return ["Errors:", *lines] if lines else []


def ranking_text(experiment: Experiment) -> str:
    """"sorted by mean loss, lowest first (mode min: the name says loss or err)"."""
    primary = experiment.primary
    text = f"sorted by mean {escape(primary.name)}, {'lowest' if primary.ascending else 'highest'} first"
    if primary.why == "--mode":
        return f"{text} (--mode {primary.mode})"
    if primary.why.startswith("these runs"):
        return f"{text} ({escape(primary.why)})"
    return text if primary.name == "val_acc" else f"{text} (mode {primary.mode}: {primary.why})"


def _counting_text(experiment: Experiment) -> str:
    """What counts when some runs did not complete ("" when all did), and why no group is
    best when none is."""
    groups, text = experiment.groups, ""
    states = set(groups["state"])
    if PARTIAL in states:
        text += " An n like 2/3: 2 of the group's 3 runs completed, and only they count."
    if UNFINISHED in states:
        text += (" A group with no completed run (0/3) shows its unfinished runs at their latest"
                 " epoch, below the others.")
    if (groups["counted"] < groups["n"]).any():
        text += " Failed and cancelled runs never count; the per-run table (--runs) gives their errors."
    if experiment.best is None and states & {COMPLETE, PARTIAL}:
        text += f" No completed run logged {escape(experiment.primary.name)}, so none is best."
    elif experiment.best is None and states:
        text += " No group has a completed run, so none is best."
    return text


def lead_text(experiment: Experiment) -> str:
    """Why the best group's mark is "*?" ("" when its lead is clear): it rests on one run,
    or leads the next group by no more than one std."""
    lead = experiment.lead
    if lead is None:
        return ""
    metric = experiment.primary.name
    by, spread = units.quantity(metric, lead.by), units.quantity(metric, lead.spread)
    if pd.isna(lead.spread):
        weighed = f"leads the next group by {by}, and neither has a std to weigh that by"
    elif lead.by <= lead.spread:
        weighed = f"leads the next group by {by}, within one std ({spread})"
    else:
        weighed = f"leads the next group by {by} (std {spread})"
    rests = f"rests on {lead.runs} run and " if lead.runs < 2 else ""
    return f" *? = best by mean, but not clearly: it {rests}{weighed}; more seeds would tell."


def _best_text(metrics: list) -> str:
    """What best_val_acc is, when it is shown ("" when not)."""
    return " best_val_acc (best_acc): a run's best val_acc of any epoch;" if "best_val_acc" in metrics else ""


def group_legend(experiment: Experiment, marker: str = "* = best") -> str:
    """What the grouped table's numbers mean; ``marker`` says how the best group shows."""
    by = ", ".join(map(escape, experiment.keys)) if experiment.keys else "nothing (one group of all runs)"
    text = (f"Grouped by {by}. Cells: mean ± std over the group's counted runs (sample std, ddof=1; "
            f"none for one run);{_best_text(experiment.metrics)} {ranking_text(experiment)}")
    text += f" ({marker})." if experiment.best is not None else "."
    text += lead_text(experiment) + _counting_text(experiment)
    text += f" {COST_TEXT} Groups sum every run's." if experiment.shows_cost else ""
    return text + (f" {GPU_TEXT} Groups: the mean over their runs' GPU-hours, the highest peak, the idle GPU-hours "
                   "summed." if experiment.shows_gpu else "")


COST_TEXT = ("compute: GPU-hours (CPU-hours where a run held no GPU) of every Slurm session of a run, requeues and "
             "retries included; queued: time from each (re)submission to its start; lost: run time redone after "
             "a stop, from the last checkpoint to the stop; -: not known (no Slurm job, no accounting, or your "
             "code keeps its checkpoints elsewhere). From sacct.")


GPU_TEXT = ("gpu_util: the GPUs' utilisation over the run, weighted by time, over all its GPUs; gpu_mem_peak: the "
            "most memory any of its GPUs used; idle GPU-h: the GPU-hours sampled times (1 - utilisation); -: no "
            "sample. From the run's telemetry.jsonl.")


def runs_legend(experiment: Experiment, prefix: str) -> str:
    """What the per-run table's numbers mean."""
    if experiment.primary.name == "val_acc":
        legend = ("One row per run; epoch: the last one logged of those the spec asked for; "
                  "val_acc and val_loss at the last epoch logged;")
    else:
        legend = f"One row per run; {escape(experiment.primary.name)} at the last value logged;"
    legend = (legend + _best_text(run_metrics(experiment))).rstrip(";") + "."
    legend += f" {COST_TEXT}" if experiment.shows_cost else ""
    legend += f" {GPU_TEXT}" if experiment.shows_gpu else ""
    return legend + (f" Run ids: {escape(prefix)}<run>." if prefix else "")
