"""The Slurm executor's task side (its login side: clusterjob.launch.executors.slurm), and
its keys, which both halves read (docs/design.md, "Distributed environment").

Its ranks: an srun step's variables (a step may use a subset of the job's nodes, and
then only the step's variables describe its ranks), or torchrun's inside the job. Its
job (clusterjob.taskenv.slurmjob): SLURM_JOB_ID (an array task: ``<array>_<task>``, as
squeue names it), how often Slurm requeued it, the master port every task derives alike;
and what scontrol, squeue and sacct say of it (clusterjob.core.slurmctl): the time left,
the requeue, how its previous session ended, when it was submitted. A job started by a
raw sbatch template finds its run folder again by clusterjob.taskenv.jobrun. Stdlib
only, never torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, TypeVar

from clusterjob.core import slurmctl
from clusterjob.core.errors import EnvError, brief
from clusterjob.core.hostlist import HostlistError, expand_hostlist, parse_tasks_per_node
from clusterjob.core.ranks import DistEnv
from clusterjob.core.record import SLURM, Job
from clusterjob.core.rundir import RunDir
from clusterjob.spec.fields import opt
from clusterjob.spec.options import ExecutorOptions
from clusterjob.taskenv import jobrun
from clusterjob.taskenv.environment import MakeRun, TaskEnvironment
from clusterjob.taskenv.slurmjob import SLURM_HINT, SlurmJob, master_port_for_job, slurm_job
from clusterjob.taskenv.torchrun import DEFAULT_MASTER_PORT, master_port
from clusterjob.taskenv.variables import env_int, first_set, require_first

if TYPE_CHECKING:
    from clusterjob.spec.schema import Spec

T = TypeVar("T")

_HOSTLIST_HINT = (
    "expected Slurm's compressed form such as node[1-4] or rack[1-2]-n[01-04]; "
    "`scontrol show hostnames` shows what Slurm makes of it"
)
_TASKS_HINT = f"expected Slurm's compressed form such as 2(x3),1; {SLURM_HINT}"
_WORD = (r"[A-Za-z0-9._-]+", "letters, digits, '.', '_' and '-' (no spaces or shell characters)")
_CONSTRAINT = (r"[A-Za-z0-9._,&|\[\]()*:!-]+", "a Slurm feature expression without spaces or quotes")


@dataclass(frozen=True)
class SlurmOptions(ExecutorOptions):
    """The Slurm executor's keys, under ``resources`` (clusterjob.spec.options)."""

    partition: Optional[str] = opt(None, "Slurm partition", pattern=_WORD)
    account: Optional[str] = opt(None, "Slurm account", pattern=_WORD)
    qos: Optional[str] = opt(None, "Slurm QOS", pattern=_WORD)
    constraint: Optional[str] = opt(None, "Slurm node features, e.g. a100|h100", pattern=_CONSTRAINT)
    max_requeues: int = opt(3, "requeues after preemption or time limit before giving up", ge=0)


class SlurmEnvironment(TaskEnvironment):
    """A task of a Slurm job: an srun task, torchrun inside a job, or its batch script."""

    name = SLURM
    label = "Slurm"
    options = SlurmOptions

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return any(name in environ for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID"))

    def own_ranks(self) -> Optional[DistEnv]:
        return from_srun(self.environ) if "SLURM_PROCID" in self.environ else None

    def nodes(self, count: int) -> Optional[tuple[str, ...]]:
        return _hosts_if_consistent(self.environ, count)

    def slurm_job(self) -> Optional[SlurmJob]:
        return slurm_job(self.environ)

    def job(self) -> Optional[Job]:
        found = self.slurm_job()
        return Job(SLURM, found.run_key) if found is not None else None

    def array_task(self) -> Optional[str]:
        found = self.slurm_job()
        return found.array_task_id if found is not None else None

    def restarts(self) -> int:
        found = self.slurm_job()
        return found.restart_count if found is not None else 0

    def time_left_s(self) -> Optional[float]:
        found = self.slurm_job()
        return slurmctl.time_left_s(found.run_key) if found is not None else None

    def can_requeue(self) -> bool:
        return self.slurm_job() is not None

    def requeue(self) -> bool:
        found = self.slurm_job()
        return found is not None and slurmctl.requeue(found.run_key)  # the array task only

    def max_requeues(self, spec: Spec) -> int:
        return SlurmOptions.of(spec).max_requeues

    def node_failure(self, hosts: Sequence[str]) -> Optional[str]:
        """Slurm ended the previous session with NODE_FAIL (sacct lists each session of a
        requeued job)."""
        found = self.slurm_job()
        if found is None or slurmctl.previous_state(found.run_key) != "NODE_FAIL":
            return None  # a requeue by hand or a preemption: counted as a requeue
        return f"node failure (Slurm ended job {found.run_key} with NODE_FAIL on {', '.join(hosts) or 'its nodes'})"

    def since_restart_s(self) -> float:
        """A requeue sets the job's SubmitTime anew (scontrol gives local time)."""
        found = self.slurm_job()
        text = slurmctl.submit_time(found.run_key) if found is not None else None
        try:
            return max(0.0, (datetime.now() - datetime.fromisoformat(text or "")).total_seconds())
        except ValueError:
            return 0.0

    def stop_hint(self) -> Optional[str]:
        return "Slurm requeues or ends the job" if self.slurm_job() is not None else None

    def own_run(self, parent: Path, spec_text: str, make: MakeRun) -> Optional[RunDir]:
        found = self.slurm_job()
        return jobrun.job_folder(parent, found, spec_text, make) if found is not None else None


# --- srun tasks ---------------------------------------------------------------------------


def from_srun(environ: Mapping[str, str]) -> DistEnv:
    """The layout of an srun step, from the step's variables (a step may use a subset)."""
    tasks_var, tasks = _parsed_list(
        environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), parse_tasks_per_node,
        "a tasks-per-node list", _TASKS_HINT,
    )
    hosts_var, hosts = _parsed_list(
        environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        expand_hostlist, "a valid Slurm host list", _HOSTLIST_HINT,
    )
    num_nodes = _num_nodes(environ, tasks_var, tasks, hosts_var, hosts)
    world_size = _world_size(environ, tasks_var, tasks)
    node_rank = env_int(
        environ, "SLURM_NODEID", SLURM_HINT,
        below=(num_nodes, f"the step's node count {num_nodes}"),
    )
    local_world_size = tasks[node_rank]
    return DistEnv(
        source="slurm",
        rank=env_int(
            environ, "SLURM_PROCID", SLURM_HINT,
            below=(world_size, f"the step's task count {world_size}"),
        ),
        local_rank=env_int(
            environ, "SLURM_LOCALID", SLURM_HINT,
            below=(local_world_size, f"this node's task count {local_world_size}"),
        ),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=hosts[0],
        master_port=_job_master_port(environ),
        hosts=tuple(hosts),
        named_nodes=True,
    )


