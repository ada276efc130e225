"""The nodes that failed runs, remembered per results root (docs/design.md, "Bad nodes"):
``<output.root>/.clusterjob/bad-nodes.json``, one entry per node (its latest failure:
why, when, which run).

A node that hung a collective (the health watchdog's culprit on a stall it retries),
failed with Slurm's NODE_FAIL, had a rank killed under a retry, whose GPU or driver failed
a rank, or whose ranks raised NCCL errors in two failed runs (``suspect``) is almost always bad,
and Slurm gives it to the next job again. Later submits of any spec with the same
``output.root`` keep their jobs off the nodes listed within ``resources.bad_node_ttl``
(``--exclude``); ``clusterjob nodes`` lists them and ``--forget`` lifts one. Writers
take turns under a lock beside the file; a reader of a missing or unreadable file finds
no node (the list is advice, never a reason to fail a submit).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core.files import loads, locked, now_iso, read_text, write_atomic

FOLDER, FILE = ".clusterjob", "bad-nodes.json"
SUSPECTS = "suspect-nodes.json"  # nodes of a run that failed with NCCL errors, not listed yet
TIMES_SUSPECTED = 2  # the runs a node's ranks must fail with NCCL errors in before it is listed
MAX_SUSPECTS = 500  # the suspicions kept, newest
MAX_LIST_BYTES = 16 << 20  # a list file larger than this is damaged: no node


@dataclass(frozen=True)
class BadNode:
    """One node on the list: its name, why it is there, when it was put there, and the run."""

    node: str
    why: str
    when: str
    run: Optional[str] = None

    def age_s(self, now: Optional[datetime] = None) -> float:
        """Seconds since it was listed (an unreadable time: as old as can be)."""
        try:
            then = datetime.fromisoformat(self.when)
        except ValueError:
            return float("inf")
        return ((now or datetime.now(timezone.utc)) - then).total_seconds()


def path_of(root: "str | Path") -> Path:
    return Path(root) / FOLDER / FILE


def listed(root: "str | Path") -> list[BadNode]:
    """The nodes on the list of ``root``, oldest first; [] for no (or an unreadable) list."""
    raw = _read(path_of(root))
    entries = raw.get("nodes", []) if isinstance(raw, dict) else []
    found = []
    for item in entries:
        if isinstance(item, dict) and isinstance(item.get("node"), str) and item["node"]:
            found.append(BadNode(item["node"], str(item.get("why") or ""), str(item.get("when") or ""),
                                 item.get("run") if isinstance(item.get("run"), str) else None))
    return sorted(found, key=lambda bad: bad.when)


def fresh(root: "str | Path", ttl_s: float) -> list[str]:
    """The nodes listed within the last ``ttl_s`` seconds: what a submit keeps its jobs off."""
    if ttl_s <= 0:
        return []
    return sorted({bad.node for bad in listed(root) if bad.age_s() <= ttl_s})


def add(root: "str | Path", nodes: Sequence[str], why: str, run: Optional["str | Path"] = None) -> None:
    """Put ``nodes`` on the list of ``root`` (a node listed already: its entry renewed)."""
    names = [node for node in dict.fromkeys(nodes) if node]
    if not names:
        return
    path = path_of(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(FILE + ".lock")):
        kept = [bad for bad in listed(root) if bad.node not in names]
        kept += [BadNode(node, why, now_iso(), str(run) if run is not None else None) for node in names]
        _write(path, kept)


def suspect(root: "str | Path", nodes: Sequence[str], why: str, run: "str | Path") -> list[str]:
    """Nodes whose ranks raised NCCL errors in a failed run (``why``). One such run says
    little (every rank of a broken collective raises one); a node that did in
    TIMES_SUSPECTED different runs goes on the list, its suspicions cleared. The nodes
    listed now, in order."""
    names = [node for node in dict.fromkeys(nodes) if node]
    if not names:
        return []
    path = path_of(root).with_name(SUSPECTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path_of(root).with_name(FILE + ".lock")):
        held = _suspects(path) + [BadNode(node, why, now_iso(), str(run)) for node in names]
        runs: dict = {}
        for entry in held:
            runs.setdefault(entry.node, set()).add(entry.run)
        bad = [node for node in names if len(runs[node]) >= TIMES_SUSPECTED]
        kept = [entry for entry in held if entry.node not in bad][-MAX_SUSPECTS:]
        write_atomic(path, json.dumps({"suspects": [asdict(entry) for entry in kept]}, indent=1) + "\n")
    if bad:
        add(root, bad, f"NCCL errors in {TIMES_SUSPECTED} runs, the last: {why}", run)
    return bad


def _suspects(path: Path) -> list[BadNode]:
    """The suspicions held (an unreadable file: none)."""
    raw = _read(path)
    entries = raw.get("suspects", []) if isinstance(raw, dict) else []
    return [BadNode(item["node"], str(item.get("why") or ""), str(item.get("when") or ""), str(item.get("run") or ""))
            for item in entries if isinstance(item, dict) and isinstance(item.get("node"), str) and item["node"]]


def _read(path: Path) -> object:
    """A list file's JSON; ``loads``' NOT_JSON (no mapping: no node) when it is missing,
    unreadable, not a regular file (a FIFO would block every submit) or larger than any list."""
    return loads(read_text(path, MAX_LIST_BYTES)[0] or "")


def forget(root: "str | Path", node: str) -> bool:
    """Take ``node`` off the list of ``root``; False when it was not on it."""
    path = path_of(root)
    if not path.exists():
        return False
    with locked(path.with_name(FILE + ".lock")):
        found = listed(root)
        kept = [bad for bad in found if bad.node != node]
        if len(kept) == len(found):
            return False
        _write(path, kept)
    return True


def _write(path: Path, entries: list[BadNode]) -> None:
    write_atomic(path, json.dumps({"nodes": [asdict(bad) for bad in entries]}, indent=1) + "\n")


def root_of(run_path: "str | Path") -> Path:
    """The results root of a run folder (``<output.root>/<name>/<run_id>``)."""
    return Path(run_path).resolve().parent.parent


def table(root: "str | Path", ttl_s: float) -> list[str]:
    """``clusterjob nodes``: one line per node on the list, newest first, and whether a
    submit keeps jobs off it now (listed within ``ttl_s``, the default bad_node_ttl)."""
    found = listed(root)
    if not found:
        return [f"no bad nodes listed in {path_of(root)}"]
    rows = [("NODE", "WHEN", "EXCLUDED", "RUN", "WHY")]
    for bad in reversed(found):
        rows.append((bad.node, bad.when, "yes" if bad.age_s() <= ttl_s else "no (expired)", bad.run or "-", bad.why))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(row[:4], widths)), row[4]]).rstrip()
            for row in rows]
