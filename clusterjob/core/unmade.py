"""Runs of a Slurm sweep that their tasks make (docs/design.md, "Results layout").

A submission of a sweep to Slurm does not make its run folders: each of them costs the
login node a few file creations, 0.2 to 1 ms each on a virtual or shared disk, and a
10,000-point sweep would spend seconds in them before its arrays reach Slurm. It writes
one file instead, ``<name>/.sweeps/<stamp>.points``: what each run folder will
hold (its spec.yaml, put together from texts the points share, and its pending
run.json). The run's first task (any of its ranks) makes the folder as it starts
(``materialize``); so does the first command that writes to it (a cancel, a resume, the
job's teardown).

Until then the run is *unmade*, and every reader sees it as if its folder held what
this file says: ``clusterjob.core.record.read_raw`` reads its run.json from here,
``RunDir.exists`` and the discovery of runs (``clusterjob.core.rundir``) find it.
Only a folder without run.json is read from here: once made, the run's own files are
its record. run.json itself is written by clusterjob.core.record (``materialize``),
its one writer. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Optional

from clusterjob.core import runstate, sweepnames
from clusterjob.core.files import loads, read_text, write_new

SUFFIX = ".points"  # JSON; no ".json" suffix: .sweeps/*.json are the sweeps' records
_MAX_BYTES = 256 * 2**20  # far past 10,000 points' texts
MAX_POINTS = 1_000_000  # the most runs a store lists (a sweep's run names have up to 9 digits)
# How every store starts (``write``): its count, read alone where a listing needs no more.
_HEAD = re.compile(rb'\{"count":([1-9][0-9]{0,6}),')


def store_file(parent: "str | os.PathLike", stamp: str) -> Path:
    return Path(parent) / sweepnames.FOLDER / f"{stamp}{SUFFIX}"


def write(parent: "str | os.PathLike", stamp: str, count: int, points: list, fields: dict) -> None:
    """The store of a sweep of ``count`` runs: ``points`` are (index, spec texts (the
    parts spec.yaml is joined from), params, the run's own run.json fields); ``fields``
    go into every run.json. Each text and each value is written once, however many
    points share it. Not synced: the caller's batch (clusterjob.core.files.batched)."""
    texts: dict[str, int] = {}
    values: dict[str, int] = {}

    def text_id(text: str) -> int:
        return texts.setdefault(text, len(texts))

    def value_id(value: Any) -> int:
        return values.setdefault(json.dumps(value, sort_keys=True, default=str), len(values))

    rows = [[index, [text_id(t) for t in ([parts] if isinstance(parts, str) else parts)], value_id(params),
             value_id(own)]
            for index, parts, params, own in points]
    body = {"count": count, "fields": fields, "texts": list(texts),
            "values": [json.loads(v) for v in values], "points": rows}
    write_new(store_file(parent, stamp), json.dumps(body, separators=(",", ":"), default=str) + "\n")


class _Store:
    """A store as read: each point's spec text and run.json by index."""

    def __init__(self, raw: dict) -> None:
        """ValueError (or KeyError, TypeError) for anything but what ``write`` writes."""
        self.count, self.fields = raw["count"], raw["fields"]
        self.texts, self.values = raw["texts"], raw["values"]
        if not (type(self.count) is int and 0 < self.count <= MAX_POINTS
                and isinstance(self.fields, dict) and isinstance(self.values, list)
                and all(isinstance(t, str) for t in self.texts) and all(isinstance(v, dict) for v in self.values)):
            raise ValueError("not a store")
        self.points = {row[0]: row for row in raw["points"]
                       if _row_ok(row, self.count, len(self.texts), len(self.values))}
        if len(self.points) != len(raw["points"]):
            raise ValueError("a point that is not one")

    def spec_text(self, index: int) -> str:
        return "".join(self.texts[i] for i in self.points[index][1])

    def record(self, folder: str, index: int) -> dict:
        _, _, params, own = self.points[index]
        return {**pending_fields(os.path.basename(folder), os.path.basename(os.path.dirname(folder)),
                                 dict(self.values[params]), **self.fields, **self.values[own]), "slurm_job_id": None}


def _row_ok(row: Any, count: int, texts: int, values: int) -> bool:
    """Whether ``row`` is [index, [text ids], params id, own fields id], each in range
    (an index below the sweep's ``count``: ``names`` lists no other)."""
    return (isinstance(row, list) and len(row) == 4 and type(row[0]) is int and 0 <= row[0] < count
            and isinstance(row[1], list) and all(type(i) is int and 0 <= i < texts for i in row[1])
            and all(type(i) is int and 0 <= i < values for i in row[2:]))


def pending_fields(run_id: str, name: str, params: dict, **fields: Any) -> dict:
    """A new run's run.json: pending, with ``fields``; the one shape of a made and an unmade run."""
    return {"run_id": run_id, "name": name, "status": runstate.PENDING, "params": params, "job": None, "hosts": [],
            "world_size": None, "requeues": 0, "started_at": None, "finished_at": None, "final": None,
            "error": None, **fields}


_READ: dict = {}  # store path -> (stamp of the file, _Store or None): a sweep's runs share one


def _store(parent: str, stamp: str) -> Optional[tuple[tuple, _Store]]:
    """(the stamp of its file, the store) of sweep ``stamp`` in ``parent``; None when
    it has none or it is damaged. Read once per process while the file is unchanged."""
    path = os.path.join(parent, sweepnames.FOLDER, stamp + SUFFIX)
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_size, st.st_mtime_ns, st.st_ino)
    kept = _READ.get(path)
    if kept is None or kept[0] != key:
        text, _ = read_text(path, _MAX_BYTES)
        try:
            kept = (key, _Store(loads(text or "")))
        except (KeyError, TypeError, ValueError):  # damaged: its runs are none
            kept = (key, None)
        if len(_READ) > 64:
            _READ.clear()
        _READ[path] = kept
    return (kept[0], kept[1]) if kept[1] is not None else None


