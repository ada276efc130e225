"""Each rank's health file, ``logs/rank<R>.health.json``
(docs/design.md, "Hung and slow ranks"): which process the rank is and how to ask it for its stacks (written when it
starts), and how much of its time it waited in collectives (rewritten every few
seconds). Written by the rank alone, atomically; read by its watcher, by the watchdog's
leader, by ``status`` and by ``clusterjob stack``. Also the one rule for the straggler
over those files: the rank the others wait for is the one that waits least. Stdlib only.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from clusterjob.core.files import loads, now_iso, read_text, write_atomic
from clusterjob.core.procs import ProcessRef
from clusterjob.core.rundir import RunDir

SHOWN_FROM_PCT = 5.0  # status names the slowest rank once the others wait at least this share of their time
MIN_TOTAL_S = 2.0  # a share over less time than this says nothing yet
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Waits:
    """Seconds a rank waited inside collectives out of the seconds measured, since its
    session started and over about the last minute; ``method`` says how they were taken
    (``timed``: the built-in trainer times its own; ``sampled``: its main thread's stack
    sampled at a low rate)."""

    method: str
    wait_s: float = 0.0
    total_s: float = 0.0
    recent_wait_s: float = 0.0
    recent_total_s: float = 0.0

    def share(self) -> Optional[float]:
        """The share of its time the rank waited, over the last minute when that is long
        enough to say, else over its session; None before there is enough to tell."""
        for waited, total in ((self.recent_wait_s, self.recent_total_s), (self.wait_s, self.total_s)):
            if total >= MIN_TOTAL_S:
                return min(1.0, max(0.0, waited / total))
        return None


@dataclass(frozen=True)
class RankHealth:
    """What a rank's health file holds: its rank, session (the same token on every rank
    of one start of the run), host name and Slurm node (what ``--exclude`` takes), its
    process, the signal that makes it write its stacks (None: it takes no such signal),
    its main thread's id (as the stacks name threads) and its waits."""

    rank: int
    session: str
    host: str
    node: str
    ref: Optional[ProcessRef] = None
    stack_signal: Optional[int] = None
    main_thread: Optional[int] = None
    waits: Optional[Waits] = None
    extra: dict = field(default_factory=dict)  # further probes' readings (GPU telemetry)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ref"] = self.ref.to_dict() if self.ref else None
        return out


def write(run: RunDir, health: RankHealth) -> None:
    write_atomic(run.health_file(health.rank), json.dumps(health.to_dict()) + "\n")


def mark_ended(run: RunDir, rank: int, session: str) -> None:
    """``logs/rank<R>.ended``: the rank's process ended (or is about to) in ``session``;
    written by the rank as it stops and by its watcher once it is gone."""
    write_atomic(run.ended_file(rank), json.dumps({"session": session, "at": now_iso()}) + "\n")


def ended_in(run: RunDir, rank: int, session: str) -> bool:
    """Whether the rank's process ended in ``session``."""
    raw = loads(read_text(run.ended_file(rank))[0] or "")
    return isinstance(raw, dict) and raw.get("session") == session


def read(run: RunDir, rank: int) -> Optional[RankHealth]:
    """The rank's health file, or None when it is missing or not one (never raises)."""
    text, _ = read_text(run.health_file(rank), _MAX_BYTES)
    raw = loads(text) if text is not None else None
    if not isinstance(raw, dict):
        return None
    try:
        extra = raw.get("extra")
        return RankHealth(int(raw["rank"]), str(raw["session"]), str(raw["host"]), str(raw["node"]),
                          ProcessRef.from_dict(raw.get("ref")), _int_or_none(raw.get("stack_signal")),
                          _int_or_none(raw.get("main_thread")), _waits(raw.get("waits")),
                          extra if isinstance(extra, dict) else {})
    except (KeyError, TypeError, ValueError):
        return None


def _waits(raw: object) -> Optional[Waits]:
    """A health file's waits; raises TypeError or ValueError when damaged."""
    if not isinstance(raw, dict):
        return None
    numbers = {key: float(raw[key]) for key in ("wait_s", "total_s", "recent_wait_s", "recent_total_s")}
    return Waits(str(raw["method"]), **numbers)


def _int_or_none(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def of_session(run: RunDir, world: int) -> list[RankHealth]:
    """The health files of the run's current start: those of rank 0's session (a rank
    that has not started yet may still hold an earlier one's)."""
    found = [h for h in (read(run, rank) for rank in range(world)) if h is not None]
    first = next((h for h in found if h.rank == 0), None)
    return [h for h in found if first is not None and h.session == first.session]


@dataclass(frozen=True)
class Slowest:
    """The rank the others wait for, and the median share of their time they wait (%)."""

    rank: int
    host: str
    others_wait_pct: float

    def line(self) -> str:
        return (f"slowest: rank {self.rank} ({self.host}), the others wait {self.others_wait_pct:.0f}% "
                "of their time")


def slowest(healths: list[RankHealth]) -> Optional[Slowest]:
    """The rank that waits least in collectives: in DDP every rank waits for the slowest
    at each collective, so every step takes equally long and step times cannot tell;
    the others' share is their median. None with fewer than two ranks measured."""
    shares = [(h, h.waits.share()) for h in healths if h.waits is not None]
    measured = [(h, share) for h, share in shares if share is not None]
    if len(measured) < 2:
        return None
    least, _ = min(measured, key=lambda pair: (pair[1], pair[0].rank))
    others = statistics.median(share for h, share in measured if h is not least)
    return Slowest(least.rank, least.host, 100.0 * others)
