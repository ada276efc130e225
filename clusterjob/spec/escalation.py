"""The spec's sections for a run that outgrew its request
(docs/design.md, "Resubmit with more memory or time"): ``resources.on_oom``, ``resources.on_timeout``,
``resources.on_gpu_oom``, and how long a bad node stays excluded
(``resources.bad_node_ttl``). Off by default: a section the spec does not name is None.

Sizes and times are written as Slurm writes them ("512G", "400M"; "2-00:00:00", "90")
and read here into GB and minutes, so the decision (clusterjob.core.retry) works on
numbers. Stdlib only: the CLI checks a spec on login nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from clusterjob.core import retry
from clusterjob.core.errors import SpecError, brief
from clusterjob.spec.fields import Section, opt

_MEM = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)B?", re.IGNORECASE)
_MEM_WORDS = "a size such as 512G or 400M (K, M, G, T; no unit: MB, as Slurm's --mem)"
_MEM_UNIT_GB = {"K": 1 / 1024 ** 2, "M": 1 / 1024, "": 1 / 1024, "G": 1.0, "T": 1024.0}
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_TIME_WORDS = "minutes (90) or Slurm's [D-]HH:MM:SS, such as 2-00:00:00"
_TTL = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_TTL_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SCALE = re.compile(r"/(\d+)")  # what on_gpu_oom.set does to a key: divide it


def mem_gb(key: str, text: str) -> float:
    """A Slurm memory size ("512G", "400M", "300") in GB; SpecError naming ``key`` otherwise."""
    found = _MEM.fullmatch(text.strip())
    if found is None or float(found[1]) <= 0:
        raise SpecError(key, f"{brief(text)} is not a memory size; use {_MEM_WORDS}")
    return float(found[1]) * _MEM_UNIT_GB[found[2].upper()]


def minutes(key: str, value: Union[int, str]) -> float:
    """A Slurm time limit (90, "90", "1:30:00", "2-00:00:00") in minutes."""
    found = _TIME.fullmatch(str(value).strip()) if not isinstance(value, bool) else None
    if found is None:
        raise SpecError(key, f"{brief(value)} is not a time limit; use {_TIME_WORDS}")
    days, first, second, third = (int(part) if part else None for part in found.groups())
    if days is None and third is None:  # M or M:S
        total = (first or 0) + (second or 0) / 60
    else:  # H:M:S, D-H, D-H:M, D-H:M:S
        total = (days or 0) * 1440 + (first or 0) * 60 + (second or 0) + (third or 0) / 60
    if total <= 0:
        raise SpecError(key, f"{brief(value)} is no time; use {_TIME_WORDS}")
    return total


def ttl_s(key: str, text: str) -> float:
    """A duration ("24h", "30m", "2d", "0s": off) in seconds."""
    found = _TTL.fullmatch(text.strip())
    if found is None:
        raise SpecError(key, f"{brief(text)} is not a duration; use a number and s, m, h or d, such as 24h "
                             "(0h: remember no node)")
    return float(found[1]) * _TTL_S[found[2]]


@dataclass(frozen=True)
class OnOomSpec(Section):
    """A run Slurm (or the kernel) ended out of memory is submitted again with more."""

    retry: int = opt(2, "how often a run that ran out of memory is submitted again", ge=1, le=20)
    mem_factor: float = opt(2.0, "each time with its memory request times this", gt=1, le=64)
    max_mem: Optional[str] = opt(None, "never ask for more than this (512G, 400M); null: no ceiling")

    def check(self) -> None:
        if self.max_mem is not None:
            mem_gb("max_mem", self.max_mem)

    @property
    def max_mem_gb(self) -> Optional[float]:
        return mem_gb("max_mem", self.max_mem) if self.max_mem is not None else None


@dataclass(frozen=True)
class OnTimeoutSpec(Section):
    """A run that reached its time limit with no checkpoint to go on from is submitted
    again with more time (one with a checkpoint is requeued as it is)."""

    retry: int = opt(2, "how often a timed-out run with no checkpoint is submitted again", ge=1, le=20)
    time_factor: float = opt(1.5, "each time with its time limit times this", gt=1, le=64)
    max_time: Optional[Union[int, str]] = opt(None, "never ask for more than this (minutes, or 2-00:00:00); "
                                                    "null: no ceiling")

    def check(self) -> None:
        if self.max_time is not None:
            minutes("max_time", self.max_time)

    @property
    def max_time_min(self) -> Optional[float]:
        return minutes("max_time", self.max_time) if self.max_time is not None else None


@dataclass(frozen=True)
class OnGpuOomSpec(Section):
    """A run a rank of which raised torch's OutOfMemoryError (GPU memory) is submitted
    again with the keys ``set`` names divided (train.batch_size: "/2"); only those."""

    retry: int = opt(1, "how often a run that ran out of GPU memory is submitted again", ge=1, le=20)
    set: dict = opt({}, "spec key -> \"/N\": divided by N at each retry (train.batch_size: \"/2\", "
                        "params.batch: \"/2\")")

    def check(self) -> None:
        if not self.set:
            raise SpecError("set", "names no key, so a retry would run out of GPU memory the same way; name "
                                   "what to shrink, such as set: {train.batch_size: \"/2\"}")
        for key, how in self.set.items():
            if not isinstance(how, str) or _SCALE.fullmatch(how) is None or int(how[1:]) < 2:
                raise SpecError(f"set.{key}", f"{brief(how)} is not allowed; use \"/N\" with N >= 2, such as \"/2\"")


def divisor(how: str) -> int:
    """The N of an ``on_gpu_oom.set`` value "/N"."""
    return int(how[1:])


def leaf_value(spec: Any, key: str) -> Any:
    """The value of a dotted spec key (params.NAME: the params'); None where a section on
    the way is null or the key is absent."""
    if key.startswith("params."):
        return spec.params.get(key[len("params."):])
    value: Any = spec
    for part in key.split("."):
        value = getattr(value, part, None)
    return value


def policy(spec: Any, kind: str) -> Optional[tuple[retry.Policy, dict]]:
    """The spec's rule for an escalation of ``kind`` (retry.OOM, TIMEOUT, GPU_OOM) and the
    values it starts from; None where the spec does not ask for it."""
    r = spec.resources
    if kind == retry.OOM and r.on_oom is not None:
        return (retry.Policy(kind, "resources.on_oom", r.on_oom.retry, {"mem_gb": r.on_oom.mem_factor},
                             {"mem_gb": (r.on_oom.max_mem_gb, r.on_oom.max_mem)}), {"mem_gb": r.mem_gb})
    if kind == retry.TIMEOUT and r.on_timeout is not None:
        return (retry.Policy(kind, "resources.on_timeout", r.on_timeout.retry, {"time_min": r.on_timeout.time_factor},
                             {"time_min": (r.on_timeout.max_time_min, r.on_timeout.max_time)},
                             whole=("time_min",)),  # Slurm counts a time limit in whole minutes
                {"time_min": r.time_min})
    if kind == retry.GPU_OOM and r.on_gpu_oom is not None:
        shrunk = r.on_gpu_oom.set
        return (retry.Policy(kind, "resources.on_gpu_oom", r.on_gpu_oom.retry,
                             {key: 1 / divisor(how) for key, how in shrunk.items()}, {}),
                {key: leaf_value(spec, key) for key in shrunk})
    return None



def resized(spec: Any, info: Any) -> Any:
    """``spec`` with the resources its run (``info``, its run.json) has now: mem_gb and
    time_min, the spec's grown by its escalations; what its next job asks for (the new job
    of an escalation, a ``resume``)."""
    r = spec.resources
    minutes = retry.current(info, "time_min", r.time_min)  # whole minutes (Policy.whole)
    return replace(spec, resources=replace(r, mem_gb=retry.current(info, "mem_gb", r.mem_gb), time_min=int(minutes)))
