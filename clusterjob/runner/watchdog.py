"""The watcher of one rank: ``python -m clusterjob.runner.watchdog CONFIG``, started by the
rank (clusterjob.runner.health), CONFIG a clusterjob.runner.watchconfig.WatchConfig as
JSON; stdlib, clusterjob.core and the runner's stacks only, no torch
(docs/design.md, "Hung and slow ranks").

Every watcher, once a second: answers a stall's request for its rank's stacks (written
to ``logs/stall-<n>/rank<R>.txt``, with py-spy's native frames when py-spy is installed
and torch's NCCL flight recorder beside them under NCCL), and ends its rank when the
stall's verdict is retry or stop. It signals only its own rank, the process that
started it, verified by clusterjob.core.procs, and it ends with its rank: its stdin is a
pipe from the rank (closed by the rank's end, however it ends), the kernel sends it
SIGTERM when the rank dies (PR_SET_PDEATHSIG), and it looks at its parent every second,
from a thread of its own that ends the process a few seconds after the rank whatever its
main thread is blocked in.

The leader (rank 0's watcher; the lowest rank still running once rank 0 ended) also
notes, on its own clock, when each rank's progress marks changed (its beat file, and
its output with ``health.output_is_progress``): no change on any rank for
``health.stall_s`` is a stall. It asks every rank for its stacks, names the culprit
(clusterjob.runner.stacks), records the stall in run.json and its verdict beside the
stacks; with retry or stop it marks the run failed with ``stalled: <line>`` first, so
the launcher that sees the ranks end knows why (retrying through clusterjob.core.retry).
Every watcher also samples the memory its rank's process tree holds, keeping the
highest (clusterjob.health.hostmem). Every few seconds the leader also reads the ranks'
waits in collectives (clusterjob.health.rankhealth),
records the rank the others wait for, and warns once when they wait more than
``health.straggler_wait_pct`` of their time over a minute.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from clusterjob.core import procs, runstate
from clusterjob.core.files import loads, now_iso, read_text, write_atomic
from clusterjob.core.record import Stall, Straggler
from clusterjob.core.rundir import RunDir
from clusterjob.health import hostmem, pyspy, rankhealth, stackdump, stalls
from clusterjob.runner import stacks
from clusterjob.runner.watchconfig import WatchConfig

POLL_S = 1.0
ENDING_GRACE_S = 5.0  # the main thread's time to end on its own once the rank is gone
ANSWER_WAIT_S = 15.0  # the leader waits this long for every rank's stacks
STRAGGLER_EVERY_S = 10.0  # how often the leader reads the ranks' waits
STRAGGLER_RECORD_S = 60.0  # run.json's straggler is rewritten at most this often
NATIVE_WAIT_S = 20.0  # py-spy's dump of the native frames
NCCL_WAIT_S = 10.0  # torch's dump of its flight recorder
BEACON = "stall.request"  # logs/stall.request: the newest stall, for every watcher to answer
_PR_SET_PDEATHSIG = 1


class Progress:
    """When this watcher saw each rank's progress marks change, on its own clock: no
    clock of another node is ever compared with ours."""

    def __init__(self, run: RunDir, ranks: list[int], output: bool):
        self.paths = {r: [run.beat_file(r), *((run.logs / f"rank{r}.out", run.logs / f"rank{r}.err")
                                              if output else ())] for r in ranks}
        now = time.monotonic()
        self.marks = {r: self._marks(r) for r in ranks}
        self.changed = dict.fromkeys(ranks, now)
        self.wall = dict.fromkeys(ranks, time.time())

    def _marks(self, rank: int) -> tuple:
        found: list[Optional[tuple]] = []
        for path in self.paths[rank]:
            try:
                st = os.stat(path)
                found.append((st.st_size, st.st_mtime_ns))
            except OSError:
                found.append(None)
        return tuple(found)

    def update(self) -> None:
        for rank in self.paths:
            marks = self._marks(rank)
            if marks != self.marks[rank]:
                self.marks[rank], self.changed[rank], self.wall[rank] = marks, time.monotonic(), time.time()

    def rebase(self, rank: int) -> None:
        """Take the marks as they are now without counting a change (our own message in the log)."""
        if rank in self.paths:
            self.marks[rank] = self._marks(rank)

    def latest(self) -> float:
        return max(self.changed.values())

    def age_s(self, rank: int) -> float:
        return time.monotonic() - self.changed[rank]


class Watcher:
    """One rank's watcher (see the module's doc)."""

    def __init__(self, config: WatchConfig):
        self.config = config
        self.run = RunDir(Path(config.run))
        self.rank, self.world, self.session = config.rank, config.world, config.session
        self.parent = os.getppid()
        self.gone = threading.Event()
        self.identity = rankhealth.read(self.run, self.rank)
        self.own = Progress(self.run, [self.rank], config.output)
        self.beacon: Optional[tuple] = None
        self.answered: Optional[int] = None
        self.awaiting: Optional[int] = None  # the stall whose verdict this watcher waits for
        self.leader: Optional[Leader] = None
        self.memory = hostmem.Peak(self.run.logs, self.rank, self.parent)  # the rank's tree: its most memory

    def watch(self) -> None:
        _arm_parent_death(self.parent, self.gone)
        threading.Thread(target=self._read_stdin, daemon=True, name="rank-pipe").start()
        self._request()  # notes the beacon as it is: a request made before this session is not ours
        while not self.gone.wait(POLL_S):
            if os.getppid() != self.parent:
                break
            self.own.update()
            with _suppressed():
                self.memory.sample()
            found = self._request()
            if found is not None and found != self.answered and self.run.stall_dir(found).is_dir():
                self.answer(found)
            self.act()
            if self._leads():
                if self.leader is None:
                    self.leader = Leader(self)
                self.leader.tick()
        self._ended()

    def _read_stdin(self) -> None:
        """The rank holds the other end: EOF is its end (or its word that it is done)."""
        try:
            sys.stdin.buffer.read()
        except (OSError, ValueError):
            pass
        self.gone.set()

    def _request(self) -> Optional[int]:
        """The newest stall of this session that asks for stacks, when the beacon changed."""
        beacon = self.run.logs / BEACON
        try:
            st = os.stat(beacon)
        except OSError:
            return None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp == self.beacon:
            return None
        self.beacon = stamp
        raw = loads(read_text(beacon)[0] or "")
        if not isinstance(raw, dict) or raw.get("session") != self.session or not isinstance(raw.get("n"), int):
            return None
        return raw["n"]

    def answer(self, number: int) -> None:
        """Write this rank's stacks for stall ``number`` (and the native frames, the NCCL trace)."""
        self.answered, self.awaiting = number, number
        folder = self.run.stall_dir(number)
        got = self._stacks()
        host = self.identity.host if self.identity else socket.gethostname()
        pid = self.identity.ref.pid if self.identity and self.identity.ref else self.parent
        main = self.identity.main_thread if self.identity else None
        header = (f"# rank {self.rank} on {host}, pid {pid}, main thread {f'0x{main:016x}' if main else '?'}; "
                  f"its last progress {self.own.age_s(self.rank):.0f} s before this dump\n")
        parts = [header, got.written()]
        if got.text is not None and self.identity is not None:
            parts.append(stackdump.take_children(self.identity, self.run.stacks_file(self.rank)))
        # py-spy's native frames pause the process: that fails on one read from outside (stopped)
        native = _native(pid) if got.text is not None and not got.outside else None
        if native:
            parts.append(f"\n# native frames (py-spy dump --native)\n{native}")
        if self.config.nccl_pipe and self.config.nccl_trace:
            _nccl_trace(self.rank, folder, self.config.nccl_pipe, self.config.nccl_trace)
        write_atomic(folder / f"rank{self.rank}.txt", "".join(parts))

    def _stacks(self) -> stackdump.Stacks:
        """The rank's stacks, only from the process that started this watcher."""
        if self.identity is None or self.identity.ref is None or self.identity.ref.pid != self.parent:
            return stackdump.Stacks(None, f"its health file does not name this watcher's rank (pid {self.parent})")
        return stackdump.ask(self.identity, self.run.stacks_file(self.rank))

    def act(self) -> None:
        """On a retry or stop verdict of the stall answered: end the rank (and its group)."""
        if self.awaiting is None:
            return
        raw = loads(read_text(self.run.stall_dir(self.awaiting) / "verdict.json")[0] or "")
        if not isinstance(raw, dict):
            return
        self.awaiting = None
        if raw.get("action") in stalls.ENDING and self.identity and self.identity.ref \
                and self.identity.ref.pid == self.parent:
            procs.terminate_group(self.identity.ref)

    def _leads(self) -> bool:
        """Rank 0's watcher, or the lowest rank's still running once the ranks before it ended."""
        if self.rank == 0 or self.leader is not None:
            return True
        if not rankhealth.ended_in(self.run, 0, self.session):
            return False
        return all(rankhealth.ended_in(self.run, rank, self.session) for rank in range(1, self.rank))

    def _ended(self) -> None:
        with _suppressed():
            rankhealth.mark_ended(self.run, self.rank, self.session)
        with _suppressed():
            self.memory.save()
        if self.leader is not None:
            with _suppressed():
                self.leader.stragglers(final=True)


