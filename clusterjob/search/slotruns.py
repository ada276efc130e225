"""A search's slots as runs (docs/design.md, "Search"): each slot is an ordinary run,
``<search>/.slots/slot-K``, with its spec.yaml (the search's), run.json (its state, its
job, ``search``: the search and the slot's number) and logs, which the search's executor
starts with ``Executor.start`` like any run, its task a slot driver, one per
allocation (clusterjob.search.slots). The folder is a dot-folder, so that ``status`` and
``report`` of results show the trials, not the machinery that ran them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from clusterjob.core import claim, runstate
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso
from clusterjob.core.record import RunError
from clusterjob.core.rundir import RunDir, create_run_at
from clusterjob.search import record as searchmod
from clusterjob.search.trials import SPEC_FILE

SLOTS = ".slots"
_PREFIX = "slot-"


def slot_runs(folder: "str | os.PathLike") -> list[RunDir]:
    """The slot runs of the search in ``folder`` made so far, by number."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(os.path.join(folder, SLOTS)):
            number = entry.name.removeprefix(_PREFIX)
            if entry.name.startswith(_PREFIX) and number.isdigit() and entry.is_dir(follow_symlinks=False):
                found.append((int(number), RunDir(Path(entry.path))))
    return [run for _, run in sorted(found, key=lambda item: item[0])]


def prepared(folder: Path, count: int, claim_as: str, executor: str, **fields: Any) -> list[RunDir]:
    """The ``count`` slot runs of the search in ``folder``, ready for ``Executor.start``
    and claimed by this process (``claim_as``): made where new, reopened (as ``resume``
    reopens a run: pending, no job) where a session of the search ran them before.
    ``fields``: what the executor clears on a reopen (``Executor.reopened``)."""
    check_folders(folder, count)
    record, _ = searchmod.read(folder)
    spec_text = (folder / SPEC_FILE).read_text()
    runs = []
    for number in range(count):
        run = RunDir(folder / SLOTS / f"{_PREFIX}{number}")
        marker = {"id": record.id, "slot": number}
        if run.exists():
            claim.take(run.path, claim_as)
            run.update(runstate.reopen(), **{"search": marker, "executor": executor, "cancel_requested_at": None,
                                              "job": None, **fields})
        else:
            run = create_run_at(run.path, record.name or folder.parent.name, spec_text, {}, claim_as, search=marker,
                                executor=executor, submit_dir=record.submit_dir, git_sha=record.git_sha)
        runs.append(run)
    return runs


def check_folders(folder: Path, count: int) -> None:
    """Bad input where the folder of one of the first ``count`` slots (or ``.slots``) is
    something the search did not make: a link (its writes would land elsewhere) or a file."""
    for part in (folder / SLOTS, *(folder / SLOTS / f"{_PREFIX}{number}" for number in range(count))):
        if part.is_symlink() or (part.exists() and not part.is_dir()):
            raise BadInput(f"{part}: a search's slot folder is a link or a file, not a folder it made; move it "
                           f"away and run the command again")


def search_of(run: RunDir) -> Optional[tuple[Path, int]]:
    """(the search's folder, the slot's number) of a slot run; None for any other run."""
    marker = run.read().search or {}
    number = marker.get("slot")
    folder = run.path.parent.parent
    if run.path.parent.name != SLOTS or "trial" in marker or not isinstance(number, int) \
            or not searchmod.is_search(folder):
        return None
    return folder, number


def begin(run: RunDir, prog: str) -> Optional[tuple[Path, int]]:
    """In a slot's task (``prog``), as it starts: (the search's folder, the slot's number),
    the slot run recorded running; None, said on stderr, for a run that is no slot run."""
    found = search_of(run)
    if found is None:
        print(f"{prog}: {run.path} is no slot run of a search", file=sys.stderr)
        return None
    run.update(runstate.start(), started_at=run.read().started_at or now_iso())
    return found


def failed(run: RunDir, exc: BaseException) -> None:
    """In a slot's task that raised ``exc``: the slot run failed with its traceback."""
    run.update(runstate.fail(RunError(None, f"{type(exc).__name__}: {exc}", traceback.format_exc(), now_iso())))
