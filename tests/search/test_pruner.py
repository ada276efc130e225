"""The pruning rule behind one call (clusterjob.search.pruner): a search that prunes
nothing has a pruner that never stops a trial, and ASHA answers through the same call,
deciding each rung once and reading no file between two rungs."""

from __future__ import annotations

from clusterjob.search import asha
from clusterjob.search import pruner as prunermod
from clusterjob.search import record as searchmod

ASHA = {"method": "asha", "min_epochs": 1, "reduction": 3}


def record(prune) -> searchmod.SearchRecord:
    return searchmod.SearchRecord(id="20260101-000000-abcd", metric="val_acc", mode="max", prune=prune, last=10)


def test_no_pruning_is_a_pruner_that_never_stops_a_trial(tmp_path):
    found = prunermod.of(tmp_path, record(None))
    assert isinstance(found, prunermod.NoPruning)
    assert [found.prune(trial, 1, value) for trial, value in enumerate([0.9, 0.0, float("nan")])] == [None] * 3
    assert not (tmp_path / searchmod.RUNGS_FILE).exists()
    assert isinstance(prunermod.of(tmp_path, record({"method": "asha"})), prunermod.NoPruning)  # cannot say: none


def test_asha_behind_the_one_call_decides_each_rung_once(tmp_path, monkeypatch):
    first, second = prunermod.of(tmp_path, record(ASHA)), prunermod.of(tmp_path, record(ASHA))  # two trials' rank 0
    assert isinstance(first, asha.Asha)
    assert first.prune(0, 0.5, 0.1) is None  # below the first rung: nothing to decide
    assert first.prune(0, 1, 0.9) is None
    verdict = second.prune(1, 1, 0.2)
    assert verdict is not None and (verdict.trial, verdict.rung, verdict.cut, verdict.go) == (1, 0, 0.9, False)
    assert [(v.trial, v.rung, v.go) for v in asha.verdicts(tmp_path)] == [(0, 0, True), (1, 0, False)]
    asked = []
    monkeypatch.setattr(asha, "report", lambda *args: asked.append(args))
    assert first.prune(0, 2, 0.95) is None and asked == []  # between rungs 1 and 3: no file read
    again = prunermod.of(tmp_path, record(ASHA))  # a resumed trial's rank 0 knows the rungs it passed
    assert again.prune(0, 2, 0.95) is None and asked == []
