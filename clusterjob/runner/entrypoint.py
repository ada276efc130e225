"""Runs the user's own training code (the spec's ``entrypoint``) inside the task, as
torchrun would start it, with the run folder, metrics, preemption and requeue of the
built-in trainer.

Before the code starts: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
NODE_RANK, MASTER_ADDR and MASTER_PORT are exported; so are CLUSTERJOB_RUN_DIR,
CLUSTERJOB_RUN_ID, CLUSTERJOB_PARAMS (JSON), CLUSTERJOB_AFTER (the folders of the runs
it waited for, JSON) and CLUSTERJOB_RESTARTS; ``{run_dir}`` and ``{submit_dir}`` in args
are those folders, ``{after.run_dir}`` and ``{after.run_dirs}`` the runs it waited for;
the working directory is the one ``submit`` ran in, or the run folder under
``entrypoint.workdir: run``; CUDA_VISIBLE_DEVICES stays as Slurm set it, but is empty
under ``resources.gpus_per_node: 0`` (the runner hides the GPUs: the spec means CPU). A
script runs in this process through runpy (``__name__ == "__main__"``, ``sys.argv`` as
under torchrun). The rendezvous store of the runner is
multi-tenant, so the code's own ``init_process_group()`` (env://) shares it.

Stopping (runner.preempt): code that asks ``clusterjob.should_stop()`` checkpoints at
its next step boundary and calls ``clusterjob.requeue()``. A plain script, which never
asks, is stopped as torchrun would stop it: Ctrl-C (SIGINT) raises KeyboardInterrupt in
it, SIGTERM, SIGUSR2 and ``cancel`` raise StopRequested, and ``entrypoint.stop_grace_s``
later the process is killed. Rank 0 records the stop either way, also when the script
caught it and ended by itself (it printed its test loss after Ctrl-C: those metrics are
taken, and the run still ends as the stop says, not completed); on Slurm a USR2 requeues
the job, and the script starts again with the same args (it resumes from its own
checkpoints if it keeps any).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import runpy
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from clusterjob.core import metrics, runstate
from clusterjob.core.files import now_iso, shown
from clusterjob.core.ranks import DistEnv, export
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.runner import api, dist, metricsfile, outputpump, runrecord, sinks
from clusterjob.runner.preempt import StopSignal
from clusterjob.spec.schema import Spec, entrypoint_args
from clusterjob.taskenv import environment as taskenv


class ScriptExit(RuntimeError):
    """The user's code called sys.exit with a non-zero status."""


def prepare(spec: Spec, env: DistEnv) -> Callable[[RunDir, StopSignal], str]:
    """Nothing to decide before the rendezvous: the code makes its own choices."""
    return functools.partial(run_code, spec, env)


def run_code(spec: Spec, env: DistEnv, run: RunDir, stop: StopSignal) -> str:
    """Run the entrypoint on this rank: "completed", or "stopped" after
    ``clusterjob.requeue()`` or a stop signal. All ranks must call this."""
    ep, info = spec.entrypoint, run.read()
    assert ep is not None  # this runner is chosen only for a spec with an entrypoint
    submit_dir = info.submit_dir or os.getcwd()
    args = list(entrypoint_args(spec, str(run.path.resolve()), submit_dir, after=info.after))
    args += [f"--local_rank={env.local_rank}"] if ep.local_rank_arg else []
    _export(env, run, spec, info)
    if env.rank == 0:
        runrecord.mark_running(run, env, {"entrypoint": _describe(spec, args)}, own_code=True)
        stop.on_term = lambda: _record_term(run, spec)  # a script may be killed before it returns
    writer = sinks.for_own_code(spec, run, stop) if env.rank == 0 else None  # metrics.jsonl, the loggers, a prune
    code_dir = Path(info.code_dir or submit_dir)
    with writer or sinks.NoSinks():
        return _run_and_record(spec, env, run, stop, writer, lambda: _call(spec, args, code_dir))


