"""A sweep's names (docs/design.md, "Results layout"): which sweep a run folder belongs
to by its name alone, the name of each of its runs, and where its record and claim are.
What the record (clusterjob.core.sweep) and the runs its tasks make
(clusterjob.core.unmade) both need, without reading either. Stdlib only.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

FOLDER = ".sweeps"  # a dot-folder: never a run
_RUN_ID = re.compile(r"(\d{8}-\d{6}-[0-9a-f]{4})(?:-(\d{3,9}))?")  # rundir.new_run_id, -NNN for a point
_SWEEP_ID = re.compile(r"(.+)-(\d{8}-\d{6}-[0-9a-f]{4})")


@dataclass(frozen=True)
class Member:
    """A run's place in its sweep: the folder of its name, the sweep's stamp, its index."""

    parent: str
    stamp: str
    index: int

    @property
    def record_file(self) -> Path:
        return record_file(self.parent, self.stamp)


def member(folder: "str | os.PathLike") -> Optional[Member]:
    """Where the run in ``folder`` belongs, from its name alone; None for a run of no
    submission (a raw sbatch template's ``slurm-<job>``, a folder named by hand)."""
    path = os.fspath(folder)
    return _member(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))


@functools.lru_cache(maxsize=1 << 15)
def _member(path: str) -> Optional[Member]:
    """``member`` of an absolute path: kept, as status asks it of 10,000 runs, twice."""
    path = os.path.normpath(path)
    found = _RUN_ID.fullmatch(os.path.basename(path))
    if found is None:
        return None
    return Member(os.path.dirname(path), found.group(1), int(found.group(2) or 0))


def run_name(stamp: str, index: int, count: int) -> str:
    """The run id of point ``index`` of a submission of ``count`` runs."""
    return stamp if count == 1 else f"{stamp}-{index:03d}"


def sweep_id(name: str, stamp: str) -> str:
    """What ``submit`` prints and ``status``, ``cancel``, ``resume`` and ``logs`` take."""
    return f"{name}-{stamp}"


def parse_id(text: str) -> Optional[tuple[str, str]]:
    """(name, stamp) of a sweep id; None when ``text`` is none."""
    found = _SWEEP_ID.fullmatch(text)
    return (found.group(1), found.group(2)) if found else None


def record_file(parent: "str | os.PathLike", stamp: str) -> Path:
    return Path(parent) / FOLDER / f"{stamp}.json"


def lock_file(parent: "str | os.PathLike", stamp: str) -> Path:
    """The sweep's claim (clusterjob.core.claim)."""
    return Path(parent) / FOLDER / f"{stamp}.lock"
