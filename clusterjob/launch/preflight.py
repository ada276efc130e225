"""``clusterjob validate SPEC --cluster`` (and ``submit`` first, unless ``--no-preflight``):
ask the cluster, read-only, whether a spec's jobs can run there before anything is queued.

One ``Check`` per question: the partition exists and is up; nodes, CPUs per node and the
time limit fit the partition and the QOS; the GPUs asked for exist there (gres, with the
constraint); the sweep fits MaxArraySize (or how it is split); ``sbatch --test-only``
accepts the script as rendered. Each failing check names what was found and the fix.
The answers are read with clusterjob.core.slurmctl's reader; a command that does not
answer, or a value of its answer that cannot be read, fails the checks that need it with
a line that says so, never a guess (such as nodes with 0 CPUs).
Nothing here writes: only scontrol/sinfo/sacctmgr show and sbatch --test-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from clusterjob.core import slurmctl
from clusterjob.core.errors import BadInput, SlurmUnreachable
from clusterjob.health import badnodes
from clusterjob.launch import limits
from clusterjob.spec.schema import Spec
from clusterjob.taskenv.slurm import SlurmOptions

Ask = Callable[..., Optional[object]]  # slurmctl.ask: (cmd, stdin=None) -> CompletedProcess | None

PARTITIONS = "scontrol show partition"
NODES = "sinfo -N"
QOS = "sacctmgr show qos"
_UNANSWERED_FIX = "check that Slurm answers here (SLURM_CONF, slurmctld), or pass --no-preflight to submit anyway"
_UNREAD_FIX = "ask the cluster's admins what it means, or pass --no-preflight to submit without this check"
_ARRAY_FIX = ("submit each sweep point as a spec of its own (one value per swept key: one run needs no array), "
              "or ask the cluster's admins for job arrays")
_UNLIMITED = ("UNLIMITED", "INFINITE")


@dataclass(frozen=True)
class Check:
    """One preflight answer: ``ok``, what was found, and for a failure the fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"
        return head if self.ok or not self.fix else f"{head}; fix: {self.fix}"


@dataclass(frozen=True)
class Partition:
    """What ``scontrol show partition -o`` says of one partition; ``unread``: the fields
    (and what they said) that could not be read, whose values here are None."""

    name: str
    state: Optional[str]  # None: not said
    total_nodes: Optional[int]
    max_nodes: Optional[int]  # None: unlimited
    max_time_min: Optional[int]  # None: unlimited
    qos: Optional[str]  # the partition's own QOS
    default: bool
    unread: tuple[tuple[str, Optional[str]], ...] = ()


def _read(fields: dict, key: str, parse: Callable[[str], Optional[int]], unread: list,
          limit: bool = False) -> Optional[int]:
    """``fields[key]`` parsed; None for a ``limit`` that is UNLIMITED, and for a value that
    cannot be read, which goes into ``unread``."""
    text = fields.get(key)
    if limit and text is not None and text.upper() in _UNLIMITED:
        return None
    value = None if text is None else parse(text)
    if value is None:
        unread.append((key, text))
    return value


