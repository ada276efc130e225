"""Run folders as pandas tables: reading them (this module) and the tables (tables.py).

``load_runs(root)`` gives one row per run, ``load_epochs(root)`` one row per run
and logged line (an epoch of the built-in trainer, a step of a user's own code).
``root`` is ``results/<name>`` (a folder of run folders), ``results/`` (several
names) or a single run folder; which folders are runs is rundir's rule.

Damaged input (a truncated last line of metrics.jsonl, a missing, cut-off or
mistyped run.json, values that are not numbers) never raises: each problem is
emitted as a ``ResultsWarning`` through Python's ``warnings`` module, listed in
``df.attrs["warnings"]`` and in the run's ``warnings`` column, and the run keeps
what could be read (status ``unknown`` when run.json gives none).

Parsed runs are cached in ``<root>/.clusterjob-cache.npz`` (``reading``).
"""

from __future__ import annotations

import os
import warnings

import pandas as pd

from clusterjob.report.reading import Results, ResultsWarning, collect
from clusterjob.report.tables import epochs_frame, runs_frame

__all__ = ["ResultsWarning", "Results", "collect", "load_runs", "load_epochs", "runs_frame", "epochs_frame"]


def _warn(results: Results) -> None:
    """Emit each problem as a ResultsWarning."""
    for message in results.warnings:
        warnings.warn(message, ResultsWarning, stacklevel=3)


def load_runs(root: "str | os.PathLike", cache: bool = True) -> pd.DataFrame:
    """One row per run under ``root``.

    Columns: run_id, name, status (categorical: the documented states, then
    ``unknown`` for runs whose run.json is missing or unreadable), one column per key
    by its dotted name (e.g. ``train.lr``: every key of the runs' params, and every
    spec.yaml key whose value differs between runs of one name), epochs (last epoch logged,
    else the number of lines), val_acc (last value logged), best_val_acc (max over
    epochs), best_epoch, val_loss, train_loss, train_acc (last value logged;
    val_acc_ema / val_acc_tta too when logged), wall_time_s (the sum of the run's
    sessions' running time, ``tables.running_time``; else the sum of epoch_time_s, or
    finished_at - started_at for a run that recorded no sessions), samples_per_s (mean over epochs),
    world_size, slurm_job_id, requeues, started_at, finished_at (UTC datetimes),
    backend, amp, git_sha, error, error_rank, path, warnings, straggler (the rank
    the others waited for: "rank 3 (node4) 45%"). Numbers are float64
    with NaN for missing, except counts (epochs int64; best_epoch, world_size,
    requeues, error_rank nullable Int64). Problems are emitted as
    ``ResultsWarning`` and kept in ``df.attrs["warnings"]``.
    """
    results = collect(root, cache=cache)
    _warn(results)
    frame = runs_frame(results)
    results.save_cache()
    return frame


def load_epochs(root: "str | os.PathLike", cache: bool = True) -> pd.DataFrame:
    """One row per run and logged line under ``root``.

    Columns: run_id and name (categoricals), the key columns, then every metric
    logged by any run (epoch and step int64, nullable Int64 when some lines lack
    them; the others float64, NaN where a line did not log it). Rows are in run
    order, then epoch (or step) order. Problems are emitted as ``ResultsWarning``
    and kept in ``df.attrs["warnings"]``.
    """
    results = collect(root, cache=cache)
    _warn(results)
    frame = epochs_frame(results)
    results.save_cache()
    return frame
