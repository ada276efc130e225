"""The study of a search (docs/design.md, "Search"): which trials exist, which slot runs
each, how each ended. The one place trials are taken, so that none is run twice or lost.

A slot takes a trial under the study's lock (clusterjob.search.record.study_lock) and the
study records which slot holds it in the same step. Until the slot tells how the trial
ended, the trial stays the slot's: a slot started again (a requeued array task, a resumed
search) takes back the trial it holds and continues it from its checkpoint, never a new
one. A trial held by a slot that no longer exists (a resumed local search with fewer
slots) or by none (a take cut short) is adopted by the next slot that asks.

One store, ``study.jsonl``: one JSON line per event (``new`` with the trial's values,
``slot`` for a new holder, ``end`` with its state, metric and rung values), appended
under the lock. Only the draw of a new trial's values differs by method:

- ``RandomDraw`` (method random): a generator seeded by (seed, n); stdlib only, so a
  random search needs no Optuna.
- ``TpeDraw`` (method tpe): Optuna's TPESampler, seeded by (seed, n), asked on an Optuna
  study in memory rebuilt from study.jsonl (``optuna_study``): one sampler seeded once
  would draw the same values in every slot's process and again after a resume (its first
  trials are random draws). A pruned trial is PRUNED there with the values of its rungs
  as intermediate values, so TPE sees it as pruned.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from clusterjob.core import runstate
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso
from clusterjob.search import asha
from clusterjob.search import record as searchmod

RUNNING = runstate.RUNNING
# how a trial ended, as its run did
ENDS = (runstate.COMPLETED, runstate.PRUNED, runstate.FAILED, runstate.CANCELLED)


@dataclass(frozen=True)
class Trial:
    """One trial as the study holds it: its number, values, the slot that holds it (None:
    none), its state (RUNNING until its slot told how it ended) and how it ended."""

    number: int
    params: dict
    slot: Optional[int]
    state: str = RUNNING
    value: Optional[float] = None  # the search metric it ended with (None: none logged, or not ended)
    rungs: tuple = ()  # (position, value) of each rung it reached, once ended


class Study:
    """The trials of the search in ``folder`` (its record ``record``), kept in study.jsonl;
    new trials' values drawn by ``draw`` (by the search's method)."""

    def __init__(self, folder: Path, record: searchmod.SearchRecord, draw: "Draw"):
        self.folder, self.record, self.draw = Path(folder), record, draw

    @property
    def journal(self) -> Path:
        return self.folder / searchmod.STUDY_FILE

    def take(self, slot: int, slots: int) -> Optional[Trial]:
        """The trial slot ``slot`` (of ``slots`` that exist now) runs next: the one it
        holds, else one held by no existing slot, else a new one while the search has
        fewer than its ``trials``; None when every trial is taken."""
        with searchmod.study_lock(self.folder):
            trials = self._trials()
            running = [t for t in trials if t.state == RUNNING]
            own = next((t for t in running if t.slot == slot), None)
            if own is not None:
                return own
            orphan = next((t for t in running if t.slot is None or t.slot >= slots), None)
            if orphan is not None:
                searchmod.append_line(self.journal, {"op": "slot", "trial": orphan.number, "slot": slot,
                                                     "at": now_iso()})
                return replace(orphan, slot=slot)
            limit = searchmod.read(self.folder)[0].trials or self.record.trials or 0  # resume may raise it
            if len(trials) >= limit:
                return None
            params = self.draw.values(len(trials), trials)
            searchmod.append_line(self.journal, {"op": "new", "trial": len(trials), "slot": slot, "params": params,
                                                 "at": now_iso()})
            return Trial(len(trials), params, slot)

    def finish(self, number: int, state: str, value: Optional[float]) -> None:
        """Trial ``number`` ended ``state`` (one of ENDS) with the search metric's ``value``
        (None: not logged), and the values of the rungs it reached; once: a trial told
        already stays as it was told."""
        with searchmod.study_lock(self.folder):
            trial = next((t for t in self._trials() if t.number == number), None)
            if trial is None or trial.state != RUNNING:
                return
            rungs = {str(int(v.position)): v.value for v in asha.verdicts(self.folder) if v.trial == number}
            searchmod.append_line(self.journal, {"op": "end", "trial": number, "state": state, "value": value,
                                                 "rungs": rungs, "at": now_iso()})

    def trials(self) -> list[Trial]:
        with searchmod.study_lock(self.folder):
            return self._trials()

    def _trials(self) -> list[Trial]:
        """Every trial, by number, as study.jsonl tells (the lock is held)."""
        return trials_in(self.journal)


def trials_in(journal: Path) -> list[Trial]:
    """The trials study.jsonl ``journal`` tells of; a line that does not fit is skipped."""
    found: dict[int, Trial] = {}
    for line in searchmod.read_lines(journal):
        number, op = line.get("trial"), line.get("op")
        if not isinstance(number, int) or isinstance(number, bool):
            continue
        if op == "new" and number not in found and isinstance(line.get("params"), dict):
            found[number] = Trial(number, line["params"], _slot(line.get("slot")))
        elif op == "slot" and number in found:
            found[number] = replace(found[number], slot=_slot(line.get("slot")))
        elif op == "end" and number in found and line.get("state") in ENDS:
            found[number] = replace(found[number], state=line["state"], value=_number(line.get("value")),
                                    rungs=_rungs(line.get("rungs")))
    return [found[n] for n in sorted(found)]


def open_study(folder: "str | Path", record: Optional[searchmod.SearchRecord] = None) -> Study:
    """The study of the search in ``folder``, drawing by its method."""
    record = record if record is not None else searchmod.read(folder)[0]
    draw: Draw = TpeDraw(record) if record.method == "tpe" else RandomDraw(record)
    return Study(Path(folder), record, draw)


def create(folder: Path, record: searchmod.SearchRecord) -> None:
    """Make the study of a new search (and refuse tpe at once where Optuna is missing)."""
    if record.method == "tpe":
        _optuna()
    (folder / searchmod.STUDY_FILE).touch()


def _slot(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _rungs(value: Any) -> tuple:
    """(position, value) pairs of an end line's rungs; what does not fit is left out."""
    if not isinstance(value, dict):
        return ()
    pairs = [(int(k), _number(v)) for k, v in value.items() if isinstance(k, str) and k.isdigit()]
    return tuple(sorted((k, v) for k, v in pairs if v is not None))


