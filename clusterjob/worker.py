"""What every task runs: ``python -m clusterjob.worker SPEC``.

Every launch style gives the same run (clusterjob.env derives ranks from each):

    srun python -m clusterjob.worker jobs/cifar.yaml             # Slurm variables
    torchrun --nproc_per_node 2 -m clusterjob.worker jobs/cifar.yaml
    python -m torch.distributed.launch --nproc_per_node 2 --use-env ... # legacy, --local_rank
    MASTER_ADDR=h MASTER_PORT=p RANK=r WORLD_SIZE=n python -m clusterjob.worker jobs/cifar.yaml

SPEC is a spec file or a run folder's ``spec.yaml``; running again on the same run folder
resumes from its latest checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

from clusterjob import __version__, checkpoint, dist, metrics, slurmctl
from clusterjob import env as envmod
from clusterjob.data import build_datasets, build_loaders, set_epoch, val_valid_count
from clusterjob.device import DevicePlan, detect_plan
from clusterjob.errors import BadInput
from clusterjob.models import build_model
from clusterjob.optim import current_lrs
from clusterjob.preempt import StopSignal
from clusterjob.rundir import (RunDir, create_run, link_rank_logs, mark_failed, new_run_id, now_iso, record_error,
                               run_dir_of_spec)
from clusterjob.spec import Spec, dump_spec, expand_sweep, load_spec
from clusterjob.train import EpochState, Trainer, build_trainer, epoch_metrics, evaluate, train_epoch

TIMEOUT_MARGIN_S = 180  # USR2 with less time left than this is the time limit's warning (sent 120 s before)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clusterjob.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="spec file, or a run folder's spec.yaml")
    p.add_argument("--run-dir", help="run folder to use (default: derived, see README)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key")
    p.add_argument("--point", type=int, help="sweep point to run (default: SLURM_ARRAY_TASK_ID)")
    # The legacy launcher passes --local_rank; clusterjob.env reads it from argv.
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    """Exit status 0 when the run completed or stopped to be resumed, 2 on bad input."""
    try:
        run_task(argv)
    except BadInput as err:
        print(f"clusterjob.worker: error: {err}", file=sys.stderr)
        return 2
    return 0


def run_task(argv: Optional[list[str]] = None) -> str:
    """Run this task's part of the run: "completed", or "stopped" (checkpointed to resume)."""
    args = parse_args(argv)
    env = envmod.detect(argv=sys.argv if argv is None else argv)
    spec, params = _spec_point(args, env)
    plan = detect_plan(spec, env.local_rank, env.world_size)
    return _run(args, env, spec, params, plan)


def _spec_point(args: argparse.Namespace, env: envmod.DistEnv) -> tuple[Spec, dict]:
    """The spec of this run; a sweep spec runs the point of --point or the array task."""
    points = expand_sweep(load_spec(args.spec, args.set))
    if len(points) == 1:
        return points[0].spec, points[0].params
    job = envmod.slurm_job()
    index = args.point if args.point is not None else (job and job.array_task_id)
    if index is None or not 0 <= int(index) < len(points):
        raise BadInput(f"{args.spec} is a sweep of {len(points)} runs; pass --point 0..{len(points) - 1}, "
                       "run it as a Slurm array, or use `clusterjob submit`")
    point = points[int(index)]
    return point.spec, point.params


def _run(args: argparse.Namespace, env: envmod.DistEnv, spec: Spec, params: dict, plan: DevicePlan) -> str:
    if "OMP_NUM_THREADS" not in os.environ:  # else every rank takes every core and they thrash
        torch.set_num_threads(spec.resources.cpus_per_task)
    if plan.device_type == "cuda":
        torch.cuda.set_device(plan.device)
    stop = StopSignal().install()
    dist.init(env, plan.backend, spec.dist.init_method, spec.dist.timeout_s)
    run = None
    try:
        run = _resolve_run(args, spec, params)
        link_rank_logs(run, env.rank)
        return run_training(spec, env, plan, run, stop)
    except BaseException as exc:
        _on_failure(run, env, exc)
        raise
    finally:
        dist.destroy()


def _resolve_run(args: argparse.Namespace, spec: Spec, params: dict) -> RunDir:
    """Rank 0 picks (and if needed creates) the run folder; every rank gets its path."""
    path = str(_choose_run(args, spec, params).path) if dist.is_main() else None
    return RunDir(Path(dist.broadcast_object(path)))


def _choose_run(args: argparse.Namespace, spec: Spec, params: dict) -> RunDir:
    """--run-dir, else the run folder holding SPEC, else a new one (named after the Slurm job,
    so a requeued raw sbatch job finds its folder again and resumes)."""
    if args.run_dir:
        run = RunDir(Path(args.run_dir))
    else:
        run = run_dir_of_spec(Path(args.spec))
        if run is None:
            job = envmod.slurm_job()
            run_id = f"slurm-{job.run_key}" if job else new_run_id()
            run = RunDir(Path(spec.output.root) / spec.name / run_id)
    if not run.exists():
        run = create_run(run.path.parent.parent, run.path.parent.name, run.path.name, dump_spec(spec), params)
    return run


