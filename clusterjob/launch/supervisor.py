"""The local executor's supervisor (docs/design.md, "Executors and scripts"; what its
faults end in: "Failures"): ``tasks_per_node`` ranks of ``python -m clusterjob.run`` on
this machine (gloo on CPU, one per GPU with CUDA), the same run folders as on Slurm,
per-rank logs in ``<run>/logs/``.

A supervisor runs the runs one after another: ``submit --wait`` itself, else a detached
``python -m clusterjob.launch.supervisor WORLD CLAIM_FDS RUN...`` (so closing the
terminal ends nothing). It owns its ranks:

- each rank has its own process group, so a Ctrl-C in the terminal reaches the supervisor
  only, and the kernel sends each rank SIGTERM when the supervisor dies (even by kill -9):
  no rank outlives it;
- on SIGINT, SIGTERM or SIGHUP the supervisor says ``stopping N ranks`` and sends its
  ranks SIGTERM: the built-in trainer (and code that asks ``should_stop()``) checkpoints
  at its next step boundary, a plain script is stopped and killed after
  ``entrypoint.stop_grace_s``; a second Ctrl-C, or ``STOP_GRACE_S``, kills them all.
  Once no rank is alive the run is ``cancelled`` (``resume`` continues it from its
  checkpoint), and so are the runs not started yet; the same after ``clusterjob cancel``
  (read from run.json at each tick: the supervisor stops the ranks it started, also
  those that had not recorded themselves yet when the cancel looked, and it alone
  marks the run cancelled once they all exited);
- every rank is polled at each tick: when one exits non-zero or is killed, the others
  are stopped within seconds (SIGTERM, SIGKILL after ``GRACE_S``), and the run fails or
  is retried naming that rank and how it ended; a rank killed by a signal nobody here
  sent is named as the cause, over the other ranks' "connection reset" errors;
- a run that waits for other runs (run.json's ``after``, from ``submit --after``) starts
  once they completed, and is failed ("dependency failed") once one never will;
- a failure that points at the machine (clusterjob.core.retry) starts the run again
  from its last checkpoint after a back-off, up to ``resources.max_retries`` times; so
  does a stall the health watchdog ended with ``on_stall: retry`` (its reason
  ``stalled: <culprit line>``), and one it ended with ``stop`` keeps its error.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from clusterjob.core import claim, procs, retry, stalls
from clusterjob.core import env as envmod
from clusterjob.core.rundir import (
    FINAL_STATUSES,
    RunDir,
    RunError,
    RunRecord,
    first_error,
    mark_failed,
    now_iso,
    rank_errors,
    tail_lines,
)
from clusterjob.launch import chain
from clusterjob.spec.schema import load_spec

POLL_S = 0.2
GRACE_S = 5.0         # after one rank fails, the others get this long to exit before SIGKILL
STOP_GRACE_S = 60.0   # after a stop request, time to reach a progress line and checkpoint
DEPENDENCY_POLL_S, DEPENDENCY_POLL_MAX_S = 1.0, 10.0  # how often a waiting run asks after its dependencies
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environ(base: dict, rank: int, world: int, port: int) -> dict:
    """The child environment: the caller's, minus any launcher/Slurm variables, plus ranks."""
    env = envmod.DistEnv(source="torchrun", rank=rank, local_rank=rank, world_size=world,
                         local_world_size=world, node_rank=0, num_nodes=1, master_addr="127.0.0.1",
                         master_port=port, hosts=("127.0.0.1",))
    child = envmod.clean_environ(base)
    envmod.export(env, child)
    child["PYTHONUNBUFFERED"] = "1"
    child[envmod.SUPERVISED_VAR] = "1"  # the ranks leave the run's end to us (cancelled, failed...)
    return child


def _die_with(parent: int) -> Callable[[], None]:
    """In the child before exec: SIGTERM when ``parent`` dies (PR_SET_PDEATHSIG); if it
    died already, between fork and here, at once."""
    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


def start_ranks(run: RunDir, world: int) -> list[subprocess.Popen]:
    """Start the run's ranks, each recorded in ``logs/rankN.proc.json`` at once (the rank
    records itself again once it runs): a ``cancel`` finds every rank of this start
    from its first instant, never only the records of an earlier start."""
    run.logs.mkdir(parents=True, exist_ok=True)
    port, ranks, parent = free_port(), [], os.getpid()
    for rank in range(world):
        with open(run.logs / f"rank{rank}.out", "ab") as out, open(run.logs / f"rank{rank}.err", "ab") as err:
            ranks.append(subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(run.spec_file)],
                                          env=rank_environ(dict(os.environ), rank, world, port),
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_die_with(parent)))
        if (ref := procs.current(ranks[-1].pid)) is not None:
            procs.save(run.proc_file(rank), ref)
    return ranks