def _parsed_list(
    environ: Mapping[str, str],
    names: Sequence[str],
    parse: Callable[[str], list[T]],
    what: str,
    hint: str,
) -> tuple[str, list[T]]:
    """(variable, parsed value) of the first of ``names`` that is set.

    The step's variable comes first in ``names``: a step may run on a subset of the
    job's nodes, and then only the step's variables describe this step's ranks.
    """
    name = require_first(environ, names, "SLURM_PROCID is set", SLURM_HINT)
    try:
        return name, parse(environ[name])
    except HostlistError as error:
        raise EnvError(
            f"{name}={brief(environ[name])} is not {what} ({error}). Hint: {hint}"
        ) from error


def _num_nodes(
    environ: Mapping[str, str], tasks_var: str, tasks: list[int], hosts_var: str, hosts: list[str]
) -> int:
    """The step's node count, checked against its tasks-per-node list and node list."""
    found = first_set(environ, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"))
    if found is None:
        count, label = len(tasks), f"{tasks_var}={environ[tasks_var]!r}"
    else:
        count = env_int(environ, found[0], SLURM_HINT, minimum=1)
        label = f"{found[0]}={found[1]!r}"
    if len(tasks) != count:
        raise EnvError(
            f"{tasks_var}={environ[tasks_var]!r} lists {len(tasks)} nodes but {label} says "
            f"{count}. Hint: {SLURM_HINT}"
        )
    if len(hosts) != count:
        raise EnvError(
            f"{hosts_var}={environ[hosts_var]!r} names {len(hosts)} hosts but {label} says "
            f"{count} nodes. Hint: {SLURM_HINT}"
        )
    return count


def _world_size(environ: Mapping[str, str], tasks_var: str, tasks: list[int]) -> int:
    """The step's task count, which must equal the sum of its tasks per node."""
    total = sum(tasks)
    found = first_set(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
    if found is None:
        return total  # e.g. the batch script of `sbatch -N2` without --ntasks
    world_size = env_int(environ, found[0], SLURM_HINT, minimum=1)
    if world_size != total:
        raise EnvError(
            f"{found[0]}={found[1]!r} does not match {tasks_var}={environ[tasks_var]!r}, "
            f"which sums to {total} tasks. Hint: {SLURM_HINT}"
        )
    return world_size


def _hosts_if_consistent(environ: Mapping[str, str], num_nodes: int) -> Optional[tuple[str, ...]]:
    """The Slurm step's node names when torchrun runs one agent per node of that step.

    Only informational under torchrun (torchrun owns the rendezvous), so a list that
    does not parse or counts other nodes is ignored rather than an error.
    """
    found = first_set(environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    if found is None:
        return None
    try:
        hosts = expand_hostlist(found[1])
    except HostlistError:
        return None
    return tuple(hosts) if len(hosts) == num_nodes else None


def _job_master_port(environ: Mapping[str, str]) -> int:
    """MASTER_PORT when set, else the job's derived port (the same on every rank)."""
    if "MASTER_PORT" in environ:
        return master_port(environ, DEFAULT_MASTER_PORT)
    job = slurm_job(environ)
    if job is None:
        raise EnvError(
            f"SLURM_PROCID={environ['SLURM_PROCID']!r} is set but SLURM_JOB_ID is not, so no "
            f"master port can be derived. Hint: set MASTER_PORT; {SLURM_HINT}"
        )
    return master_port_for_job(job.job_id, job.array_job_id, job.array_task_id)
