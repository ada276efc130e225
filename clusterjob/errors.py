"""Error types the CLI maps to exit codes (2: bad input, 1: anything else), and how an
error quotes what the user gave."""

import re
from typing import Any

# Line breaks and other control characters, shown escaped so that an error is one line.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class BadInput(Exception):
    """Bad spec, flag or environment. The CLI prints the message and exits 2."""

    exit_code = 2

    def __str__(self) -> str:
        # Messages quote what the user gave (paths, variables); whatever it holds, the
        # error stays one line on the terminal.
        return CONTROL_CHARS.sub(lambda m: repr(m.group())[1:-1], super().__str__())


class SpecError(BadInput):
    """A spec key holds a value that is not allowed."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.detail = message
        super().__init__(f"{key}: {message}" if key else message)

    def under(self, prefix: str) -> "SpecError":
        """The same error, with its key placed under ``prefix`` (a section name)."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return SpecError(key, self.detail)


class EnvError(BadInput):
    """The distributed environment variables are missing or inconsistent."""


def brief(value: Any) -> str:
    """``repr(value)``, shortened when long (an error line stays readable)."""
    text = repr(value)
    size = len(value) if isinstance(value, str) else len(text)
    return text if len(text) <= 120 else f"{text[:100]}...{text[-10:]} ({size} characters)"


def key_text(key: Any) -> str:
    """A key as written in an error: itself if a plain string, else its repr (e.g. 1, None)."""
    plain = isinstance(key, str) and len(key) <= 100 and not CONTROL_CHARS.search(key)
    return key if plain else brief(key)


def shown(value: Any) -> str:
    """``brief(value)`` with its type: "'x' (str)"."""
    return f"{brief(value)} ({type(value).__name__})"
