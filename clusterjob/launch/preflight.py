"""``clusterjob validate SPEC --cluster`` (and ``submit`` first, unless ``--no-preflight``):
ask the cluster, read-only, whether a spec's jobs can run there before anything is queued.

One ``Check`` per question: the partition exists and is up; nodes, CPUs per node and the
time limit fit the partition and the QOS; the GPUs asked for exist there (gres, with the
constraint); the sweep fits MaxArraySize (or how it is split); ``sbatch --test-only``
accepts the script as rendered. Each failing check names what was found and the fix.
Nothing here writes: only scontrol/sinfo/sacctmgr show and sbatch --test-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from clusterjob.core import slurmctl
from clusterjob.spec.schema import Spec

Ask = Callable[..., Optional[object]]  # slurmctl.ask: (cmd, stdin=None) -> CompletedProcess | None


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
    """What ``scontrol show partition -o`` says of one partition."""

    name: str
    state: str
    total_nodes: int
    max_nodes: Optional[int]  # None: unlimited
    max_time_min: Optional[int]  # None: unlimited
    qos: Optional[str]  # the partition's own QOS
    default: bool


def _fields(line: str) -> dict:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _limit(text: str, parse: Callable[[str], Optional[int]]) -> Optional[int]:
    return None if text.upper() in ("UNLIMITED", "INFINITE", "") else parse(text)


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition -o`` (one line per partition) as Partitions."""
    found = []
    for line in text.splitlines():
        f = _fields(line)
        if "PartitionName" not in f:
            continue
        time_s = _limit(f.get("MaxTime", ""), slurmctl.parse_duration)
        found.append(Partition(
            f["PartitionName"], f.get("State", "UP"), int(f.get("TotalNodes", "0") or 0),
            _limit(f.get("MaxNodes", ""), lambda t: int(t) if t.isdigit() else None),
            None if time_s is None else time_s // 60,
            None if f.get("QoS", "N/A") in ("N/A", "") else f["QoS"], f.get("Default") == "YES"))
    return found


def parse_minutes(text: str) -> Optional[int]:
    """A QOS MaxWall (``[D-]HH:MM:SS``, ``MM:SS`` or minutes) in minutes; None: unlimited."""
    if not text:
        return None
    seconds = slurmctl.parse_duration(text if ":" in text else f"{text}:00")
    return None if seconds is None else seconds // 60


def parse_tres(text: str) -> dict:
    """``node=2,gres/gpu=4,cpu=8`` as {"node": 2, "gres/gpu": 4, "cpu": 8}."""
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if value.isdigit():
            out[key.strip()] = int(value)
    return out


def check_partition(spec: Spec, partitions: list[Partition]) -> tuple[Check, Optional[Partition]]:
    want = spec.resources.partition
    names = ", ".join(p.name for p in partitions) or "none"
    found = next((p for p in partitions if p.name == want or (want is None and p.default)), None)
    if found is None:
        what = f"{want!r} does not exist" if want else "no partition given and the cluster has no default"
        return Check("partition", False, f"{what} (partitions: {names})",
                     f"set resources.partition to one of: {names}"), None
    if found.state != "UP":
        return Check("partition", False, f"{found.name} is {found.state}",
                     "pick another partition, or wait until it is UP"), found
    return Check("partition", True, f"{found.name} ({found.total_nodes} nodes, state UP)"), found


def check_nodes(spec: Spec, part: Partition) -> Check:
    nodes = spec.resources.nodes
    cap = min(n for n in (part.max_nodes, part.total_nodes) if n is not None)
    if nodes > cap:
        why = f"MaxNodes={part.max_nodes}" if part.max_nodes is not None and part.max_nodes < part.total_nodes \
            else f"it has {part.total_nodes} nodes"
        return Check("nodes", False, f"resources.nodes: {nodes} does not fit partition {part.name} ({why})",
                     f"set resources.nodes to at most {cap}, or use a larger partition")
    return Check("nodes", True, f"{nodes} of at most {cap} in {part.name}")


def check_cpus(spec: Spec, cpus_per_node: list[int], part: Partition) -> Check:
    r = spec.resources
    need = r.tasks_per_node * r.cpus_per_task
    have = max(cpus_per_node, default=0)
    if need > have:
        return Check("cpus", False, f"tasks_per_node {r.tasks_per_node} x cpus_per_task {r.cpus_per_task} = {need} "
                                    f"CPUs per node, but the nodes of {part.name} have at most {have}",
                     f"lower resources.cpus_per_task or tasks_per_node so that they multiply to <= {have}")
    return Check("cpus", True, f"{need} CPUs per node of {have}")


def check_time(spec: Spec, part: Partition, qos_wall: Optional[int], qos: Optional[str]) -> Check:
    minutes = spec.resources.time_min
    limits = [(part.max_time_min, f"partition {part.name} MaxTime"), (qos_wall, f"QOS {qos} MaxWall")]
    for limit, where in limits:
        if limit is not None and minutes > limit:
            return Check("time", False, f"resources.time_min: {minutes} is over the {where} of {limit} min",
                         f"set resources.time_min to at most {limit} (checkpoints and requeue carry long runs on)")
    shown = [f"{where} {limit} min" for limit, where in limits if limit is not None]
    return Check("time", True, f"{minutes} min ({', '.join(shown) or 'no limit'})")


