"""What the report's tables show: cell text, display columns and legends, shared by
the terminal (markdown) and the HTML report.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any, Callable

import pandas as pd

from clusterjob.core import runstate, units
from clusterjob.core.errors import escape
from clusterjob.report.provider import number_cell
from clusterjob.report.stats import COMPLETE, PARTIAL, TRIAL, UNFINISHED, Experiment, json_value, run_metrics
from clusterjob.report.tables import RESOLVED, search_record
from clusterjob.report.termtable import Column
from clusterjob.search import asha


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


def _marks(experiment: Experiment) -> list:
    """The marker column: the best group's mark; every trial that ties for best marked too."""
    tied = set(experiment.tied)
    return [best_marker(experiment) if i == 0 or i in tied else "" for i in range(len(experiment.groups))]


def group_display(experiment: Experiment) -> list:
    """Display columns of the grouped table: the best-group marker, keys, n, the metrics,
    the columns of each family its runs have (``Experiment.families``), and which runs did
    not complete (when some did not)."""
    groups = experiment.groups
    marks = _marks(experiment)
    columns = [Column("", "", marks, marks, right=False, tight=True), *_key_columns(groups, experiment.keys)]
    if experiment.trials:  # a trial is one run: its number as in its run id, no n
        numbers = ["-" if pd.isna(n) else f"{int(n):03d}" for n in groups[TRIAL]]
        columns[1] = Column(TRIAL, TRIAL, numbers, numbers, right=True, key=True)
    else:
        n = _n_cells(groups)
        columns.append(Column("n", "n", n, n))
    for metric in experiment.metrics:
        header, short = metric_text(metric)
        pairs = list(zip(groups[f"{metric}_mean"], groups[f"{metric}_std"]))
        full = [_mean_std(metric, m, s, True) for m, s in pairs]
        compact = [_mean_std(metric, m, s, False) for m, s in pairs]
        columns.append(Column(header, short, full, compact))
    for family in experiment.families:
        columns += family.cells(groups, True)
    others = [escape(text) for text in groups["not_completed"]]
    if experiment.trials:
        ends = trial_ends(experiment)
        columns.append(Column("outcome", "outcome", ends, ends, right=False, css="state"))
    elif any(others):
        columns.append(Column("not completed", "not completed", others, others, right=False, css="state"))
    return columns


def trial_ends(experiment: Experiment) -> list:
    """Per row of a search's table by trial, how the trial ended or where it stands:
    "completed", "pruned at rung 0 (epoch 1): val_acc 16.83% < cut 82.18%" (the
    search's metric, its verdict), "cancelled at epoch 3 of 20", "running at step 40",
    "failed"."""
    runs = experiment.runs
    record = search_record(experiment.results)
    metric = (record.metric if record is not None else None) or experiment.primary.name
    rows = {n: i for i, n in zip(runs.index, runs[TRIAL]) if not pd.isna(n)}
    ends = []
    for number in experiment.groups[TRIAL]:
        at = rows.get(number) if not pd.isna(number) else None
        ends.append("-" if at is None else escape(_trial_end(experiment, at, metric)))
    return ends


