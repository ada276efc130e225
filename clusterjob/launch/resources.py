"""The spec's resources as Slurm options: one rendering for the sbatch templates
(``clusterjob sbatch``) and for submitit's job scripts (``clusterjob submit``).

Stdlib only: it runs on login nodes.
"""

from __future__ import annotations

from typing import Optional, Sequence

from clusterjob.core.units import slurm_mem, slurm_time
from clusterjob.health import badnodes
from clusterjob.spec.schema import Spec
from clusterjob.taskenv.slurm import SlurmOptions

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to reach a step boundary
# The job script's first line on stderr in each session of a job (a requeued job appends to its log)
SESSION_MARK = "clusterjob: job session starts"


def slurm_array(points: int, parallelism: Optional[int]) -> str:
    """Array indices of a sweep: one task per point, at most ``parallelism`` at once."""
    return f"0-{points - 1}" + (f"%{parallelism}" if parallelism else "")


def signal_delay_s(spec: Spec) -> int:
    """How long before the time limit SIGUSR2 comes: 120 s, or a quarter of a short limit."""
    return int(min(SIGNAL_DELAY_S, spec.resources.time_min * 60 // 4))


def sbatch_options(spec: Spec, points: int = 1) -> dict[str, Optional[str]]:
    """The ``#SBATCH`` options a spec decides, as sbatch spells them; None leaves an
    option out (no gres without GPUs, no mem for mem_gb 0, no partition when null)."""
    r, slurm = spec.resources, SlurmOptions.of(spec)
    return {
        "job-name": spec.name,
        "nodes": str(r.nodes),
        "ntasks-per-node": str(r.tasks_per_node),
        "gres": f"gpu:{r.gpus_per_node}" if r.gpus_per_node else None,
        "cpus-per-task": str(r.cpus_per_task),
        "mem": slurm_mem(r.mem_gb) if r.mem_gb else None,
        "time": slurm_time(r.time_min),
        "partition": slurm.partition,
        "account": slurm.account,
        "qos": slurm.qos,
        "constraint": slurm.constraint,
        "array": slurm_array(points, r.array_parallelism) if points > 1 else None,
    }


def after_options(jobs: Sequence[str]) -> dict:
    """sbatch options that make a job wait for ``jobs`` to complete: afterok on each
    (``123``, ``123_4``), and the job cancelled by Slurm once one can no longer complete."""
    if not jobs:
        return {}
    return {"dependency": "afterok:" + ":".join(jobs), "kill_on_invalid_dep": "yes"}


def exclude_options(spec: Spec) -> dict:
    """sbatch's --exclude of the nodes that failed runs of this results root within
    ``resources.bad_node_ttl`` (clusterjob.health.badnodes); {} for none."""
    nodes = badnodes.fresh(spec.output.root, spec.resources.bad_node_ttl_s)
    return {"exclude": ",".join(nodes)} if nodes else {}


def submitit_parameters(spec: Spec, teardown: list[str], after_jobs: Sequence[str] = ()) -> dict:
    """submitit's SlurmExecutor parameters: the same option values as the templates'
    (submitit adds --array itself for a batch of jobs). With ``after_jobs`` the job
    starts once each of those jobs (or array tasks) completed, and Slurm cancels it when
    one of them failed (so it never waits for ever)."""
    options = sbatch_options(spec)
    passed = ("gres", "mem", "time", "partition", "account", "qos", "constraint")
    r = spec.resources
    params = {
        "job_name": spec.name, "nodes": r.nodes, "ntasks_per_node": r.tasks_per_node,
        "cpus_per_task": r.cpus_per_task, "signal_delay_s": signal_delay_s(spec),
        # Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation
        "setup": [f'echo "{SESSION_MARK}" >&2', *r.setup, f"export SRUN_CPUS_PER_TASK={r.cpus_per_task}"],
        "teardown": teardown,
        "srun_args": ["--kill-on-bad-exit=1"],  # one failed rank ends the step: no rank hangs
        "additional_parameters": {"requeue": True, **{k: options[k] for k in passed if options[k]},
                                  **after_options(after_jobs), **exclude_options(spec)},
    }
    if r.array_parallelism:
        params["array_parallelism"] = r.array_parallelism
    return params