class Leader:
    """The stall detector and the straggler's reader (see the module's doc)."""

    def __init__(self, watcher: Watcher):
        self.w = watcher
        self.run, self.world, self.session = watcher.run, watcher.world, watcher.session
        self.progress = Progress(self.run, list(range(self.world)), watcher.config.output)
        self.stall_s = watcher.config.stall_s
        self.open: Optional[Stall] = None
        self.open_seen = 0.0  # when the open stall was seen (monotonic)
        self.done = False  # a verdict ended the ranks: nothing more to watch
        self.next_straggler = time.monotonic() + STRAGGLER_EVERY_S
        self.recorded, self.warned = -math.inf, False

    def tick(self) -> None:
        self.progress.update()
        now = time.monotonic()
        if self.stall_s is not None and not self.done:
            if self.open is None and now - self.progress.latest() >= self.stall_s:
                self.declare()
            elif self.open is not None and self.progress.latest() > self.open_seen:
                self.recovered()
        if now >= self.next_straggler:
            self.next_straggler = now + STRAGGLER_EVERY_S
            self.stragglers()

    def declare(self) -> None:
        """A stall: every rank's stacks, the culprit, the record, the verdict."""
        seen, at = time.monotonic(), now_iso()
        since = _iso(max(self.progress.wall.values()))
        number = _next_number(self.run)
        folder = self.run.stall_dir(number)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "request.json", json.dumps({"n": number, "session": self.session, "at": at}) + "\n")
        write_atomic(self.run.logs / BEACON, json.dumps({"n": number, "session": self.session}) + "\n")
        self.w.answer(number)
        healths = {h.rank: h for h in rankhealth.of_session(self.run, self.world)}
        ended = {r for r in range(self.world) if rankhealth.ended_in(self.run, r, self.session)}
        self._await_answers(folder, [r for r in range(self.world) if r not in ended])
        found = stacks.culprit([self._dump(folder, r, healths.get(r), r in ended) for r in range(self.world)])
        assert found is not None  # world >= 1
        self.progress.update()
        action = "none" if self.progress.latest() > seen else self.w.config.action
        stall = Stall(number, at, since, found.line, found.rank, found.host, action,
                      now_iso() if action == "none" else None)
        stall = self._record(stall)
        write_atomic(folder / "verdict.json", json.dumps(stall.to_dict()) + "\n")
        self._say(f"clusterjob: stall {number}: no progress on any rank for {self.stall_s:g} s; stacks in {folder}; "
                  f"{stall.line}; on_stall: {stall.action}")
        self.open, self.open_seen = (stall, seen) if stall.action == "warn" else (None, seen)
        self.done = stall.action in stalls.ENDING
        self.w.act()  # its own rank at once: the sooner every rank ends, the fewer errors it causes

    def _await_answers(self, folder: Path, ranks: list[int]) -> None:
        deadline = time.monotonic() + ANSWER_WAIT_S
        while time.monotonic() < deadline and not all((folder / f"rank{r}.txt").exists() for r in ranks):
            time.sleep(0.2)

    def _dump(self, folder: Path, rank: int, health: Optional[rankhealth.RankHealth], ended: bool) -> stacks.RankDump:
        text, _ = read_text(folder / f"rank{rank}.txt", stackdump.MAX_DUMP_BYTES * 2)
        host = health.node if health else "?"
        why = "" if text is not None else f"its watcher did not answer within {ANSWER_WAIT_S:g} s"
        return stacks.RankDump(rank, host, text, why, ended, self.progress.age_s(rank),
                               health.main_thread if health else None)

    def _record(self, stall: Stall) -> Stall:
        """The stall in run.json; a retry or stop verdict also fails the run with its line
        (the launcher retries on it). A run that ended or was cancelled meanwhile keeps its end."""
        info = self.run.read()
        if stall.action in stalls.ENDING and (info.status in runstate.FINAL_STATUSES or info.cancel_requested_at):
            stall = replace(stall, action="none", ended_at=now_iso())
        ended = runstate.fail(stalls.error(stall), runstate.STALLED) if stall.action in stalls.ENDING else None
        self.run.update(ended, stalls=[*info.stalls, stall])
        return stall

    def recovered(self) -> None:
        """Progress again after a stall it warned about: the stall is over."""
        assert self.open is not None  # only an open stall recovers
        info = self.run.read()
        ended = [replace(s, ended_at=now_iso()) if s.n == self.open.n and s.ended_at is None else s
                 for s in info.stalls]
        self.run.update(stalls=ended)
        self._say(f"clusterjob: stall {self.open.n} is over: progress again")
        self.open = None

    def stragglers(self, final: bool = False) -> None:
        """Record the rank the others wait for (at most every STRAGGLER_RECORD_S, and at
        the end), and warn once when they wait too long over a whole minute."""
        healths = rankhealth.of_session(self.run, self.world)
        slow = rankhealth.slowest(healths)
        if slow is None or slow.others_wait_pct < rankhealth.SHOWN_FROM_PCT:
            return
        now = time.monotonic()
        if final or now - self.recorded >= STRAGGLER_RECORD_S:
            self.recorded = now
            self.run.update(straggler=Straggler(slow.rank, slow.host, round(slow.others_wait_pct, 1), now_iso()))
        minute = all(h.waits is not None and h.waits.recent_total_s >= 0.9 * 60 for h in healths)
        if minute and not self.warned and slow.others_wait_pct > self.w.config.straggler_pct:
            self.warned = True
            line = (f"health: rank {slow.rank} on {slow.host} is the slowest: the others waited "
                    f"{slow.others_wait_pct:.0f}% of their time in collectives over the last minute "
                    f"(health.straggler_wait_pct: {self.w.config.straggler_pct:g})")
            self._say(f"clusterjob: warning: {line}")
            info = self.run.read()
            self.run.update(warnings=[w for w in info.warnings if not w.startswith("health: ")] + [line])

    def _say(self, line: str) -> None:
        """A line on the leader's rank's stderr, which is no progress of that rank."""
        with _suppressed():
            print(line, file=sys.stderr, flush=True)
        self.progress.rebase(self.w.rank)
        self.w.own.rebase(self.w.rank)


