"""The Slurm job a task belongs to (part of the Slurm executor's task side,
clusterjob.taskenv.slurm): its id (an array task: ``<array>_<task>``, as squeue names
it), how often Slurm requeued it, and the master port every task of it derives alike
without talking. Stdlib only, never torch.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Mapping, Optional

from clusterjob.core.errors import EnvError
from clusterjob.taskenv.torchrun import DEFAULT_MASTER_PORT, master_port
from clusterjob.taskenv.variables import NON_NEGATIVE, first_set, optional_int, parse_int

# Derived Slurm ports stay clear of the well-known and common service ports below 20000,
# and of Linux's ephemeral range (32768-60999), where the kernel picks the local ports of
# outgoing connections: a rendezvous port there can be taken by any client socket.
PORT_RANGE_START = 20000
PORT_RANGE_END = 32768

SLURM_HINT = (
    "these variables come from srun inside a job: start the worker with srun, and do not "
    "set SLURM_* by hand or carry them over from another job's shell"
)


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job this process belongs to, as far as naming and requeue need it."""

    job_id: str
    array_job_id: Optional[str] = None
    array_task_id: Optional[str] = None
    restart_count: int = 0  # how often Slurm requeued the job (preemption, node failure)

    @property
    def is_array(self) -> bool:
        """True for one task of a job array."""
        return self.array_job_id is not None

    @property
    def run_key(self) -> str:
        """A name stable across requeues: ``<array_job>_<task>`` (squeue's form) or the job id."""
        if self.is_array:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


def master_port_for_job(
    job_id: str, array_job_id: Optional[str] = None, array_task_id: Optional[str] = None
) -> int:
    """A port in [20000, 32768) that every rank of a job derives alike, without talking.

    zlib.crc32 rather than hash(): Python salts str hashes per process, so ranks would
    disagree. Array tasks add their task id to the array's base port, so the tasks of
    one array (which may share a node) never collide with each other.
    """
    span = PORT_RANGE_END - PORT_RANGE_START
    if array_job_id and array_task_id:
        base = zlib.crc32(f"array:{array_job_id}".encode())
        if NON_NEGATIVE.fullmatch(array_task_id):
            return PORT_RANGE_START + (base + int(array_task_id)) % span
        return PORT_RANGE_START + zlib.crc32(f"{base}:{array_task_id}".encode()) % span
    if not job_id:
        raise ValueError("master_port_for_job needs a job id (SLURM_JOB_ID), got an empty one")
    return PORT_RANGE_START + zlib.crc32(f"job:{job_id}".encode()) % span


def job_port(environ: Optional[Mapping[str, str]] = None) -> int:
    """MASTER_PORT when set, else the port derived from this process's Slurm job: the
    number every task of the job derives (``clusterjob env --port``, which the torchrun
    template uses for its rendezvous, so there is one rule for the port)."""
    environ = os.environ if environ is None else environ
    if "MASTER_PORT" in environ:
        return master_port(environ, DEFAULT_MASTER_PORT)
    job = slurm_job(environ)
    if job is None:
        raise EnvError("neither MASTER_PORT nor SLURM_JOB_ID is set, so no port can be derived. "
                       "Hint: run this inside a Slurm job, or set MASTER_PORT")
    return master_port_for_job(job.job_id, job.array_job_id, job.array_task_id)


def slurm_job(environ: Optional[Mapping[str, str]] = None) -> Optional[SlurmJob]:
    """The Slurm job of this process, or None outside Slurm (no SLURM_JOB_ID)."""
    environ = os.environ if environ is None else environ
    found = first_set(environ, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if found is None:
        return None
    if not found[1].strip():
        raise EnvError(f"{found[0]}={found[1]!r} is blank. Hint: {SLURM_HINT}")
    array_job_id, array_task_id = _array_ids(environ)
    restart = optional_int(environ, "SLURM_RESTART_COUNT", SLURM_HINT) or 0
    return SlurmJob(_job_id(found[0], found[1]), array_job_id, array_task_id, restart)


def _job_id(name: str, raw: str) -> str:
    """A Slurm job or array task id: decimal digits. It names run folders (``slurm-<id>``),
    so anything else (a path, a space) is refused rather than used."""
    parse_int(name, raw, SLURM_HINT)
    return raw.strip()


def _array_ids(environ: Mapping[str, str]) -> tuple[Optional[str], Optional[str]]:
    """(array job id, task id), both or neither: one alone means a half-copied environment."""
    job = environ.get("SLURM_ARRAY_JOB_ID", "").strip() or None
    task = environ.get("SLURM_ARRAY_TASK_ID", "").strip() or None
    if (job is None) != (task is None):
        name = "SLURM_ARRAY_JOB_ID" if job is not None else "SLURM_ARRAY_TASK_ID"
        raise EnvError(
            f"{name}={environ[name]!r} is set without its partner "
            f"(SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID come together). Hint: {SLURM_HINT}"
        )
    if job is None or task is None:
        return None, None
    return _job_id("SLURM_ARRAY_JOB_ID", job), _job_id("SLURM_ARRAY_TASK_ID", task)
