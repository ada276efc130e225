"""The task of a search's slot run on this machine (docs/design.md, "Search"): one process
per slot run (clusterjob.search.slots ``LocalSlots``), which the local executor's
supervisor starts in the slot's share of the machine (its cores, its GPUs):

    python -m clusterjob.search.localslot --run SLOT_RUN

It records its slot run running, then supervises its slot's trials one after another in
this process (clusterjob.launch.supervisor, with the search's trials as its feed: the one
the slot holds first, then new ones), each trial's ranks on the slot's cores, until every
trial is taken: the slot run completed (cancelled, when the search was cancelled or the
slot was stopped). What it prints (each trial's progress, its prune, its end) is the slot
run's output, which ``submit --wait`` passes on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clusterjob.core import claim, procs, runstate
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.launch.executor import Watch
from clusterjob.launch.executors.local import LocalExecutor
from clusterjob.launch.progress import LiveLine
from clusterjob.launch.slots import Slot
from clusterjob.launch.submit import summary_line
from clusterjob.search import record as searchmod
from clusterjob.search import slotruns
from clusterjob.search.trials import SPEC_FILE, Feed
from clusterjob.spec.schema import load_spec

PROG = "python -m clusterjob.search.localslot"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="the task of a search's slot run on this machine")
    parser.add_argument("--run", required=True, help="the slot run's folder")
    slot_run = RunDir(Path(parser.parse_args(argv).run))
    found = slotruns.begin(slot_run, PROG)
    if found is None:
        return 2
    try:
        stopped = _supervise(*found)
    except BaseException as exc:
        slotruns.failed(slot_run, exc)
        raise
    slot_run.update(runstate.cancel() if stopped else runstate.complete())
    return 0


def _supervise(folder: Path, slot: int) -> bool:
    """The slot's trials under a supervisor in this process, each one's lines and summary
    on stdout; whether it stopped before the search's end (a stop signal, a cancel)."""
    record, _ = searchmod.read(folder)
    feed = Feed(folder, record.parallel or 1, claim_as=claim.SUPERVISOR, executor="local", launcher=procs.current())
    live = LiveLine(sys.stdout)

    def ended(run: RunDir, info: RunRecord) -> None:
        live.clear()
        print(summary_line(info, run), flush=True)

    supervisor, _ = LocalExecutor().supervise(load_spec(folder / SPEC_FILE), [], Watch(live.show, ended),
                                              [Slot(slot)], feed)
    return supervisor.stop_signal is not None or feed.cancelled()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
