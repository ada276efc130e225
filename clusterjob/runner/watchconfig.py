"""What a rank tells its watcher (docs/design.md, "Hung and slow ranks"): the one
argument of ``python -m clusterjob.runner.watchdog``, a typed record that crosses the
process boundary as JSON (``to_json`` in the rank, ``of`` in the watcher). A value that
is not allowed is refused at either end, with its field, the value and what to give
instead. Stdlib and clusterjob.core only: the watcher loads no torch and no spec.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Callable, Optional

from clusterjob.core.errors import brief
from clusterjob.core.files import is_number

ACTIONS = ("retry", "stop", "warn")  # a stall's verdict, as HealthSpec.action resolves on_stall


class WatchConfigError(ValueError):
    """The watch config holds a value that is not allowed (``field``: which; "": the whole)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"watch config: {field}: {message}" if field else f"watch config: {message}")


@dataclass(frozen=True)
class WatchConfig:
    """The run and the rank watched, and the spec's ``health:`` as resolved for this rank.
    The rest the watcher reads from the rank's health file."""

    run: str  # the run's folder
    rank: int
    world: int
    session: str  # this start of the run: the same token on every rank
    stall_s: Optional[float]  # no progress on any rank for this long is a stall; None: no stall watch
    action: str  # a stall's verdict: one of ACTIONS
    output: bool  # a line of a rank's output is progress
    straggler_pct: float  # warn when the others wait for the slowest rank more than this % of their time
    # torch's flight recorder under NCCL: a write to <nccl_pipe><rank>.pipe makes it dump to
    # <nccl_trace><rank> (None: no NCCL, or no such file: no trace beside the stacks)
    nccl_pipe: Optional[str] = None
    nccl_trace: Optional[str] = None

    def __post_init__(self) -> None:
        for name, (allowed, fix) in _RULES.items():
            value = getattr(self, name)
            if not allowed(value):
                raise WatchConfigError(name, f"{brief(value)} is not allowed; {fix}")
        if self.rank >= self.world:
            raise WatchConfigError("rank", f"{self.rank} is not a rank of world {self.world}; "
                                           f"give 0 to {self.world - 1}")

    def to_json(self) -> str:
        """The config as the watcher's argument (``of`` reads it back)."""
        return json.dumps(asdict(self))

    @classmethod
    def of(cls, text: str) -> "WatchConfig":
        """The config that ``to_json`` wrote; WatchConfigError names what is wrong with it."""
        try:
            raw = json.loads(text)
        except ValueError as err:
            raise WatchConfigError("", f"not JSON ({err}); pass WatchConfig.to_json()'s text") from None
        if not isinstance(raw, dict):
            raise WatchConfigError("", f"{brief(raw)} is not a JSON object; pass WatchConfig.to_json()'s text")
        names = [f.name for f in fields(cls)]
        for key in raw:
            if key not in names:
                raise WatchConfigError(str(key), f"no such field; the fields are {', '.join(names)}")
        for f in fields(cls):
            if f.default is MISSING and f.name not in raw:
                raise WatchConfigError(f.name, "missing; give it (WatchConfig.to_json() writes every field)")
        return cls(**raw)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _optional_text(value: Any) -> bool:
    return value is None or _text(value)


def _stall_s(value: Any) -> bool:
    return value is None or (is_number(value) and math.isfinite(value) and value > 0)


def _percent(value: Any) -> bool:
    return is_number(value) and 0 < value <= 100


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "run": (_text, "give the run's folder"),
    "world": (lambda v: _whole(v) and v >= 1, "give the number of ranks, a whole number >= 1"),
    "rank": (lambda v: _whole(v) and v >= 0, "give the rank watched, a whole number >= 0"),
    "session": (_text, "give the session's token (the same on every rank)"),
    "stall_s": (_stall_s, "give the seconds without progress that make a stall (> 0), or null: no stall watch"),
    "action": (lambda v: v in ACTIONS, f"give one of {', '.join(ACTIONS)} (on_stall as resolved)"),
    "output": (lambda v: isinstance(v, bool), "give true or false (whether a rank's output is progress)"),
    "straggler_pct": (_percent, "give a share in percent, a number above 0 and at most 100"),
    "nccl_pipe": (_optional_text, "give the prefix of torch's NCCL debug pipe, or null without NCCL"),
    "nccl_trace": (_optional_text, "give the prefix of torch's NCCL trace dump, or null without NCCL"),
}
