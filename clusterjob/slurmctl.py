"""Thin wrappers over the Slurm commands clusterjob runs (squeue, sacct, scontrol, scancel).

Each returns plain data or raises nothing on a missing/unreachable Slurm: callers treat
"unknown" as "ask the run folder", never as a state of its own.
"""

from __future__ import annotations

import subprocess
from typing import Optional

TIMEOUT_S = 15


def _run(cmd: list[str]) -> Optional[str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def requeue(job_id: str) -> bool:
    """Requeue one job or one array task (``123_4``), not the whole array."""
    return _run(["scontrol", "requeue", job_id]) is not None


def cancel(job_id: str) -> bool:
    return _run(["scancel", job_id]) is not None


def queue_states(job_ids: list[str]) -> dict[str, str]:
    """State of jobs still in the queue, e.g. {"123_4": "RUNNING"}; finished jobs are absent."""
    if not job_ids:
        return {}
    out = _run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(job_ids)]) or ""
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def accounting_states(job_ids: list[str]) -> dict[str, str]:
    """Final states from sacct (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...); {} without accounting."""
    if not job_ids:
        return {}
    out = _run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)]) or ""
    states = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        states[job] = state.split()[0] if state else ""  # "CANCELLED by 0" -> CANCELLED
    return states


def time_left_s(job_id: str) -> Optional[int]:
    """Seconds before the job's time limit, from squeue (None if unknown or unlimited)."""
    out = (_run(["squeue", "-h", "-o", "%L", "-j", job_id]) or "").strip()
    return parse_duration(out) if out else None


def parse_duration(text: str) -> Optional[int]:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` to seconds; None for INVALID/UNLIMITED."""
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        seconds = 0
        for part in parts:
            seconds = seconds * 60 + part
        return seconds + int(days or 0) * 86400
    except ValueError:
        return None
