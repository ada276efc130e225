"""Error types the CLI maps to exit codes (2: bad input, 1: anything else), and how an
error quotes what the user gave."""

import re
from typing import Any

# Line breaks and other control characters (C0, DEL, C1, the Unicode line and paragraph
# separators) and lone surrogates (undecodable bytes): shown escaped, so that an error or a
# status line is one line on the terminal, whatever a path or a run folder holds.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def escape(text: str) -> str:
    """``text`` with every control character escaped (\\n, \\x1b, \\u2028): safe to print
    on one line. The one escape routine for terminal output."""
    return CONTROL_CHARS.sub(lambda m: repr(m.group())[1:-1], text) if CONTROL_CHARS.search(text) else text


class BadInput(Exception):
    """Bad spec, flag or environment. The CLI prints the message and exits 2."""

    exit_code = 2

    def __str__(self) -> str:
        # Messages quote what the user gave (paths, variables); whatever it holds, the
        # error stays one line on the terminal.
        return escape(super().__str__())


class Failure(RuntimeError):
    """A command failed for a reason that is not bad input (a disk, a read, a cluster).
    The CLI prints the message, one line, and exits 1."""

    exit_code = 1

    def __str__(self) -> str:
        return escape(super().__str__())


class SlurmUnreachable(Failure):
    """A Slurm command that had to succeed did not answer: the input was fine, the
    cluster was not."""


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


def brief(value: Any, width: int = 120) -> str:
    """``repr(value)``, shortened past ``width`` characters (an error line stays readable)."""
    text = repr(value)
    size = len(value) if isinstance(value, str) else len(text)
    return text if len(text) <= width else f"{text[:width - 20]}...{text[-10:]} ({size} characters)"


def key_text(key: Any) -> str:
    """A key as written in an error: itself if a plain string, else its repr (e.g. 1, None)."""
    plain = isinstance(key, str) and len(key) <= 100 and not CONTROL_CHARS.search(key)
    return key if plain else brief(key)


def with_type(value: Any) -> str:
    """``brief(value)`` with its type: "'x' (str)"."""
    return f"{brief(value)} ({type(value).__name__})"


_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_MARKS = re.compile(r"^\s*[\^~]+\s*$")  # the carets under a source line (Python 3.11+)


def traceback_excerpt(text: str, fallback: int = 4) -> list:
    """The lines of a traceback worth a glance: the last frame ('File "x.py", line 3,
    in f'), its source line and the exception line. Text with no frame (a signal's
    stderr tail) gives its last ``fallback`` lines. Caret lines are left out."""
    lines = [line.rstrip() for line in text.strip().splitlines() if not _MARKS.match(line)]
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if not frames:
        return lines[-fallback:]
    last = frames[-1]
    source = lines[last + 1:last + 2]
    if source and not source[0].startswith((" ", "\t")):  # no source: the exception line follows
        source = []
    rest = lines[last + 1 + len(source):]
    exception = [line for line in rest if line and not line.startswith((" ", "\t"))][:1]
    return [lines[last].strip(), *("  " + s.strip() for s in source), *exception]


def one_line(text: str) -> str:
    """``text`` with its lines joined by a space: an exception's text (a download's tries,
    one per line) inside a one-line message."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def is_bad_input(exception_line: str) -> bool:
    """Whether a traceback's exception line ("clusterjob.core.errors.SpecError: ...")
    names one of clusterjob's bad-input errors (those of the modules loaded here)."""
    family, todo = set(), [BadInput]
    while todo:
        cls = todo.pop()
        family.add(f"{cls.__module__}.{cls.__qualname__}")
        todo += cls.__subclasses__()
    return exception_line.split(":", 1)[0].strip() in family
