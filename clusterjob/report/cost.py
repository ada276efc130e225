"""What each run cost on Slurm, from the cluster's accounting (sacct): the report's
compute, queued and lost columns.

- GPU-hours and CPU-hours: each session's run time (ElapsedRaw) times the GPUs, and the
  CPUs, it held (AllocTRES), summed over every session of the run's jobs: requeues,
  retries and the jobs of ``clusterjob resume`` included.
- Queue wait: each session's Submit -> Start (a requeue submits the job again); a
  session still pending counts until now.
- Work lost: for each stop the run went on from, the time from its last checkpoint to
  the stop (the session's End). The checkpoint is the one the next session found
  newest in checkpoints/ (run.json ``sessions``); a restart from scratch loses all
  the run time before it.

Of each job id only the requeue chain around the run's first recorded start counts
(``_chain``): an older or later job that got the same id is not this run's.

A run with no Slurm job (local), a job sacct does not know or whose answer cannot be
read (slurmctl.segments), or a cluster without accounting has no number: NaN, which
the tables show as ``-``. So has the compute of a session that ran but whose AllocTRES
is empty, and the work lost of your own code that keeps its checkpoints elsewhere: an
unknown is never counted as 0. Nothing here writes. ``PROVIDER`` gives the columns to the
report (``provider.Provider``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from clusterjob.core import slurmctl, sweep, units
from clusterjob.core.record import SLURM, is_job_id
from clusterjob.core.slurmctl import Segment
from clusterjob.report.provider import Provider, Runs, number_cell
from clusterjob.report.tables import timestamp
from clusterjob.report.termtable import Column

COLUMNS = ("gpu_hours", "cpu_hours", "queue_wait_s", "lost_s")
NAN = math.nan


@dataclass(frozen=True)
class Cost:
    """One run's cost; NaN where it is not known."""

    gpu_hours: float = NAN
    cpu_hours: float = NAN
    queue_wait_s: float = NAN
    lost_s: float = NAN


@dataclass(frozen=True)
class _Start:
    """A session of the run as run.json recorded it, in Unix seconds."""

    at: float
    job: Optional[str]
    checkpoint_at: Optional[float]
    knows_checkpoints: bool


def slurm_jobs(info: dict, records: Optional[sweep.Records] = None) -> list:
    """The Slurm jobs the run ran in, in order: each session's, then the recorded one
    (its run.json's, else its sweep's record's: clusterjob.core.sweep.job_of)."""
    recorded = info["slurm_job_id"]
    never_started = recorded is None and not info["sessions"] and info.get("path")
    if never_started and sweep.has_job_of(SLURM, info["path"], records):
        job = sweep.job_of_folder(info["path"], records)  # its job in its sweep's record
        recorded = job.id if job is not None and job.executor == SLURM else None
    jobs = [session.get("job") for session in info["sessions"]] + [recorded]
    return list(dict.fromkeys(job for job in jobs if is_job_id(job)))


def columns(infos: Sequence[dict], ask: Callable = slurmctl.segments, now: Optional[float] = None) -> dict:
    """{column: array over runs} of COLUMNS for the runs' ``infos`` (the report's run
    fields), from one sacct query for all of them; {} (and no query) when no run ran
    in a Slurm job."""
    records = sweep.Records()
    jobs = [slurm_jobs(info, records) for info in infos]
    wanted = sorted({job for listed in jobs for job in listed})
    if not wanted:
        return {}
    answer = ask(wanted)
    now = time.time() if now is None else now
    costs = [cost_of(info, listed, answer, now) for info, listed in zip(infos, jobs)]
    return {name: np.array([getattr(cost, name) for cost in costs], dtype=float) for name in COLUMNS}


