"""Tables for a terminal of any width: a GitHub-style pipe table when it fits, a
compact one when not, and one block per row on a very narrow terminal.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

# Layouts from the roomiest: (headers, cells) in the full or compact style, cell padding.
LAYOUTS = ((False, False, (" ", " ")), (True, False, (" ", " ")), (True, True, (" ", " ")),
           (True, True, (" ", "")), (True, True, ("", "")))


@dataclass(frozen=True)
class Column:
    """One displayed column: headers and cells in the full and the compact style."""

    header: str
    short: str
    cells: list
    compact: list
    right: bool = True
    key: bool = False  # shown as "header=value" in the block layout
    tight: bool = False  # no padding: the one-character best-group marker
    css: str = ""  # the HTML class of its cells ("status", "error"): how the page marks them


def pipe_table(columns: list, compact: bool, pad: tuple, short: bool) -> list:
    """A GitHub-style pipe table as lines: ``compact`` cells, ``short`` headers; ``pad`` is
    the (left, right) padding of a cell, which a ``tight`` column never gets."""
    headers = [c.short if short else c.header for c in columns]
    rows = list(zip(*[c.compact if compact else c.cells for c in columns]))
    pads = [("", "") if c.tight else pad for c in columns]
    # A right-aligned rule cell needs two characters ("-:"), padding included.
    widths = [max([len(h), 1 + (c.right and not (left or right)), *(len(r[i]) for r in rows)])
              for i, (h, c, (left, right)) in enumerate(zip(headers, columns, pads))]

    def line(cells: list) -> str:
        text = [left + (cell.rjust(w) if c.right else cell.ljust(w)) + right
                for cell, w, c, (left, right) in zip(cells, widths, columns, pads)]
        return "|" + "|".join(text) + "|"

    spans = [w + len(left) + len(right) for w, (left, right) in zip(widths, pads)]
    rule = ["-" * (n - 1) + ":" if c.right else "-" * n for n, c in zip(spans, columns)]
    return [line(headers), "|" + "|".join(rule) + "|"] + [line(list(r)) for r in rows]


def pack(items: list, width: int, indent: str, sep: str = " · ") -> list:
    """Items joined with ``sep`` into lines of at most ``width`` (an item is never split)."""
    lines, current = [], ""
    for item in items:
        candidate = f"{current}{sep}{item}" if current else item
        if current and len(indent + candidate) > width:
            lines.append(indent + current)
            candidate = item
        current = candidate
    return lines + ([indent + current] if current else [])


def blocks(columns: list, heading: int, width: int) -> list:
    """Fallback for a narrow terminal: one block per row, "header value" items; the
    first ``heading`` columns head the block."""
    lines = []
    for i in range(len(columns[0].cells)):
        head = [f"{c.short}={c.compact[i]}" if c.key else c.compact[i] for c in columns[:heading]]
        head_lines = pack([part for part in head if part], width, "  ", " ") or ["  "]
        lines += ["- " + head_lines[0][2:], *head_lines[1:]]
        lines += pack([f"{c.short} {c.compact[i]}" for c in columns[heading:]], width, "    ")
    return lines


def fit(columns: list, heading: int, width: int) -> list:
    """The roomiest layout that fits ``width``: padded table, the same with short
    headers, compact table, left-padded, bare, else blocks (which wrap to any width)."""
    for short, compact, pad in LAYOUTS:
        lines = pipe_table(columns, compact, pad, short)
        if max(map(len, lines)) <= width:
            return lines
    return blocks(columns, heading, width)


def wrap(text: str, width: int) -> list:
    """Prose wrapped to ``width``."""
    return textwrap.wrap(text, width=width, break_on_hyphens=False) or [""]
