"""The spec's ``env``: environment variables every rank gets (docs/design.md, "Spec").

A name is a POSIX name (what a shell can export) that is not the launcher's nor one a
process reads only as it starts (``core.env.refused`` decides which). A value is text,
line breaks and tabs allowed (a key file, a JSON blob: every file that holds it writes it
quoted), no other control character; a number or true/false written bare in YAML becomes its text (1 -> "1", 0.5 ->
"0.5", true -> "true"), so a spec.yaml always holds text. An error never quotes the value
of a secret (``core.env.is_secret``): it may be printed, and on a task written into
run.json. No torch.
"""

from __future__ import annotations

import math
import re
from typing import Any

from clusterjob.core import env as envmod
from clusterjob.core.errors import CONTROL_CHARS, SpecError, brief, key_text
from clusterjob.spec.fields import MAX_TEXT_LENGTH

MAX_NAME_LENGTH = 255
_EXAMPLE = "e.g. NCCL_DEBUG: INFO"
# What a variable's text may not hold: the control characters but a line break and a tab.
_BAD_IN_VALUE = re.compile(CONTROL_CHARS.pattern.replace(r"\x00-\x1f", r"\x00-\x08\x0b-\x1f"))


def checked_env(env: dict) -> dict[str, str]:
    """The spec's env with every name checked and every value as text."""
    return {check_name(f"env.{key_text(name)}", name): env_text(f"env.{name}", name, value)
            for name, value in env.items()}


def check_name(where: str, name: Any) -> str:
    """``name`` when a spec may set it; else a SpecError at ``where``."""
    if not isinstance(name, str) or not envmod.ENV_NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise SpecError(where, f"{brief(name)} is not a variable name; use letters, digits and '_', not starting "
                               f"with a digit, {_EXAMPLE}")
    why = envmod.refused(name)
    if why is not None:
        raise SpecError(where, why)
    return name


def check_sweepable(where: str, name: str) -> None:
    """A swept variable's values are written in run.json's params and the report's
    columns, so a secret cannot be swept."""
    check_name(where, name)
    if envmod.is_secret(name):
        raise SpecError(where, f"{name} is a secret (its name holds KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL), "
                               "and a swept value is written in run.json and the report; set it in env or "
                               "export it in the shell you submit from, and sweep something else")


def env_text(where: str, name: str, value: Any) -> str:
    """``value`` as the variable's text: text as it is, true/false and numbers as YAML
    writes them."""
    said = "the value (a secret: not shown)" if envmod.is_secret(name) else brief(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(where, f"{said} is not a finite number; write it in quotes to pass the text")
        return repr(value)  # the shortest text that reads back: 0.1, 1e-05
    if value is None:
        raise SpecError(where, f"null is no value; write '' for an empty variable, or leave {name} out")
    if not isinstance(value, str):
        kind = "a list" if isinstance(value, (list, tuple)) else "a mapping" if isinstance(value, dict) else "no text"
        raise SpecError(where, f"{said} is {kind}; a variable holds one line of text, {_EXAMPLE}")
    bad = _BAD_IN_VALUE.search(value)
    if bad:
        raise SpecError(where, f"{said} contains the control character {bad.group()!r} at position {bad.start()}; "
                               "a variable holds printable text (line breaks and tabs allowed): remove it")
    if len(value) > MAX_TEXT_LENGTH:
        raise SpecError(where, f"{said} is {len(value)} characters long; use at most {MAX_TEXT_LENGTH}")
    return value
