"""The patterns of .gitignore files, for a snapshot taken outside a git repository
(inside one, git itself lists the files).

The forms gitignore(5) documents: blank lines and ``#`` comments are skipped; ``!``
re-includes; a trailing ``/`` matches folders only; a ``/`` at the start or in the middle
anchors the pattern to the folder of its .gitignore, else it matches a name at any depth
below; ``*``, ``?`` and ``[...]`` match within one path part; ``**/`` at the start,
``/**/`` in the middle and ``/**`` at the end match across parts; a backslash makes the
next character literal; trailing spaces are dropped unless escaped. The last matching
pattern wins, a deeper .gitignore's after a shallower one's. A file inside an ignored
folder is never reached (the walk does not enter it), so, as with git, it cannot be
re-included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MAX_GITIGNORE_BYTES = 1_000_000  # a .gitignore is a few hundred bytes; a larger one is not read


@dataclass(frozen=True)
class Rule:
    regex: "re.Pattern[str]"  # over a path relative to the snapshot's source, '/'-separated
    negated: bool
    folders_only: bool


@dataclass(frozen=True)
class Rules:
    """The patterns that apply in one folder: its parents' and its own, in order."""

    rules: tuple[Rule, ...] = ()

    def extended(self, gitignore: Path, base: str) -> "Rules":
        """These rules and those of ``gitignore`` (in folder ``base``, relative to the
        source; "" for the source itself); the same rules when there is none to read."""
        try:
            with open(gitignore, "rb") as f:
                text = f.read(MAX_GITIGNORE_BYTES).decode(errors="surrogateescape")
        except OSError:
            return self
        own = tuple(r for r in (rule(line, base) for line in text.splitlines()) if r is not None)
        return Rules(self.rules + own) if own else self

    def ignored(self, path: str, is_folder: bool) -> bool:
        """Whether ``path`` (relative to the source) is ignored: the last rule that
        matches it decides."""
        verdict = False
        for r in self.rules:
            if (is_folder or not r.folders_only) and r.regex.fullmatch(path):
                verdict = not r.negated
        return verdict


NONE = Rules()


def rule(line: str, base: str) -> Optional[Rule]:
    """The rule of one .gitignore line in folder ``base``; None for a blank or a comment."""
    pattern = _strip_trailing_spaces(line)
    if not pattern or pattern.startswith("#"):
        return None
    negated = pattern.startswith("!")
    pattern = pattern[1:] if negated else pattern
    folders_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    if not pattern:
        return None
    anchored = "/" in pattern
    prefix = re.escape(base + "/") if base else ""
    body = _translate(pattern.lstrip("/"))
    regex = prefix + (body if anchored else "(?:.*/)?" + body)
    try:
        return Rule(re.compile(regex, re.DOTALL), negated, folders_only)
    except re.error:  # a pattern git would not match anything with either
        return None


def _strip_trailing_spaces(line: str) -> str:
    stripped = line.rstrip(" ")
    return stripped + " " if stripped.endswith("\\") and len(stripped) < len(line) else stripped


def _translate(pattern: str) -> str:
    """A glob of gitignore(5) as a regex over '/'-separated paths."""
    out, i = [], 0
    while i < len(pattern):
        at_part = i == 0 or pattern[i - 1] == "/"
        if at_part and pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif at_part and pattern[i:] == "**":
            out.append(".*")
            i += 2
        else:
            piece, i = _token(pattern, i)
            out.append(piece)
    return "".join(out)


def _token(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the glob token at ``i``, and where the next one starts."""
    char = pattern[i]
    if char == "*":
        while i < len(pattern) and pattern[i] == "*":  # other runs of stars are one star
            i += 1
        return "[^/]*", i
    if char == "?":
        return "[^/]", i + 1
    if char == "\\" and i + 1 < len(pattern):
        return re.escape(pattern[i + 1]), i + 2
    if char == "[":
        return _bracket(pattern, i)
    return re.escape(char), i + 1


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """``[abc]``, ``[a-z]``, ``[!a]``: one character of a set, never '/'; a ``[``
    without its ``]`` is itself."""
    start = i + 1
    if start < len(pattern) and pattern[start] in "!^":
        start += 1
    end = pattern.find("]", start + 1 if start < len(pattern) and pattern[start] == "]" else start)
    if end < 0:
        return re.escape("["), i + 1
    inside = "".join(c if c == "-" else re.escape(c) for c in pattern[start:end])
    negate = "^" if start > i + 1 else ""
    return f"(?!/)[{negate}{inside}]", end + 1
