"""The ``search:`` section (docs/design.md, "Search"): random or Bayesian (tpe) search over
a space of spec keys, with ASHA pruning. Its keys and their values are checked here; which
keys may be searched (those a sweep may set) and the values the space may take (each
bound applied to the spec) are checked with the whole spec (clusterjob.spec.schema).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from clusterjob.core.errors import SpecError, brief, key_text, with_type
from clusterjob.spec.fields import Section, check_kind, did_you_mean, opt

MAX_TRIALS = 10_000
# the distributions a searched key may have: name -> how many numbers its list holds (None: a list of choices)
DISTRIBUTIONS = {"uniform": 2, "log_uniform": 2, "int_uniform": 2, "choice": None}
OPTUNA_EXTRA = 'pip install "clusterjob[search]"'
_EXAMPLE = "{log_uniform: [1.0e-4, 0.3]}"


@dataclass(frozen=True)
class PruneSpec(Section):
    """ASHA: a trial below the best 1/reduction at a rung stops there (pruned)."""

    method: Literal["asha"] = opt("asha", "asha: asynchronous successive halving")
    min_epochs: int = opt(1, "the first rung: epochs of the built-in trainer, the metric's steps for your own code",
                          ge=1)
    reduction: int = opt(3, "rungs at min_epochs x reduction^k; the best 1/reduction at a rung go on", ge=2)


@dataclass(frozen=True)
class SearchSpec(Section):
    """Trials drawn from ``space`` one at a time, ``parallel`` at once, each an ordinary run."""

    method: Literal["random", "tpe"] = opt("random", "random | tpe (Optuna's TPESampler: pip install "
                                                     "\"clusterjob[search]\")")
    trials: int = opt(16, "how many trials in all", ge=1)
    parallel: int = opt(1, "trials at once: the Slurm array's slots, locally process groups", ge=1)
    metric: Optional[str] = opt(None, "what the search ranks and prunes by; null: val_acc for the built-in trainer, "
                                      "the first of entrypoint.metrics for your own code")
    mode: Optional[Literal["max", "min"]] = opt(None, "max | min; null: min for a name with loss or err, else max")
    seed: int = opt(0, "seeds the sampler: the same seed draws the same trials", ge=0)
    space: dict = opt({}, "dotted key -> {uniform: [lo, hi]} | {log_uniform: [lo, hi]} | {int_uniform: [lo, hi]} | "
                          "{choice: [values]}; what a sweep may set may be searched")
    prune: Optional[PruneSpec] = opt(None, "{method: asha, min_epochs: 1, reduction: 3}; null: every trial runs to "
                                           "the end")

    def check(self) -> None:
        if self.trials > MAX_TRIALS:
            raise SpecError("trials", f"{self.trials} is more than {MAX_TRIALS}; split the search or run fewer trials")
        if self.parallel > self.trials:
            raise SpecError("parallel", f"{self.parallel} slots for {self.trials} trial(s): at most {self.trials} "
                                        f"can run at once; set parallel to at most {self.trials}")
        if self.metric is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", self.metric):
            raise SpecError("metric", f"{brief(self.metric)} is not a metric name; use letters, digits, '_' and '.', "
                                      "e.g. val_acc")
        if not self.space:
            raise SpecError("space", f"is empty: nothing to search; give at least one key, e.g. train.lr: {_EXAMPLE}")
        object.__setattr__(self, "space", {key: _distribution(key, value) for key, value in self.space.items()})
        why = _optuna_missing() if self.method == "tpe" else None
        if why is not None:
            raise SpecError("method", f"tpe needs Optuna, which this Python cannot import ({why}); {OPTUNA_EXTRA}, "
                                      "or use method: random")


def _optuna_missing() -> Optional[str]:
    """Why Optuna cannot be imported here (None: it can). Imported for real (a fifth of a
    second), as the slots will: an install that is there but broken (a dependency
    missing) is refused here too, not when the search's folder is made."""
    try:
        import optuna  # noqa: F401
    except Exception as err:  # whatever its import raises, tpe cannot run
        return f"{type(err).__name__}: {err}"
    return None


def _distribution(key: Any, value: Any) -> dict:
    """One entry of the space, checked: a mapping of one distribution to its list."""
    where = f"space.{key_text(key)}"
    if not isinstance(value, dict) or len(value) != 1:
        raise SpecError(where, f"expected one distribution such as {_EXAMPLE}, got {with_type(value)}; "
                               f"the distributions are {', '.join(DISTRIBUTIONS)}")
    kind, args = next(iter(value.items()))
    if kind not in DISTRIBUTIONS:
        raise SpecError(where, f"{brief(kind)} is no distribution{did_you_mean(kind, DISTRIBUTIONS)}; use one of "
                               f"{', '.join(DISTRIBUTIONS)}")
    where = f"{where}.{kind}"
    if not isinstance(args, (list, tuple)):
        raise SpecError(where, f"expected a list, got {with_type(args)}; e.g. {kind}: {_example(kind)}")
    if kind == "choice":
        return {kind: _choices(where, list(args))}
    return {kind: _range(where, kind, list(args))}


def _example(kind: str) -> str:
    return {"uniform": "[0.0, 0.5]", "log_uniform": "[1.0e-4, 0.3]", "int_uniform": "[16, 256]",
            "choice": "[sgd, adamw]"}[kind]


def _choices(where: str, values: list) -> list:
    if not values:
        raise SpecError(where, f"[] gives nothing to choose from; list at least one value, e.g. {_example('choice')}")
    for index, value in enumerate(values):
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise SpecError(f"{where}[{index}]", f"{with_type(value)} is not a plain value; a choice is text, a "
                                                 "number, true/false or null")
        check_kind(f"{where}[{index}]", value, {})
    if len({repr(v) for v in values}) != len(values):
        raise SpecError(where, f"{brief(values)} lists a value twice; list each choice once")
    return values


def _range(where: str, kind: str, values: list) -> list:
    """[low, high]: numbers (whole for int_uniform), low below high (int_uniform: at most),
    both positive for log_uniform."""
    if len(values) != 2:
        raise SpecError(where, f"{brief(values)} has {len(values)} value(s); give [low, high], e.g. "
                               f"{kind}: {_example(kind)}")
    whole = kind == "int_uniform"
    for index, value in enumerate(values):
        number = isinstance(value, int) if whole else isinstance(value, (int, float))
        if isinstance(value, bool) or not number:
            word = "a whole number" if whole else "a number"
            raise SpecError(f"{where}[{index}]", f"expected {word}, got {with_type(value)}")
        check_kind(f"{where}[{index}]", value, {})
        if not whole and not math.isfinite(float(value)):
            raise SpecError(f"{where}[{index}]", f"{value!r} must be a finite number")
    low, high = values
    if (low > high) if whole else (low >= high):
        relation = "above" if low > high else "equal to"
        raise SpecError(where, f"[{low!r}, {high!r}] is an empty range: the low end is {relation} the high end; "
                               f"give [low, high] with low {'<=' if whole else '<'} high")
    if kind == "log_uniform" and low <= 0:
        raise SpecError(where, f"[{low!r}, {high!r}]: a log range must be positive (log of {low!r} is undefined); "
                               f"give a low end above 0, e.g. [1.0e-4, {high!r}], or use uniform")
    return [low, high] if whole else [float(low), float(high)]
