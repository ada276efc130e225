"""``clusterjob report --watch DIR``: the report re-drawn in the terminal every few
seconds while runs run.

Read-only: each frame reads the results cache and the run folders (``build_report``),
each run's state derived as ``status`` derives it (its executor: the processes of a
local run, the queue and accounting of a Slurm job), and nothing is written, the cache
included. It ends by itself once every run has ended (completed, failed or
cancelled), and at once on Ctrl-C (exit 130, as ``logs --follow``). On a terminal each
frame replaces the one before; in a pipe the frames follow each other.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.runstate import FINAL_STATUSES
from clusterjob.report.assemble import build_report
from clusterjob.report.build import ReportOptions, render
from clusterjob.report.reading import RunStates
from clusterjob.report.stats import Report

INTERVAL_S = 5.0  # between frames, unless --interval
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def check(args: ReportOptions) -> float:
    """The seconds between frames, once the arguments that make no sense here are refused."""
    if args.out:
        raise BadInput("--watch draws the report in the terminal; drop --out (or drop --watch to write a file)")
    if args.format not in (None, "md"):
        raise BadInput(f"--watch draws the md report; drop --format {args.format} (or drop --watch)")
    interval = INTERVAL_S if args.interval is None else args.interval
    if not 0.1 <= interval <= 3600:
        raise BadInput(f"--interval: {interval:g} is out of range; give seconds between 0.1 and 3600, e.g. 5")
    return interval


def main(args: ReportOptions, states: Optional[RunStates] = None) -> int:
    """Draw, wait, draw again, until every run has ended (0) or Ctrl-C (130, by the CLI).
    ``states`` derives each run's state as ``status`` does (the command line hands it
    in): a run whose every process died ends the watch as failed, whatever run.json says."""
    interval = check(args)
    tty = sys.stdout.isatty()
    while True:
        report = build_report(args.source, args.group_by, metric=args.metric, mode=args.mode, states=states)
        ended = all_ended(report)
        sys.stdout.write(frame(report, args, interval, ended, tty))
        sys.stdout.flush()
        if ended:
            return 0
        time.sleep(interval)


def all_ended(report: Report) -> bool:
    """Whether every run is completed, failed or cancelled: nothing more will change."""
    return bool(len(report.runs) and report.runs["status"].astype(object).isin(FINAL_STATUSES).all())


def frame(report: Report, args: ReportOptions, interval: float, ended: bool, tty: bool) -> str:
    """One drawing: a line saying what is watched and when, then the md report."""
    width = shutil.get_terminal_size((80, 24)).columns if tty else 80
    state = "every run has ended" if ended else f"every {interval:g} s; Ctrl-C leaves"
    head = f"clusterjob report --watch {args.dir}  {time.strftime('%H:%M:%S')}  ({state})\n\n"
    body = render(report, "md", args.runs, width).encode("utf-8", "backslashreplace").decode("utf-8")
    return (CLEAR if tty else "\n") + head + body