def shared_compute(infos: Sequence[dict], ask: Callable = slurmctl.segments) -> Optional[tuple]:
    """(GPU-hours, CPU-hours, {job: (GPUs, CPUs) it held}) of every Slurm job the runs
    ran in, each job counted once however many runs shared it (a search's slots: each
    array task runs trial after trial). Of each job only the requeue chain its runs'
    recorded starts lie in counts (``_chain``). None when no run ran in a Slurm job,
    sacct does not answer or does not know a job, or a session's AllocTRES is empty:
    never a guess."""
    records = sweep.Records()
    jobs = [slurm_jobs(info, records) for info in infos]
    wanted = sorted({job for listed in jobs for job in listed})
    answer = ask(wanted) if wanted else None
    if answer is None or any(job not in answer for job in wanted):
        return None
    starts = _starts([session for info in infos for session in info["sessions"]])
    gpu = cpu = 0.0
    held = {}
    for job in wanted:
        segments = _chain(answer[job], [start for start in starts if start.job == job])
        used = _compute(segments)
        if not segments or any(math.isnan(hours) for hours in used):
            return None
        gpu, cpu = gpu + used[0], cpu + used[1]
        held[job] = (segments[-1].gpus or 0, segments[-1].cpus or 0)
    return gpu, cpu, held


def cost_of(info: dict, jobs: list, answer: Optional[dict], now: float) -> Cost:
    """One run's cost from sacct's ``answer`` ({job: segments}; None: no answer). A
    trial of a search on Slurm shares its slot's job with the slot's other trials, so
    the job's cost is not its own: not known."""
    if not jobs or answer is None or any(job not in answer for job in jobs) or info.get("search"):
        return Cost()
    starts = _starts(info["sessions"])
    segments = sorted((seg for job in jobs for seg in _chain(answer[job], [s for s in starts if s.job == job])),
                      key=lambda seg: (seg.submit or 0, seg.start or 0))
    if not segments:
        return Cost()
    gpu, cpu = _compute(segments)
    return Cost(gpu, cpu, _queued(segments, now), _lost([seg for seg in segments if seg.start is not None], starts))


def _compute(segments: list) -> tuple[float, float]:
    """GPU- and CPU-hours of the sessions; NaN for both when a session that ran does not
    say what it held (an empty AllocTRES): its share would be a guess."""
    if any(seg.cpus is None and seg.elapsed_s > 0 for seg in segments):
        return NAN, NAN
    return (sum(seg.elapsed_s * (seg.gpus or 0) for seg in segments) / 3600,
            sum(seg.elapsed_s * (seg.cpus or 0) for seg in segments) / 3600)


# A requeue submits the job again within seconds of the session's end (sacct: Submit of the
# next session vs End of this one); another job that later got the same id does not.
REQUEUE_GAP_S = 10


def _chain(segments: list, starts: list) -> list:
    """The sessions of one job id that are this run's: the requeue chain around the one
    its first recorded start ran in (the newest chain when none is recorded), so that an
    older or later job that had the same id is left out."""
    if not segments:
        return []
    anchor = _segment_of(segments, starts[0].at) if starts else len(segments) - 1
    if anchor is None:
        return []
    first = last = anchor
    while first > 0 and _requeued(segments[first - 1], segments[first]):
        first -= 1
    while last + 1 < len(segments) and _requeued(segments[last], segments[last + 1]):
        last += 1
    return segments[first:last + 1]


def _requeued(before: Segment, after: Segment) -> bool:
    """Whether ``after`` is the session a requeue of ``before`` made."""
    return before.end is not None and after.submit is not None and 0 <= after.submit - before.end <= REQUEUE_GAP_S


def _segment_of(segments: list, at: float) -> Optional[int]:
    """The index of the session that was running at ``at``: the last to start by then
    (sacct's whole seconds start no later than the truth)."""
    started = [i for i, seg in enumerate(segments) if seg.start is not None and seg.start <= at]
    return started[-1] if started else None


def _queued(segments: list, now: float) -> float:
    """Seconds from each (re)submission to its start (to its end when it never started,
    to now while it waits); NaN when a session's submission time is not known."""
    waits = []
    for seg in segments:
        until = seg.start if seg.start is not None else seg.end if seg.end is not None else now
        if seg.submit is None:
            return NAN
        waits.append(max(until - seg.submit, 0))
    return float(sum(waits))


