"""A run's states and the transitions between them (docs/design.md, "Architecture", the
state table): the one home of the statuses run.json holds, of the moves that lead from
one to another, and of the ends that stand against late writes.

A transition (``start``, ``complete``, ``stop``, ``requeue``, ``fail``, ``cancel``,
``prune``, ``retry``, ``reopen``) names a ``Move``: the state it leads to and the fields
that go with it (when the run ended, its error and the reason). ``clusterjob.core.record.update``
applies the move to the record it reads under run.json's lock (``written``). Where the
run's end stands (cancelled, pruned, or failed by a stall's verdict) the move is ignored:
the ranks of such a run, ended on purpose, may still record a stop or an error of their
own. From every other state it applies: a run's record may lag its processes, and the
last word is the one run.json keeps, so no move is refused for the state it comes from.
A move asked to lead where its transition does not is an error.

Nothing of clusterjob but the clock (core/files.py): the record, the sweep's unmade runs
and every reader use these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Protocol

from clusterjob.core.files import now_iso

PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"
TIMEOUT, PREEMPTED, CANCELLED, PRUNED = "timeout", "preempted", "cancelled", "pruned"
STATUSES = (PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, CANCELLED, PRUNED)
# pruned: a trial of a search that its search stopped early (clusterjob.search.asha): a result, never a failure
FINAL_STATUSES = (COMPLETED, FAILED, CANCELLED, PRUNED)
ACTIVE = (PENDING, RUNNING)  # not ended: waiting for its start, or running
STOPPED = (TIMEOUT, PREEMPTED)  # a stop ended the session: Slurm requeues it, or `resume` continues it
UNKNOWN = "unknown"  # the state shown for a run whose run.json gives none

# Why a run ended as it did, where the state alone does not tell it: the record's ``reason``.
Reason = Literal["stalled"]
STALLED: Reason = "stalled"  # failed by the health watchdog's verdict on a stall (retry or stop)
REASONS: tuple[Reason, ...] = (STALLED,)

# What a move writes, and what a write without one may not change where the run's end stands.
LATE_FIELDS = frozenset(("status", "finished_at", "error", "reason"))
_ENDS = frozenset((CANCELLED, PRUNED, STALLED))  # the ends that stand (``end_of``)
_ENDED_ON_PURPOSE = frozenset((CANCELLED, PRUNED))


@dataclass(frozen=True)
class Rule:
    """A transition's row of the table: the states it leads to, and the ends that stand
    against it (there it is ignored)."""

    leads_to: tuple[str, ...]
    ignored_from: frozenset


TRANSITIONS: dict[str, Rule] = {
    # rank 0 at each start of a session; a stall's failure starts again (its retry, its requeue)
    "start": Rule((RUNNING,), _ENDED_ON_PURPOSE),
    "complete": Rule((COMPLETED,), _ENDS),  # rank 0, the run's last step done
    "stop": Rule(STOPPED, _ENDS),  # a stop signal; or Slurm's word on a job that left the queue so
    "requeue": Rule(STOPPED, _ENDS),  # a stop that requeues the run's Slurm job
    "fail": Rule((FAILED,), _ENDS),
    "cancel": Rule((CANCELLED,), _ENDS),
    "prune": Rule((PRUNED,), _ENDS),  # its search stopped the trial at a rung
    "retry": Rule((PENDING,), _ENDED_ON_PURPOSE),  # after a failure of the machine, a stall's included
    "reopen": Rule((PENDING,), frozenset()),  # `resume`, of a run or a search's trial: on purpose, whatever it was
}
# A write of record fields without a move (an executor of another package may write
# ``status`` itself): as a late write of the ranks; a write of pending follows ``retry``
# and one that says ``reopen`` follows ``reopen``.
WRITE = Rule(STATUSES, _ENDS)


class Stated(Protocol):
    """What the table reads of a run's record (clusterjob.core.record.RunRecord)."""

    @property
    def status(self) -> Optional[str]: ...

    @property
    def reason(self) -> Optional[str]: ...