def _entry(folder: "str | os.PathLike") -> Optional[tuple[_Store, int, tuple, str]]:
    """(store, index, the store's stamp, the folder's absolute path) of the run a store
    lists in ``folder``: its name is the one its sweep gives it (``<stamp>-005``, not
    ``<stamp>-0005``)."""
    path = os.path.abspath(folder)
    where = sweepnames.member(path)
    if where is None:
        return None
    found = _store(where.parent, where.stamp)
    if found is None or where.index not in found[1].points:
        return None
    if os.path.basename(path) != sweepnames.run_name(where.stamp, where.index, found[1].count):
        return None
    return found[1], where.index, found[0], path


def _untouched(path: str) -> bool:
    """Whether the run folder ``path`` is not there, or holds no more than what is made
    before its run.json (an empty logs/, spec.yaml, a temporary file): a folder a run
    started in is no unmade run, whatever it lost since (its run.json is then missing)."""
    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for name in entries:
        if name == "logs":
            try:
                if os.listdir(os.path.join(path, name)):
                    return False
            except OSError:
                return False
        elif name != "spec.yaml" and not name.startswith("."):
            return False
    return True


def _unmade(folder: "str | os.PathLike") -> Optional[tuple[_Store, int, tuple, str]]:
    """``_entry`` of a run that is still as submit left it (see ``_untouched``)."""
    found = _entry(folder)
    return found if found is not None and _untouched(found[3]) else None


def listed(folder: "str | os.PathLike") -> bool:
    """Whether ``folder`` is a run its sweep's store lists (made by now or not: a run
    whose folder holds no run.json is unmade)."""
    return _entry(folder) is not None


def raw_record(folder: "str | os.PathLike") -> Optional[dict]:
    """The run.json an unmade run will start with; None for any other folder."""
    found = _unmade(folder)
    return found[0].record(found[3], found[1]) if found is not None else None


def spec_text(folder: "str | os.PathLike") -> Optional[str]:
    """The spec.yaml the unmade run ``folder`` will hold; None for any other folder."""
    found = _unmade(folder)
    return found[0].spec_text(found[1]) if found is not None else None


def stamp(folder: "str | os.PathLike") -> Optional[tuple]:
    """(size, mtime_ns, inode) of the store that lists the unmade run ``folder``; None
    for any other folder."""
    found = _unmade(folder)
    return found[2] if found is not None else None


def names(parent: "str | os.PathLike", only: Optional[str] = None, present: "set | frozenset" = frozenset()
          ) -> list[str]:
    """The run names of every store in ``parent`` (of sweep ``only``) but those in
    ``present`` (the folders a caller found). A store whose every run is present is not
    read: a scan of a sweep whose runs all started needs no more of its 4 MB (10,000
    points) than its count."""
    try:
        found = [e.name[:-len(SUFFIX)] for e in os.scandir(os.path.join(parent, sweepnames.FOLDER))
                 if e.name.endswith(SUFFIX)]
    except OSError:
        return []
    listed: list[str] = []
    for stamp_ in found:
        if (only is not None and stamp_ != only) or _all_present(parent, stamp_, present):
            continue
        store = _store(os.fspath(parent), stamp_)
        if store is not None:
            listed += [name for index in store[1].points
                       if (name := sweepnames.run_name(stamp_, index, store[1].count)) not in present]
    return listed


def _all_present(parent: "str | os.PathLike", stamp_: str, present: "set | frozenset") -> bool:
    """Whether every name the count at the head of the store gives is in ``present`` (a
    store lists no index past its count)."""
    if not present:
        return False
    try:
        with open(os.path.join(parent, sweepnames.FOLDER, stamp_ + SUFFIX), "rb") as file:
            head = _HEAD.match(file.read(32))
    except OSError:
        return False
    count = int(head.group(1)) if head else len(present) + 1
    return count <= len(present) and all(sweepnames.run_name(stamp_, i, count) in present for i in range(count))


def make_folder(folder: "str | os.PathLike") -> Optional[dict]:
    """Make the run folder ``folder`` as its store says, but for its run.json: its logs/
    and spec.yaml (each made once, never replacing one made already); the run.json it
    starts with, which clusterjob.core.record writes (``record.materialize``). None for
    any other folder."""
    found = _unmade(folder)
    if found is None:
        return None
    store, index, _, path = found
    os.makedirs(os.path.join(path, "logs"), exist_ok=True)
    create_once(Path(path) / "spec.yaml", store.spec_text(index))
    return store.record(path, index)


def create_once(path: Path, text: str) -> None:
    """``path`` made with ``text`` unless it exists: written under a name of its own,
    then linked into place (a link never replaces a file), so that processes making it
    at once make it once, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    write_new(tmp, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