class Supervisor:
    """Runs run folders one after another with ``world`` local ranks each."""

    def __init__(self, world: int, on_tick: Callable[[RunDir], None] = lambda run: None):
        self.world, self.on_tick = world, on_tick
        self.stop_signal: Optional[int] = None  # the signal that asked us to stop
        self.requests = 0  # a second Ctrl-C does not wait for the checkpoint

    def install(self) -> "Supervisor":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = self.stop_signal or signum
        self.requests += 1

    def run_all(self, runs: list[RunDir]) -> list[RunRecord]:
        """Each run's final run.json; after a stop request the rest are cancelled."""
        infos = []
        for run in runs:
            if self.stop_signal is not None:
                infos.append(run.update(status="cancelled", finished_at=now_iso()))
            elif (info := run.read()).status == "cancelled":  # `clusterjob cancel` before its turn
                infos.append(info)
            elif info.cancel_requested_at is not None:
                infos.append(run.update(status="cancelled", finished_at=now_iso()))
            else:
                infos.append(self.run_one(run))
        return infos

    def run_one(self, run: RunDir) -> RunRecord:
        """Run one run folder to its end, holding its claim the whole time (clusterjob.core.claim:
        no resume starts it meanwhile, and the claim dies with this process); its final run.json.
        It starts once the runs it waits for completed; a failure of the machine starts
        it again from its last checkpoint, up to ``resources.max_retries`` times."""
        with claim.claimed(run.path, claim.SUPERVISOR):
            info = self._await_dependencies(run)
            while info is None:
                ended, cause = self._session(run)
                info = ended if cause is None else self._retry(run, cause)
            return info

    def _session(self, run: RunDir) -> tuple[RunRecord, Optional[str]]:
        """One start of the run's ranks until they all exited: the run's record, and why
        the machine failed it (None: it did not)."""
        ranks = start_ranks(run, self.world)
        sent: dict[int, int] = {}  # rank -> the last signal we sent it
        self._wait(run, ranks, sent)
        codes = [p.returncode for p in ranks]
        info = self._settle(run, codes, sent)
        if info.status != "failed" or self.stop_signal is not None:
            return info, None
        stalled = stalls.verdict(info)  # the health watchdog ended the ranks: retry or stop, as it said
        if stalled is not None:
            return info, stalls.reason(stalled) if stalled.action == "retry" else None
        killed = _killed(run, [(rank, code) for rank, code in enumerate(codes) if code != 0], sent)
        return info, retry.machine_cause(killed and killed[1], rank_errors(run), codes)

    def _retry(self, run: RunDir, cause: str) -> Optional[RunRecord]:
        """After a failure of the machine: None once the run is reopened for a retry and
        its back-off passed; else its final record (no retry left, or stopped meanwhile)."""
        resources = load_spec(run.spec_file).resources
        decision = retry.decide(run, cause, resources.max_retries, resources.retry_backoff_s,
                                hosts=[socket.gethostname()])
        if decision is None:
            return run.read()
        print(f"{run.path}: {decision.line}", flush=True)
        return decision.record if decision.number is None else self._pause(run, decision.wait_s)

    def _await_dependencies(self, run: RunDir) -> Optional[RunRecord]:
        """None once every run this one waits for (run.json's ``after``) completed; else
        its final record: failed ("dependency failed") when one of them never will, or
        cancelled by a stop meanwhile."""
        after = run.read().after
        pause, said = DEPENDENCY_POLL_S, False
        while after:
            deps = chain.states(after)
            reason = chain.failed(deps)
            if reason is not None:
                print(f"{run.path}: {reason}", flush=True)
                return run.update(status="failed", finished_at=now_iso(), error=RunError(None, reason, "", now_iso()))
            if chain.all_done(deps):
                break
            if not said:
                print(f"{run.path}: {chain.waiting_line(deps)}", flush=True)
                said = True
            if (stopped := self._pause(run, pause)) is not None:
                return stopped
            pause = min(DEPENDENCY_POLL_MAX_S, pause * 1.5)
        return None

    def _pause(self, run: RunDir, seconds: float) -> Optional[RunRecord]:
        """Wait ``seconds`` for the run; its cancelled record when a stop signal or a
        cancel came meanwhile, else None."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            info = run.read()
            if self.stop_signal is not None or info.cancel_requested_at is not None or info.status == "cancelled":
                return run.update(status="cancelled", finished_at=now_iso())
            time.sleep(POLL_S)
        return None

    def _wait(self, run: RunDir, ranks: list[subprocess.Popen], sent: dict) -> None:
        """Until every rank exited: stop the others when one fails (exits non-zero or is
        killed), all on a stop request or a ``clusterjob cancel`` of the run. Every rank
        is polled at every tick: a rank waiting in a collective must not hide a sibling
        that died (it would wait for it until ``dist.timeout_s``). A rank that exits 0
        finished its part: the others run on to their own end (docs/design.md, "Failures")."""
        kill_at: Optional[float] = None
        while alive := [p for p in ranks if p.poll() is None]:
            self.on_tick(run)
            failed = any(p.returncode not in (None, 0) for p in ranks)
            if kill_at is None and (failed or self.stop_signal is not None or _cancel_asked(run)):
                if not failed:
                    _say_stopping(len(alive), cancel=self.stop_signal is None)
                _signal(ranks, signal.SIGTERM, sent)
                kill_at = time.monotonic() + (GRACE_S if failed else STOP_GRACE_S)
            if kill_at is not None and (time.monotonic() > kill_at or self.requests > 1):
                _signal(ranks, signal.SIGKILL, sent)
            time.sleep(POLL_S)

    def _settle(self, run: RunDir, codes: list[int], sent: dict) -> RunRecord:
        """The run's final state from the ranks' exit codes and what they recorded."""
        info = run.read()
        status = info.status
        if self.stop_signal is not None or info.cancel_requested_at is not None:
            # Ctrl-C or `cancel`: the user's stop, checkpointed or not (resume continues it);
            # an end the run recorded first (or a cancel that marked it) stands
            return info if status in FINAL_STATUSES else run.update(status="cancelled", finished_at=now_iso())
        if stalls.verdict(info) is not None:
            return info  # a stall's verdict: the ranks were ended on purpose
        bad = [(rank, code) for rank, code in enumerate(codes) if code != 0]
        if not bad:
            if status in ("pending", "running"):
                return run.update(status="failed", finished_at=now_iso(), error=RunError(
                    None, "the ranks exited without finishing the run"))
            return info
        return _record_failure(run, bad, sent)


def _say_stopping(alive: int, cancel: bool = False) -> None:
    """One line as the ranks are asked to stop (a plain script is killed after its
    grace period; the built-in trainer checkpoints first)."""
    noun = "rank" if alive == 1 else "ranks"
    why = "cancel requested: " if cancel else ""
    how = "" if cancel else " (Ctrl-C again to kill them now)"
    print(f"\n{why}stopping {alive} {noun}{how}", file=sys.stderr, flush=True)


def _cancel_asked(run: RunDir) -> bool:
    """Whether ``clusterjob cancel`` asked the run to stop (run.json); the supervisor
    stops the ranks it started, whatever records the cancel found."""
    return run.read().cancel_requested_at is not None


def _signal(ranks: list[subprocess.Popen], sig: int, sent: dict) -> None:
    for rank, p in enumerate(ranks):
        if p.poll() is None:
            p.send_signal(sig)
            sent[rank] = sig


def _killed(run: RunDir, bad: list[tuple[int, int]], sent: dict) -> Optional[tuple[int, str]]:
    """(rank, "rank R was killed by SIG") of the first rank killed by a signal nobody here
    sent, without a traceback; None when there is none."""
    for rank, code in bad:
        if code < 0 and rank not in sent and not run.error_file(rank).exists():
            return rank, f"rank {rank} {_ended(code)}"
    return None


def _ended(code: int) -> str:
    """How a rank ended, from its exit status: "exited with code 3", "was killed by SIGKILL"."""
    if code >= 0:
        return f"exited with code {code}"
    return f"was killed by {signal.Signals(-code).name if -code in signal.valid_signals() else f'signal {-code}'}"


def _record_failure(run: RunDir, bad: list[tuple[int, int]], sent: dict) -> RunRecord:
    """A rank killed by a signal that nobody here sent, without a traceback, is the cause
    (the others then fail on a closed connection); else the first traceback; else the
    first rank that exited non-zero by itself (not the siblings stopped for it)."""
    killed = _killed(run, bad, sent)
    if killed is None and first_error(run) is not None:
        return mark_failed(run, "")
    if killed is None:
        first, code = next(((rank, code) for rank, code in bad if rank not in sent), bad[0])
        killed = first, f"rank {first} {_ended(code)}"
    rank, said = killed
    return run.update(status="failed", finished_at=now_iso(), error=RunError(
        rank, f"{said} (no traceback)", "\n".join(tail_lines(run.logs / f"rank{rank}.err", 20))))


def main(argv: list[str]) -> int:
    """``python -m clusterjob.launch.supervisor WORLD CLAIM_FDS RUN...``: CLAIM_FDS are the
    descriptors of the runs' claims that the local executor handed over (-1: none), in
    run order."""
    world, fds, paths = int(argv[0]), [int(fd) for fd in argv[1].split(",")], argv[2:]
    for fd, path in zip(fds, paths):
        if fd >= 0:
            claim.adopt(fd, path, claim.SUPERVISOR)
    supervisor = Supervisor(world).install()
    for path, info in zip(paths, supervisor.run_all([RunDir(Path(p)) for p in paths])):
        print(f"{path}: {info.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
