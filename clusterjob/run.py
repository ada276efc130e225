"""What every task runs: ``python -m clusterjob.run SPEC`` (docs/design.md, "The runner").

The local executor, submitit's tasks, both sbatch templates and ``clusterjob sbatch`` all
start this, and so can any launcher by hand; the task side of the executor that started it
(clusterjob.taskenv.environment) derives the ranks from each:

    srun python -m clusterjob.run jobs/cifar.yaml                   # Slurm variables
    torchrun --nproc_per_node 2 -m clusterjob.run jobs/cifar.yaml
    python -m torch.distributed.launch --nproc_per_node 2 -m clusterjob.run jobs/cifar.yaml
    MASTER_ADDR=h MASTER_PORT=p RANK=r WORLD_SIZE=n python -m clusterjob.run jobs/cifar.yaml

SPEC is a spec file or a run folder's ``spec.yaml``; running again on the same run folder
resumes it. The runner derives the environment (checked before any rendezvous), meets
the other ranks, finds or makes the run folder, owns the stop signals (SIGUSR2, SIGTERM),
and runs the built-in trainer (clusterjob.trainer.worker) or the spec's entrypoint. Nothing
imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
from pathlib import Path
from typing import Any, MutableMapping, Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.ranks import DistEnv
from clusterjob.core.rundir import RunDir, create_run, new_run_id, run_dir_of_spec
from clusterjob.spec import envvars, task
from clusterjob.spec.schema import Spec, dump_spec
from clusterjob.taskenv import environment as taskenv


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    return task.parse(argv, prog="python -m clusterjob.run", description=__doc__)


def main(argv: Optional[list[str]] = None) -> int:
    """Exit status 0 when the run completed or stopped to be resumed, 2 on bad input,
    1 when it failed."""
    faulthandler.enable(all_threads=True)  # an abort (NCCL's watchdog) still leaves a traceback in the log
    parent = os.getppid()
    try:
        run_task(argv)
    except BadInput as err:
        print(f"clusterjob.run: error: {err}", file=sys.stderr)
        return 2
    finally:
        taskenv.current().end_own(parent)  # what it started, where its executor would not end it
    return 0


def run_task(argv: Optional[list[str]] = None) -> str:
    """This task's part of the run: "completed", "stopped" (checkpointed to resume), or
    "failed" (a node failure with no retry left)."""
    args = parse_args(argv)
    env = taskenv.detect(argv=sys.argv if argv is None else argv)
    if args.runs is not None:
        args.spec = task.listed_run(args.runs, taskenv.current().array_task())
    spec, params = _spec_point(args, env)
    task_environ(spec, os.environ)  # before torch is imported
    from clusterjob.runner import dist, health, runrecord
    from clusterjob.runner.preempt import StopSignal

    target = _target(spec).prepare(spec, env)  # this rank's bad input, before any rendezvous
    stop = StopSignal().install()
    dist.rendezvous(env, spec.dist.init_method, spec.dist.timeout_s)
    # Absolute: your code may change the working directory (entrypoint.workdir: run).
    run = RunDir(Path(dist.from_rank0("run-dir", lambda: os.path.abspath(_choose_run(args, spec, params).path))))
    _register(run, env, stop)
    resources = spec.resources
    decided = dist.from_rank0("retries", lambda: runrecord.after_requeue(run, resources.max_retries,
                                                                         resources.retry_backoff_s))
    if decided == runrecord.FAILED:
        dist.destroy()
        return "failed"  # a node failure with no retry left: recorded by rank 0
    runrecord.hold(decided, lambda: stop.requested)  # a retry's back-off the executor's hold did not cover
    watched = health.start(run, env, spec)  # before the code takes over stdout and stderr (the output pump)
    try:
        outcome = target(run, stop)
    except BaseException as exc:
        with contextlib.suppress(ValueError):  # (a thread other than the main one may not; none does here)
            # DataLoader's SIGCHLD handler raises again for each dead worker: not while this error is recorded
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        runrecord.on_failure(run, env.rank, exc, watched.ended_before(exc) if watched is not None else "")
        dist.abort()
        raise
    finally:
        if watched is not None:
            watched.stop()
    dist.destroy()
    return outcome


def task_environ(spec: Spec, environ: MutableMapping[str, str]) -> None:
    """The spec's ``env`` (every launch style comes through here, at every start: submit,
    requeue, resume, the sbatch templates), then the variables torch reads once, when it
    loads or first touches CUDA: OMP_NUM_THREADS = cpus_per_task unless set (else every
    rank takes every core and they thrash), and no visible GPU when
    ``resources.gpus_per_node`` is 0: that spec means CPU, for the built-in trainer and the
    user's own code alike, whatever the node shows (else every rank takes GPU 0, and NCCL
    refuses the shared GPU)."""
    envvars.apply_env(spec.env, environ)
    if "OMP_NUM_THREADS" not in environ:
        environ["OMP_NUM_THREADS"] = str(spec.resources.cpus_per_task)
    if spec.resources.gpus_per_node == 0:
        environ["CUDA_VISIBLE_DEVICES"] = ""


def _register(run: RunDir, env: DistEnv, stop) -> None:
    """Link this rank's logs into the run folder and record which process it is (for
    ``clusterjob cancel``, which signals only a process it verified); rank 0 also
    stops when the run is marked cancelled."""
    from clusterjob.core import procs
    from clusterjob.core.rundir import link_rank_logs

    link_rank_logs(run, env.rank)
    ref = procs.current()
    if ref is not None:
        procs.save(run.proc_file(env.rank), ref)
    if env.rank == 0:
        stop.watch(run)


def _target(spec: Spec):
    """The module that runs the task: the built-in trainer, or the user's own code."""
    if spec.entrypoint is not None:
        from clusterjob.runner import entrypoint

        return entrypoint
    from clusterjob.trainer import worker

    return worker


