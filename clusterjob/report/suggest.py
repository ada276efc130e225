"""``clusterjob report --suggest``: the smallest request that would have fit each
experiment's runs, with a 20% margin, as a spec fragment
(docs/design.md, "Resubmit with more memory or time").

Of each completed run only the job it completed in counts (an earlier job killed out of
memory used what its limit let it, not what the run needed): the most memory a task of
it used (sacct's MaxRSS over its steps) times the tasks per node, and the seconds it ran.
A run with no Slurm job, or that sacct does not know, adds nothing; an experiment with
none says so. Read-only: one sacct query for all the runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from clusterjob.core import runstate, slurmctl, units
from clusterjob.core.record import is_job_id

MARGIN = 1.2  # the room above the peak a suggestion leaves


@dataclass(frozen=True)
class Fit:
    """What an experiment's completed runs used at most: per node in GB (None: not
    known), the longest run in seconds, and how many runs it is of."""

    name: str
    runs: int
    mem_gb: Optional[float]
    longest_s: Optional[float]


def fits(infos: Sequence[dict], ask: Callable = slurmctl.peaks) -> list[Fit]:
    """One Fit per experiment (spec name) of the report's run fields ``infos``, in order."""
    done = [(info, job) for info in infos
            if info["status"] == runstate.COMPLETED and is_job_id(job := info.get("slurm_job_id"))]
    answer = (ask(sorted({job for _, job in done})) if done else {}) or {}
    found: dict[str, list] = {}
    for info in infos:
        found.setdefault(info["name"], [])
    for info, job in done:
        if job in answer:
            rss, ran = answer[job]
            tasks = (info.get("spec") or {}).get("resources.tasks_per_node") or 1
            found[info["name"]].append((rss * tasks / 2**30 if rss is not None else None, ran))
    return [Fit(name, len(used), _most([u[0] for u in used]), _most([u[1] for u in used]))
            for name, used in found.items()]


def _most(values: list) -> Optional[float]:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def fragment(fit: Fit) -> str:
    """The spec fragment of one experiment: its resources with the margin, rounded up."""
    if not fit.runs or (fit.mem_gb is None and fit.longest_s is None):
        return f"# {fit.name}: no completed run with a Slurm job that sacct knows; nothing to suggest"
    lines = [f"# {fit.name}: {fit.runs} completed run(s); at most "
             + ", ".join(part for part in (
                 f"{units.slurm_mem(fit.mem_gb)} per node (sacct MaxRSS x tasks per node)" if fit.mem_gb else "",
                 f"{units.duration(fit.longest_s)} run time" if fit.longest_s is not None else "") if part)
             + f"; with a {round((MARGIN - 1) * 100)}% margin:",
             f"name: {fit.name}", "resources:"]
    if fit.mem_gb:
        lines.append(f"  mem_gb: {math.ceil(fit.mem_gb * MARGIN * 100) / 100:g}")
    if fit.longest_s is not None:
        lines.append(f"  time_min: {max(1, math.ceil(fit.longest_s * MARGIN / 60))}")
    return "\n".join(lines)


def suggestion(infos: Sequence[dict], ask: Callable = slurmctl.peaks) -> str:
    """Every experiment's fragment, one YAML document each."""
    return "\n---\n".join(fragment(fit) for fit in fits(infos, ask))
