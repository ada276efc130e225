"""ASHA, the pruner a spec names with ``search.prune`` (docs/design.md, "Search";
clusterjob.search.pruner): asynchronous successive halving (Li et al. 2020), as Optuna's
SuccessiveHalvingPruner decides it.

Rungs stand at ``min_epochs * reduction**k`` (k = 0, 1, ...): epochs of the built-in
trainer, the metric's own steps for your own code. The first time a trial's metric is
logged at or past a rung, its value there is compared with the values every trial
recorded at that rung so far, itself included: the trial goes on iff its value is among
the best ``len(values) // reduction`` of them (the best one while there are fewer than
``reduction``), by the search's mode; else it is pruned. Asynchronous: nobody waits for
a rung to fill; a trial that reaches a rung early is judged against the few before it.
No rung stands at or past the trainer's last epoch: a trial that got there completes.

The decisions are ``rungs.jsonl`` in the search folder, one line per trial and rung, with
the values compared and the cut: written under the study's lock, so decisions take turns,
and once per trial and rung, so a resumed trial that logs a rung again gets the decision
it had. Rank 0 of each trial decides (runner.sinks, through ``Asha.prune``); status and
the report read the lines. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from clusterjob.core import units
from clusterjob.core.files import now_iso
from clusterjob.search import record as searchmod


@dataclass(frozen=True)
class Rules:
    """What a search prunes by: the metric, which way is better, the first rung, the
    reduction factor, and the last position (the trainer's epochs; None: unknown)."""

    metric: str
    mode: str
    min_steps: int
    reduction: int
    last: Optional[int] = None

    @classmethod
    def of(cls, record: searchmod.SearchRecord) -> Optional["Rules"]:
        """The search's rules; None when it prunes nothing (prune: null) or its record
        cannot say."""
        prune = record.prune or {}
        first, factor = prune.get("min_epochs"), prune.get("reduction")
        if not (record.metric and record.mode in ("max", "min") and isinstance(first, int)
                and isinstance(factor, int)) or isinstance(first, bool) or isinstance(factor, bool):
            return None
        return cls(record.metric, record.mode, max(1, first), max(2, factor), record.last)

    def rungs(self) -> Iterator[tuple[int, float]]:
        """(k, position) of every rung, in order (while below ``last``; endless without it)."""
        k, at = 0, self.min_steps
        while self.last is None or at < self.last:
            yield k, at
            if at > 2**62:
                return
            k, at = k + 1, at * self.reduction

    def reached(self, position: float) -> list[int]:
        """The rungs at or below ``position``."""
        found = []
        for k, at in self.rungs():
            if at > position:
                break
            found.append(k)
        return found

    def position(self, rung: int) -> int:
        return self.min_steps * self.reduction ** rung


@dataclass(frozen=True)
class Verdict:
    """A trial's decision at a rung: ``go`` on, or pruned; ``cut`` the value it had to reach."""

    trial: int
    rung: int
    position: float
    value: float
    cut: float
    go: bool
    competing: int = 1  # the values compared, its own included

    def to_dict(self) -> dict:
        return {"trial": self.trial, "rung": self.rung, "at": self.position, "value": self.value, "cut": self.cut,
                "go": self.go, "competing": self.competing, "decided_at": now_iso()}

    @classmethod
    def of(cls, raw: dict) -> Optional["Verdict"]:
        try:
            verdict = cls(int(raw["trial"]), int(raw["rung"]), float(raw["at"]), float(raw["value"]),
                          float(raw["cut"]), bool(raw["go"]), int(raw.get("competing", 1)))
        except (KeyError, TypeError, ValueError):
            return None
        return verdict if type(raw["go"]) is bool else None

    def line(self, metric: str) -> str:
        """``pruned at rung 1 (epoch 3): val_acc 0.41 below the cut 0.57 of 4 trials``."""
        word = "below" if not self.go else "at or past"
        return (f"rung {self.rung} (position {self.position:g}): {metric} {self.value:.4g} {word} the cut "
                f"{self.cut:.4g} of {self.competing} trial(s)")


def pruned_text(pruned: object, metric: str, where: str = "epoch") -> str:
    """``pruned at rung 1 (epoch 3): val_acc 92.77% < cut 96.29%``: a pruned trial's
    verdict (run.json's ``pruned``) in the metric's unit, as ``submit --wait``, ``status``
    and the report say it; ``where``: epoch (the trainer) or step (your code). Only
    ``pruned at rung N`` when the verdict cannot be read."""
    raw = pruned if isinstance(pruned, dict) else {}
    try:
        rung, at, value, cut = int(raw["rung"]), float(raw["at"]), float(raw["value"]), float(raw["cut"])
    except (KeyError, TypeError, ValueError):
        rung_only = raw.get("rung")
        return f"pruned at rung {rung_only}" if type(rung_only) is int else "pruned"
    sign = "<" if value < cut else ">" if value > cut else "="
    said = units.quantity(metric, value) if value == value else "not a number"
    return f"pruned at rung {rung} ({where} {at:g}): {metric} {said} {sign} cut {units.quantity(metric, cut)}"


def promoted(value: float, competing: list[float], reduction: int, mode: str) -> tuple[bool, float]:
    """(whether ``value`` goes on, the cut) among ``competing`` (its own value included):
    the best ``len // reduction`` go on, the best one while there are fewer. A value that
    is not a number (a diverged trial's nan) never goes on and never sets the cut."""
    ranked = sorted((v for v in competing if v == v), reverse=mode == "max")
    if value != value or not ranked:
        return False, ranked[0] if ranked else value
    keep = max(1, len(ranked) // reduction)
    cut = ranked[keep - 1]
    return (value >= cut if mode == "max" else value <= cut), cut


def verdicts(folder: "str | Path") -> list[Verdict]:
    """Every decision recorded in the search's folder, in order."""
    found = (Verdict.of(line) for line in searchmod.read_lines(Path(folder) / searchmod.RUNGS_FILE))
    return [v for v in found if v is not None]


def report(folder: "str | Path", trial: int, position: float, value: float, rules: Rules) -> Optional[Verdict]:
    """Trial ``trial`` logged ``value`` at ``position``: decide each rung it reached that is
    not decided yet, in order, and record it. The verdict that prunes it (also one
    recorded before: a resumed trial is pruned as it was), else None."""
    folder = Path(folder)
    with searchmod.study_lock(folder):
        known = verdicts(folder)
        mine = {v.rung: v for v in known if v.trial == trial}
        stop = next((v for v in mine.values() if not v.go), None)
        for rung in rules.reached(position):
            if stop is not None:
                break
            if rung in mine:
                continue
            competing = [v.value for v in known if v.rung == rung and v.trial != trial] + [value]
            go, cut = promoted(value, competing, rules.reduction, rules.mode)
            verdict = Verdict(trial, rung, position, value, cut, go, len(competing))
            searchmod.append_line(folder / searchmod.RUNGS_FILE, verdict.to_dict())
            stop = None if go else verdict
    return stop


def pending_rung(rules: Rules, decided: set, position: float) -> bool:
    """Whether ``position`` reaches a rung not in ``decided`` (cheap: no file read)."""
    return any(k not in decided for k in rules.reached(position))


class Asha:
    """ASHA as a pruner (clusterjob.search.pruner.Pruner) of the search in ``folder``:
    ``prune`` decides each rung the value reaches that the trial has no decision for
    (``report``). The rungs a trial went on at are remembered, so that the values it logs
    between two rungs read no file."""

    def __init__(self, folder: "str | Path", rules: Rules):
        self.folder, self.rules = Path(folder), rules
        self._passed: dict[int, set] = {}  # trial -> the rungs it went on at

    def prune(self, trial: int, position: float, value: float) -> Optional[Verdict]:
        passed = self._passed.get(trial)
        if passed is None:  # a resumed trial keeps the rungs it passed before
            passed = self._passed[trial] = {v.rung for v in verdicts(self.folder) if v.trial == trial and v.go}
        if not pending_rung(self.rules, passed, position):
            return None
        verdict = report(self.folder, trial, position, value, self.rules)
        passed.update(self.rules.reached(position))
        return verdict
