"""The study of a search (docs/design.md, "Search"): which trials exist, which slot runs
each, how each ended. The one place trials are taken, so that none is run twice or lost.

A slot takes a trial under the study's lock (clusterjob.search.record.study_lock) and the
study records which slot holds it in the same step. Until the slot tells how the trial
ended, the trial stays the slot's: a slot started again (a requeued array task, a resumed
search) takes back the trial it holds and continues it from its checkpoint, never a new
one. A trial held by a slot that no longer exists (a resumed local search with fewer
slots) or by none (a take cut short) is adopted by the next slot that asks.

Two stores, one contract:

- ``FileStudy`` (method random): ``study.jsonl``, one JSON line per event, under the lock;
  trial n's values drawn from a generator seeded by (seed, n). Stdlib only: a random
  search needs no Optuna.
- ``OptunaStudy`` (method tpe): Optuna's JournalStorage with its file backend
  (``study.optuna.log``). Each trial is an Optuna trial (its slot a system attribute),
  its values drawn by a TPESampler of its own seeded by (seed, number): one sampler
  seeded once would draw the same values in every slot's process and again after a
  resume (its first trials are random draws). A pruned trial is told PRUNED with the
  values of its rungs as intermediate values, so TPE sees it as pruned. ``optuna.load_study`` (and
  optuna-dashboard) open it as any Optuna study.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
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
    none) and its state (RUNNING until its slot told how it ended)."""

    number: int
    params: dict
    slot: Optional[int]
    state: str = RUNNING


class Study(abc.ABC):
    """The trials of the search in ``folder`` (its record ``record``)."""

    def __init__(self, folder: Path, record: searchmod.SearchRecord):
        self.folder, self.record = Path(folder), record

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
                return self._assign(orphan, slot)
            limit = searchmod.read(self.folder)[0].trials or self.record.trials or 0  # resume may raise it
            if len(trials) >= limit:
                return None
            return self._new(len(trials), slot)

    def finish(self, number: int, state: str, value: Optional[float]) -> None:
        """Trial ``number`` ended ``state`` (one of ENDS) with the search metric's ``value``
        (None: not logged); once: a trial told already stays as it was told."""
        with searchmod.study_lock(self.folder):
            trial = next((t for t in self._trials() if t.number == number), None)
            if trial is None or trial.state != RUNNING:
                return
            rungs = [v for v in asha.verdicts(self.folder) if v.trial == number]
            self._end(trial, state, value, rungs)

    def trials(self) -> list[Trial]:
        with searchmod.study_lock(self.folder):
            return self._trials()

    @abc.abstractmethod
    def _trials(self) -> list[Trial]:
        """Every trial, by number (the lock is held)."""

    @abc.abstractmethod
    def _new(self, number: int, slot: int) -> Trial:
        """A new trial ``number`` held by ``slot``, its values drawn (the lock is held)."""

    @abc.abstractmethod
    def _assign(self, trial: Trial, slot: int) -> Trial:
        """``trial`` now held by ``slot`` (the lock is held)."""

    @abc.abstractmethod
    def _end(self, trial: Trial, state: str, value: Optional[float], rungs: list) -> None:
        """Record how ``trial`` ended (the lock is held)."""


def open_study(folder: "str | Path", record: Optional[searchmod.SearchRecord] = None) -> Study:
    """The study of the search in ``folder``, by its method."""
    record = record if record is not None else searchmod.read(folder)[0]
    if record.method == "tpe":
        return OptunaStudy(Path(folder), record)
    return FileStudy(Path(folder), record)


def create(folder: Path, record: searchmod.SearchRecord) -> None:
    """Make the study of a new search (Optuna's, for tpe: made once here, so that the
    slots only load it)."""
    if record.method == "tpe":
        OptunaStudy.create(folder, record)
    else:
        (folder / searchmod.STUDY_FILE).touch()


# ----------------------------------------------------------------------------- the built-in store