def _spec_point(args: argparse.Namespace, env: DistEnv) -> tuple[Spec, dict]:
    """The spec of this run; a sweep spec runs the point of --point or the array task."""
    return task.point(args, taskenv.current().array_task())


def _choose_run(args: argparse.Namespace, spec: Spec, params: dict) -> RunDir:
    """--run-dir, else the run folder holding SPEC, else the job's own (so a requeued job
    of a raw script finds its folder again and resumes: its executor's task side
    knows it), else a new one."""
    if args.run_dir:
        run = RunDir(Path(args.run_dir))
        return run if run.exists() else _create(run, spec, params)
    found = run_dir_of_spec(Path(args.spec))
    if found is not None:
        return found
    parent = Path(spec.output.root) / spec.name
    own = taskenv.current().own_run(parent, dump_spec(spec), lambda run, **fields: _create(run, spec, params, **fields))
    return own if own is not None else _create(RunDir(parent / new_run_id()), spec, params)


def _create(run: RunDir, spec: Spec, params: dict, **fields: Any) -> RunDir:
    return create_run(run.path.parent.parent, run.path.parent.name, run.path.name, dump_spec(spec), params,
                      env=envvars.shown_env(spec.env), **fields)


def _leave(code: int) -> None:
    """Exit as Python would, without its interpreter teardown: non-daemon threads are
    joined, atexit handlers run (loggers flush there) and every file left open is
    flushed, then the process ends. In the teardown torch's C++ objects (gloo's threads,
    the store) are destroyed in no set order while the interpreter is half gone, and now
    and then that aborts a rank that has finished its work (SIGABRT, "terminate called
    without an active exception"): Slurm and the supervisor would call a completed task
    failed."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush_open_files()
    os._exit(code)


def _flush_open_files() -> None:
    """Flush the buffer of every open file object (a script's ``open()`` it never closed,
    stdout, stderr): the teardown would have."""
    import gc
    import io

    for obj in gc.get_objects():
        if issubclass(type(obj), (io.TextIOBase, io.BufferedIOBase)):  # type(): no proxy's __getattr__ runs
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):  # a closed pipe, a full disk: the teardown would not do better
                pass


if __name__ == "__main__":
    _leave(main())