# ----------------------------------------------------------------------------- the draws


class Draw(abc.ABC):
    """How a new trial's values are drawn."""

    def __init__(self, record: searchmod.SearchRecord):
        self.record = record

    @abc.abstractmethod
    def values(self, number: int, trials: list[Trial]) -> dict:
        """Trial ``number``'s values, the study's ``trials`` so far known (the lock is held)."""


class RandomDraw(Draw):
    def values(self, number: int, trials: list[Trial]) -> dict:
        return searchmod.draw(self.record.dimensions, self.record.seed or 0, number)


class TpeDraw(Draw):
    """Optuna's TPESampler of trial ``number`` (module docstring); Optuna is imported here only."""

    def values(self, number: int, trials: list[Trial]) -> dict:
        optuna = _optuna()
        sampler = optuna.samplers.TPESampler(seed=searchmod.trial_seed(self.record.seed or 0, number))
        study = in_memory(self.record, trials, sampler)
        return dict(study.ask(distributions(self.record.dimensions)).params)


SLOT_ATTR = "clusterjob_slot"
STATE_ATTR = "clusterjob_state"


def optuna_study(folder: "str | Path") -> Any:
    """The study of the search in ``folder`` as an Optuna study in memory (what TPE draws
    from; for Optuna's plots): each trial with its values, its slot as a system attribute,
    its state (a completed trial without its metric is FAIL there), its rung values."""
    record = searchmod.read(folder)[0]
    return in_memory(record, trials_in(Path(folder) / searchmod.STUDY_FILE), None)


def in_memory(record: searchmod.SearchRecord, trials: list[Trial], sampler: Any) -> Any:
    optuna = _optuna()
    from optuna.trial import TrialState

    states = {runstate.PRUNED: TrialState.PRUNED, RUNNING: TrialState.RUNNING}
    study = optuna.create_study(direction="maximize" if record.mode == "max" else "minimize", sampler=sampler)
    space = distributions(record.dimensions)
    for t in trials:
        state = states.get(t.state, TrialState.FAIL)
        if t.state == runstate.COMPLETED and t.value is not None:
            state = TrialState.COMPLETE
        try:
            study.add_trial(optuna.trial.create_trial(
                state=state, value=t.value if state == TrialState.COMPLETE else None, params=t.params,
                distributions={k: v for k, v in space.items() if k in t.params}, intermediate_values=dict(t.rungs),
                system_attrs={SLOT_ATTR: t.slot}, user_attrs={} if t.state == RUNNING else {STATE_ATTR: t.state}))
        except ValueError:  # values outside today's space (a study edited by hand): TPE learns nothing from it
            continue
    return study


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise BadInput("search.method: tpe needs Optuna, which is not installed in this Python; "
                       'pip install "clusterjob[search]" (or search with method: random)') from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(space: list) -> dict:
    """Optuna's distribution of each searched key."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    found: dict = {}
    for dim in space:
        if dim.kind == "choice":
            found[dim.key] = CategoricalDistribution(list(dim.args))
        elif dim.kind == "int_uniform":
            found[dim.key] = IntDistribution(dim.args[0], dim.args[1])
        else:
            found[dim.key] = FloatDistribution(dim.args[0], dim.args[1], log=dim.kind == "log_uniform")
    return found
