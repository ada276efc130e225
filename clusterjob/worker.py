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

from clusterjob import __version__, checkpoint, dist, metrics
from clusterjob import env as envmod
from clusterjob.data import build_datasets, build_loaders, set_epoch, val_valid_count
from clusterjob.device import DevicePlan, detect_plan
from clusterjob.errors import BadInput
from clusterjob.models import build_model
from clusterjob.optim import current_lrs
from clusterjob.rundir import RunDir, create_run, mark_failed, new_run_id, now_iso, record_error, run_dir_of_spec
from clusterjob.spec import Spec, dump_spec, expand_sweep, load_spec
from clusterjob.train import Trainer, build_trainer, evaluate, train_epoch


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
    args = parse_args(argv)
    try:
        env = envmod.detect(argv=sys.argv if argv is None else argv)
        spec, params = _spec_point(args, env)
        plan = detect_plan(spec, env.local_rank, env.world_size)
    except BadInput as err:
        print(f"clusterjob.worker: error: {err}", file=sys.stderr)
        return 2
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


def _run(args: argparse.Namespace, env: envmod.DistEnv, spec: Spec, params: dict, plan: DevicePlan) -> int:
    if "OMP_NUM_THREADS" not in os.environ:  # else every rank takes every core and they thrash
        torch.set_num_threads(spec.resources.cpus_per_task)
    if plan.device_type == "cuda":
        torch.cuda.set_device(plan.device)
    dist.init(env, plan.backend, spec.dist.init_method, spec.dist.timeout_s)
    run = None
    try:
        run = _resolve_run(args, spec, params)
        return run_training(spec, env, plan, run)
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


def run_training(spec: Spec, env: envmod.DistEnv, plan: DevicePlan, run: RunDir) -> int:
    """Train from the run's latest checkpoint (or from scratch) to the last epoch."""
    torch.manual_seed(spec.train.seed)  # identical initial weights on every rank
    data = build_datasets(spec.data, env.local_rank, spec.train.seed)
    loaders = build_loaders(data, spec.data, spec.train.batch_size, env.rank, env.world_size,
                            spec.train.seed, plan.pin_memory)
    model = build_model(spec.model.arch, data.num_classes, data.in_shape)
    trainer = build_trainer(spec, plan, model, len(loaders.train_loader), env.world_size)
    torch.manual_seed(spec.train.seed * 1000 + env.rank + 1)  # dropout differs across ranks
    start = _resume(trainer, run, env)
    if dist.is_main():
        _mark_running(run, env, plan, spec)
    n_valid = val_valid_count(len(data.val), env.rank, env.world_size)
    for epoch in range(start, spec.train.epochs + 1):
        _debug_fail(spec, env, epoch)
        set_epoch(loaders, epoch)
        record = _epoch(trainer, loaders, n_valid, epoch)
        _save(trainer, run, epoch, env)
        if dist.is_main():
            _log_epoch(run, record, spec.train.epochs)
        if spec.debug.exit_after_epoch == epoch:
            return _stop_early(run, epoch)
    if dist.is_main():
        _finish(run)
    return 0


def _epoch(t: Trainer, loaders, n_valid: int, epoch: int) -> dict:
    progress = _progress_printer(epoch, t.spec.train.epochs) if dist.is_main() else _quiet
    record = {"epoch": epoch, **train_epoch(t, loaders.train_loader, progress)}
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


def _save(t: Trainer, run: RunDir, epoch: int, env: envmod.DistEnv) -> None:
    """Checkpoint on the spec's cadence, at the last epoch and before a debug exit.
    All ranks must call this (the RNG states are gathered)."""
    spec = t.spec
    due = epoch % spec.checkpoint.every_epochs == 0 or epoch in (spec.train.epochs, spec.debug.exit_after_epoch)
    if not due:
        return
    rng = _gather(checkpoint.rng_state(), env.world_size)
    if dist.is_main():
        checkpoint.save(run.checkpoints, epoch, {**t.state_dict(), "epoch": epoch, "rng": rng},
                        spec.checkpoint.keep_last)


def _gather(obj: object, world_size: int) -> list:
    """Every rank's ``obj``, in rank order. All ranks must call this."""
    if world_size == 1:
        return [obj]
    out: list = [None] * world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def _resume(t: Trainer, run: RunDir, env: envmod.DistEnv) -> int:
    """Load the latest checkpoint if any; returns the first epoch to train."""
    state = checkpoint.load_latest(run.checkpoints)
    if state is None:
        return 1
    t.load_state_dict(state)
    if len(state["rng"]) == env.world_size:
        checkpoint.set_rng_state(state["rng"][env.rank])
    if dist.is_main():
        metrics.keep_until(run.metrics_file, state["epoch"])
        print(f"resuming {run.path} after epoch {state['epoch']}", flush=True)
    return state["epoch"] + 1


def _debug_fail(spec: Spec, env: envmod.DistEnv, epoch: int) -> None:
    if spec.debug.fail_at_epoch == epoch and env.rank == spec.debug.fail_rank:
        raise RuntimeError(f"debug.fail_at_epoch: rank {env.rank} fails at epoch {epoch} on purpose")


# ----------------------------------------------------------------------------- rank-0 records


def _mark_running(run: RunDir, env: envmod.DistEnv, plan: DevicePlan, spec: Spec) -> None:
    info = run.read_info()
    job = envmod.slurm_job()
    run.update(status="running", hosts=list(env.hosts), world_size=env.world_size, backend=plan.backend,
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


def _stop_early(run: RunDir, epoch: int) -> int:
    if dist.is_main():
        run.update(status="preempted")
        print(f"debug.exit_after_epoch: stopping after epoch {epoch}", flush=True)
    return 0


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
