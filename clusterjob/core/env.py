"""The distributed environment of this process: who am I, how many are we, where is rank 0.

The rules are in docs/design.md, "Distributed environment". This is the only module
that reads rank variables from ``os.environ``,
so every launch style (srun, torchrun, the legacy launcher, hand-set variables, the local
executor) is decided in one place and checked before any rendezvous: a wrong count here
would otherwise show up as a rendezvous that hangs until its timeout.

Stdlib only, never torch: ``clusterjob env`` imports this on login nodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, MutableMapping, Optional, Sequence, TypeVar

from clusterjob.core.errors import BadInput, EnvError, brief
from clusterjob.core.hostlist import HostlistError, expand_hostlist, parse_tasks_per_node

DEFAULT_MASTER_ADDR = "127.0.0.1"
# torchrun's own default; used only when a hand-set launch names no port (e.g. it
# rendezvouses through a file:// init method and never opens this port).
DEFAULT_MASTER_PORT = 29500
# Derived Slurm ports stay clear of the well-known and common service ports below 20000,
# and of Linux's ephemeral range (32768-60999), where the kernel picks the local ports of
# outgoing connections: a rendezvous port there can be taken by any client socket.
PORT_RANGE_START = 20000
PORT_RANGE_END = 32768

# Variables a submitting shell must not pass on: inside an allocation they describe the
# old job, and a new job or local launch would take them as its own layout.
_LEAKING_PREFIXES = (
    "SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_", "TORCHELASTIC_",
)
_LEAKING_NAMES = frozenset(
    {
        "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
        "CLUSTERJOB_SUPERVISED",
    }
)
SUPERVISED_VAR = "CLUSTERJOB_SUPERVISED"  # set by the local supervisor for the ranks it starts
# The client configuration path is how sbatch and squeue find the cluster at all.
_KEPT_NAMES = frozenset({"SLURM_CONF"})

T = TypeVar("T")

_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
_NON_NEGATIVE = re.compile(r"[0-9]+")
# Ranks, sizes and job ids are far shorter; a longer number is garbage (and int() of
# thousands of digits is slow or refused).
_MAX_DIGITS = 18
# A host name or address: no spaces, line breaks or other control characters.
_HOST = re.compile(r"[\x21-\x7e]+")

_TORCHRUN_HINT = (
    "launch with torchrun, or set RANK, WORLD_SIZE (and LOCAL_RANK, LOCAL_WORLD_SIZE) "
    "consistently by hand; unset RANK and WORLD_SIZE to use Slurm's variables instead"
)
_SLURM_HINT = (
    "these variables come from srun inside a job: start the worker with srun, and do not "
    "set SLURM_* by hand or carry them over from another job's shell"
)
_HOSTLIST_HINT = (
    "expected Slurm's compressed form such as node[1-4] or rack[1-2]-n[01-04]; "
    "`scontrol show hostnames` shows what Slurm makes of it"
)
_TASKS_HINT = f"expected Slurm's compressed form such as 2(x3),1; {_SLURM_HINT}"
_PORT_HINT = "set MASTER_PORT to a free TCP port in 1..65535, or unset it to use the default"


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job; everything a rendezvous and the trainer need."""

    source: str  # "torchrun" | "slurm" | "single": which launch rule matched
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    hosts: tuple[str, ...]
    # torchrun's agent serves the rendezvous store at MASTER_ADDR:MASTER_PORT itself
    agent_store: bool = False

    def __post_init__(self) -> None:
        # Accept a list for convenience but store a tuple, so the value stays hashable.
        object.__setattr__(self, "hosts", tuple(self.hosts))

    def to_dict(self) -> dict[str, object]:
        """The fields of ``clusterjob env --json``, JSON-ready (hosts as a list)."""
        return {
            "source": self.source,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "hosts": list(self.hosts),
        }


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


