"""A run's states and transitions (clusterjob.core.runstate): which move leads where, the
ends that stand against late writes, and the reason a run ended so, kept with its error."""

from __future__ import annotations

import json

import pytest

from clusterjob.core import record, runstate, slurmctl
from clusterjob.core.record import RunError, RunRecord
from clusterjob.core.rundir import create_run

STALL = RunError(1, "stalled: rank 1 on n2: time.sleep at t.py:4; rank 0 in all_reduce")
# Every state a record may be in: each status, a stall's failure, none (a damaged
# run.json) and one of a later version.
FROM = {**{status: RunRecord(status=status) for status in runstate.STATUSES},
        "stalled": RunRecord(status=runstate.FAILED, error=STALL, reason=runstate.STALLED),
        "none": RunRecord(), "later": RunRecord(status="suspended")}
# The table, written out: where each transition is ignored (the run's end stands).
IGNORED = {"start": {"cancelled", "pruned"}, "retry": {"cancelled", "pruned"}, "reopen": set(),
           **{name: {"cancelled", "pruned", "stalled"}
              for name in ("complete", "stop", "requeue", "fail", "cancel", "prune")}}
MOVES = {"start": runstate.start(), "complete": runstate.complete(), "stop": runstate.stop(runstate.PREEMPTED),
         "requeue": runstate.requeue(runstate.TIMEOUT), "fail": runstate.fail(RunError(None, "boom")),
         "cancel": runstate.cancel(), "prune": runstate.prune(), "retry": runstate.retry(),
         "reopen": runstate.reopen()}


def test_the_table_names_each_transition_and_where_it_leads():
    assert set(runstate.TRANSITIONS) == set(MOVES) == set(IGNORED)
    leads = {name: move.to for name, move in MOVES.items()}
    assert leads == {"start": "running", "complete": "completed", "stop": "preempted", "requeue": "timeout",
                     "fail": "failed", "cancel": "cancelled", "prune": "pruned", "retry": "pending",
                     "reopen": "pending"}
    assert runstate.stop(runstate.TIMEOUT, ended=True).fields.keys() == {"status", "finished_at"}
    assert runstate.requeue(runstate.PREEMPTED).fields == {"status": "preempted"}


@pytest.mark.parametrize("name", sorted(MOVES))
@pytest.mark.parametrize("where", sorted(FROM))
def test_each_move_applies_from_every_state_but_the_ends_that_stand_against_it(name, where):
    move = MOVES[name]
    got = runstate.written(FROM[where], {"requeues": 3}, move)
    if where in IGNORED[name]:
        assert got == {"requeues": 3}  # ignored: the end stands, the other fields are written
    else:
        assert got == {"requeues": 3, **move.fields} and got["status"] == move.to


@pytest.mark.parametrize("ask", [lambda: runstate.stop(runstate.RUNNING), lambda: runstate.requeue("completed"),
                                 lambda: runstate.Move("finish", {"status": "completed"}),
                                 lambda: runstate.Move("cancel", {"status": "cancelled", "hosts": []})])
def test_a_move_the_table_does_not_have_is_refused(ask):
    with pytest.raises(ValueError, match="leads to|no transition|writes"):
        ask()


def test_a_move_and_the_fields_it_sets_cannot_both_be_given():
    with pytest.raises(TypeError, match="fail sets finished_at itself"):
        runstate.written(RunRecord(), {"finished_at": "x"}, runstate.fail(None))


@pytest.mark.parametrize("status, reopen, where, kept", [
    ("completed", False, "cancelled", False), ("pending", False, "cancelled", False),
    ("pending", True, "cancelled", True), ("preempted", False, "stalled", False), ("pending", False, "stalled", True),
    ("running", False, "stalled", False), ("failed", False, "running", True),
])
def test_a_write_without_a_move_follows_the_same_table(status, reopen, where, kept):
    """An executor of another package may write ``status`` itself: a late write of the
    ranks, pending a retry, ``reopen`` the move of that name."""
    got = runstate.written(FROM[where], {"status": status, "error": None, "final": {}}, reopen=reopen)
    assert got == ({"status": status, "error": None, "final": {}} if kept else {"final": {}})


def test_the_reason_is_kept_with_the_stalls_failure_until_a_retry_or_a_start(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(runstate.fail(STALL, runstate.STALLED))
    assert json.loads(run.info_file.read_text())["reason"] == "stalled"
    for late in (runstate.fail(RunError(0, "RuntimeError: Connection closed by peer")), runstate.cancel(),
                 runstate.stop(runstate.PREEMPTED), runstate.complete()):
        kept = run.update(late, stopped_at="x")
        assert (kept.status, kept.error, kept.reason, kept.stopped_at) == ("failed", STALL, "stalled", "x")
    retried = run.update(runstate.retry(), retries=1)
    assert (retried.status, retried.error, retried.reason, retried.retries) == ("pending", None, None, 1)
    run.update(runstate.fail(STALL, runstate.STALLED))
    started = run.update(runstate.start())
    assert (started.status, started.error, started.reason) == ("running", None, None)


def test_an_ordinary_failure_has_no_reason_and_gives_way_to_a_later_move(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    failed = run.update(runstate.fail(RunError(0, "ValueError: bad")))
    assert (failed.status, failed.reason) == ("failed", None)
    assert run.update(runstate.cancel()).status == "cancelled"
    assert run.update(runstate.start()).status == "cancelled"  # a cancel stands: only `resume` reopens it
    assert run.update(runstate.reopen()).status == "pending"


@pytest.mark.parametrize("raw, reason", [
    ({"status": "failed", "error": {"rank": 1, "message": STALL.message, "traceback": ""}}, "stalled"),  # before it
    ({"status": "failed", "error": {"rank": 0, "message": "ValueError: stalled: no"}}, None),
    ({"status": "failed", "error": {"rank": 1, "message": STALL.message}, "reason": None}, None),  # written: as said
    ({"status": "failed", "reason": "stalled"}, "stalled"),
    ({"status": "running"}, None),
])
def test_a_run_json_without_the_reason_is_read_as_its_error_tells(raw, reason):
    got, problems = record.checked(raw)
    assert (got.reason, problems) == (reason, [])


def test_a_reason_of_no_kind_is_a_problem():
    got, problems = record.checked({"status": "failed", "reason": "bored"})
    assert got.reason is None
    assert problems == ["run.json: reason is 'bored' (str), not a reason (stalled); ignored"]


def test_a_write_of_an_error_without_a_move_drops_the_reason_it_replaces(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(runstate.fail(STALL, runstate.STALLED))
    run.update(reopen=True, status="pending", error=None)
    assert run.update(status="failed", error=RunError(0, "ValueError: bad")).reason is None


def test_slurms_ended_states_map_to_run_states_in_one_table():
    assert set(slurmctl.ENDED.values()) <= set(runstate.STATUSES)
    assert {state: slurmctl.ENDED[state] for state in ("COMPLETED", "TIMEOUT", "PREEMPTED", "CANCELLED")} == {
        "COMPLETED": "failed", "TIMEOUT": "timeout", "PREEMPTED": "preempted", "CANCELLED": "cancelled"}
    assert not {"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING"} & slurmctl.ENDED.keys()
