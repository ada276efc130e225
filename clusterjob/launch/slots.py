"""How the local supervisor shares this machine between the runs of a sweep
(docs/design.md, "Executors and scripts"): the GPUs a rank started here would see, and
the slots that runs take side by side.

A slot is what one run gets while its ranks run: its own GPUs (CUDA_VISIBLE_DEVICES,
disjoint from every other slot's), its share of the cores (a CPU affinity mask for its
ranks, disjoint from the other slots' where there are enough cores) and OMP_NUM_THREADS
for each rank. ``plan`` decides the slots from the facts, as a pure function; ``here``
gathers the facts of this machine. Stdlib only: no torch on this side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from clusterjob.core.ranks import listed_gpus


@dataclass(frozen=True)
class Slot:
    """One run's share of the machine: ``cpus`` its ranks' affinity (empty: as the
    supervisor's), ``gpus`` the CUDA_VISIBLE_DEVICES entries its ranks see (None: left as
    it is, a CPU run), ``threads`` each rank's OMP_NUM_THREADS unless the user set it."""

    index: int
    cpus: tuple = ()
    gpus: Optional[tuple] = None
    threads: Optional[int] = None

    def environ(self, base: Mapping[str, str]) -> dict:
        """The variables a rank of this slot gets on top of ``base`` (the supervisor's)."""
        extra = {} if self.gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}
        if self.threads is not None and "OMP_NUM_THREADS" not in base:
            extra["OMP_NUM_THREADS"] = str(self.threads)
        return extra

    def pin(self) -> None:
        """In a rank before exec: keep it on the slot's cores."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)


WHOLE = Slot(0)  # the machine as it is: one run at a time, nothing set


def plan(runs: int, tasks: int, cpus_per_task: int, gpus_per_node: int, parallelism: Optional[int],
         cores: Sequence[int], gpus: Sequence[str]) -> list[Slot]:
    """The slots for ``runs`` runs of ``tasks`` ranks each on a machine with ``cores``
    (CPU ids this process may use) and ``gpus`` (CUDA_VISIBLE_DEVICES entries it sees).

    A GPU run (``gpus_per_node`` > 0) takes one GPU per task, or ``gpus_per_node`` if
    more (at most every GPU): never more runs at once than have GPUs of their own. A
    CPU run counts ``tasks * cpus_per_task`` cores: without ``parallelism``
    (resources.array_parallelism null) as many runs as fit; with it, that many, up to
    one core of its own each. Never more slots than runs, at least one. The cores are
    split evenly between the slots (contiguous ids), each rank gets
    ``min(cpus_per_task, its share of its slot's cores)`` threads (at least 1)."""
    per_run = min(len(gpus), max(tasks, gpus_per_node)) if gpus_per_node > 0 else 0
    if per_run:
        fit = len(gpus) // per_run
        count = min(fit, parallelism or fit)
    else:
        fit = len(cores) // max(1, tasks * cpus_per_task)
        count = min(parallelism or fit, len(cores) or 1)
    count = max(1, min(count, runs))
    shares = _split(list(cores), count)
    return [Slot(index, shares[index], tuple(gpus[index * per_run:(index + 1) * per_run]) if per_run else None,
                 max(1, min(cpus_per_task, len(shares[index]) // tasks)) if shares[index] else cpus_per_task)
            for index in range(count)]


def _split(cores: list, count: int) -> list[tuple]:
    """``count`` disjoint runs of ``cores``, as even as can be (none empty while there
    are as many cores as slots)."""
    return [tuple(cores[index * len(cores) // count:(index + 1) * len(cores) // count]) for index in range(count)]


def here(runs: int, tasks: int, cpus_per_task: int, gpus_per_node: int, parallelism: Optional[int],
         environ: Mapping[str, str]) -> list[Slot]:
    """``plan`` with this machine's facts: the cores this process may run on, and (for a
    GPU run only: a CPU run calls no nvidia-smi) the GPUs a rank started here would see."""
    gpus = gpu_entries(environ.get("CUDA_VISIBLE_DEVICES"), machine_gpus()) if gpus_per_node > 0 else []
    return plan(runs, tasks, cpus_per_task, gpus_per_node, parallelism, sorted(os.sched_getaffinity(0)), gpus)


# ----------------------------------------------------------------------------- the GPUs of this machine


def gpu_entries(cuda_visible_devices: Optional[str], smi_listing: Optional[str]) -> list[str]:
    """The GPUs a rank started here will see, as CUDA_VISIBLE_DEVICES entries, without
    torch (which the login side never loads): those of CUDA_VISIBLE_DEVICES when set,
    else every GPU of ``nvidia-smi -L`` by index (None: no nvidia-smi, so no GPU)."""
    machine = None if smi_listing is None else sum(line.startswith("GPU ") for line in smi_listing.splitlines())
    if cuda_visible_devices is None:
        return [str(index) for index in range(machine or 0)]
    return listed_gpus(cuda_visible_devices, machine)


def visible_gpus(cuda_visible_devices: Optional[str], smi_listing: Optional[str]) -> int:
    """How many GPUs a rank started here will see (``gpu_entries``)."""
    return len(gpu_entries(cuda_visible_devices, smi_listing))


def machine_gpus() -> Optional[str]:
    """``nvidia-smi -L``'s listing (one ``GPU n: ...`` line per GPU), None without it."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpus_here(environ: Mapping[str, str]) -> tuple[int, str]:
    """(GPUs a local rank will see, where that number comes from, for an error line)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    smi = machine_gpus()
    count = visible_gpus(listed, smi)
    if listed is not None:
        return count, f"CUDA_VISIBLE_DEVICES={listed!r}"
    return count, "no nvidia-smi" if smi is None else "nvidia-smi -L"
