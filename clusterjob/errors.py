"""Error types the CLI maps to exit codes (2: bad input, 1: anything else)."""

import re

# Line breaks and other control characters, shown escaped so that an error is one line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class BadInput(Exception):
    """Bad spec, flag or environment. The CLI prints the message and exits 2."""

    exit_code = 2

    def __str__(self) -> str:
        # Messages quote what the user gave (paths, variables); whatever it holds, the
        # error stays one line on the terminal.
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], super().__str__())


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
