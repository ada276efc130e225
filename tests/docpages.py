"""What the tests read in the documentation: README.md and the pages of docs/ (a site that
mkdocs.yml builds), and the lists of the package's modules they hold.

    modules_named(text)           # ["core/ranks.py", ...]: the modules a list or table names
    package_modules()             # {"core/ranks.py", ...}: the modules that exist
    section(text, "The package")  # a heading's text, up to the next heading of its level
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "clusterjob"
DOCS = REPO / "docs"


def package_modules() -> set[str]:
    """Every module of the package as a path under clusterjob/, __init__.py left out."""
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}


def modules_named(text: str) -> list[str]:
    """The modules a list or a table names, in order, a module named twice twice. A name
    holds its part (`core/ranks.py`), or the list item it stands in starts with its part's
    folder (- `core/`: `ranks.py`, `hostlist.py`)."""
    named = []
    for item in re.split(r"\n(?=- |\| )", text):
        part = re.match(r"- `(\w+/)`:", item)
        named += [(part.group(1) if part else "") + name for name in re.findall(r"`([\w/]+\.py)`", item)]
    return named


def section(text: str, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of the same or a higher level."""
    (line,) = [line for line in text.splitlines() if line.lstrip("#").strip() == heading and line.startswith("#")]
    level = len(line) - len(line.lstrip("#"))
    body = text[text.index(line + "\n") + len(line) + 1:]
    end = re.search(rf"^#{{1,{level}}} ", body, re.M)
    return body[:end.start()] if end else body
