"""The stalls the health watchdog recorded in run.json
(docs/design.md, "Hung and slow ranks"), as every reader needs them: the verdict that ended a session (the launchers
keep it over the ranks' collateral errors, and retry on it), the stall still open (what
``status`` shows), and the words for both. Stdlib only: ``status`` runs on login nodes.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

from clusterjob.core import runstate, units
from clusterjob.core.record import STALLED_ERROR, RunError, RunRecord, Stall, parse_time

PREFIX = STALLED_ERROR  # the error and the retry's reason: "stalled: rank 1 on node2: time.sleep at train.py:40; ..."
ENDING = ("retry", "stop")  # verdicts that end the ranks


def reason(stall: Stall) -> str:
    """The run's error message, and a retry's reason, for a stall that ended its session."""
    return f"{PREFIX}{stall.line}"


def error(stall: Stall) -> RunError:
    """The run's error once a stall ended it: the culprit's rank and line."""
    from clusterjob.core.files import now_iso

    return RunError(stall.rank, reason(stall), "", now_iso())


def verdict(info: RunRecord) -> Optional[Stall]:
    """The stall that ended the run's latest session (retry or stop), while the run's
    error is still that stall's (run.json keeps it against the ranks' late writes:
    clusterjob.core.record.update). None once the run was reopened (a retry, a resume)."""
    if info.error is None or not info.stalls:
        return None
    last = info.stalls[-1]
    if last.action in ENDING and info.error.message == reason(last):
        return last
    return None


def open_stall(info: RunRecord) -> Optional[Stall]:
    """The stall of a running run that no progress ended yet (``on_stall: warn``)."""
    if info.status != runstate.RUNNING or not info.stalls:
        return None
    last = info.stalls[-1]
    return last if last.ended_at is None and last.action == "warn" else None


def culprit(line: Optional[str]) -> str:
    """The culprit's part of a stall line: ``rank 1 on node2: time.sleep at train.py:40``."""
    return (line or "").split("; ", 1)[0]


def summary(stall: Stall, now: Optional[datetime] = None) -> str:
    """``stalled 12.0 min (rank 1 on node2: time.sleep at train.py:40)``: how long no
    rank made progress, and the culprit."""
    since = parse_time(stall.since) or parse_time(stall.at)
    now = now or datetime.now(timezone.utc)
    length = f" {units.duration(max(0.0, (now - since).total_seconds()))}" if since else ""
    return f"stalled{length} ({culprit(stall.line)})"


