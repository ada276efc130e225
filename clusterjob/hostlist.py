"""Slurm's compressed host and task lists, expanded as Slurm itself does it.

The rank layout of a job (first host = master address, tasks on each node) comes from
these strings, so a near-miss parser (a regex that handles one bracket group) picks the
wrong master on names like ``rack[1-2]-n[01-04]``. This module follows
``scontrol show hostnames`` exactly and refuses anything it does not understand, so a bad
list fails before any rendezvous instead of hanging in one. Stdlib only: the CLI imports
it on login nodes.
"""

from __future__ import annotations

import itertools
import re

# Slurm's own per-range limit (MAX_RANGE in hostlist.c); the total limit keeps a typo
# such as ``n[1-99999]x[1-99999]`` from exhausting memory on a login node.
MAX_RANGE = 64 * 1024
MAX_HOSTS = 1024 * 1024

_SEPARATORS = ",\t\n\r "
_BOUND = re.compile(r"[0-9]+")
_TASK_ENTRY = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


class HostlistError(ValueError):
    """A host list or tasks-per-node string that Slurm would not produce."""


def expand_hostlist(text: str) -> list[str]:
    """Every host name of a Slurm host list, in Slurm's order, duplicates kept.

    ``rack[1-2]-n[01-04]`` gives rack1-n01 .. rack1-n04, rack2-n01 .. rack2-n04 (the
    leftmost bracket varies slowest). Names are separated by commas or whitespace
    outside brackets; zero padding follows the width of each range's lower bound.
    """
    hosts: list[str] = []
    for name in _split_names(text):
        hosts.extend(_expand_name(name))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"host list {text!r} expands to more than {MAX_HOSTS} names")
    return hosts


def _split_names(text: str) -> list[str]:
    """The top-level names of ``text``; a comma or whitespace inside brackets does not split."""
    if not text.strip():
        raise HostlistError(f"host list {text!r} is empty")
    names: list[str] = []
    for piece in _split_top_level(text, ","):
        words = _split_top_level(piece, " \t\n\r")
        words = [word for word in words if word]
        if not words:
            raise HostlistError(
                f"host list {text!r} has an empty name (two commas in a row, or a comma at "
                f"either end); remove the extra comma"
            )
        names.extend(words)
    return names


def _split_top_level(text: str, separators: str) -> list[str]:
    """``text`` cut at each separator that is outside brackets (bracket errors left to later)."""
    parts: list[str] = []
    start, depth = 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char in separators and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _expand_name(name: str) -> list[str]:
    """All hosts of one name with any number of bracket groups (cartesian product)."""
    pieces = _name_pieces(name)
    choices = [piece if isinstance(piece, list) else [piece] for piece in pieces]
    total = 1
    for options in choices:
        total *= len(options)
    if total > MAX_HOSTS:
        raise HostlistError(f"host name {name!r} expands to more than {MAX_HOSTS} names")
    # itertools.product varies the rightmost group fastest, which is Slurm's order.
    return ["".join(combo) for combo in itertools.product(*choices)]


def _name_pieces(name: str) -> list[str | list[str]]:
    """``name`` as literal text and expanded bracket groups, in order."""
    pieces: list[str | list[str]] = []
    rest = name
    while rest:
        open_at, close_at = rest.find("["), rest.find("]")
        if open_at < 0:
            if close_at >= 0:
                raise HostlistError(f"host name {name!r} has a ']' without a '['")
            pieces.append(rest)
            break
        if close_at < 0:
            raise HostlistError(f"host name {name!r} has a '[' that is never closed")
        if close_at < open_at:
            raise HostlistError(f"host name {name!r} has a ']' without a '['")
        inner = rest[open_at + 1 : close_at]
        if "[" in inner:
            raise HostlistError(f"host name {name!r} has nested or unclosed brackets")
        pieces.append(rest[:open_at])
        pieces.append(_expand_bracket(inner, name))
        rest = rest[close_at + 1 :]
    return pieces


def _expand_bracket(inner: str, name: str) -> list[str]:
    """The numbers of one bracket body such as ``1-3,7,10-11``, padded as written."""
    if not inner:
        raise HostlistError(f"host name {name!r} has empty brackets '[]'")
    numbers: list[str] = []
    for item in inner.split(","):
        numbers.extend(_expand_range(item, name))
    return numbers


def _expand_range(item: str, name: str) -> list[str]:
    """One ``lo`` or ``lo-hi`` entry; the width of ``lo`` sets the zero padding (as Slurm)."""
    low_text, dash, high_text = item.partition("-")
    if not dash:
        high_text = low_text
    if not (_BOUND.fullmatch(low_text) and _BOUND.fullmatch(high_text)):
        raise HostlistError(
            f"host name {name!r}: range {item!r} must be a number or 'low-high' with "
            f"decimal digits only"
        )
    low, high = int(low_text), int(high_text)
    if low > high:
        raise HostlistError(
            f"host name {name!r}: range {item!r} is reversed; write it as '{high_text}-{low_text}'"
        )
    if high - low + 1 > MAX_RANGE:
        raise HostlistError(f"host name {name!r}: range {item!r} has more than {MAX_RANGE} hosts")
    width = len(low_text)
    return [f"{number:0{width}d}" for number in range(low, high + 1)]


def parse_tasks_per_node(text: str) -> list[int]:
    """Tasks on each node from Slurm's compressed form: ``2(x3),1`` -> [2, 2, 2, 1]."""
    if not text.strip():
        raise HostlistError(f"tasks-per-node list {text!r} is empty")
    counts: list[int] = []
    for entry in text.strip().split(","):
        match = _TASK_ENTRY.fullmatch(entry)
        if match is None:
            raise HostlistError(
                f"tasks-per-node list {text!r}: entry {entry!r} is not 'N' or 'N(xM)'"
            )
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat == 0:
            raise HostlistError(f"tasks-per-node list {text!r}: entry {entry!r} repeats 0 times")
        if len(counts) + repeat > MAX_HOSTS:
            raise HostlistError(f"tasks-per-node list {text!r} covers more than {MAX_HOSTS} nodes")
        counts.extend([tasks] * repeat)
    return counts
