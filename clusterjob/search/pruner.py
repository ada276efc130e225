"""The pruning rule of a search behind one call (docs/design.md, "Search"), as Optuna's
``BasePruner.prune`` or Ray Tune's ``on_trial_result``: rank 0 of a trial hands each
value of the search's metric it logs, at its position (the epoch, your code's step), to
``prune(trial, position, value)``, which answers None (go on) or the verdict that stops
the trial there (recorded in its run.json as ``pruned``).

A search that prunes nothing (``prune: null``) has a pruner too, ``NoPruning``, which
never stops a trial: no caller asks whether a search prunes. ASHA (clusterjob.search.asha)
is the one rule a spec can name; ``of`` is the one place a search's record picks its rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol

from clusterjob.search import asha
from clusterjob.search.asha import Verdict
from clusterjob.search.record import SearchRecord


class Pruner(Protocol):
    """Whether a trial goes on, asked with each value of the search's metric it logs."""

    def prune(self, trial: int, position: float, value: float) -> Optional[Verdict]:
        """None: trial ``trial`` goes on; else the verdict that stops it at ``position``."""


class NoPruning:
    """The pruner of a search that prunes nothing: every trial runs to its end."""

    def prune(self, trial: int, position: float, value: float) -> Optional[Verdict]:
        return None


def of(folder: "str | Path", record: SearchRecord) -> Pruner:
    """The pruner of the search in ``folder`` (its record ``record``): ASHA by its rules,
    or NoPruning for ``prune: null`` and for a record that cannot say what it prunes by."""
    rules = asha.Rules.of(record)
    return asha.Asha(folder, rules) if rules is not None else NoPruning()
