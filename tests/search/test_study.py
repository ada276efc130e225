"""The study of a tpe search (clusterjob.search.study, its TpeDraw; docs/design.md
"Search"), without training: each slot's process opens the study on its own, so two
openings of one folder stand for two slots (or a slot and the resumed search). Trial n's
values come from Optuna's TPESampler seeded by (seed, n): never the same in two
processes, never again after a resume; a slot started again takes back the trial it
holds; how a trial ended reaches the Optuna study TPE draws from as Optuna's own states."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clusterjob.search import asha
from clusterjob.search import record as searchmod
from clusterjob.search import study as studymod

optuna = pytest.importorskip("optuna", reason="Optuna is not installed here (scripts/setup-venv installs it)")

SPACE = {"train.lr": {"log_uniform": [1.0e-4, 0.3]}, "train.weight_decay": {"choice": [0.0, 5.0e-4]},
         "train.batch_size": {"int_uniform": [8, 64]}, "params.dropout": {"uniform": [0.0, 0.5]}}


def new_search(folder: Path, trials: int = 6, seed: int = 3, prune: bool = True) -> searchmod.SearchRecord:
    folder.mkdir(parents=True, exist_ok=True)
    record = searchmod.update(folder, id="20260101-000000-abcd", method="tpe", trials=trials, parallel=2,
                              metric="val_acc", mode="max", seed=seed, space=SPACE, last=4,
                              prune={"method": "asha", "min_epochs": 1, "reduction": 2} if prune else None)
    studymod.create(folder, record)
    return record


def journal(folder: Path) -> list:
    """The trials of the study as Optuna reads them (the study TPE draws from)."""
    return studymod.optuna_study(folder).get_trials()


def within(params: dict) -> bool:
    return (1.0e-4 <= params["train.lr"] <= 0.3 and params["train.weight_decay"] in (0.0, 5.0e-4)
            and isinstance(params["train.batch_size"], int) and 8 <= params["train.batch_size"] <= 64
            and 0.0 <= params["params.dropout"] <= 0.5)


def first_proposal(seed: int, number: int) -> dict:
    """What Optuna's TPESampler seeded for trial ``number`` proposes on a study of its own
    (TPE's first trials are random draws, whatever the others gave)."""
    sampler = optuna.samplers.TPESampler(seed=searchmod.trial_seed(seed, number))
    return optuna.create_study(sampler=sampler).ask(studymod.distributions(searchmod.space_of(SPACE))).params


def test_two_slots_processes_draw_distinct_values_the_same_whoever_draws(tmp_path):
    record = new_search(tmp_path / "a")
    one, two = studymod.open_study(tmp_path / "a"), studymod.open_study(tmp_path / "a")  # two slots' processes
    taken = [one.take(0, 2), two.take(1, 2)]
    assert [t.number for t in taken] == [0, 1] and [t.slot for t in taken] == [0, 1]
    assert taken[0].params != taken[1].params and all(within(t.params) for t in taken)
    # the other way round, in another folder: each trial has the values its number gives
    new_search(tmp_path / "b")
    other = studymod.open_study(tmp_path / "b")
    swapped = [other.take(1, 2), other.take(0, 2)]
    assert [t.params for t in swapped] == [t.params for t in taken]
    assert [t.params for t in taken] == [first_proposal(record.seed or 0, n) for n in (0, 1)]
    held = journal(tmp_path / "a")
    assert [(t.number, t.params, t.system_attrs[studymod.SLOT_ATTR]) for t in held] == \
        [(t.number, t.params, t.slot) for t in taken]
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in held)


def test_a_slot_started_again_takes_back_its_trial_and_an_orphan_is_adopted(tmp_path):
    new_search(tmp_path)
    first = studymod.open_study(tmp_path).take(0, 2)
    orphan = studymod.open_study(tmp_path).take(1, 2)
    again = studymod.open_study(tmp_path)  # a requeued slot 0, a resumed search with one slot
    assert again.take(0, 2) == first
    adopted = again.take(0, 1)  # slot 0 holds trial 0 still: it is taken back before any orphan
    assert adopted == first
    again.finish(0, "completed", 0.5)
    adopted = again.take(0, 1)  # slot 1 is gone: its trial goes to slot 0, its values kept
    assert (adopted.number, adopted.params, adopted.slot) == (1, orphan.params, 0)
    assert journal(tmp_path)[1].system_attrs[studymod.SLOT_ATTR] == 0
    assert len(journal(tmp_path)) == 2  # no new trial was drawn


def test_how_each_trial_ended_is_optunas_state_told_once(tmp_path):
    record = new_search(tmp_path, trials=4)
    study = studymod.open_study(tmp_path)
    for slot in range(4):
        study.take(slot, 4)
    rules = asha.Rules.of(record)
    assert rules is not None
    asha.report(tmp_path, 0, 1, 0.8, rules)
    asha.report(tmp_path, 1, 1, 0.2, rules)  # below trial 0 at rung 1: pruned there
    asha.report(tmp_path, 1, 1, 0.9, rules)  # a second report at a decided rung changes nothing
    study.finish(0, "completed", 0.85)
    study.finish(1, "pruned", None)
    study.finish(2, "failed", None)
    study.finish(3, "completed", None)  # no metric logged: Optuna cannot rank it, it is failed there
    study.finish(0, "failed", None)  # told already: stays completed
    held = journal(tmp_path)
    states = optuna.trial.TrialState
    assert [t.state for t in held] == [states.COMPLETE, states.PRUNED, states.FAIL, states.FAIL]
    assert held[0].value == pytest.approx(0.85) and held[1].intermediate_values == {1: pytest.approx(0.2)}
    assert [t.user_attrs[studymod.STATE_ATTR] for t in held] == ["completed", "pruned", "failed", "completed"]
    assert [t.state for t in study.trials()] == ["completed", "pruned", "failed", "completed"]
    assert study.take(0, 4) is None  # every trial taken


def test_past_its_random_start_tpe_draws_from_the_results_pruned_ones_included(tmp_path):
    """12 trials (TPE models past its 10 random ones), a third pruned: the values stay
    within the space, none drawn twice, Optuna reads every one of them."""
    record = new_search(tmp_path, trials=12)
    rules = asha.Rules.of(record)
    assert rules is not None
    study = studymod.open_study(tmp_path)
    for number in range(12):
        trial = studymod.open_study(tmp_path).take(number % 2, 2) if number % 3 else study.take(number % 2, 2)
        assert trial is not None and trial.number == number and within(trial.params)
        score = -abs(math.log10(trial.params["train.lr"]) + 2)  # best near lr 0.01
        if number % 3 == 2:
            asha.report(tmp_path, number, 1, score - 10, rules)
            study.finish(number, "pruned", None)
        else:
            study.finish(number, "completed", score)
    held = journal(tmp_path)
    assert [t.number for t in held] == list(range(12))
    assert len({tuple(sorted(t.params.items())) for t in held} ) == 12
    assert sum(t.state == optuna.trial.TrialState.PRUNED for t in held) == 4
