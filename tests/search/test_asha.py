"""The one prune decision (clusterjob.search.asha) and the random method's draws
(clusterjob.search.record): rungs, the cut, one verdict per trial and rung, and trial n's
values fixed by (seed, n)."""

from __future__ import annotations

import json

from clusterjob.search import asha
from clusterjob.search import record as searchmod

RULES = asha.Rules("val_acc", "max", 1, 3, last=10)


def test_rungs_stand_at_min_epochs_times_reduction_to_the_k_below_the_last_epoch():
    assert [at for _, at in RULES.rungs()] == [1, 3, 9]
    assert RULES.reached(4) == [0, 1] and RULES.reached(0.5) == []
    assert [at for _, at in asha.Rules("loss", "min", 2, 2, last=None).rungs()][:5] == [2, 4, 8, 16, 32]


def test_the_best_third_goes_on_the_best_one_while_fewer_than_the_reduction():
    assert asha.promoted(0.5, [0.5], 3, "max") == (True, 0.5)  # alone: the best
    assert asha.promoted(0.4, [0.5, 0.4], 3, "max") == (False, 0.5)
    assert asha.promoted(0.6, [0.5, 0.1, 0.2, 0.3, 0.9, 0.6], 3, "max") == (True, 0.6)  # top 2 of 6
    assert asha.promoted(0.5, [0.5, 0.1, 0.2, 0.3, 0.9, 0.6], 3, "max") == (False, 0.6)
    assert asha.promoted(0.1, [0.5, 0.1, 0.2], 3, "min") == (True, 0.1)  # a loss: lower is better
    nan = float("nan")
    assert asha.promoted(nan, [0.5, nan], 3, "max") == (False, 0.5)  # a diverged trial stops
    assert asha.promoted(0.4, [nan, 0.4], 3, "min") == (True, 0.4)  # and sets no cut


def test_a_verdict_is_recorded_once_per_trial_and_rung_and_holds_on_resume(tmp_path):
    assert asha.report(tmp_path, 0, 1, 0.9, RULES) is None  # alone at rung 0: goes on
    verdict = asha.report(tmp_path, 1, 1, 0.2, RULES)
    assert verdict is not None and (verdict.rung, verdict.cut, verdict.competing) == (0, 0.9, 2)
    again = asha.report(tmp_path, 1, 3, 0.99, RULES)  # a resumed trial logs past its rung: pruned as it was
    assert again == verdict
    lines = [json.loads(line) for line in (tmp_path / searchmod.RUNGS_FILE).read_text().splitlines()]
    assert [(e["trial"], e["rung"], e["go"]) for e in lines] == [(0, 0, True), (1, 0, False)]
    assert asha.report(tmp_path, 0, 3, 0.95, RULES) is None  # rung 1 decided once for trial 0
    assert [(v.trial, v.rung) for v in asha.verdicts(tmp_path)] == [(0, 0), (1, 0), (0, 1)]


def test_trial_n_draws_the_same_values_whatever_slot_or_order():
    space = searchmod.space_of({"train.lr": {"log_uniform": [1e-4, 0.3]}, "train.batch_size": {"int_uniform": [8, 64]},
                                "train.optimizer": {"choice": ["sgd", "adamw"]}})
    first = [searchmod.draw(space, 7, n) for n in range(20)]
    assert [searchmod.draw(space, 7, n) for n in reversed(range(20))] == first[::-1]
    assert all(1e-4 <= d["train.lr"] <= 0.3 and 8 <= d["train.batch_size"] <= 64 for d in first)
    assert {d["train.optimizer"] for d in first} == {"sgd", "adamw"}
    assert searchmod.draw(space, 8, 0) != first[0]
