"""The ranks of a launch by hand (docs/design.md, "Distributed environment"): torchrun,
the legacy ``torch.distributed.launch``, variables set by hand, or one process; and the
rule every task-side environment applies first, since torchrun started inside any job
sees both and only its own variables describe the processes.

Stdlib only, never torch.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional, Sequence

from clusterjob.core.errors import EnvError
from clusterjob.core.ranks import DistEnv
from clusterjob.taskenv.variables import env_int, optional_int, parse_int

DEFAULT_MASTER_ADDR = "127.0.0.1"
# torchrun's own default; used only when a hand-set launch names no port (e.g. it
# rendezvouses through a file:// init method and never opens this port).
DEFAULT_MASTER_PORT = 29500

_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
# A host name or address: no spaces, line breaks or other control characters.
_HOST = re.compile(r"[\x21-\x7e]+")

_TORCHRUN_HINT = (
    "launch with torchrun, or set RANK, WORLD_SIZE (and LOCAL_RANK, LOCAL_WORLD_SIZE) "
    "consistently by hand; unset RANK and WORLD_SIZE to use Slurm's variables instead"
)
_PORT_HINT = "set MASTER_PORT to a free TCP port in 1..65535, or unset it to use the default"

Nodes = Callable[[int], Optional[tuple[str, ...]]]  # the job's node names, when it runs that many nodes


def detect(environ: Mapping[str, str], argv: Sequence[str], own: Callable[[], Optional[DistEnv]] = lambda: None,
           nodes: Nodes = lambda count: None) -> DistEnv:
    """This process's ranks by the first matching rule: torchrun's variables (RANK and
    WORLD_SIZE set; ``nodes`` names the hosts where the job knows them), else the
    executor's own layout (``own``: an srun step), else one process. Raises EnvError,
    naming the variable and its value, on anything missing or inconsistent."""
    has_rank, has_world = "RANK" in environ, "WORLD_SIZE" in environ
    if has_rank and has_world:
        return from_torchrun(environ, argv, nodes)
    if has_rank or has_world:
        _raise_half_set(environ, "RANK" if has_rank else "WORLD_SIZE")
    return own() or single(environ)


def _raise_half_set(environ: Mapping[str, str], name: str) -> None:
    """Refuse one of RANK/WORLD_SIZE without the other: a half-set launch, or a leak."""
    other = "WORLD_SIZE" if name == "RANK" else "RANK"
    raise EnvError(
        f"{name}={environ[name]!r} is set but {other} is not. Hint: set both for a hand-set "
        f"launch, or unset {name} to use Slurm's variables or a single process"
    )


def from_torchrun(environ: Mapping[str, str], argv: Sequence[str], nodes: Nodes) -> DistEnv:
    """The layout torchrun (or a hand-set launch) already wrote into the environment."""
    world_size = env_int(environ, "WORLD_SIZE", _TORCHRUN_HINT, minimum=1)
    rank = env_int(
        environ, "RANK", _TORCHRUN_HINT, below=(world_size, f"WORLD_SIZE={world_size}")
    )
    local_world_size = _torchrun_local_world_size(environ, world_size)
    per_node, num_nodes, nodes_label = _torchrun_node_counts(environ, world_size, local_world_size)
    addr = master_addr(environ)
    return DistEnv(
        source="torchrun",
        rank=rank,
        local_rank=_torchrun_local_rank(environ, argv, rank, local_world_size, per_node),
        world_size=world_size,
        local_world_size=per_node,
        node_rank=_torchrun_node_rank(environ, rank, local_world_size, (num_nodes, nodes_label)),
        num_nodes=num_nodes,
        master_addr=addr,
        master_port=master_port(environ, DEFAULT_MASTER_PORT),
        hosts=nodes(num_nodes) or (addr,),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def _torchrun_local_world_size(environ: Mapping[str, str], world_size: int) -> Optional[int]:
    """LOCAL_WORLD_SIZE if set; a node cannot run more processes than the whole job."""
    value = optional_int(environ, "LOCAL_WORLD_SIZE", _TORCHRUN_HINT, minimum=1)
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
    groups = optional_int(
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
        return env_int(environ, "LOCAL_RANK", _TORCHRUN_HINT, below=bound)
    argument = legacy_local_rank_argument(argv)
    if argument is not None:
        flag, raw = argument
        return parse_int(flag, raw, _TORCHRUN_HINT, below=bound)
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
            return env_int(environ, name, _TORCHRUN_HINT, below=bound)
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


def master_addr(environ: Mapping[str, str]) -> str:
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


def master_port(environ: Mapping[str, str], default: int) -> int:
    """MASTER_PORT when set (it must be a TCP port, 1..65535), else ``default``."""
    if "MASTER_PORT" not in environ:
        return default
    port = env_int(environ, "MASTER_PORT", _PORT_HINT, minimum=1)
    if port > 65535:
        raise EnvError(
            f"MASTER_PORT={environ['MASTER_PORT']!r} is above 65535. Hint: {_PORT_HINT}"
        )
    return port


def single(environ: Mapping[str, str]) -> DistEnv:
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
        master_port=master_port(environ, DEFAULT_MASTER_PORT),
        hosts=(DEFAULT_MASTER_ADDR,),
    )
