"""Thin wrappers over the Slurm commands clusterjob runs (squeue, sacct, scontrol, scancel).

None of them raises on a missing or unreachable Slurm. The queries tell a failed query
(None: no Slurm here, controller down, timed out) from an answer ({}: none of these
jobs is in the queue), so that callers never take an error for "the job ended".
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

TIMEOUT_S = 15
# squeue's answer for a single job id that has left the controller's memory (MinJobAge):
# an answer ("not in the queue"), not a failure, although squeue exits 1.
_GONE = "Invalid job id specified"


def _query(cmd: list[str], env: Optional[dict] = None) -> Optional[subprocess.CompletedProcess]:
    """The finished command, or None when it could not run or ran past TIMEOUT_S."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL, errors="replace", env=env)
    except (OSError, subprocess.SubprocessError):
        return None


def _run(cmd: list[str], env: Optional[dict] = None) -> Optional[str]:
    done = _query(cmd, env)
    return done.stdout if done is not None and done.returncode == 0 else None


def ask(cmd: list[str], stdin: Optional[str] = None) -> Optional[subprocess.CompletedProcess]:
    """A read-only Slurm command's result (any exit status), None when it could not run."""
    if stdin is None:
        return _query(cmd)
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None


def requeue(job_id: str, hold: bool = False) -> bool:
    """Requeue one job or one array task (``123_4``), not the whole array; with ``hold``
    held until ``release`` (so that it is changed before it can start)."""
    return _run(["scontrol", "requeuehold" if hold else "requeue", job_id]) is not None


def exclude_nodes(job_id: str, nodes: list[str]) -> bool:
    """Keep a pending job off ``nodes`` (its ExcNodeList)."""
    return _run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"]) is not None


def release(job_id: str) -> bool:
    """Let a held job start."""
    return _run(["scontrol", "release", job_id]) is not None


def start_later(job_id: str, seconds: float) -> bool:
    """Hold a requeued (pending) job until ``seconds`` from now, unless Slurm holds it
    longer already (its own delay of a requeued job); False when that did not work."""
    out = _run(["scontrol", "show", "job", "-o", job_id]) or ""
    found = re.search(r"(?:^|\s)StartTime=(\S+)", out)
    try:
        held_s = (datetime.fromisoformat(found.group(1)) - datetime.now()).total_seconds() if found else 0.0
    except ValueError:  # StartTime=Unknown
        held_s = 0.0
    if held_s >= seconds:
        return True
    return _run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{math.ceil(seconds)}"]) is not None


def previous_state(job_id: str) -> Optional[str]:
    """How the job's session before this one ended (sacct -D lists each session of a
    requeued job: REQUEUED, PREEMPTED, NODE_FAIL, ...); None without accounting or
    without an earlier session."""
    out = _run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", job_id]) or ""
    states = [state.split()[0] for job, _, state in (line.partition("|") for line in out.splitlines())
              if job == job_id and state.split()]
    return states[-2] if len(states) >= 2 else None


def cancel(job_id: str) -> bool:
    return _run(["scancel", job_id]) is not None


def queue_states(job_ids: list[str]) -> Optional[dict[str, str]]:
    """State of jobs still in the queue, e.g. {"123_4": "RUNNING"}; jobs that left it are
    absent; None when squeue did not answer."""
    if not job_ids:
        return {}
    done = _query(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(job_ids)])
    if done is None:
        return None
    if done.returncode != 0:
        return {} if _GONE in done.stderr else None
    return dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)


def accounting_states(job_ids: list[str]) -> Optional[dict[str, str]]:
    """Final states from sacct (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...); None when
    sacct did not answer (no accounting on this cluster, or unreachable)."""
    if not job_ids:
        return {}
    out = _run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
    if out is None:
        return None
    states = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        states[job] = state.split()[0] if state.split() else ""  # "CANCELLED by 0" -> CANCELLED
    return states


def submit_time(job_id: str) -> Optional[str]:
    """The job's SubmitTime as ``scontrol show job`` gives it (None when it does not
    answer). A requeue sets it anew; a later job that gets the same id has its own."""
    out = _run(["scontrol", "show", "job", "-o", job_id]) or ""
    found = re.search(r"(?:^|\s)SubmitTime=(\S+)", out)
    return found.group(1) if found else None


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


def max_array_size(default: int = 1001) -> int:
    """The cluster's MaxArraySize (array indices run 0 .. MaxArraySize-1); Slurm's
    default when the controller does not say."""
    for line in (_run(["scontrol", "show", "config"]) or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return default


@dataclass(frozen=True)
class Segment:
    """One session of a job as sacct -D lists it (a requeued job has one per start): its
    state, when it was (re)submitted, started and ended (Unix seconds; None: not yet),
    seconds it ran, and the CPUs and GPUs it held."""

    job: str
    state: str
    submit: Optional[int]
    start: Optional[int]
    end: Optional[int]
    elapsed_s: int
    cpus: int
    gpus: int


_SEGMENT_FIELDS = "JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES"
_IDS_PER_QUERY = 500  # a command line of a few KiB, whatever the sweep


def segments(job_ids: list[str]) -> Optional[dict[str, list[Segment]]]:
    """{job id: its sessions, oldest first} from sacct (every requeued session, -D); a
    job sacct does not know is absent; None when sacct did not answer (no accounting on
    this cluster, or unreachable). An array is asked once for all its tasks. Times are
    asked as Unix seconds (SLURM_TIME_FORMAT), so no time zone is guessed."""
    wanted = set(job_ids)
    asked = sorted({job.split("_")[0] for job in wanted})
    found: dict[str, list[Segment]] = {}
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    for first in range(0, len(asked), _IDS_PER_QUERY):
        chunk = ",".join(asked[first:first + _IDS_PER_QUERY])
        out = _run(["sacct", "-D", "-X", "-n", "-P", "-o", _SEGMENT_FIELDS, "-j", chunk], env)
        if out is None:
            return None
        for segment in filter(None, map(_segment, out.splitlines())):
            if segment.job in wanted:
                found.setdefault(segment.job, []).append(segment)
    return {job: sorted(listed, key=lambda seg: seg.submit or 0) for job, listed in found.items()}


def _segment(line: str) -> Optional[Segment]:
    """One line of ``segments``' sacct query; None when it is not one."""
    parts = line.split("|")
    if len(parts) != 7 or not parts[5].isdigit():
        return None
    tres = dict(item.partition("=")[::2] for item in parts[6].split(",") if "=" in item)
    submit, start, end = (int(text) if text.isdigit() else None for text in parts[2:5])  # Unknown, None
    return Segment(parts[0], (parts[1].split() or [""])[0], submit, start, end, int(parts[5]),
                   _count(tres.get("cpu")), _count(tres.get("gres/gpu")))


def _count(text: Optional[str]) -> int:
    return int(text) if text is not None and text.isdigit() else 0