def detect(
    environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None
) -> DistEnv:
    """This process's distributed environment, by the first matching rule.

    torchrun (RANK and WORLD_SIZE set) wins over Slurm, because torchrun started from an
    srun task sees both and only its own variables describe the processes. Raises
    EnvError, naming the variable and its value, on anything missing or inconsistent.
    """
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    has_rank, has_world = "RANK" in environ, "WORLD_SIZE" in environ
    if has_rank and has_world:
        return _from_torchrun(environ, argv)
    if has_rank or has_world:
        _raise_half_set(environ, "RANK" if has_rank else "WORLD_SIZE")
    if "SLURM_PROCID" in environ:
        return _from_slurm(environ)
    return _single(environ)


def _raise_half_set(environ: Mapping[str, str], name: str) -> None:
    """Refuse one of RANK/WORLD_SIZE without the other: a half-set launch, or a leak."""
    other = "WORLD_SIZE" if name == "RANK" else "RANK"
    raise EnvError(
        f"{name}={environ[name]!r} is set but {other} is not. Hint: set both for a hand-set "
        f"launch, or unset {name} to use Slurm's variables or a single process"
    )


# --- torchrun, the legacy launcher, hand-set launches -------------------------------


def _from_torchrun(environ: Mapping[str, str], argv: Sequence[str]) -> DistEnv:
    """The layout torchrun (or a hand-set launch) already wrote into the environment."""
    world_size = _env_int(environ, "WORLD_SIZE", _TORCHRUN_HINT, minimum=1)
    rank = _env_int(
        environ, "RANK", _TORCHRUN_HINT, below=(world_size, f"WORLD_SIZE={world_size}")
    )
    local_world_size = _torchrun_local_world_size(environ, world_size)
    per_node, num_nodes, nodes_label = _torchrun_node_counts(environ, world_size, local_world_size)
    master_addr = _master_addr(environ)
    return DistEnv(
        source="torchrun",
        rank=rank,
        local_rank=_torchrun_local_rank(environ, argv, rank, local_world_size, per_node),
        world_size=world_size,
        local_world_size=per_node,
        node_rank=_torchrun_node_rank(environ, rank, local_world_size, (num_nodes, nodes_label)),
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=_master_port(environ, DEFAULT_MASTER_PORT),
        hosts=_slurm_hosts_if_consistent(environ, num_nodes) or (master_addr,),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def _torchrun_local_world_size(environ: Mapping[str, str], world_size: int) -> Optional[int]:
    """LOCAL_WORLD_SIZE if set; a node cannot run more processes than the whole job."""
    value = _optional_int(environ, "LOCAL_WORLD_SIZE", _TORCHRUN_HINT, minimum=1)
    if value is not None and value > world_size:
        raise EnvError(
            f"LOCAL_WORLD_SIZE={environ['LOCAL_WORLD_SIZE']!r} is larger than "
            f"WORLD_SIZE={environ['WORLD_SIZE']!r}. Hint: {_TORCHRUN_HINT}"
        )
    return value


def _torchrun_node_counts(
    environ: Mapping[str, str], world_size: int, local_world_size: Optional[int]
) -> tuple[int, int, str]:
    """(processes per node, node count, where the count came from, for error messages).

    With neither LOCAL_WORLD_SIZE nor GROUP_WORLD_SIZE (hand-set launches, the
    pre-elastic launcher) one node is assumed, the same assumption as the
    LOCAL_RANK = RANK fallback; a last node may run fewer processes, hence ceil.
    """
    groups = _optional_int(
        environ, "GROUP_WORLD_SIZE", _TORCHRUN_HINT, minimum=1,
        below=(world_size + 1, f"{world_size + 1} (no more nodes than WORLD_SIZE={world_size})"),
    )
    if groups is not None:
        per_node = local_world_size or -(-world_size // groups)
        return per_node, groups, f"GROUP_WORLD_SIZE={groups}"
    if local_world_size is not None:
        count = -(-world_size // local_world_size)
        return local_world_size, count, f"{count} nodes (WORLD_SIZE / LOCAL_WORLD_SIZE)"
    return world_size, 1, (
        "1 node (assumed: set LOCAL_WORLD_SIZE or GROUP_WORLD_SIZE for a multi-node launch)"
    )


def _torchrun_local_rank(
    environ: Mapping[str, str],
    argv: Sequence[str],
    rank: int,
    local_world_size: Optional[int],
    per_node: int,
) -> int:
    """LOCAL_RANK, else the legacy ``--local_rank`` argument, else derived from RANK."""
    bound = (per_node, f"LOCAL_WORLD_SIZE={per_node}")
    if "LOCAL_RANK" in environ:
        return _env_int(environ, "LOCAL_RANK", _TORCHRUN_HINT, below=bound)
    argument = legacy_local_rank_argument(argv)
    if argument is not None:
        flag, raw = argument
        return _parse_int(flag, raw, _TORCHRUN_HINT, below=bound)
    return rank % local_world_size if local_world_size else rank


def _torchrun_node_rank(
    environ: Mapping[str, str],
    rank: int,
    local_world_size: Optional[int],
    bound: tuple[int, str],
) -> int:
    """GROUP_RANK (torchrun), else NODE_RANK, else RANK div LOCAL_WORLD_SIZE, else 0."""
    for name in ("GROUP_RANK", "NODE_RANK"):
        if name in environ:
            return _env_int(environ, name, _TORCHRUN_HINT, below=bound)
    return rank // local_world_size if local_world_size else 0


def legacy_local_rank_argument(argv: Sequence[str]) -> Optional[tuple[str, str]]:
    """The flag and raw value of the last ``--local_rank``/``--local-rank`` in ``argv``.

    ``python -m torch.distributed.launch`` passes the local rank this way (older torch
    spells it ``--local_rank``, torch 2 ``--local-rank``); the last one wins, as with
    argparse, and nothing after ``--`` counts.
    """
    args = list(argv)
    found: Optional[tuple[str, str]] = None
    for index, arg in enumerate(args):
        if arg == "--":
            break
        flag, equals, value = arg.partition("=")
        if flag not in _LOCAL_RANK_FLAGS:
            continue
        if not equals:
            if index + 1 >= len(args):
                raise EnvError(
                    f"{flag} is the last argument and has no value. Hint: {_TORCHRUN_HINT}"
                )
            value = args[index + 1]
        found = (flag, value)
    return found


def _master_addr(environ: Mapping[str, str]) -> str:
    """MASTER_ADDR when set (it must not be blank), else the loopback address."""
    if "MASTER_ADDR" not in environ:
        return DEFAULT_MASTER_ADDR
    value = environ["MASTER_ADDR"]
    if not value.strip():
        raise EnvError(
            f"MASTER_ADDR={value!r} is blank. Hint: set it to the host name or address of "
            f"rank 0, or unset it to use {DEFAULT_MASTER_ADDR}"
        )
    if not _HOST.fullmatch(value.strip()):
        raise EnvError(
            f"MASTER_ADDR={value!r} is not a host name or address (it holds spaces, control or "
            f"non-ASCII characters). Hint: set it to the host name or address of rank 0"
        )
    return value.strip()


def _slurm_hosts_if_consistent(
    environ: Mapping[str, str], num_nodes: int
) -> Optional[tuple[str, ...]]:
    """The Slurm step's node names when torchrun runs one agent per node of that step.

    Only informational under torchrun (torchrun owns the rendezvous), so a list that
    does not parse or counts other nodes is ignored rather than an error.
    """
    found = _first_set(environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    if found is None:
        return None
    try:
        hosts = expand_hostlist(found[1])
    except HostlistError:
        return None
    return tuple(hosts) if len(hosts) == num_nodes else None


# --- Slurm (srun tasks) ---------------------------------------------------------------


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    """The layout of an srun step, from the step's variables (a step may use a subset)."""
    tasks_var, tasks = _parsed_slurm_list(
        environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), parse_tasks_per_node,
        "a tasks-per-node list", _TASKS_HINT,
    )
    hosts_var, hosts = _parsed_slurm_list(
        environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        expand_hostlist, "a valid Slurm host list", _HOSTLIST_HINT,
    )
    num_nodes = _slurm_num_nodes(environ, tasks_var, tasks, hosts_var, hosts)
    world_size = _slurm_world_size(environ, tasks_var, tasks)
    node_rank = _env_int(
        environ, "SLURM_NODEID", _SLURM_HINT,
        below=(num_nodes, f"the step's node count {num_nodes}"),
    )
    local_world_size = tasks[node_rank]
    return DistEnv(
        source="slurm",
        rank=_env_int(
            environ, "SLURM_PROCID", _SLURM_HINT,
            below=(world_size, f"the step's task count {world_size}"),
        ),
        local_rank=_env_int(
            environ, "SLURM_LOCALID", _SLURM_HINT,
            below=(local_world_size, f"this node's task count {local_world_size}"),
        ),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=hosts[0],
        master_port=_slurm_master_port(environ),
        hosts=tuple(hosts),
    )


def _parsed_slurm_list(
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
    name = _require_first(environ, names)
    try:
        return name, parse(environ[name])
    except HostlistError as error:
        raise EnvError(
            f"{name}={brief(environ[name])} is not {what} ({error}). Hint: {hint}"
        ) from error


def _slurm_num_nodes(
    environ: Mapping[str, str], tasks_var: str, tasks: list[int], hosts_var: str, hosts: list[str]
) -> int:
    """The step's node count, checked against its tasks-per-node list and node list."""
    found = _first_set(environ, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"))
    if found is None:
        count, label = len(tasks), f"{tasks_var}={environ[tasks_var]!r}"
    else:
        count = _env_int(environ, found[0], _SLURM_HINT, minimum=1)
        label = f"{found[0]}={found[1]!r}"
    if len(tasks) != count:
        raise EnvError(
            f"{tasks_var}={environ[tasks_var]!r} lists {len(tasks)} nodes but {label} says "
            f"{count}. Hint: {_SLURM_HINT}"
        )
    if len(hosts) != count:
        raise EnvError(
            f"{hosts_var}={environ[hosts_var]!r} names {len(hosts)} hosts but {label} says "
            f"{count} nodes. Hint: {_SLURM_HINT}"
        )
    return count


def _slurm_world_size(environ: Mapping[str, str], tasks_var: str, tasks: list[int]) -> int:
    """The step's task count, which must equal the sum of its tasks per node."""
    total = sum(tasks)
    found = _first_set(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
    if found is None:
        return total  # e.g. the batch script of `sbatch -N2` without --ntasks
    world_size = _env_int(environ, found[0], _SLURM_HINT, minimum=1)
    if world_size != total:
        raise EnvError(
            f"{found[0]}={found[1]!r} does not match {tasks_var}={environ[tasks_var]!r}, "
            f"which sums to {total} tasks. Hint: {_SLURM_HINT}"
        )
    return world_size


def _slurm_master_port(environ: Mapping[str, str]) -> int:
    """MASTER_PORT when set, else the job's derived port (the same on every rank)."""
    if "MASTER_PORT" in environ:
        return _master_port(environ, DEFAULT_MASTER_PORT)
    job = slurm_job(environ)
    if job is None:
        raise EnvError(
            f"SLURM_PROCID={environ['SLURM_PROCID']!r} is set but SLURM_JOB_ID is not, so no "
            f"master port can be derived. Hint: set MASTER_PORT; {_SLURM_HINT}"
        )
    return master_port_for_job(job.job_id, job.array_job_id, job.array_task_id)


# --- single process ---------------------------------------------------------------------


def _single(environ: Mapping[str, str]) -> DistEnv:
    """One process on this machine: rank 0 of 1, rendezvous on the loopback address."""
    return DistEnv(
        source="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=DEFAULT_MASTER_ADDR,
        master_port=_master_port(environ, DEFAULT_MASTER_PORT),
        hosts=(DEFAULT_MASTER_ADDR,),
    )


# --- ports and the Slurm job -------------------------------------------------------------


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
        if _NON_NEGATIVE.fullmatch(array_task_id):
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
        return _master_port(environ, DEFAULT_MASTER_PORT)
    job = slurm_job(environ)
    if job is None:
        raise EnvError("neither MASTER_PORT nor SLURM_JOB_ID is set, so no port can be derived. "
                       "Hint: run this inside a Slurm job, or set MASTER_PORT")
    return master_port_for_job(job.job_id, job.array_job_id, job.array_task_id)


def supervised(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True in a rank that the local supervisor started (it settles the run's end)."""
    return (os.environ if environ is None else environ).get(SUPERVISED_VAR) == "1"


def slurm_job(environ: Optional[Mapping[str, str]] = None) -> Optional[SlurmJob]:
    """The Slurm job of this process, or None outside Slurm (no SLURM_JOB_ID)."""
    environ = os.environ if environ is None else environ
    found = _first_set(environ, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if found is None:
        return None
    if not found[1].strip():
        raise EnvError(f"{found[0]}={found[1]!r} is blank. Hint: {_SLURM_HINT}")
    array_job_id, array_task_id = _array_ids(environ)
    restart = _optional_int(environ, "SLURM_RESTART_COUNT", _SLURM_HINT) or 0
    return SlurmJob(_job_id(found[0], found[1]), array_job_id, array_task_id, restart)


def _job_id(name: str, raw: str) -> str:
    """A Slurm job or array task id: decimal digits. It names run folders (``slurm-<id>``),
    so anything else (a path, a space) is refused rather than used."""
    _parse_int(name, raw, _SLURM_HINT)
    return raw.strip()


def _array_ids(environ: Mapping[str, str]) -> tuple[Optional[str], Optional[str]]:
    """(array job id, task id), both or neither: one alone means a half-copied environment."""
    job = environ.get("SLURM_ARRAY_JOB_ID", "").strip() or None
    task = environ.get("SLURM_ARRAY_TASK_ID", "").strip() or None
    if (job is None) != (task is None):
        name = "SLURM_ARRAY_JOB_ID" if job is not None else "SLURM_ARRAY_TASK_ID"
        raise EnvError(
            f"{name}={environ[name]!r} is set without its partner "
            f"(SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID come together). Hint: {_SLURM_HINT}"
        )
    if job is None or task is None:
        return None, None
    return _job_id("SLURM_ARRAY_JOB_ID", job), _job_id("SLURM_ARRAY_TASK_ID", task)


def _master_port(environ: Mapping[str, str], default: int) -> int:
    """MASTER_PORT when set (it must be a TCP port, 1..65535), else ``default``."""
    if "MASTER_PORT" not in environ:
        return default
    port = _env_int(environ, "MASTER_PORT", _PORT_HINT, minimum=1)
    if port > 65535:
        raise EnvError(
            f"MASTER_PORT={environ['MASTER_PORT']!r} is above 65535. Hint: {_PORT_HINT}"
        )
    return port


# --- writing and cleaning environments ------------------------------------------------------


def export(env: DistEnv, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Write ``env`` as the variables torch's ``env://`` init method reads.

    GROUP_WORLD_SIZE goes along so that detect() on the result gives the same layout.
    """
    target = os.environ if environ is None else environ
    target.update(
        {
            "MASTER_ADDR": env.master_addr,
            "MASTER_PORT": str(env.master_port),
            "RANK": str(env.rank),
            "LOCAL_RANK": str(env.local_rank),
            "WORLD_SIZE": str(env.world_size),
            "LOCAL_WORLD_SIZE": str(env.local_world_size),
            "GROUP_RANK": str(env.node_rank),
            "NODE_RANK": str(env.node_rank),
            "GROUP_WORLD_SIZE": str(env.num_nodes),
        }
    )


def clean_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` without the job layout of the shell it came from.

    Submitting from inside an allocation would otherwise hand the old job's SLURM_* and
    rank variables to the new job, whose tasks would then detect the wrong layout.
    """
    return {name: value for name, value in environ.items() if not _leaks(name)}


@contextlib.contextmanager
def scrubbed_environ() -> Iterator[None]:
    """Run a block (a submission) with ``clean_environ`` applied to this process's
    environment: sbatch exports the submitter's environment to the job."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_environ(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _leaks(name: str) -> bool:
    """True for a variable that describes the current job or launch, not the user's setup."""
    if name in _KEPT_NAMES:
        return False
    return _launcher_variable(name)


def _launcher_variable(name: str) -> bool:
    return name in _LEAKING_NAMES or name.startswith(_LEAKING_PREFIXES)


# --- the spec's env: what every rank gets, and what stays out of files ----------------------

HIDDEN = "***"  # a secret's value wherever a spec is written; at a start it is taken from the environment
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: what a shell can export
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Read once by the dynamic loader, the C library or the interpreter as the process starts:
# the runner sets env inside an interpreter that is already running, too late for these.
_AT_START_PREFIXES = ("LD_", "PYTHON", "MALLOC_")
_AT_START_NAMES = frozenset({"GLIBC_TUNABLES"})
_GPU_VARIABLES = frozenset({"CUDA_VISIBLE_DEVICES"})


def is_secret(name: str) -> bool:
    """Whether a variable's value is kept out of every file and printout: its name holds
    KEY, TOKEN, SECRET, PASSWORD (PASSWD) or CREDENTIAL, in any case (WANDB_API_KEY, HF_TOKEN)."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def refused(name: str) -> Optional[str]:
    """Why a spec's ``env`` may not set variable ``name`` (the words after ``env.NAME: ``),
    or None: the launcher's own variables, the GPU rule's, and those a process reads only
    as it starts."""
    if name in _GPU_VARIABLES:
        return (f"{name} follows the spec's GPU rule (Slurm's allocation, the local supervisor's split, none "
                "under resources.gpus_per_node: 0); leave it out of env and set resources.gpus_per_node")
    if _launcher_variable(name) or name.startswith("CLUSTERJOB_"):
        return (f"{name} is the launcher's: Slurm, torchrun, the local supervisor or clusterjob sets it for each "
                "rank; leave it out of env")
    if name in _AT_START_NAMES or name.startswith(_AT_START_PREFIXES):
        return (f"{name} is read as a process starts, before the runner sets env, so it would not reach the "
                "ranks; export it in the shell you submit from (local ranks and Slurm jobs inherit that "
                "environment), or on Slurm in resources.setup")
    return None


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """A spec's env as every file and printout holds it: each secret's value as ``***``."""
    return {name: HIDDEN if is_secret(name) else value for name, value in env.items()}


def apply_env(env: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Give this task the spec's env (every rank, at every start, before torch and the code
    load); a ``***`` value (a secret, kept out of the run's spec.yaml) is the
    environment's own, which must have it."""
    target = os.environ if environ is None else environ
    for name, value in env.items():
        if value == HIDDEN:
            _require_hidden(name, target)
        else:
            target[name] = value


def hand_down_secrets(env: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """At submit or resume: put the spec's secret values into this process's environment,
    which the local supervisor and sbatch pass to the ranks (the run's spec.yaml holds
    ``***`` for them); a ``***`` value must be there already (another shell's resume)."""
    target = os.environ if environ is None else environ
    for name, value in env.items():
        if value == HIDDEN:
            _require_hidden(name, target)
        elif is_secret(name):
            target[name] = value


def _require_hidden(name: str, environ: Mapping[str, str]) -> None:
    if name not in environ:
        raise EnvError(
            f"env.{name}: {name} is not set in this environment, and the spec holds {HIDDEN} for it (a secret's "
            f"value never goes into a file); export {name} in the shell that runs `clusterjob submit` or "
            "`clusterjob resume` (a Slurm job keeps it across requeues)"
        )


def describe(env: DistEnv) -> str:
    """``clusterjob env``'s text: one aligned ``key  value`` line per field."""
    fields = env.to_dict()
    fields["hosts"] = " ".join(env.hosts)
    width = max(len(key) for key in fields) + 2
    return "\n".join(f"{key:<{width}}{value}" for key, value in fields.items())


# --- reading variables ------------------------------------------------------------------------


def _first_set(environ: Mapping[str, str], names: Iterable[str]) -> Optional[tuple[str, str]]:
    """(name, value) of the first of ``names`` present in ``environ``."""
    for name in names:
        if name in environ:
            return name, environ[name]
    return None


def _require_first(environ: Mapping[str, str], names: Sequence[str]) -> str:
    """The first of ``names`` that is set; an EnvError naming all of them if none is."""
    found = _first_set(environ, names)
    if found is None:
        raise EnvError(
            f"SLURM_PROCID is set but none of {', '.join(names)} is. Hint: {_SLURM_HINT}"
        )
    return found[0]


def _env_int(
    environ: Mapping[str, str],
    name: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> int:
    """The integer in variable ``name`` (which must be set), checked against its bounds."""
    if name not in environ:
        raise EnvError(f"{name} is not set. Hint: {hint}")
    return _parse_int(name, environ[name], hint, minimum, below)


def _optional_int(
    environ: Mapping[str, str],
    name: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> Optional[int]:
    """Like _env_int, but None when the variable is not set."""
    if name not in environ:
        return None
    return _parse_int(name, environ[name], hint, minimum, below)


def _parse_int(
    label: str,
    raw: str,
    hint: str,
    minimum: int = 0,
    below: Optional[tuple[int, str]] = None,
) -> int:
    """``raw`` as a decimal integer in [minimum, below[0]); errors say ``label=raw``.

    ``below`` pairs the bound with the words that say where it came from.
    """
    text = raw.strip()
    # int() alone would also take "+3", "1_0" and non-ASCII digits; Slurm and torchrun
    # never write those, so seeing one means the variable was set by mistake.
    if not _NON_NEGATIVE.fullmatch(text):
        raise EnvError(f"{label}={brief(raw)} is not a non-negative integer. Hint: {hint}")
    if len(text) > _MAX_DIGITS:
        raise EnvError(f"{label}={brief(raw)} is too large ({len(text)} digits). Hint: {hint}")
    value = int(text)
    if value < minimum:
        raise EnvError(f"{label}={raw!r} must be at least {minimum}. Hint: {hint}")
    if below is not None and value >= below[0]:
        raise EnvError(
            f"{label}={raw!r} is out of range: it must be below {below[1]}. Hint: {hint}"
        )
    return value


# ----------------------------------------------------------------------------- the GPU of a rank


def listed_gpus(text: str, machine: Optional[int]) -> list[str]:
    """The GPUs CUDA makes of CUDA_VISIBLE_DEVICES: the entries up to the first that names
    no GPU of the machine ("", -1, an index past its GPUs); a repeated entry hides all."""
    listed: list[str] = []
    for entry in (part.strip() for part in text.split(",")):
        uuid = entry.startswith(("GPU-", "MIG-"))
        index_ok = entry.isascii() and entry.isdigit() and (machine is None or int(entry) < machine)
        if not (uuid or index_ok):
            break
        if entry in listed:
            return []
        listed.append(entry)
    return listed


def cuda_index(local_rank: int, local_world_size: int, cuda_count: int) -> int:
    """The GPU of this rank among the ones it sees.

    As many GPUs as ranks on the node (or more): LOCAL_RANK picks. One GPU: Slurm gave
    each task its own (``--gpus-per-task``, MIG), or the ranks share it, which
    ``check_unique_gpus`` refuses after the rendezvous. Fewer than the ranks, but
    several: no rule maps ranks to GPUs without sharing."""
    if local_rank < cuda_count and local_world_size <= cuda_count:
        return local_rank
    if cuda_count == 1:
        return 0
    raise BadInput(f"LOCAL_RANK={local_rank} of LOCAL_WORLD_SIZE={local_world_size} ranks on this node, but "
                   f"{cuda_count} GPUs are visible; run one task per GPU "
                   "(resources.tasks_per_node <= gpus_per_node, or --gpus-per-task=1)")
