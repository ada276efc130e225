"""A rank's place in its job (docs/design.md, "Distributed environment"): the ``DistEnv``
every task-side environment derives (clusterjob.taskenv), written as the variables torch
reads (``export``) and shown (``describe``); the variables a launcher sets for each rank,
which a submission does not pass on (``clean_environ``) and a spec may not set
(clusterjob.spec.envvars); and the GPU a rank takes among those it sees.

This module reads no variable of the environment: the task-side environments do.
Stdlib only, never torch: ``clusterjob env`` imports this on login nodes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Mapping, MutableMapping, Optional

from clusterjob.core.errors import BadInput

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
# The client configuration path is how sbatch and squeue find the cluster at all.
_KEPT_NAMES = frozenset({"SLURM_CONF"})


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job; everything a rendezvous and the trainer need."""

    source: str  # "torchrun" | "slurm" | "single" | another executor's: which launch rule matched
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
    # ``hosts`` are the nodes as the executor names them (what its exclusion of a node
    # takes), not merely the addresses the ranks reach each other by
    named_nodes: bool = False

    def __post_init__(self) -> None:
        # Accept a list for convenience but store a tuple, so the value stays hashable.
        object.__setattr__(self, "hosts", tuple(self.hosts))

    @property
    def node(self) -> Optional[str]:
        """This rank's node as its executor names it; None where the launch named none."""
        return self.hosts[self.node_rank] if self.named_nodes and 0 <= self.node_rank < len(self.hosts) else None

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


def describe(env: DistEnv) -> str:
    """``clusterjob env``'s text: one aligned ``key  value`` line per field."""
    fields = env.to_dict()
    fields["hosts"] = " ".join(env.hosts)
    width = max(len(key) for key in fields) + 2
    return "\n".join(f"{key:<{width}}{value}" for key, value in fields.items())


# --- the launcher's variables ---------------------------------------------------------------


def launcher_names() -> frozenset:
    """The names (not the prefixes) of the variables a launcher sets for each rank."""
    return _LEAKING_NAMES


def launcher_variable(name: str) -> bool:
    """True for a variable a launcher (Slurm, torchrun, MPI, the local supervisor) sets for
    each rank: it describes the job, not the user's setup."""
    return name in _LEAKING_NAMES or name.startswith(_LEAKING_PREFIXES)


def clean_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` without the job layout of the shell it came from.

    Submitting from inside an allocation would otherwise hand the old job's SLURM_* and
    rank variables to the new job, whose tasks would then detect the wrong layout.
    """
    return {name: value for name, value in environ.items() if name in _KEPT_NAMES or not launcher_variable(name)}


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