@dataclass(frozen=True)
class Move:
    """A transition asked of a run: its name and the fields it writes, ``status`` the
    state it leads to. ValueError for a name the table has not, or a state its
    transition does not lead to."""

    name: str
    fields: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        rule = TRANSITIONS.get(self.name)
        if rule is None:
            raise ValueError(f"no transition {self.name!r}: one of {', '.join(TRANSITIONS)}")
        if self.fields.get("status") not in rule.leads_to:
            raise ValueError(f"{self.name} leads to {' or '.join(rule.leads_to)}, not {self.fields.get('status')!r}")
        if not self.fields.keys() <= LATE_FIELDS:
            raise ValueError(f"a move writes {', '.join(sorted(LATE_FIELDS))} only, not {sorted(self.fields)}")

    @property
    def to(self) -> str:
        return self.fields["status"]


def end_of(record: Stated) -> Optional[str]:
    """The end of ``record`` that stands against late writes: cancelled, pruned, or
    stalled (failed by a stall's verdict); None for any other state."""
    if record.status in _ENDED_ON_PURPOSE:
        return record.status
    return STALLED if record.status == FAILED and record.reason == STALLED else None


def rule_of(move: Optional[Move], fields: dict, reopen: bool = False) -> Rule:
    """The row an update follows: its move's, else a plain write's (``WRITE``)."""
    if move is not None:
        return TRANSITIONS[move.name]
    if reopen:
        return TRANSITIONS["reopen"]
    return TRANSITIONS["retry"] if fields.get("status") == PENDING else WRITE


def written(record: Stated, fields: dict, move: Optional[Move] = None, reopen: bool = False) -> dict:
    """What an update writes over ``record``: ``fields`` and the move's, less LATE_FIELDS
    where the run's end stands against it (``rule_of``). TypeError for fields that set
    what the move sets."""
    if move is not None:
        both = fields.keys() & LATE_FIELDS
        if both:
            raise TypeError(f"{move.name} sets {', '.join(sorted(both))} itself")
        fields = {**fields, **move.fields}
    if end_of(record) in rule_of(move, fields, reopen).ignored_from:
        return {key: value for key, value in fields.items() if key not in LATE_FIELDS}
    return fields


# ----------------------------------------------------------------------------- the transitions


def start() -> Move:
    """A session starts: running, its end and error cleared."""
    return Move("start", {"status": RUNNING, "finished_at": None, "error": None, "reason": None})


def complete() -> Move:
    return Move("complete", {"status": COMPLETED, "finished_at": now_iso()})


def stop(to: str, ended: bool = False) -> Move:
    """A stop ended the session (``to``: TIMEOUT near the time limit, else PREEMPTED);
    ``ended``: its job is gone (Slurm's word), so the run's end is now."""
    return Move("stop", {"status": to, **({"finished_at": now_iso()} if ended else {})})


def requeue(to: str) -> Move:
    """A stop that requeues the run's Slurm job: TIMEOUT or PREEMPTED until it starts again."""
    return Move("requeue", {"status": to})


def fail(error: object, reason: Optional[Reason] = None) -> Move:
    """Failed with ``error`` (a clusterjob.core.record.RunError), for ``reason`` where one tells it apart."""
    return Move("fail", {"status": FAILED, "finished_at": now_iso(), "error": error, "reason": reason})


def cancel() -> Move:
    return Move("cancel", {"status": CANCELLED, "finished_at": now_iso()})


def prune() -> Move:
    return Move("prune", {"status": PRUNED, "finished_at": now_iso()})


def retry() -> Move:
    """Pending again for a retry after a failure of the machine: its end and error cleared."""
    return Move("retry", {"status": PENDING, "finished_at": None, "error": None, "reason": None})


def reopen() -> Move:
    """Pending again on purpose (``resume``), whatever it was: its end and error cleared."""
    return Move("reopen", {"status": PENDING, "finished_at": None, "error": None, "reason": None})