def _run_and_record(spec: Spec, env: DistEnv, run: RunDir, stop: StopSignal, writer: Optional[sinks.Sinks],
                    call: Callable[[], Any]) -> str:
    """Run the code with its metrics taken from its output, its metrics file and the
    API, and record how it ended (rank 0)."""
    ep = spec.entrypoint
    assert ep is not None  # only an entrypoint is run
    stopping = _Stopping(run, spec, env, stop)
    tee = outputpump.Tee(ep.metrics, writer)
    follower = metricsfile.follower(ep.metrics_file, run.path, writer)  # takes the working directory as it starts
    session = _session(spec, env, run, stop, writer, tee)
    api._start(session)
    try:
        with tee, follower, _plain_while_running(stop, session, ep.stop_grace_s):
            result = call()
    except api.Requeue:
        return _requeued(run, spec, env, stop, writer)
    except BaseException:
        if not stop.requested:
            raise
        return stopping.record()  # asked to stop: whatever it ended with (a peer's closed socket) is the stop
    if stop.requested:  # it caught the stop (KeyboardInterrupt) and ended by itself: still the stop
        if writer is not None:
            writer.close("stopped")
        return stopping.record()
    if writer is not None:  # rank 0
        returned = _returned(writer, result)
        writer.close("completed")  # the loggers hold every record before the run says completed
        _finish(run, spec, returned, follower.problem())
    return "completed"


class _Stopping:
    """A plain script's stop, recorded once by rank 0: when it ends, or when its grace
    period runs out and the process is killed (then the main thread may be stuck)."""

    def __init__(self, run: RunDir, spec: Spec, env: DistEnv, stop: StopSignal):
        self.run, self.spec, self.env, self.stop = run, spec, env, stop
        self.lock, self.done = threading.Lock(), False
        stop.before_kill = self.record

    def record(self) -> str:
        with self.lock:
            if self.env.rank == 0 and not self.done:
                runrecord.record_stop(self.run, self.spec, self.stop.signal)
            self.done = True
        return "stopped"


@contextlib.contextmanager
def _plain_while_running(stop: StopSignal, session: api.Session, grace_s: float) -> Iterator[None]:
    """While the code runs, a stop signal stops it unless it asks should_stop() (see
    runner.preempt); a stop asked before it started stops it at once."""
    stop.grace_s = grace_s
    stop.is_plain_script = lambda: not session.polled
    try:
        stop.raise_if_plain()
        yield
    finally:
        stop.is_plain_script = lambda: False


def _export(env: DistEnv, run: RunDir, spec: Spec, info: RunRecord) -> None:
    assert spec.entrypoint is not None  # only an entrypoint's environment is made
    export(env)
    os.environ.update({"CLUSTERJOB_RUN_DIR": str(run.path.resolve()), "CLUSTERJOB_RUN_ID": run.run_id,
                       api.PARAMS_VAR: json.dumps(spec.params), api.AFTER_VAR: json.dumps(info.after),
                       "CLUSTERJOB_RESTARTS": str((info.requeues or 0) + (info.restarts or 0) + (info.retries or 0))})
    if spec.entrypoint.workdir == "run":
        os.chdir(run.path)  # the code's ./checkpoints and ./output are the run's own
    elif info.submit_dir is not None and Path(info.submit_dir).is_dir():
        os.chdir(info.submit_dir)  # relative data paths of the script keep working


def _describe(spec: Spec, args: list[str]) -> dict:
    """run.json's record of the code: what ran, with which arguments and params."""
    ep = spec.entrypoint
    assert ep is not None  # only an entrypoint is described
    kind = "script" if ep.script else "module" if ep.module else "function"
    return {kind: getattr(ep, kind), "args": args, "params": spec.params, "snapshot": ep.snapshot,
            "metrics": list(ep.metrics), "metrics_file": ep.metrics_file}


def _session(spec: Spec, env: DistEnv, run: RunDir, stop: StopSignal,
             writer: Optional[sinks.Sinks], tee: outputpump.Tee) -> api.Session:
    def log_metrics(step: Optional[int], values: dict) -> None:
        if writer is not None:
            tee.sync()  # the prints before this call are matched first: their steps come first
            writer.log(step, values)

    return api.Session(run_dir=run.path, rank=env.rank, world_size=env.world_size,
                       keep_last=spec.checkpoint.keep_last, stop_requested=lambda: stop.requested,
                       agree=dist.any_rank_anywhere, barrier=dist.barrier_anywhere, log_metrics=log_metrics)