def _trial_end(experiment: Experiment, at: int, metric: str) -> str:
    """One trial's end (``trial_ends``): the run at position ``at`` of the results."""
    row = experiment.runs.loc[at]
    status = str(row["status"])
    epoch, planned = row["epochs"], row["planned_epochs"]
    step = row["step"] if "step" in row.index else pd.NA
    if status == runstate.PRUNED:
        return asha.pruned_text(experiment.results.infos[at]["pruned"], metric, "epoch" if pd.notna(epoch) else "step")
    if status in (runstate.COMPLETED, runstate.FAILED):
        return status
    if pd.notna(epoch) and epoch > 0:
        return f"{status} at epoch {number_cell('epochs', epoch)}" + (f" of {planned}" if pd.notna(planned) else "")
    return f"{status} at step {number_cell('step', step)}" if pd.notna(step) and step > 0 else status


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
    return [number_cell("epochs", last) if pd.isna(total) else f"{number_cell('epochs', last)}/{total}"
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
        cells = _epoch_cells(runs) if metric == "epochs" else [number_cell(metric, v) for v in runs[metric]]
        columns.append(Column(header, short, cells, cells))
    for family in experiment.families:
        columns += family.cells(runs, False)
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


def _listed(heading: str, items: list, width: int) -> list:
    """``heading`` and each item wrapped, its lines after the first indented (none: [])."""
    lines = [line for item in items
             for line in textwrap.wrap(item, width=width, subsequent_indent="  ", break_on_hyphens=False)]
    return [heading, *lines] if lines else []


def error_lines(experiment: Experiment, prefix: str, width: int) -> list:
    """"Errors:" and one wrapped item per run that recorded one (none: [])."""
    runs = experiment.runs
    return _listed("Errors:", [f"- {escape(str(run_id)[len(prefix):])} ({escape(str(status))}): {error}"
                               for run_id, status, error in zip(runs["run_id"], runs["status"], run_errors(experiment))
                               if error], width)


def note_lines(experiment: Experiment, prefix: str, width: int) -> list:
    """Per family its tables show, its heading ("GPU warnings:") and one wrapped item per
    run that has a note (none: [])."""
    ids = [escape(str(run_id)[len(prefix):]) for run_id in experiment.runs["run_id"]]
    return [line for family in experiment.families for line in _listed(
        family.notes_heading, [f"- {i}: {note}" for i, note in zip(ids, family.notes(experiment.runs)) if note], width)]


def run_notes(experiment: Experiment) -> tuple:
    """Per run, its error and the notes of every family its tables show, joined by " / "."""
    notes = [run_errors(experiment), *(family.notes(experiment.runs) for family in experiment.families)]
    return tuple(" / ".join(filter(None, row)) for row in zip(*notes))


def ranking_text(experiment: Experiment) -> str:
    """"sorted by mean loss, lowest first (mode min: the name says loss or err)"."""
    primary = experiment.primary
    mean = "" if experiment.trials else "mean "
    text = f"sorted by {mean}{escape(primary.name)}, {'lowest' if primary.ascending else 'highest'} first"
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
        never = "Failed trials" if experiment.search is not None else "Failed and cancelled runs"  # a search's
        text += f" {never} never count; the per-run table (--runs) gives their errors."  # cancelled ones do
    if experiment.best is None and states & {COMPLETE, PARTIAL}:
        text += f" No completed run logged {escape(experiment.primary.name)}, so none is best."
    elif experiment.best is None and states:
        text += " No group has a completed run, so none is best."
    return text


def lead_text(experiment: Experiment) -> str:
    """Why the best group's mark is "*?" ("" when its lead is clear): it rests on one run,
    or leads the next group by no more than one std, or ties with it; for a search's table
    by trial, which trials tie for best ("" when none)."""
    if experiment.trials:
        return _tie_text(experiment)
    lead = experiment.lead
    if lead is None:
        return ""
    metric = experiment.primary.name
    by, spread = units.quantity(metric, lead.by), units.quantity(metric, lead.spread)
    if by == units.quantity(metric, 0.0):
        weighed = "ties with the next group: their means are the same as written"
    elif pd.isna(lead.spread):
        weighed = f"leads the next group by {by}, and neither has a std to weigh that by"
    elif lead.by <= lead.spread:
        weighed = f"leads the next group by {by}, within one std ({spread})"
    else:
        weighed = f"leads the next group by {by} (std {spread})"
    rests = f"rests on {lead.runs} run and " if lead.runs < 2 else ""
    return f" *? = best by mean, but not clearly: it {rests}{weighed}; more seeds would tell."


def _trials_text(experiment: Experiment, marker: str) -> str:
    """The legend of a search's table by trial: one row per trial, what its values are,
    which is best and whether trials tie for it."""
    by = ", ".join(map(escape, experiment.keys[1:]))
    text = f"Grouped by {by}: one row per trial of the search;{_best_text(experiment.metrics)} "
    text += ranking_text(experiment)
    text += f" ({marker} trial)." if experiment.best is not None else "."
    text += (" Completed trials first, at their last epoch; then the others at their latest: a pruned one where "
             "its search stopped it, with the cut it fell short of; failed trials last.")
    text += lead_text(experiment)
    if experiment.best is None and len(experiment.groups):
        text += " No trial completed with a value, so none is best."
    return text


def _tie_text(experiment: Experiment) -> str:
    """" Trials 000 and 003 tie for best: val_acc 92.08% each; both are marked." ("" without a tie)."""
    tied = experiment.tied
    if not tied:
        return ""
    groups, metric = experiment.groups, experiment.primary.name
    numbers = [f"{int(n):03d}" if not pd.isna(n) else "-" for n in groups.loc[tied, TRIAL]]
    value = units.quantity(metric, float(groups.loc[tied[0], f"{metric}_mean"]))
    names = ", ".join(numbers[:-1]) + f" and {numbers[-1]}"
    return f" Trials {names} tie for best: {escape(metric)} {value} each; all of them are marked."


def _key_text(experiment: Experiment) -> Callable[[str], str]:
    """A group key as the legend names it: "train.amp (--group-by amp: the spec's key)" when
    --group-by named it by the word of a run.json field."""
    took = experiment.took
    return lambda key: escape(key) + (f" (--group-by {escape(took[key])}: the spec's key)" if key in took else "")


def _resolved_text(keys: list) -> str:
    """What the values of a key a run resolves as it starts (train.amp: auto) are ("" for none)."""
    resolved = [key for key in keys if key in RESOLVED]
    return "".join(f" {escape(key)}: what each run resolved it to (run.json's {RESOLVED[key]}); a run not started "
                   "yet counts with the runs given the same value." for key in resolved)


def _best_text(metrics: list) -> str:
    """What best_val_acc is, when it is shown ("" when not)."""
    return " best_val_acc (best_acc): a run's best val_acc of any epoch;" if "best_val_acc" in metrics else ""


def group_legend(experiment: Experiment, marker: str = "* = best") -> str:
    """What the grouped table's numbers mean; ``marker`` says how the best group shows."""
    if experiment.trials:
        text = _trials_text(experiment, marker)
    else:
        by = ", ".join(map(_key_text(experiment), experiment.keys)) or "nothing (one group of all runs)"
        text = (f"Grouped by {by}.{_resolved_text(experiment.keys)} Cells: mean ± std over the group's counted "
                f"runs (sample std, ddof=1; none for one run);{_best_text(experiment.metrics)} "
                f"{ranking_text(experiment)}")
        text += f" ({marker})." if experiment.best is not None else "."
        text += lead_text(experiment) + _counting_text(experiment)
    return text + _families_text(experiment, True)


def _families_text(experiment: Experiment, grouped: bool) -> str:
    """What the cells of each family its tables show mean, and (``grouped``) how a group's
    come from its runs': " <legend> <group_legend>" each ("" for none)."""
    texts = [" ".join(filter(None, (f.legend, f.group_legend if grouped else ""))) for f in experiment.families
             if f.in_groups or not grouped]
    return "".join(f" {text}" for text in texts if text)


def runs_legend(experiment: Experiment, prefix: str) -> str:
    """What the per-run table's numbers mean."""
    if experiment.primary.name == "val_acc":
        legend = ("One row per run; epoch: the last one logged of those the spec asked for; "
                  "val_acc and val_loss at the last epoch logged;")
    else:
        legend = f"One row per run; {escape(experiment.primary.name)} at the last value logged;"
    legend = (legend + _best_text(run_metrics(experiment))).rstrip(";") + "."
    legend += _families_text(experiment, False)
    return legend + (f" Run ids: {escape(prefix)}<run>." if prefix else "")
