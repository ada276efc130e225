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

A run with no Slurm job (local), a job sacct does not know, or a cluster without
accounting has no number: NaN, which the tables show as ``-``. So has the work lost
of your own code that keeps its checkpoints elsewhere. Nothing here writes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Optional, Sequence

import numpy as np

from clusterjob.core import slurmctl
from clusterjob.core.record import is_job_id
from clusterjob.core.slurmctl import Segment

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
    checkpoint_at: Optional[float]
    knows_checkpoints: bool


def slurm_jobs(info: dict) -> list:
    """The Slurm jobs the run ran in, in order: each session's, then the recorded one."""
    jobs = [session.get("job") for session in info["sessions"]] + [info["slurm_job_id"]]
    return list(dict.fromkeys(job for job in jobs if is_job_id(job)))


def columns(infos: Sequence[dict], ask: Callable = slurmctl.segments, now: Optional[float] = None) -> dict:
    """{column: array over runs} of COLUMNS for the runs' ``infos`` (the report's run
    fields), from one sacct query for all of them; {} (and no query) when no run ran
    in a Slurm job."""
    jobs = [slurm_jobs(info) for info in infos]
    wanted = sorted({job for listed in jobs for job in listed})
    if not wanted:
        return {}
    answer = ask(wanted)
    now = time.time() if now is None else now
    costs = [cost_of(info, listed, answer, now) for info, listed in zip(infos, jobs)]
    return {name: np.array([getattr(cost, name) for cost in costs], dtype=float) for name in COLUMNS}


def cost_of(info: dict, jobs: list, answer: Optional[dict], now: float) -> Cost:
    """One run's cost from sacct's ``answer`` ({job: segments}; None: no answer)."""
    if not jobs or answer is None or any(job not in answer for job in jobs):
        return Cost()
    starts = _starts(info["sessions"])
    first = starts[0].at if starts else None
    finished = _seconds(info["finished_at"])
    segments = sorted((seg for job in jobs for seg in answer[job] if _belongs(seg, first, finished)),
                      key=lambda seg: (seg.submit or 0, seg.start or 0))
    if not segments:
        return Cost()
    gpu = sum(seg.elapsed_s * seg.gpus for seg in segments) / 3600
    cpu = sum(seg.elapsed_s * seg.cpus for seg in segments) / 3600
    return Cost(gpu, cpu, _queued(segments, now), _lost([seg for seg in segments if seg.start is not None], starts))


def _belongs(seg: Segment, first: Optional[float], finished: Optional[float]) -> bool:
    """Whether a session of the job id is this run's: not one of an older job that had
    the id (ended before the run's first start), nor of a later one (submitted after
    the run finished)."""
    if first is not None and seg.end is not None and seg.end < first:
        return False
    return finished is None or seg.submit is None or seg.submit <= finished


def _queued(segments: list, now: float) -> float:
    """Seconds from each (re)submission to its start (to its end when it never started,
    to now while it waits)."""
    waits = []
    for seg in segments:
        until = seg.start if seg.start is not None else seg.end if seg.end is not None else now
        if seg.submit is not None:
            waits.append(max(until - seg.submit, 0))
    return float(sum(waits))


def _lost(ran: list, starts: list) -> float:
    """Seconds of run time a later session had to redo (see the module docstring); NaN
    when a stop's next session was not recorded or cannot know its checkpoints."""
    lost = 0.0
    for index, seg in enumerate(ran[:-1]):
        end = seg.end if seg.end is not None else seg.start + seg.elapsed_s
        after = next((start for start in starts if start.at >= end), None)
        if after is None or not after.knows_checkpoints:
            return NAN
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
            found.append(_Start(at, _seconds(session.get("checkpoint_at")), session.get("knows_checkpoints") is True))
    return sorted(found, key=lambda start: start.at)


def _seconds(text: Optional[str]) -> Optional[float]:
    """Unix seconds of one of run.json's times (ISO 8601 with an offset); None when absent,
    unreadable, or without an offset (its zone would be a guess)."""
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except (ValueError, AttributeError):
        return None
    return stamp.timestamp() if stamp is not None and stamp.tzinfo is not None else None