def _minutes(text: str) -> Optional[int]:
    seconds = slurmctl.parse_duration(text)
    return None if seconds is None else seconds // 60


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition -o`` (one line per partition) as Partitions."""
    found = []
    for f in slurmctl.records(text):
        if "PartitionName" not in f:
            continue
        unread: list = []
        total = _read(f, "TotalNodes", slurmctl.number, unread)
        most = _read(f, "MaxNodes", slurmctl.number, unread, limit=True)
        time_min = _read(f, "MaxTime", _minutes, unread, limit=True)
        found.append(Partition(f["PartitionName"], f.get("State") or None, total, most, time_min,
                               None if f.get("QoS", "N/A") in ("N/A", "") else f["QoS"], f.get("Default") == "YES",
                               tuple(unread)))
    return found


def parse_minutes(text: str) -> Optional[int]:
    """A QOS MaxWall (``[D-]HH:MM:SS``, ``MM:SS`` or minutes) in minutes; None when it
    cannot be read."""
    return _minutes(text if ":" in text else f"{text}:00")


def parse_tres(text: str) -> dict[str, Optional[int]]:
    """``node=2,gres/gpu=4,cpu=8`` as {"node": 2, "gres/gpu": 4, "cpu": 8}; None for a
    value that is no count (``mem=8G``, or one that cannot be read)."""
    pairs = (part.partition("=") for part in text.split(","))
    return {key.strip(): slurmctl.number(value) for key, sep, value in pairs if sep}


def _unread(name: str, command: str, pairs) -> Check:
    """The failed check ``name`` whose answer from ``command`` could not be read."""
    said = "; ".join(slurmctl.unreadable(command, field, text) for field, text in pairs)
    return Check(name, False, said, _UNREAD_FIX)


def _part_unread(name: str, part: Partition, *keys: str) -> Optional[Check]:
    pairs = [(key, text) for key, text in part.unread if key in keys]
    return _unread(name, PARTITIONS, pairs) if pairs else None


def check_partition(spec: Spec, partitions: list[Partition]) -> tuple[Check, Optional[Partition]]:
    want = SlurmOptions.of(spec).partition
    names = ", ".join(p.name for p in partitions) or "none"
    found = next((p for p in partitions if p.name == want or (want is None and p.default)), None)
    if found is None:
        what = f"{want!r} does not exist" if want else "no partition given and the cluster has no default"
        return Check("partition", False, f"{what} (partitions: {names})",
                     f"set resources.partition to one of: {names}"), None
    if found.state is None:
        return _unread("partition", PARTITIONS, [("State", None)]), found
    if found.state != "UP":
        return Check("partition", False, f"{found.name} is {found.state}",
                     "pick another partition, or wait until it is UP"), found
    size = "" if found.total_nodes is None else f"{found.total_nodes} nodes, "
    return Check("partition", True, f"{found.name} ({size}state UP)"), found


def check_nodes(spec: Spec, part: Partition) -> Check:
    nodes, total = spec.resources.nodes, part.total_nodes
    unread = _part_unread("nodes", part, "TotalNodes", "MaxNodes")
    if unread is not None or total is None:
        return unread or _unread("nodes", PARTITIONS, [("TotalNodes", None)])
    cap = total if part.max_nodes is None else min(part.max_nodes, total)
    if nodes > cap:
        why = f"MaxNodes={part.max_nodes}" if part.max_nodes is not None and part.max_nodes < total \
            else f"it has {total} nodes"
        return Check("nodes", False, f"resources.nodes: {nodes} does not fit partition {part.name} ({why})",
                     f"set resources.nodes to at most {cap}, or use a larger partition")
    return Check("nodes", True, f"{nodes} of at most {cap} in {part.name}")


def check_bad_nodes(spec: Spec, part: Partition, nodes: list[dict]) -> Optional[Check]:
    """How many of the partition's nodes a submit keeps its jobs off (the list of bad
    nodes, clusterjob.health.badnodes), and whether the job still fits the rest; None
    where it keeps the job off none."""
    bad = badnodes.fresh(spec.output.root, spec.resources.bad_node_ttl_s)
    names = {row["name"] for row in nodes}
    excluded = sorted(node for node in bad if node in names or not names)
    if not excluded:
        return None
    said = f"{len(excluded)} node(s) excluded as bad within resources.bad_node_ttl ({', '.join(excluded)})"
    left = (part.total_nodes or len(names)) - len(excluded)
    if spec.resources.nodes > left:
        return Check("bad nodes", False, f"{said}: resources.nodes: {spec.resources.nodes} does not fit the {left} "
                                         f"left in {part.name}",
                     "`clusterjob nodes --forget NODE` for a node that is fine again, or lower resources.nodes")
    return Check("bad nodes", True, said)


def _nodes_unknown(name: str, nodes: list[dict], part: Partition, problem: Optional[str],
                   key: str, column: str) -> Optional[Check]:
    """The failed check ``name`` when sinfo did not answer, lists no node, or gave a
    ``column`` that cannot be read; None when every node's ``key`` is known."""
    if problem is not None:
        return Check(name, False, problem, _UNANSWERED_FIX)
    if not nodes:
        return Check(name, False, f"`{NODES}` lists no nodes in partition {part.name}", "use another partition")
    bad = next((node for node in nodes if node[key] is None), None)
    if bad is not None:
        return _unread(name, f"{NODES} -p {part.name}", [(column, bad["said"].get(column))])
    return None