class FileStudy(Study):
    """study.jsonl: ``new`` (number, slot, values), ``slot`` (a new holder), ``end``
    (state, value) lines, appended under the study's lock."""

    @property
    def journal(self) -> Path:
        return self.folder / searchmod.STUDY_FILE

    def _trials(self) -> list[Trial]:
        found: dict[int, Trial] = {}
        for line in searchmod.read_lines(self.journal):
            number, op = line.get("trial"), line.get("op")
            if not isinstance(number, int) or isinstance(number, bool):
                continue
            if op == "new" and number not in found and isinstance(line.get("params"), dict):
                found[number] = Trial(number, line["params"], _slot(line.get("slot")))
            elif op == "slot" and number in found:
                found[number] = Trial(number, found[number].params, _slot(line.get("slot")), found[number].state)
            elif op == "end" and number in found and line.get("state") in ENDS:
                found[number] = Trial(number, found[number].params, found[number].slot, line["state"])
        return [found[n] for n in sorted(found)]

    def _new(self, number: int, slot: int) -> Trial:
        params = searchmod.draw(self.record.dimensions, self.record.seed or 0, number)
        searchmod.append_line(self.journal, {"op": "new", "trial": number, "slot": slot, "params": params,
                                             "at": now_iso()})
        return Trial(number, params, slot)

    def _assign(self, trial: Trial, slot: int) -> Trial:
        searchmod.append_line(self.journal, {"op": "slot", "trial": trial.number, "slot": slot, "at": now_iso()})
        return Trial(trial.number, trial.params, slot)

    def _end(self, trial: Trial, state: str, value: Optional[float], rungs: list) -> None:
        searchmod.append_line(self.journal, {"op": "end", "trial": trial.number, "state": state, "value": value,
                                             "at": now_iso()})


def _slot(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------- Optuna's store

SLOT_ATTR = "clusterjob_slot"
STATE_ATTR = "clusterjob_state"


class OptunaStudy(Study):
    """Optuna's JournalStorage (file backend) and TPESampler; Optuna is imported here only."""

    def __init__(self, folder: Path, record: searchmod.SearchRecord):
        super().__init__(folder, record)
        self.optuna = _optuna()
        self.study = self.optuna.load_study(study_name=record.id, storage=_storage(folder),
                                            sampler=self._sampler(0))
        self.distributions = distributions(record.dimensions)

    def _sampler(self, number: int) -> Any:
        """Trial ``number``'s own TPESampler (module docstring)."""
        return self.optuna.samplers.TPESampler(seed=searchmod.trial_seed(self.record.seed or 0, number))

    @classmethod
    def create(cls, folder: Path, record: searchmod.SearchRecord) -> None:
        optuna = _optuna()
        optuna.create_study(study_name=record.id, storage=_storage(folder),
                            direction="maximize" if record.mode == "max" else "minimize")

    def _trials(self) -> list[Trial]:
        from optuna.trial import TrialState

        states = {TrialState.COMPLETE: runstate.COMPLETED, TrialState.PRUNED: runstate.PRUNED,
                  TrialState.FAIL: runstate.FAILED}
        found = []
        for t in self.study.get_trials(deepcopy=False):
            state = t.user_attrs.get(STATE_ATTR) or states.get(t.state, RUNNING)
            found.append(Trial(t.number, dict(t.params), _slot(t.system_attrs.get(SLOT_ATTR)),
                               state if state in ENDS else RUNNING))
        return found

    def _new(self, number: int, slot: int) -> Trial:
        self.study.sampler = self._sampler(number)
        trial = self.study.ask(self.distributions)
        self.study._storage.set_trial_system_attr(trial._trial_id, SLOT_ATTR, slot)
        return Trial(trial.number, dict(trial.params), slot)

    def _assign(self, trial: Trial, slot: int) -> Trial:
        """An orphan (a take cut short between Optuna's steps may have left some of its
        values undrawn): its values completed, its slot set."""
        frozen = self.study.get_trials(deepcopy=False)[trial.number]
        self.study.sampler = self._sampler(trial.number)
        live = self.optuna.trial.Trial(self.study, frozen._trial_id)
        params = {name: live._suggest(name, dist) for name, dist in self.distributions.items()}
        self.study._storage.set_trial_system_attr(frozen._trial_id, SLOT_ATTR, slot)
        return Trial(trial.number, params, slot)

    def _end(self, trial: Trial, state: str, value: Optional[float], rungs: list) -> None:
        from optuna.trial import TrialState

        frozen = self.study.get_trials(deepcopy=False)[trial.number]
        storage = self.study._storage
        for verdict in rungs:
            storage.set_trial_intermediate_value(frozen._trial_id, int(verdict.position), verdict.value)
        storage.set_trial_user_attr(frozen._trial_id, STATE_ATTR, state)
        if state == runstate.COMPLETED and value is not None:
            self.study.tell(trial.number, value)
        else:
            self.study.tell(trial.number, state=TrialState.PRUNED if state == runstate.PRUNED else TrialState.FAIL)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise BadInput("search.method: tpe needs Optuna, which is not installed in this Python; "
                       'pip install "clusterjob[search]" (or search with method: random)') from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _storage(folder: Path) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(folder / searchmod.OPTUNA_FILE)))


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
