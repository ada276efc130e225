"""Reading a launcher's variables (the task-side environments' helpers): an integer in
its bounds, the first of several names that is set. Every error is one EnvError line
naming the variable, its value and the fix (``hint``), so that a wrong count shows up
before any rendezvous, not as a rendezvous that hangs until its timeout. Stdlib only.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional, Sequence

from clusterjob.core.errors import EnvError, brief

NON_NEGATIVE = re.compile(r"[0-9]+")
# Ranks, sizes and job ids are far shorter; a longer number is garbage (and int() of
# thousands of digits is slow or refused).
_MAX_DIGITS = 18


def first_set(environ: Mapping[str, str], names: Iterable[str]) -> Optional[tuple[str, str]]:
    """(name, value) of the first of ``names`` present in ``environ``."""
    for name in names:
        if name in environ:
            return name, environ[name]
    return None


def require_first(environ: Mapping[str, str], names: Sequence[str], why: str, hint: str) -> str:
    """The first of ``names`` that is set; an EnvError naming all of them if none is
    (``why``: what made them needed)."""
    found = first_set(environ, names)
    if found is None:
        raise EnvError(f"{why} but none of {', '.join(names)} is. Hint: {hint}")
    return found[0]


def env_int(
    environ: Mapping[str, str],
    name: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> int:
    """The integer in variable ``name`` (which must be set), checked against its bounds."""
    if name not in environ:
        raise EnvError(f"{name} is not set. Hint: {hint}")
    return parse_int(name, environ[name], hint, minimum, below)


def optional_int(
    environ: Mapping[str, str],
    name: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> Optional[int]:
    """Like env_int, but None when the variable is not set."""
    if name not in environ:
        return None
    return parse_int(name, environ[name], hint, minimum, below)


def parse_int(
    label: str,
    raw: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> int:
    """``raw`` as a decimal integer in [minimum, below[0]); errors say ``label=raw``.

    ``below`` pairs the bound with the words that say where it came from.
    """
    text = raw.strip()
    # int() alone would also take "+3", "1_0" and non-ASCII digits; Slurm and torchrun
    # never write those, so seeing one means the variable was set by mistake.
    if not NON_NEGATIVE.fullmatch(text):
        raise EnvError(f"{label}={brief(raw)} is not a non-negative integer. Hint: {hint}")
    if len(text) > _MAX_DIGITS:
        raise EnvError(f"{label}={brief(raw)} is too large ({len(text)} digits). Hint: {hint}")
    value = int(text)
    if value < minimum:
        raise EnvError(f"{label}={raw!r} must be at least {minimum}. Hint: {hint}")
    if below is not None and value >= below[0]:
        raise EnvError(
            f"{label}={raw!r} is out of range: it must be below {below[1]}. Hint: {hint}"
        )
    return value