def _on_failure(run: Optional[RunDir], env: envmod.DistEnv, exc: BaseException) -> None:
    """Each rank reports its own crash; rank 0 also marks the run failed."""
    if run is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    record_error(run, env.rank, exc)
    if dist.is_main():
        mark_failed(run, f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- training


def run_training(spec: Spec, env: envmod.DistEnv, plan: DevicePlan, run: RunDir, stop: StopSignal) -> str:
    """Train from the run's latest checkpoint (or from scratch) to the last epoch, or until
    a stop signal: then checkpoint where all ranks are and return "stopped"."""
    torch.manual_seed(spec.train.seed)  # identical initial weights on every rank
    data = build_datasets(spec.data, env.local_rank, spec.train.seed)
    loaders = build_loaders(data, spec.data, spec.train.batch_size, env.rank, env.world_size,
                            spec.train.seed, plan.pin_memory)
    model = build_model(spec.model.arch, data.num_classes, data.in_shape)
    trainer = build_trainer(spec, plan, model, len(loaders.train_loader), env.world_size)
    torch.manual_seed(spec.train.seed * 1000 + env.rank + 1)  # dropout differs across ranks
    start, partial = _resume(trainer, run, env)
    if dist.is_main():
        _mark_running(run, env, plan)
    n_valid = val_valid_count(len(data.val), env.rank, env.world_size)
    for epoch in range(start, spec.train.epochs + 1):
        _debug_fail(spec, env, epoch)
        set_epoch(loaders, epoch, partial.batches)
        progress = _progress_printer(epoch, spec.train.epochs) if dist.is_main() else _quiet
        state = train_epoch(trainer, loaders.train_loader, progress, stop.agreed, partial)
        partial = EpochState()
        if not state.finished:
            _save(trainer, run, epoch - 1, env, state)
            return _stopped(run, spec, stop)
        record = _epoch_record(trainer, loaders, n_valid, epoch, state)
        stopping = epoch < spec.train.epochs and (spec.debug.exit_after_epoch == epoch or stop.agreed())
        if dist.is_main():
            _log_epoch(run, record, spec.train.epochs)
        _save(trainer, run, epoch, env, force=stopping or epoch == spec.train.epochs)
        if stopping:
            return _stopped(run, spec, stop)
    if dist.is_main():
        _finish(run)
    return "completed"


def _epoch_record(t: Trainer, loaders, n_valid: int, epoch: int, state: EpochState) -> dict:
    record = {"epoch": epoch, **epoch_metrics(state, t.plan.device)}
    record.update(evaluate(t.raw_model, loaders.val_loader, n_valid, t.plan, tta=t.spec.data.tta == "flip"))
    if t.spec.train.ema_decay is not None:
        ema = evaluate(t.ema.module, loaders.val_loader, n_valid, t.plan)
        record.update(val_acc_ema=ema["val_acc"], val_loss_ema=ema["val_loss"])
    return {**record, "step": t.step, **current_lrs(t.optimizer)}


def _quiet(*_: object) -> None:
    pass


def _progress_printer(epoch: int, epochs: int):
    def show(step: int, steps: int, loss: float, images_per_s: float) -> None:
        print(f"[progress] epoch {epoch}/{epochs} step {step}/{steps} loss {loss:.4f} "
              f"{images_per_s:.0f} img/s", flush=True)
    return show


def _save(t: Trainer, run: RunDir, epoch: int, env: envmod.DistEnv, partial: Optional[EpochState] = None,
          force: bool = False) -> None:
    """Checkpoint after ``epoch`` complete epochs (plus ``partial`` progress into the next)
    on the spec's cadence or when forced. All ranks must call this: the RNG states and the
    ranks' partial sums are gathered."""
    if not (force or partial is not None or epoch % t.spec.checkpoint.every_epochs == 0):
        return
    per_rank = _gather((checkpoint.rng_state(), partial and list(partial.totals)), env.world_size)
    if dist.is_main():
        extra = {"batches": partial.batches, "seconds": partial.seconds,
                 "totals": [totals for _, totals in per_rank]} if partial else None
        checkpoint.save(run.checkpoints, epoch, {**t.state_dict(), "epoch": epoch, "partial": extra,
                                                 "rng": [rng for rng, _ in per_rank]},
                        t.spec.checkpoint.keep_last, batches=partial.batches if partial else 0)
    dist.barrier()  # the file is complete before any rank moves on (or exits)


def _gather(obj: object, world_size: int) -> list:
    """Every rank's ``obj``, in rank order. All ranks must call this."""
    if world_size == 1:
        return [obj]
    out: list = [None] * world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def _resume(t: Trainer, run: RunDir, env: envmod.DistEnv) -> tuple[int, EpochState]:
    """Load the latest checkpoint if any: the epoch to train next and how far into it."""
    state = checkpoint.load_latest(run.checkpoints)
    if state is None:
        return 1, EpochState()
    t.load_state_dict(state)
    same_world = len(state["rng"]) == env.world_size
    if same_world:
        checkpoint.set_rng_state(state["rng"][env.rank])
    partial = state.get("partial")
    if dist.is_main():
        metrics.keep_until(run.metrics_file, state["epoch"])
        where = f" and {partial['batches']} batches" if partial else ""
        print(f"resuming {run.path} after epoch {state['epoch']}{where}", flush=True)
    if not partial or not same_world:  # another world size cannot continue another's shards
        return state["epoch"] + 1, EpochState()
    return state["epoch"] + 1, EpochState(partial["batches"], tuple(partial["totals"][env.rank]), partial["seconds"])


def _stopped(run: RunDir, spec: Spec, stop: StopSignal) -> str:
    """Every rank has checkpointed: rank 0 records why and requeues the Slurm job (or task)."""
    if dist.is_main():
        _record_stop(run, spec, stop)
    dist.barrier()  # no rank exits before the requeue is on record
    return "stopped"


def _record_stop(run: RunDir, spec: Spec, stop: StopSignal) -> None:
    job = envmod.slurm_job()
    reason = _stop_reason(job, stop)
    requeues = run.read_info().get("requeues") or 0
    if job is None or not stop.requeue_wanted:
        run.update(status=reason)
        hint = "Slurm requeues or ends the job" if job else f"run the worker on {run.spec_file} again to resume"
        print(f"stopped ({reason}); {hint}", flush=True)
    elif requeues >= spec.resources.max_requeues:
        run.update(status="failed", finished_at=now_iso(), error={
            "rank": None, "message": f"{reason} {requeues + 1} times; resources.max_requeues={spec.resources.max_requeues} "
            "reached, not requeued (resume by resubmitting the run folder's spec.yaml)", "traceback": ""})
    else:
        run.update(status=reason, requeues=requeues + 1)
        ok = slurmctl.requeue(job.run_key)
        print(f"{reason}: {'requeued' if ok else 'could not requeue'} job {job.run_key}", flush=True)


def _stop_reason(job: Optional[envmod.SlurmJob], stop: StopSignal) -> str:
    """timeout when the signal came near the job's time limit, else preempted."""
    if job is None or stop.received_at is None:
        return "preempted"
    left = slurmctl.time_left_s(job.run_key)
    return "timeout" if left is not None and left <= TIMEOUT_MARGIN_S else "preempted"


def _debug_fail(spec: Spec, env: envmod.DistEnv, epoch: int) -> None:
    if spec.debug.fail_at_epoch == epoch and env.rank == spec.debug.fail_rank:
        raise RuntimeError(f"debug.fail_at_epoch: rank {env.rank} fails at epoch {epoch} on purpose")


# ----------------------------------------------------------------------------- rank-0 records


def _mark_running(run: RunDir, env: envmod.DistEnv, plan: DevicePlan) -> None:
    info = run.read_info()
    job = envmod.slurm_job()
    requeues = max(info.get("requeues") or 0, job.restart_count if job else 0)  # scontrol requeue too
    cancelled_job = info.get("status") == "cancelled" and job and info.get("slurm_job_id") == job.run_key
    run.update(reopen=not cancelled_job, status="running", requeues=requeues, hosts=list(env.hosts),
               world_size=env.world_size, backend=plan.backend,
               amp=plan.amp_name, device=plan.device_type, master_addr=env.master_addr,
               master_port=env.master_port, slurm_job_id=job.run_key if job else info.get("slurm_job_id"),
               versions=_versions(), git_sha=_git_sha(), started_at=info.get("started_at") or now_iso(),
               finished_at=None, error=None)


def _log_epoch(run: RunDir, record: dict, epochs: int) -> None:
    metrics.append_epoch(run.metrics_file, record)
    run.update(final=record)
    print(f"epoch {record['epoch']}/{epochs} train_loss {record['train_loss']:.4f} "
          f"train_acc {record['train_acc']:.4f} val_loss {record['val_loss']:.4f} "
          f"val_acc {record['val_acc']:.4f} lr {record['lr']:.4g} {record['epoch_time_s']:.1f}s "
          f"{record['samples_per_s']:.0f} img/s", flush=True)


def _finish(run: RunDir) -> None:
    info = run.update(status="completed", finished_at=now_iso())
    print(f"completed {run.path}: {json.dumps(info.get('final'))}", flush=True)


def _versions() -> dict:
    import torchvision

    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "clusterjob": __version__}


def _git_sha() -> Optional[str]:
    """The commit of the code being run (the working directory's repository), if any."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
