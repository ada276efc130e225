"""How a spec section declares and checks its keys: ``opt`` (a key's default, doc and
checks) and ``Section`` (the base of every section, and of every executor's own options,
spec/options.py), with the checks every value gets. docs/design.md, "Spec".

Errors are ``SpecError`` with the key, the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from dataclasses import MISSING, field, fields
from typing import Any, Literal, Optional, Union, get_args, get_origin, get_type_hints

from clusterjob.core.errors import CONTROL_CHARS, SpecError, brief

MAX_TEXT_LENGTH = 10_000  # any string value: a setup line, a path, a rendezvous URL
MAX_PATH_PART_BYTES = 255  # NAME_MAX of common file systems
MAX_PATH_BYTES = 4095  # PATH_MAX - 1
MAX_INT = 2**63 - 1  # what Slurm, torch and C code downstream can hold
HOLDS_OPTIONS = "holds_options"  # the metadata flag of a field that holds executors' options


def opt(default: Any, doc: str = "", **checks: Any) -> Any:
    """A spec field: its default, a one-line doc, and checks run by ``Section.__post_init__``.

    checks: ``choices`` (allowed values), ``ge``/``gt``/``lt``/``le`` (bounds for numbers),
    ``pattern`` ((regex, words) that a string must match in full), ``max_len`` (characters),
    ``path`` (True: ``~`` is expanded and the length fits file system limits).
    """
    meta = {"doc": doc, **checks}
    if isinstance(default, type):  # a section: each spec gets its own instance
        return field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict)):
        factory = type(default)
        return field(default_factory=lambda: factory(default), metadata=meta)
    return field(default=default, metadata=meta)


class Section:
    """Base of every spec section: checks each field against its metadata, then ``check()``."""

    def __post_init__(self) -> None:
        cls: type = type(self)  # plain type: mypy finds type[Section] not Hashable for the cache
        for f in key_fields(cls):
            value = getattr(self, f.name)
            _check_value(f.name, value, _field_checks(cls, f))
            if f.metadata.get("path") and isinstance(value, str):
                object.__setattr__(self, f.name, _checked_path(f.name, value))
        self.check()

    def check(self) -> None:
        """Checks that involve several fields of the section (overridden where needed)."""


def _check_value(key: str, value: Any, meta: Any) -> None:
    """Raise SpecError if ``value`` breaks the field's choices, bounds or pattern."""
    if value is None or value is MISSING:
        return
    if isinstance(value, tuple):
        for index, item in enumerate(value):
            if isinstance(item, str):
                check_text(f"{key}[{index}]", item)
        return
    check_kind(key, value, meta)
    choices = meta.get("choices")
    if choices is not None and not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise SpecError(key, f"{brief(value)} is not allowed; choose one of {_words(choices)}"
                             f"{did_you_mean(value, choices)}")
    for name, ok, words in _BOUNDS:
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            raise SpecError(key, f"{value!r} is out of range; it must be {words} {bound}")
    pattern = meta.get("pattern")
    if pattern is not None and not re.fullmatch(pattern[0], value):
        raise SpecError(key, f"{brief(value)} is not allowed; use {pattern[1]}")


_BOUNDS = (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"), ("lt", lambda v, b: v < b, "<"),
           ("le", lambda v, b: v <= b, "<="))


def check_kind(key: str, value: Any, meta: Any) -> None:
    """Checks every value of its kind gets: one line of text, finite floats, ints in range."""
    if isinstance(value, str):
        check_text(key, value, meta.get("max_len", MAX_TEXT_LENGTH))
    elif isinstance(value, float) and not math.isfinite(value):
        raise SpecError(key, f"{value!r} must be a finite number; write a number such as 0.1")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise SpecError(key, f"{brief(value)} is too large; it must be at most {MAX_INT}")


def check_text(key: str, value: str, max_len: int = MAX_TEXT_LENGTH) -> None:
    """A string must be one line without control characters (it may land in a shell script)."""
    bad = CONTROL_CHARS.search(value)
    if bad:
        fix = "put each line in its own list entry" if key.startswith("setup[") else "remove it"
        raise SpecError(key, f"{brief(value)} contains the control character {bad.group()!r} at position "
                             f"{bad.start()}; a value must be one line of printable text: {fix}")
    if len(value) > max_len:
        raise SpecError(key, f"{brief(value)} is {len(value)} characters long; use at most {max_len}")


def _checked_path(key: str, value: str) -> str:
    """``value`` with ``~``/``~user`` expanded, checked against file system length limits."""
    path = os.path.expanduser(value) if value.startswith("~") else value
    if path.startswith("~"):
        user = value[1:].split("/", 1)[0]
        raise SpecError(key, f"{value!r} starts with ~{user}, but there is no user {user!r} here; "
                             "write the path out")
    size = len(path.encode())
    if size > MAX_PATH_BYTES:
        raise SpecError(key, f"{brief(path)} is {size} bytes long; a path may have at most {MAX_PATH_BYTES}")
    for part in path.split("/"):
        if len(part.encode()) > MAX_PATH_PART_BYTES:
            raise SpecError(key, f"{brief(path)} has a folder name {brief(part)} longer than "
                                 f"{MAX_PATH_PART_BYTES} bytes; shorten it")
    return path


def _words(choices: Any) -> str:
    return ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)


def did_you_mean(value: Any, choices: Any) -> str:
    """A did-you-mean suffix for a misspelled choice or key."""
    text = str(value)
    if len(text) > 200:  # difflib is quadratic; nothing that long is a near miss
        return ""
    found = difflib.get_close_matches(text, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


@functools.cache
def _field_checks(cls: type, f: Any) -> dict:
    """A field's checks: its metadata, plus the choices its type allows (a ``Literal``)."""
    choices = choices_of(hints(cls)[f.name])
    return {**f.metadata, "choices": choices} if choices else dict(f.metadata)


def choices_of(hint: Any) -> Optional[tuple]:
    """The values a ``Literal`` type allows (inside Optional or beside bool too: bool adds
    true and false); None when the type allows more than a fixed set."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return args
    if origin is not Union:
        return None
    allowed: list = []
    for arg in (a for a in args if a is not type(None)):
        inner = (True, False) if arg is bool else choices_of(arg)
        if inner is None:
            return None
        allowed += inner
    return tuple(allowed)


def key_fields(cls: Any) -> tuple:
    """The fields of a section that are keys of the spec: all but one that holds the
    executors' options (``ResourcesSpec.options``, whose keys are written beside the
    section's own)."""
    return _key_fields(cls)


@functools.cache
def _key_fields(cls: type) -> tuple:
    return tuple(f for f in fields(cls) if not f.metadata.get(HOLDS_OPTIONS))


def hints(cls: Any) -> dict:
    """The resolved type hints of a section (the same for every spec; read-only)."""
    return _hints(cls)


@functools.cache
def _hints(cls: type) -> dict:
    return get_type_hints(cls)