def _lost(ran: list, starts: list) -> float:
    """Seconds of run time a later session had to redo (see the module docstring); NaN
    when a stop's next session was not recorded or cannot know its checkpoints. ``ran``:
    the run's sessions that started, oldest first."""
    ran_in = [_segment_of(ran, start.at) for start in starts]  # which session each start was
    lost = 0.0
    for index, seg in enumerate(ran[:-1]):
        after = next((start for start, i in zip(starts, ran_in) if i is not None and i > index), None)
        if after is None or not after.knows_checkpoints:
            return NAN
        end = seg.end if seg.end is not None else seg.start + seg.elapsed_s
        if after.checkpoint_at is None:  # from scratch: all run time so far is redone
            here = sum(s.elapsed_s for s in ran[:index + 1]) - lost
        else:
            here = end - max(seg.start, after.checkpoint_at)
        lost += max(here, 0.0)
    return lost


def _starts(sessions: list) -> list:
    """run.json's sessions with readable times, oldest first."""
    found = []
    for session in sessions:
        at = _seconds(session.get("at"))
        if at is not None:
            found.append(_Start(at, session.get("job"), _seconds(session.get("checkpoint_at")),
                                session.get("knows_checkpoints") is True))
    return sorted(found, key=lambda start: start.at)


def _seconds(text: Optional[str]) -> Optional[float]:
    """Unix seconds of one of run.json's times (ISO 8601; one without an offset is UTC, as
    ``record.parse_time`` reads every time of a run folder); None when absent or unreadable."""
    stamp = timestamp(text) if isinstance(text, str) else None
    return stamp.timestamp() if stamp is not None else None


# ---------------------------------------------------------------- the report's columns


TEXT = ("compute: GPU-hours (CPU-hours where a run held no GPU) of every Slurm session of a run, requeues and "
        "retries included; queued: time from each (re)submission to its start; lost: run time redone after a "
        "stop, from the last checkpoint to the stop; -: not known (no Slurm job, no accounting, or your code "
        "keeps its checkpoints elsewhere). From sacct.")


class CostColumns(Provider):
    """compute, queued and lost of each run (and summed over a group's runs), when some run
    of the report ran in a Slurm job."""

    fields = ("slurm_job_id", "sessions", "search")  # the jobs a run held, a search's trials not billed
    run_columns = COLUMNS
    group_columns = tuple(f"{column}_sum" for column in COLUMNS)
    reserved = COLUMNS  # a metric named gpu_hours is not the cost
    legend = TEXT
    group_legend = "Groups sum every run's."

    def columns(self, runs: Runs) -> pd.DataFrame:
        """COLUMNS of every run, from one sacct query (none for local runs only)."""
        return pd.DataFrame(columns(runs.results.infos, runs.ask), index=pd.RangeIndex(len(runs.results.infos)))

    def group(self, runs: pd.DataFrame, grouped) -> dict:
        """<column>_sum of every run of a group, counted or not; unknown when one run's is."""
        n = grouped.size()
        return {f"{column}_sum": grouped[column].sum().where(grouped[column].count() == n)
                for column in COLUMNS if column in runs.columns}

    def cells(self, frame: pd.DataFrame, grouped: bool) -> list:
        """compute in GPU-hours (CPU-hours without a GPU), time queued, work lost to stops."""
        suffix = "_sum" if grouped else ""
        compute = [units.compute_hours(g, c) for g, c in zip(frame[f"gpu_hours{suffix}"], frame[f"cpu_hours{suffix}"])]
        shown = [Column("compute", "compute", compute, compute)]
        for name, header in (("queue_wait_s", "queued"), ("lost_s", "lost")):
            cells = [number_cell(name, v) for v in frame[f"{name}{suffix}"]]
            shown.append(Column(header, header, cells, cells))
        return shown


PROVIDER = CostColumns()