def check_cpus(spec: Spec, nodes: list[dict], part: Partition, problem: Optional[str] = None) -> Check:
    r = spec.resources
    need = r.tasks_per_node * r.cpus_per_task
    unknown = _nodes_unknown("cpus", nodes, part, problem, "cpus", "CPUS")
    if unknown is not None:
        return unknown
    have = max(node["cpus"] for node in nodes)
    if need > have:
        return Check("cpus", False, f"tasks_per_node {r.tasks_per_node} x cpus_per_task {r.cpus_per_task} = {need} "
                                    f"CPUs per node, but the nodes of {part.name} have at most {have}",
                     f"lower resources.cpus_per_task or tasks_per_node so that they multiply to <= {have}")
    return Check("cpus", True, f"{need} CPUs per node of {have}")


def check_time(spec: Spec, part: Partition, qos_row: Optional[dict], qos: Optional[str]) -> Check:
    minutes = spec.resources.time_min
    wall_text = (qos_row or {}).get("MaxWall", "")
    qos_wall = parse_minutes(wall_text) if wall_text else None
    unread = _part_unread("time", part, "MaxTime")
    if unread is not None or (wall_text and qos_wall is None):
        return unread or _unread("time", QOS, [("MaxWall", wall_text)])
    limits = [(part.max_time_min, f"partition {part.name} MaxTime"), (qos_wall, f"QOS {qos} MaxWall")]
    for limit, where in limits:
        if limit is not None and minutes > limit:
            return Check("time", False, f"resources.time_min: {minutes} is over the {where} of {limit} min",
                         f"set resources.time_min to at most {limit} (checkpoints and requeue carry long runs on)")
    said = [f"{where} {limit} min" for limit, where in limits if limit is not None]
    return Check("time", True, f"{minutes} min ({', '.join(said) or 'no limit'})")


def check_qos(spec: Spec, qos: Optional[str], row: Optional[dict], problem: Optional[str] = None) -> Check:
    """The spec's QOS (else the partition's) exists, and the job fits its MaxTRES;
    ``problem``: why sacctmgr did not answer."""
    if qos is None:
        return Check("qos", True, "none asked")
    if row is None and SlurmOptions.of(spec).qos is None:
        return Check("qos", True, f"the partition's QOS {qos} (its limits are not readable here)")
    if row is None:
        if problem is not None:
            return Check("qos", False, f"resources.qos: {qos!r} could not be checked: {problem}", _UNANSWERED_FIX)
        return Check("qos", False, f"resources.qos: {qos!r} does not exist",
                     "set resources.qos to a QOS of `sacctmgr show qos`, or leave it out")
    tres = parse_tres(row.get("MaxTRES", ""))
    r = spec.resources
    asked = {"node": r.nodes, "cpu": r.nodes * r.tasks_per_node * r.cpus_per_task,
             "gres/gpu": r.nodes * r.gpus_per_node}
    for key, value in asked.items():
        limit = tres.get(key, -1)
        if limit is None:
            return _unread("qos", QOS, [("MaxTRES", row.get("MaxTRES"))])
        if limit >= 0 and value > limit:
            return Check("qos", False, f"the job asks {key}={value}, over QOS {qos}'s MaxTRES {key}={limit}",
                         f"ask for at most {key}={limit} per job, or use another QOS")
    return Check("qos", True, f"{qos} (MaxTRES {row.get('MaxTRES') or 'none'}, MaxWall {row.get('MaxWall') or 'none'})")


def check_gpus(spec: Spec, nodes: list[dict], part: Partition, problem: Optional[str] = None) -> Check:
    r = spec.resources
    if r.gpus_per_node == 0:
        return Check("gpus", True, "none asked (CPU)")
    unknown = _nodes_unknown("gpus", nodes, part, problem, "gpus", "GRES")
    if unknown is not None:
        return unknown
    constraint = SlurmOptions.of(spec).constraint
    wanted = set(filter(None, re.split(r"[&|,]", constraint or "")))
    fit = [n for n in nodes if n["gpus"] >= r.gpus_per_node and (not wanted or wanted & n["features"])]
    if len(fit) < r.nodes:
        most = max(n["gpus"] for n in nodes)
        where = f" with features {constraint}" if constraint else ""
        return Check("gpus", False, f"{r.nodes} node(s) with {r.gpus_per_node} GPUs{where} asked; partition "
                                    f"{part.name} has {len(fit)} (at most {most} GPUs per node)",
                     "lower resources.gpus_per_node/nodes, change resources.constraint, or use a GPU partition")
    return Check("gpus", True, f"{len(fit)} node(s) of {part.name} have {r.gpus_per_node}+ GPUs")