def _next_number(run: RunDir) -> int:
    """One more than the highest stall of the run so far (the folders stay across sessions)."""
    taken = [int(p.name[len("stall-"):]) for p in run.logs.glob("stall-*") if p.name[len("stall-"):].isdigit()]
    return max(taken, default=0) + 1


def _iso(wall: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="milliseconds")


def _native(pid: int) -> Optional[str]:
    """py-spy's dump with native frames (the ``[health]`` extra), or None without py-spy."""
    exe = pyspy.executable()
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=NATIVE_WAIT_S, errors="replace")
    except (OSError, subprocess.SubprocessError) as err:
        return f"(py-spy failed: {err})\n"
    return done.stdout + (f"(py-spy exited {done.returncode}: {done.stderr.strip()})\n" if done.returncode else "")


def _nccl_trace(rank: int, folder: Path, pipe: str, trace: str) -> None:
    """Ask torch (under NCCL) to dump its flight recorder, and copy the dump beside the stacks."""
    target = Path(f"{trace}{rank}")
    before = _stamp(target)
    try:
        fd = os.open(f"{pipe}{rank}.pipe", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no such pipe, or nobody reads it: no NCCL group in this rank
        return
    try:
        os.write(fd, b"1\n")
    except OSError:
        return
    finally:
        os.close(fd)
    deadline = time.monotonic() + NCCL_WAIT_S
    while time.monotonic() < deadline and _stamp(target) == before:
        time.sleep(0.2)
    if _stamp(target) != before:
        time.sleep(0.5)  # torch writes the dump in one go; let it finish
        with _suppressed():
            shutil.copyfile(target, folder / target.name)


def _stamp(path: Path) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _suppressed() -> contextlib.suppress:
    """The watcher's own failures (a full disk) end nothing: the rank trains on."""
    return contextlib.suppress(Exception)


def _arm_parent_death(parent: int, gone: threading.Event) -> None:
    """SIGTERM from the kernel when the rank dies (PR_SET_PDEATHSIG); a SIGTERM while the
    rank lives (Slurm's scancel reaches every process of the step) leaves the rank to end us."""
    def on_term(signum: int, frame: object) -> None:
        if os.getppid() != parent:
            gone.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _suppressed():
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        gone.set()
    threading.Thread(target=_lifeline, args=(parent, gone), daemon=True, name="lifeline").start()


def _lifeline(parent: int, gone: threading.Event) -> None:
    """Ends this process ENDING_GRACE_S after its rank is gone, wherever the main thread is:
    a signal handler runs only between the main thread's calls, and a main thread blocked
    in a lock (run.json's, held by a stopped process), a write to a full pipe or a stuck
    py-spy would otherwise keep the watcher alive, SIGTERM and all, long after its rank."""
    while not gone.wait(POLL_S):
        if os.getppid() != parent:
            gone.set()
    time.sleep(ENDING_GRACE_S)  # the main thread's own end (the rank's ended file) comes first
    os._exit(0)


def main(argv: list[str]) -> int:
    Watcher(WatchConfig.of(argv[0])).watch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