def _call(spec: Spec, args: list[str], code_dir: Path) -> Any:
    """Run the script (as __main__), the module (as ``python -m``) or call the function."""
    ep = spec.entrypoint
    assert ep is not None  # only an entrypoint is called
    if ep.script:
        sys.argv = [ep.script, *args]
        sys.path.insert(0, str(Path(ep.script).parent))
        return _main(lambda: runpy.run_path(ep.script, run_name="__main__"))
    sys.path.insert(0, str(code_dir))
    if ep.module:
        sys.argv = [ep.module, *args]
        return _main(lambda: runpy.run_module(ep.module, run_name="__main__", alter_sys=True))
    assert ep.function is not None  # neither script nor module: the function (EntrypointSpec.check)
    module, _, name = ep.function.partition(":")
    sys.argv = [ep.function, *args]
    return _main(getattr(importlib.import_module(module), name))


def _main(call) -> Any:
    """``call()``; sys.exit(0) is a normal end, another status a failure."""
    try:
        return call()
    except SystemExit as exc:
        if exc.code in (None, 0):
            return None
        raise ScriptExit(f"the entrypoint exited with status {exc.code!r}") from None


def _returned(writer: sinks.Sinks, result: Any) -> Optional[dict]:
    """A function's returned mapping of numbers, logged as a last line; as written
    (non-finite values dropped), or None."""
    if isinstance(result, dict) and result and all(metrics.is_number(v) for v in result.values()):
        return writer.log(None, {str(k): metrics.as_float(v) for k, v in result.items()})
    return None


def _finish(run: RunDir, spec: Spec, returned: Optional[dict], file_problem: Optional[str]) -> None:
    """Rank 0 records the end: final (a function's returned mapping, else each metric's
    latest value) and a warning for each configured source that gave no metric."""
    ep = spec.entrypoint
    assert ep is not None  # only an entrypoint is finished here
    present = metrics.final_values(run.metrics_file)
    warnings = [f"entrypoint.metrics.{name}: the regex {shown(rx)} never matched a number on rank 0's output, so the "
                f"run has no {name}; compare it with a line of logs/rank0.out" for name, rx in ep.metrics.items()
                if name not in present]
    warnings += [file_problem] if file_problem else []
    for line in warnings:
        print(f"clusterjob: warning: {line}", file=sys.stderr, flush=True)
    warnings += [line for line in run.read().warnings if line.startswith("logging.")]  # a logger's, kept
    final = returned or present
    runrecord.finish(run, warnings=warnings, **({"final": final} if final else {}))


def _requeued(run: RunDir, spec: Spec, env: DistEnv, stop: StopSignal, writer: Optional[sinks.Sinks]) -> str:
    """Every rank called clusterjob.requeue(): rank 0 lets its loggers finish (Slurm ends
    a requeued job soon), records the stop and requeues the Slurm task; no rank leaves
    before that is on record."""
    dist.barrier_anywhere()
    if writer is not None:  # rank 0
        writer.close("stopped")
        runrecord.record_stop(run, spec, stop.signal)
    dist.barrier_anywhere()
    return "stopped"


def _record_term(run: RunDir, spec: Spec) -> None:
    """SIGTERM on rank 0: Slurm ends the job (time limit, preemption, scancel) and kills
    it after KillWait; say so now, in case the code does not get to return. A cancel, a
    prune (its own SIGTERM: the stop records it) or a local supervisor (which settles the
    end itself) leaves the status alone."""
    info = run.read()
    if info.cancel_requested_at is not None or info.pruned is not None or taskenv.current().supervised:
        run.update(stopped_at=now_iso())
        return
    outcome = runrecord.outcome_now("SIGTERM", 0, spec)
    run.update(runstate.stop(outcome.status), stopped_at=now_iso())