def check_qos(spec: Spec, qos: Optional[str], row: Optional[dict]) -> Check:
    """The spec's QOS (else the partition's) exists, and the job fits its MaxTRES."""
    if qos is None:
        return Check("qos", True, "none asked")
    if row is None and spec.resources.qos is None:
        return Check("qos", True, f"the partition's QOS {qos} (its limits are not readable here)")
    if row is None:
        return Check("qos", False, f"resources.qos: {qos!r} does not exist (or accounting does not answer)",
                     "set resources.qos to a QOS of `sacctmgr show qos`, or leave it out")
    tres = parse_tres(row.get("MaxTRES", ""))
    r = spec.resources
    asked = {"node": r.nodes, "cpu": r.nodes * r.tasks_per_node * r.cpus_per_task,
             "gres/gpu": r.nodes * r.gpus_per_node}
    for key, value in asked.items():
        if key in tres and value > tres[key]:
            return Check("qos", False, f"the job asks {key}={value}, over QOS {qos}'s MaxTRES {key}={tres[key]}",
                         f"ask for at most {key}={tres[key]} per job, or use another QOS")
    return Check("qos", True, f"{qos} (MaxTRES {row.get('MaxTRES') or 'none'}, MaxWall {row.get('MaxWall') or 'none'})")


def check_gpus(spec: Spec, nodes: list[dict], part: Partition) -> Check:
    r = spec.resources
    if r.gpus_per_node == 0:
        return Check("gpus", True, "none asked (CPU)")
    wanted = set(filter(None, re.split(r"[&|,]", r.constraint or "")))
    fit = [n for n in nodes if n["gpus"] >= r.gpus_per_node and (not wanted or wanted & n["features"])]
    if len(fit) < r.nodes:
        most = max((n["gpus"] for n in nodes), default=0)
        where = f" with features {r.constraint}" if r.constraint else ""
        return Check("gpus", False, f"{r.nodes} node(s) with {r.gpus_per_node} GPUs{where} asked; partition "
                                    f"{part.name} has {len(fit)} (at most {most} GPUs per node)",
                     "lower resources.gpus_per_node/nodes, change resources.constraint, or use a GPU partition")
    return Check("gpus", True, f"{len(fit)} node(s) of {part.name} have {r.gpus_per_node}+ GPUs")


def check_array(points: int, max_array: int) -> Check:
    if points <= 1:
        return Check("array", True, "one run, no array")
    if points <= max_array:
        return Check("array", True, f"{points} runs in one array (MaxArraySize {max_array})")
    parts = -(-points // max_array)
    return Check("array", True, f"{points} runs split into {parts} arrays of at most {max_array} (MaxArraySize)")


def node_rows(text: str) -> list[dict]:
    """``sinfo -h -N -o %N|%c|%G|%f`` as {name, cpus, gpus, features} per node."""
    rows = []
    for line in text.splitlines():
        name, cpus, gres, features = (line.split("|") + ["", "", ""])[:4]
        gpus = sum(int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))
        rows.append({"name": name, "cpus": int(cpus) if cpus.strip().isdigit() else 0, "gpus": gpus,
                     "features": set(filter(None, features.replace("(null)", "").split(",")))})
    return rows


def check_test_only(script: str, ask: Ask) -> Check:
    done = ask(["sbatch", "--test-only"], stdin=script)
    said = " ".join(((getattr(done, "stderr", "") or "") + (getattr(done, "stdout", "") or "")).split())
    if done is None or getattr(done, "returncode", 1) != 0:
        return Check("sbatch --test-only", False, said.removeprefix("sbatch: error: ") or "sbatch did not run",
                     "fix the resource named above (resources.* in the spec)")
    return Check("sbatch --test-only", True, said.removeprefix("sbatch: ") or "accepted")


def run_checks(spec: Spec, points: int, scripts: list[str], ask: Ask = slurmctl.ask) -> list[Check]:
    """Every check of ``spec`` (``points`` runs, rendered as ``scripts``) against the cluster."""
    shown = ask(["scontrol", "show", "partition", "-o"])
    if shown is None or getattr(shown, "returncode", 1) != 0:
        return [Check("slurm", False, "scontrol does not answer", "check SLURM_CONF and that slurmctld is up")]
    first, part = check_partition(spec, parse_partitions(getattr(shown, "stdout", "")))
    if part is None:
        return [first]
    listed = ask(["sinfo", "-h", "-N", "-p", part.name, "-o", "%N|%c|%G|%f"])
    nodes = node_rows(getattr(listed, "stdout", "") if listed is not None else "")
    qos = spec.resources.qos or part.qos
    row = _qos_row(qos, ask) if qos else None
    wall = parse_minutes(row.get("MaxWall", "")) if row else None
    checks = [first, check_nodes(spec, part), check_cpus(spec, [n["cpus"] for n in nodes], part),
              check_time(spec, part, wall, qos), check_qos(spec, qos, row),
              check_gpus(spec, nodes, part), check_array(points, slurmctl.max_array_size())]
    return checks + [check_test_only(script, ask) for script in scripts[:1]]


def _qos_row(name: str, ask: Ask) -> Optional[dict]:
    done = ask(["sacctmgr", "-n", "-P", "show", "qos", name, "format=Name,MaxWall,MaxTRES"])
    for line in (getattr(done, "stdout", "") or "").splitlines() if done is not None else []:
        got_name, wall, tres = (line.split("|") + ["", ""])[:3]
        if got_name == name:
            return {"MaxWall": wall, "MaxTRES": tres}
    return None
