"""The stacks of a stall, read (docs/design.md, "Hung and slow ranks"): each rank's dump
as faulthandler writes it, where its main thread is (inside a collective or not), and
the culprit named in one line of evidence:

    rank 1 on node2: time.sleep at train.py:40; rank 0 in all_reduce

The culprit is a rank that could not answer in its state (stopped by SIGSTOP, a debugger:
``rank 1 on node2: stopped (T), time.sleep at train.py:40``, its stacks read by py-spy);
else the rank whose main thread is not inside a collective (a rank that waits
in one waits for another); else a rank whose process ended while the others waited;
else one that gave no stacks; else the rank whose last progress is oldest. Stdlib only
(the watcher has no torch).
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Optional

from clusterjob.health.stackdump import CHILD_MARK, STACK_HEADER, THREAD_HEADER, state_in

_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\(")
_NOT_CALLS = frozenset({"if", "elif", "while", "for", "return", "yield", "assert", "not", "and", "or", "in", "print",
                        "with", "lambda", "await", "del", "raise"})
_SEP = os.sep
_DDP_FILE = f"{_SEP}torch{_SEP}nn{_SEP}parallel{_SEP}distributed.py"  # DDP's own broadcasts and syncs
COLLECTIVE_FILES = (f"{_SEP}torch{_SEP}distributed{_SEP}", f"{_SEP}clusterjob{_SEP}runner{_SEP}dist.py", _DDP_FILE)
BACKWARD_FILES = (f"{_SEP}torch{_SEP}autograd{_SEP}", f"{_SEP}torch{_SEP}_tensor.py")
_WRAPPERS = frozenset({"wrapper", "inner", "_fn", "decorate_context"})
_LIBRARIES = tuple(dict.fromkeys(p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
                                              sysconfig.get_paths().get("platlib")) if p))
# Another interpreter's standard library or packages (a rank's Python may not be ours)
_LIBRARY = re.compile(r"[/\\](?:site-packages|dist-packages|lib[/\\]python\d+(?:\.\d+)?)[/\\]")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def place(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class Thread:
    ident: Optional[int]
    current: bool
    frames: tuple  # innermost first, as faulthandler writes them


def parse(text: str) -> list[Thread]:
    """The threads of one faulthandler dump (several dumps: those of the last one)."""
    threads: list[Thread] = []
    ident: Optional[int] = None
    current, inside = False, False
    frames: list[Frame] = []
    for line in text.splitlines():
        header, single = THREAD_HEADER.match(line), STACK_HEADER.match(line)
        if header or single:
            if inside:
                threads.append(Thread(ident, current, tuple(frames)))
            if header and header.group(1) == "Thread" and threads and threads[-1].current:
                threads = []  # a later dump begins: faulthandler ends each with the current thread
            ident = int(header.group(2), 16) if header else None
            current, frames, inside = header is None or header.group(1) == "Current thread", [], True
        elif inside and (found := _FRAME.match(line)):
            frames.append(Frame(found.group(1), int(found.group(2)), found.group(3)))
    if inside:
        threads.append(Thread(ident, current, tuple(frames)))
    return threads


def main_thread(threads: list[Thread], ident: Optional[int]) -> Optional[Thread]:
    """The rank's main thread: the one of ``ident``, else the thread the signal found
    (the dump's current one), else the first."""
    for thread in threads:
        if ident is not None and thread.ident == ident:
            return thread
    return next((t for t in threads if t.current), threads[0] if threads else None)


@dataclass(frozen=True)
class Place:
    """Where a main thread is: inside a collective (``call`` is its name, the one your
    code called) or at ``call`` (the call on the source line, or the function); ``frame``
    is your code's innermost frame, ``entry`` the library frame it called and ``inside``
    the innermost one, where it waits (None: it is in your code itself)."""

    collective: bool
    call: str
    frame: Optional[Frame] = None
    inside: Optional[Frame] = None
    entry: Optional[Frame] = None
    between: int = 0  # library frames between ``entry`` and ``inside``

    def words(self, at: bool = False) -> str:
        """``in all_reduce`` (``at``: ``in all_reduce at train.py:12``), or ``time.sleep at
        train.py:40 (in __next__, dataloader.py:733 > ... > select, selectors.py:415)``."""
        if self.collective:
            return f"in {self.call}" + (f" at {self.frame.place}" if at and self.frame else "")
        text = f"{self.call} at {self.frame.place}" if self.frame else self.call
        if self.inside is None:
            return text
        path = [self.entry, *([None] if self.between else []), self.inside] if self.entry else [self.inside]
        return text + " (in " + " > ".join(f"{f.function}, {f.place}" if f else "..." for f in path) + ")"


def place(thread: Optional[Thread]) -> Optional[Place]:
    """Where ``thread`` is; None for no Python frame at all."""
    if thread is None or not thread.frames:
        return None
    inner = thread.frames[0]
    own_at = next((i for i, f in enumerate(thread.frames) if not _library(f.file)), None)
    own = thread.frames[own_at] if own_at is not None else None
    if any(part in inner.file for part in COLLECTIVE_FILES):
        return Place(True, _collective_call(thread.frames), own)
    if any(part in inner.file for part in BACKWARD_FILES) and "backward" in {f.function for f in thread.frames}:
        return Place(True, "backward", own)  # DDP's all-reduce waits in C++ at the end of backward
    if own is None or own_at is None:
        return Place(False, call_on(inner), inner)
    entry = thread.frames[own_at - 1] if own_at > 0 else None
    return Place(False, call_on(own), own, inner if inner is not own else None, entry if own_at > 1 else None,
                 max(0, own_at - 2))


def _collective_call(frames: tuple) -> str:
    """The collective your code called: the outermost torch.distributed (or DDP) frame
    that is no decorator's wrapper (``init_process_group``, not the helper it waits in)."""
    named = [f for f in frames if any(part in f.file for part in COLLECTIVE_FILES) and f.function not in _WRAPPERS]
    if not named:
        return frames[0].function
    outer = named[-1]
    return f"DistributedDataParallel.{outer.function}" if _DDP_FILE in outer.file else outer.function


def _library(file: str) -> bool:
    """A frame of the standard library or an installed package (or frozen, ``<...>``)."""
    return file.startswith(_LIBRARIES) or file.startswith("<") or _LIBRARY.search(file) is not None


def call_on(frame: Frame) -> str:
    """The first call on the frame's source line (``time.sleep``), else its function
    with the line itself (``<module> (x += 1)``: a loop in pure Python)."""
    text = linecache.getline(frame.file, frame.line).strip()
    for found in _CALL.finditer(text):
        name = re.sub(r"\s+", "", found.group(1))
        if name not in _NOT_CALLS:
            return name
    return f"{frame.function} ({text[:60]})" if text else frame.function


@dataclass(frozen=True)
class RankDump:
    """What the stall gave of one rank: its stacks (None: none came, ``why`` says why),
    whether its process had ended, and how long before the stall it last made progress."""

    rank: int
    host: str
    text: Optional[str] = None
    why: str = ""
    ended: bool = False
    age_s: float = 0.0
    main_ident: Optional[int] = None

    @property
    def state(self) -> str:
        """The state its process was in when it could not answer (``stopped (T)``), else ""."""
        return state_in(self.text) if self.text else ""

    def where(self) -> Optional[Place]:
        """Where the rank's main thread is, from its own dump (its children's follow it)."""
        own = self.text.split(CHILD_MARK, 1)[0] if self.text else None
        return place(main_thread(parse(own), self.main_ident)) if own else None


@dataclass(frozen=True)
class Culprit:
    rank: int
    host: str
    line: str


def culprit(dumps: list[RankDump]) -> Optional[Culprit]:
    """The rank at fault and the evidence (see the module's doc); None without ranks."""
    if not dumps:
        return None
    places = {d.rank: d.where() for d in dumps}
    frozen = [d for d in dumps if not d.ended and d.state]
    outside = [d for d in dumps if not d.ended and not d.state and not getattr(places[d.rank], "collective", True)]
    ended = [d for d in dumps if d.ended]
    silent = [d for d in dumps if not d.ended and places[d.rank] is None]
    for group, says in ((frozen, None), (outside, None), (ended, "its process ended while the others waited"),
                        (silent, "no stacks")):
        if group:
            found = max(group, key=lambda d: (d.age_s, -d.rank))
            what = says if says is not None else _where(found, places[found.rank], "no stacks")
            if group is silent and found.why:
                what += f" ({found.why})"
            return Culprit(found.rank, found.host, _line(found, what, dumps, places))
    # Every rank waits in a collective: the one whose progress is oldest, and where each
    # waits in your code (collectives called from different lines deadlock each other)
    found = max(dumps, key=lambda d: (d.age_s, -d.rank))
    what = f"{places[found.rank].words(at=True)}, its last progress the oldest ({found.age_s:.0f} s)"  # type: ignore[union-attr]
    line = _line(found, what, dumps, places, at=True)
    calls = {(p.call, p.frame) for p in places.values()}  # type: ignore[union-attr]
    if len(calls) > 1:
        line += "; every rank waits in a collective, each at another call: a deadlock between collectives"
    return Culprit(found.rank, found.host, line)


def _line(found: RankDump, what: str, dumps: list[RankDump], places: dict, at: bool = False) -> str:
    """``rank 1 on node2: <what>; ranks 0,2 in all_reduce; rank 3 <where>``: the culprit,
    then the others grouped by where they are (``at``: with the line of your code)."""
    groups: dict[str, list[int]] = {}
    for dump in dumps:
        if dump.rank == found.rank:
            continue
        said = "ended" if dump.ended else _where(dump, places[dump.rank], "gave no stacks", at)
        groups.setdefault(said, []).append(dump.rank)
    others = [f"{'ranks' if len(ranks) > 1 else 'rank'} {_ranks(ranks)} {said}" for said, ranks in groups.items()]
    return "; ".join([f"rank {found.rank} on {found.host}: {what}", *others])


def _where(dump: RankDump, place: Optional[Place], none: str, at: bool = False) -> str:
    """Where the rank is (``none`` without its stacks), after its state when it could not
    answer: ``stopped (T), time.sleep at train.py:40``."""
    where = place.words(at) if place is not None else none
    return f"{dump.state}, {where}" if dump.state else where


def _ranks(ranks: list[int]) -> str:
    """0,2,3 (at most 8 named, then how many more)."""
    listed = ",".join(str(r) for r in ranks[:8])
    return listed + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
