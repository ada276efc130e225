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

from clusterjob.core.errors import brief

# Slurm's own per-range limit (MAX_RANGE in hostlist.c); the total limit keeps a typo
# such as ``n[1-99999]x[1-99999]`` from exhausting memory on a login node.
MAX_RANGE = 64 * 1024
MAX_HOSTS = 1024 * 1024
# Far above Slurm's own MAX_TASKS_PER_NODE (512 unless built otherwise).
MAX_TASKS_PER_NODE = 64 * 1024
# Numbers in these lists are short; longer digit runs are garbage (and int() of
# thousands of digits is slow or refused).
MAX_DIGITS = 18

_BOUND = re.compile(r"[0-9]+")
_TASK_ENTRY = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
# Text of a host name outside brackets: printable ASCII, no separators or brackets.
_NAME_TEXT = re.compile(r"[\x21-\x7e]*")


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
            raise HostlistError(f"host list {brief(text)} expands to more than {MAX_HOSTS} names")
    return hosts


def _split_names(text: str) -> list[str]:
    """The top-level names of ``text``; a comma or whitespace inside brackets does not split."""
    if not text.strip():
        raise HostlistError(f"host list {brief(text)} is empty")
    names: list[str] = []
    for piece in _split_top_level(text, ","):
        words = _split_top_level(piece, " \t\n\r")
        words = [word for word in words if word]
        if not words:
            raise HostlistError(
                f"host list {brief(text)} has an empty name (two commas in a row, or a comma at "
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
        raise HostlistError(f"host name {brief(name)} expands to more than {MAX_HOSTS} names")
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
                raise HostlistError(f"host name {brief(name)} has a ']' without a '['")
            pieces.append(_literal(rest, name))
            break
        if close_at < 0:
            raise HostlistError(f"host name {brief(name)} has a '[' that is never closed")
        if close_at < open_at:
            raise HostlistError(f"host name {brief(name)} has a ']' without a '['")
        inner = rest[open_at + 1 : close_at]
        if "[" in inner:
            raise HostlistError(f"host name {brief(name)} has nested or unclosed brackets")
        pieces.append(_literal(rest[:open_at], name))
        pieces.append(_expand_bracket(inner, name))
        rest = rest[close_at + 1 :]
    return pieces


def _literal(text: str, name: str) -> str:
    """Host name text outside brackets, refused if it holds control or non-ASCII characters."""
    if not _NAME_TEXT.fullmatch(text):
        bad = next(char for char in text if not _NAME_TEXT.fullmatch(char))
        raise HostlistError(
            f"host name {brief(name)} has the character {bad!r}, which Slurm does not write "
            f"in host names"
        )
    return text


def _expand_bracket(inner: str, name: str) -> list[str]:
    """The numbers of one bracket body such as ``1-3,7,10-11``, padded as written."""
    if not inner:
        raise HostlistError(f"host name {brief(name)} has empty brackets '[]'")
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
            f"host name {brief(name)}: range {brief(item)} must be a number or 'low-high' with "
            f"decimal digits only"
        )
    if max(len(low_text), len(high_text)) > MAX_DIGITS:
        raise HostlistError(f"host name {brief(name)}: range {brief(item)} has a number longer "
                            f"than {MAX_DIGITS} digits")
    low, high = int(low_text), int(high_text)
    if low > high:
        raise HostlistError(
            f"host name {brief(name)}: range {brief(item)} is reversed; "
            f"write it as '{high_text}-{low_text}'"
        )
    if high - low + 1 > MAX_RANGE:
        raise HostlistError(
            f"host name {brief(name)}: range {brief(item)} has more than {MAX_RANGE} hosts"
        )
    width = len(low_text)
    return [f"{number:0{width}d}" for number in range(low, high + 1)]


def parse_tasks_per_node(text: str) -> list[int]:
    """Tasks on each node from Slurm's compressed form: ``2(x3),1`` -> [2, 2, 2, 1]."""
    if not text.strip():
        raise HostlistError(f"tasks-per-node list {brief(text)} is empty")
    counts: list[int] = []
    for entry in text.strip().split(","):
        tasks, repeat = _task_entry(entry, text)
        if len(counts) + repeat > MAX_HOSTS:
            raise HostlistError(
                f"tasks-per-node list {brief(text)} covers more than {MAX_HOSTS} nodes"
            )
        counts.extend([tasks] * repeat)
    return counts


def _task_entry(entry: str, text: str) -> tuple[int, int]:
    """(tasks, repeat) of one entry ``N`` or ``N(xM)``; every node runs at least one task."""
    match = _TASK_ENTRY.fullmatch(entry)
    where = f"tasks-per-node list {brief(text)}: entry {brief(entry)}"
    if match is None:
        raise HostlistError(f"{where} is not 'N' or 'N(xM)'")
    if max(len(match.group(1)), len(match.group(2) or "")) > MAX_DIGITS:
        raise HostlistError(f"{where} has a number longer than {MAX_DIGITS} digits")
    tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
    if tasks == 0:
        raise HostlistError(
            f"{where} gives nodes 0 tasks; a step runs at least one task on each of its nodes"
        )
    if tasks > MAX_TASKS_PER_NODE:
        raise HostlistError(f"{where} gives a node more than {MAX_TASKS_PER_NODE} tasks")
    if repeat == 0:
        raise HostlistError(f"{where} repeats 0 times")
    return tasks, repeat