def check_array(points: int, max_array: int) -> Check:
    """How a sweep of ``points`` runs goes into job arrays of at most ``max_array`` (the
    cluster's MaxArraySize; 0: it takes no arrays)."""
    if points <= 1:
        return Check("array", True, "one run, no array")
    if max_array == 0:
        return Check("array", False, f"a sweep of {points} runs is submitted as job arrays, and this cluster "
                                     "takes none (MaxArraySize=0 in `scontrol show config`)", _ARRAY_FIX)
    if points <= max_array:
        return Check("array", True, f"{points} runs in one array (MaxArraySize {max_array})")
    parts = -(-points // max_array)
    return Check("array", True, f"{points} runs split into {parts} arrays of at most {max_array} (MaxArraySize)")


def array_check(points: int, ask: Optional[Ask] = None) -> tuple[Check, int]:
    """The array check of a sweep of ``points``, and how many runs one of its arrays holds
    (0 when the check failed). One run asks nothing."""
    if points <= 1:
        return check_array(points, 1), 1
    try:
        limit = slurmctl.max_array_size(ask) if ask is not None else slurmctl.max_array_size()
    except SlurmUnreachable as err:
        return Check("array", False, str(err), _UNANSWERED_FIX), 0
    except slurmctl.Unreadable as err:
        return Check("array", False, str(err), _ARRAY_FIX), 0
    check = check_array(points, limit)
    return check, limit if check.ok else 0


def array_size(points: int) -> int:
    """How many runs of a sweep of ``points`` one job array holds (one run asks nothing):
    bad input, with the array check's line, where the cluster takes no arrays or its
    MaxArraySize cannot be read; SlurmUnreachable where scontrol does not answer."""
    if points <= 1:
        return 1
    try:
        limit = slurmctl.max_array_size()
    except slurmctl.Unreadable as err:
        raise BadInput(f"{err}; fix: {_ARRAY_FIX}") from None
    check = check_array(points, limit)
    if not check.ok:
        raise BadInput(f"{check.detail}; fix: {check.fix}")
    return limit


_GRES_COUNT = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:([^:,(]*)")


def _gpus(gres: str) -> Optional[int]:
    """The GPUs of a node's gres (``gpu:a100:4(S:0-1),mps:100``); None when a count of
    them cannot be read."""
    counts = [slurmctl.number(count) for count in _GRES_COUNT.findall(gres)]
    return None if None in counts else sum(count or 0 for count in counts)


def node_rows(text: str) -> list[dict]:
    """``sinfo -N -o %N|%c|%G|%f`` (with its header) as {name, cpus, gpus, features,
    said} per node; cpus and gpus are None when they cannot be read (``said``: the row)."""
    rows = []
    for row in slurmctl.table(text):
        gres = row.get("GRES")
        rows.append({"name": row.get("NODELIST", ""), "cpus": slurmctl.number(row.get("CPUS")),
                     "gpus": None if gres is None else _gpus(gres), "said": row,
                     "features": set(filter(None, row.get("AVAIL_FEATURES", "").replace("(null)", "").split(",")))})
    return rows


def check_test_only(script: str, ask: Ask) -> Check:
    done = ask(TEST_ONLY, stdin=script)
    said = " ".join(((getattr(done, "stderr", "") or "") + (getattr(done, "stdout", "") or "")).split())
    if done is None or getattr(done, "returncode", 1) != 0:
        return Check("sbatch --test-only", False, said.removeprefix("sbatch: error: ") or "sbatch did not run",
                     "fix the resource named above (resources.* in the spec)")
    return Check("sbatch --test-only", True, said.removeprefix("sbatch: ") or "accepted")


def _answer(done: Optional[object], command: str) -> tuple[str, Optional[str]]:
    """(stdout, None) of a command that answered; ("", why not) otherwise."""
    if done is None or getattr(done, "returncode", 1) != 0:
        return "", slurmctl.unanswered(command, done)
    return getattr(done, "stdout", "") or "", None


PARTITIONS_CMD = ["scontrol", "show", "partition", "-o"]
TEST_ONLY = ["sbatch", "--test-only"]


def nodes_cmd(partition: str) -> list[str]:
    return ["sinfo", "-N", "-p", partition, "-o", "%N|%c|%G|%f"]


def qos_cmd(name: str) -> list[str]:
    return ["sacctmgr", "-P", "show", "qos", name, "format=Name,MaxWall,MaxTRES,MaxSubmitPU,MaxSubmitPA,GrpSubmit"]


def run_checks(spec: Spec, points: int, scripts: list[str], ask: Ask = slurmctl.ask) -> list[Check]:
    """Every check of ``spec`` (``points`` runs, rendered as ``scripts``) against the
    cluster. The questions that depend on no answer are asked at once (the user's
    associations too: sacctmgr answers at once where there is no accounting), then those
    that depend on the partition (slurmctl.AskedAtOnce): a round trip each, not their sum."""
    asked = slurmctl.AskedAtOnce(ask).start(PARTITIONS_CMD, slurmctl.CONFIG, limits.QUEUE_CMD, limits.assoc_cmd(),
                                            *((TEST_ONLY, script) for script in scripts[:1]))
    try:
        return _checks(spec, points, scripts, asked)
    finally:
        asked.close()


def _checks(spec: Spec, points: int, scripts: list[str], ask: slurmctl.AskedAtOnce) -> list[Check]:
    answer, problem = _answer(ask(PARTITIONS_CMD), PARTITIONS)
    if problem is not None:
        return [Check("slurm", False, problem, "check SLURM_CONF and that slurmctld is up")]
    first, part = check_partition(spec, parse_partitions(answer))
    if part is None:
        return [first]
    qos = SlurmOptions.of(spec).qos or part.qos
    ask.start(nodes_cmd(part.name), *([qos_cmd(qos)] if qos else []))
    listed, unlisted = _answer(ask(nodes_cmd(part.name)), NODES)
    nodes = node_rows(listed)
    rows: dict = {}

    def qos_row(name: str) -> tuple[Optional[dict], Optional[str]]:
        if name not in rows:
            rows[name] = _qos_row(name, ask)
        return rows[name]

    row, unasked = qos_row(qos) if qos else (None, None)
    bad = check_bad_nodes(spec, part, nodes)  # a check only where the list excludes some node
    checks = [first, check_nodes(spec, part), *([bad] if bad is not None else []),
              check_cpus(spec, nodes, part, unlisted),
              check_time(spec, part, row, qos), check_qos(spec, qos, row, unasked),
              check_gpus(spec, nodes, part, unlisted), array_check(points, ask)[0],
              check_jobs(spec, points, part, ask, qos_row)]
    return checks + [check_test_only(script, ask) for script in scripts[:1]]


def _qos_row(name: str, ask: Ask) -> tuple[Optional[dict], Optional[str]]:
    """sacctmgr's row of QOS ``name`` (None: no such QOS), or why sacctmgr did not answer."""
    said, problem = _answer(ask(qos_cmd(name)), QOS)
    return next((row for row in slurmctl.table(said) if row.get("Name") == name), None), problem


def check_jobs(spec: Spec, points: int, part: Partition, ask: Ask,
               qos_row: Callable[[str], tuple[Optional[dict], Optional[str]]]) -> Check:
    """The submission's jobs (each array task one) fit the cluster's limits on jobs:
    MaxJobCount with the jobs the controller holds, and the submit limits of the
    user's association and QOS with the jobs already queued (clusterjob.launch.limits)."""
    options = SlurmOptions.of(spec)
    try:
        found = limits.limits(options.account, options.qos, part.name, part.qos, ask, qos_row,
                              _UNANSWERED_FIX, _UNREAD_FIX)
    except limits.Unknown as err:
        return Check("jobs", False, err.line, err.fix)
    hit = limits.over(points, found)
    if hit is not None:
        return Check("jobs", False, f"{hit.name} is {hit.most}, and the {points} job(s) of this submission (each "
                                    f"array task is one) with the {hit.counted} that count already make "
                                    f"{hit.counted + points}", hit.fix(points))
    fits = ", ".join(f"{limit.name.split(' (')[0]} {limit.counted + points} of {limit.most}" for limit in found)
    return Check("jobs", True, f"{points} job(s) fit: {fits}")
