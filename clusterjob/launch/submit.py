"""``clusterjob submit`` and ``clusterjob resume``: validate everything, make (or reopen) the
run folders, hand them to an executor (clusterjob.launch.executor), and with ``--wait`` follow
them to the end: one summary line per run, then the report.

All checks run before anything is written, so bad input changes nothing on disk; a
submission that fails after its run folders were made and before the executor has them
(sbatch refusing the job, a snapshot that cannot be copied, Ctrl-C) leaves none of them
``pending`` (clusterjob.launch.handover).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from clusterjob.core import claim, metrics, precision, runstate, sweep, units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.files import batched
from clusterjob.core.record import RunRecord, materialize
from clusterjob.core.rundir import RunDir, make_runs
from clusterjob.launch import chain, control, executor
from clusterjob.launch.executor import Dependency, Executor, Watch
from clusterjob.launch.handover import Window
from clusterjob.launch.progress import LiveLine
from clusterjob.spec import envvars, escalation
from clusterjob.spec.schema import Spec, check_after_args, check_paths, expand_sweep, load_spec, spec_parts


def submit(spec: Spec, executor_name: str = "auto", wait: bool = False, dry_run: bool = False,
           preflight: bool = True, after: Sequence[str] = ()) -> int:
    """``clusterjob submit`` of a spec that is no search (clusterjob.search.commands
    submits those): exit status 0 when submitted (with --wait: all completed). With
    ``after`` (``--after``) each run starts once those runs completed."""
    assert spec.search is None  # the command line picks clusterjob.search.commands.submit for a search
    points = expand_sweep(spec)
    check_paths(spec)
    deps = dependencies(spec, chain.resolve(after))
    chosen = dry_run_executor(executor_name) if dry_run else executor.choose(executor_name)
    chosen.check(spec, len(points), preflight=preflight and not dry_run, after=deps)
    if dry_run:
        for line in chosen.preview(spec, len(points), deps):
            print(line)
        return 0
    snap = _snapshot_plan(spec)
    envvars.hand_down_secrets(spec.env)  # spec.yaml holds *** for them: the ranks inherit them from here
    waits = {"after": [str(dep.run.path) for dep in deps]} if deps else {}
    # One batch: every file of every run is written once and none is synced alone; the
    # batch syncs before a job can read them, and once at its end (clusterjob.core.files)
    with batched(), Window(parent=Path(spec.output.root) / spec.name) as window:
        runs = _made(spec, points, chosen, snap, waits, window)
        lines = _hand_over(runs, window, lambda: chosen.start(spec, runs, follow=wait, after=deps))
    for line in amp_lines([p.spec for p in points], chosen.ranks_here):  # once handed over: a refusal prints nothing
        print(line)
    print_started(lines, runs, wait)
    return _follow(spec, runs, chosen, wait)


def _made(spec: Spec, points: list, chosen: Executor, snap, waits: dict, window: Window) -> list[RunDir]:
    """The run folders of ``points``, claimed by this process and held by ``window`` (so
    a snapshot that fails leaves none), then their code's snapshot."""
    runs = window.hold(make_runs(Path(spec.output.root), spec.name,
                                 [(p.index, spec_parts(p.spec), p.run_params, {"env": envvars.shown_env(p.spec.env)})
                                  for p in points],
                                 claim_as="clusterjob submit", executor=chosen.name,
                                 by_tasks=chosen.makes_runs_at_start(len(points)) and snap is None,
                                 **_origin(), **waits))  # resume's executor, if the start fails
    if snap is not None:
        from clusterjob.launch import snapshot

        snapshot.take(snap, points, runs)
    return runs


# ``submit --debug``: one rank unless the command line asks for more (its --set come after these)
DEBUG_WORLD = ("resources.nodes=1", "resources.tasks_per_node=1")


def debug(spec: Spec, executor_name: str = "auto", preflight: bool = True) -> int:
    """``clusterjob submit --debug``: the spec's one run, its rank 0 in the foreground of
    this terminal (stdin attached: ``breakpoint()`` in the code stops there), its other
    ranks beside it, an ordinary run otherwise (its folder, run.json, status, report).
    Exit status 0 when it completed, else 1."""
    points = expand_sweep(spec)
    if len(points) > 1:
        raise BadInput(f"--debug runs one run, and this spec makes {len(points)}; pick one point, e.g. --set "
                       "sweep={} --set params.KEY=VALUE")
    check_paths(spec)
    chosen = executor.choose(executor_name)
    if not chosen.debuggable:
        raise BadInput(f"--debug: the {chosen.name} executor cannot run a rank in the foreground; use --executor "
                       "local (here) or slurm (in an salloc)")
    chosen.check(spec, 1, preflight=preflight)
    snap = _snapshot_plan(spec)
    envvars.hand_down_secrets(spec.env)
    with batched(), Window(parent=Path(spec.output.root) / spec.name) as window:
        (run,) = _made(spec, points, chosen, snap, {}, window)

        def start() -> list[str]:
            chosen.start_debug(spec, run)
            return []

        _hand_over([run], window, start)
    world = spec.resources.nodes * spec.resources.tasks_per_node
    print(f"{run.path}  (--debug: rank 0 of {world} on this terminal; Ctrl-C stops the run)", flush=True)
    record = chosen.debug(spec, run)
    print(summary_line(record, run))
    return 0 if record.status == runstate.COMPLETED else 1


def amp_lines(specs: Sequence[Spec], ranks_here: bool) -> list[str]:
    """What ``train.amp`` will be, once per distinct answer: the built-in trainer's runs
    only (your own code sets its own precision)."""
    lines = (precision.submit_line(s.train.amp, s.resources.gpus_per_node > 0, ranks_here)
             for s in specs if s.entrypoint is None)
    return list(dict.fromkeys(line for line in lines if line is not None))


def dry_run_executor(requested: str) -> Executor:
    """The executor a dry run shows: a named one even where it cannot run (a dry run
    sends nothing, so it needs no cluster), with a note on stderr of what went unchecked."""
    if requested == "auto":
        return executor.choose(requested)
    chosen = executor.get(requested)
    why = chosen.unavailable()
    if why is not None:
        print(f"note: --executor {requested}: {why}. A dry run needs no cluster, so here is what would be sent, "
              "unchecked: no preflight (validate --cluster) ran and the cluster's limits were not read (a sweep "
              "is split at Slurm's default MaxArraySize, 1001)", file=sys.stderr)
    return chosen


def dependencies(spec: Spec, runs: Sequence[RunDir]) -> list[Dependency]:
    """The runs a new run waits for, as they are now: bad input when one will never
    complete, or when the code's args name them in a way their number does not fit."""
    check_after_args(spec, len(runs))
    deps = chain.states([run.path for run in runs])
    chain.refuse_failed(deps)
    return deps


def cluster_preflight(spec: Spec, points: int) -> int:
    """``validate --cluster``: the Slurm cluster's answers, one line per check; exit 2
    when any failed."""
    checks = executor.choose("slurm").checks(spec, points)
    for check in checks:
        print(check.line())
    failed = sum(not c.ok for c in checks)
    print(f"{'ok' if not failed else 'refused'}: {len(checks) - failed} of {len(checks)} checks passed",
          file=sys.stderr)
    return 2 if failed else 0


def _snapshot_plan(spec: Spec):
    if spec.entrypoint is None or not spec.entrypoint.snapshot:
        return None
    from clusterjob.launch import snapshot

    return snapshot.plan(spec)


def _origin() -> dict:
    """Where the submission came from: its folder (the runs' working directory) and commit."""
    from clusterjob.core.provenance import git_sha

    return {"submit_dir": os.getcwd(), "git_sha": git_sha()}


def _hand_over(runs: list[RunDir], window: Window, start: Callable[[], list[str]]) -> list[str]:
    """Hand the runs (claimed by this process) to the executor (``start``: its call),
    closing the ``window``; then this process gives up their sweep's claim (the executor
    holds what it needs: a Slurm run's job is recorded, a detached local run's supervisor
    holds its claim). The lines to print."""
    try:
        with window.handing_over():
            return start()
    finally:
        for where in {(w.parent, w.stamp) for run in runs if (w := sweep.member(run.path)) is not None}:
            claim.release_sweep(*where)


def print_started(lines: list[str], runs: list[RunDir], wait: bool) -> None:
    """What the executor said, a line per run (at most LISTED), then a sweep's id (what
    status, cancel, resume and logs take) and, unless ``wait``, how to follow it."""
    for line in lines[:control.LISTED]:
        print(line)
    if len(lines) > control.LISTED:
        print(f"... and {len(lines) - control.LISTED} more")
    where = sweep.member(runs[0].path)
    named = sweep.sweep_id(runs[0].path.parent.name, where.stamp) if where is not None else None
    if named is not None and len(runs) > 1:
        print(f"sweep {named}: {len(runs)} runs in {runs[0].path.parent}")
    if not wait:
        print(f"follow with: clusterjob status {named if named and len(runs) > 1 else runs[0].path}")


def _follow(spec: Spec, runs: list[RunDir], chosen: Executor, wait: bool) -> int:
    """With ``wait``, follow the runs to their end and report: exit 0 when all completed."""
    if not wait:
        return 0
    live = LiveLine(sys.stdout)

    def ended(run: RunDir, info: RunRecord) -> None:
        live.clear()
        print(summary_line(info, run))

    waited = chosen.wait(spec, runs, Watch(progress=live.show, ended=ended))
    code = _finish(runs, waited.records)
    return 128 + waited.stop_signal if waited.stop_signal else code


def _finish(runs: list[RunDir], infos: list[RunRecord]) -> int:
    """The report of the runs (their summary lines are printed); 0 when all completed."""
    print_report(runs)
    return 0 if all(i.status == runstate.COMPLETED for i in infos) else 1


def summary_line(info: RunRecord, run: RunDir) -> str:
    """`<run_id> completed val_acc 95.12% val_loss 0.163 epoch 5 -> <path>` (your own
    code: `train_loss 1.234 (step 20)`, its first metric), or the error; then the run's
    warnings, one line each."""
    final = info.final or {}
    parts = [run.run_id, str(info.status)]
    own = metrics.own_latest(run.path, info.entrypoint)
    for key in () if own else ("val_acc", "val_loss"):
        if isinstance(final.get(key), (int, float)):
            parts.append(f"{key} {units.quantity(key, final[key])}")  # one unit per quantity, as the report
    if own:
        parts.append(escape(str(own)))  # names from the code's own file: safe for a terminal
    elif "epoch" in final:
        parts.append(f"epoch {final['epoch']}")
    said = control.message_lines(info.error.message) if info.error is not None else []
    if info.error is not None:
        rank = f" (rank {info.error.rank})" if info.error.rank is not None else ""
        parts.append(f"error{rank}: {said[0]}")
    return "\n".join(["  ".join(parts) + f"  -> {run.path}", *("    " + line for line in said[1:]),
                      *(f"  warning: {escape(w)}" for w in info.warnings)])


def print_report(runs: list[RunDir]) -> None:
    """The report (markdown) of the runs just finished."""
    from clusterjob.report import build as report

    print()
    print(report.format_report([run.path for run in runs], fmt="md", states=executor.records))


# ----------------------------------------------------------------------------- resume


def resume(run_text: str, wait: bool = False, only: Optional[str] = None) -> int:
    """``clusterjob resume RUN``: start a stopped, failed or timed-out run again in its own
    folder, from its last checkpoint, with the executor and resources it had. A run
    whose every process died without recording its end (kill -9, the OOM killer, a
    reboot) counts as stopped. The run is claimed (clusterjob.core.claim) from the check
    of its state until it is handed over, so of several resumes at once one starts it.
    A sweep (its id, or a folder of runs) resumes the runs of it that did not complete
    and are not running, narrowed to state ``only``."""
    target = control.resolve_target(run_text)
    if not target.single or only is not None:
        return _resume_all(target, wait, only)
    run = target.runs[0]
    part = control.readable_record(run).search  # before anything is started or written
    if part is not None:  # a trial (in the search's folder) or a slot (in its .slots folder)
        trial = "trial" in part
        raise BadInput(f"{run.path} is a {'trial' if trial else 'slot'} of a search: "
                       f"{'its slots run it' if trial else 'the search starts it'}; resume the search as a whole: "
                       f"clusterjob resume {run.path.parent if trial else run.path.parent.parent}")
    _check_resumable(run)  # first without the claim: a refused resume makes no lock file
    materialize(run.path)  # a run its task never made (its job ended first): made as it would have
    spec = escalation.resized(load_spec(run.spec_file), run.read())  # with the memory and time it was given
    check_paths(spec)
    envvars.hand_down_secrets(spec.env)  # the secrets of its spec.yaml (***) must be in this shell's environment
    owner = _executor_of(run)
    deps = dependencies(spec, [RunDir(Path(path)) for path in run.read().after])
    owner.check(spec, 1, preflight=False, after=deps)
    with batched(), claim.claimed(run.path, "clusterjob resume"), Window(runs=[run]) as window:
        _check_resumable(run)  # again, now that no other command can start it
        info = run.read()
        _reopen(run, info, owner)
        print(f"resuming {run.path} ({owner.name}) {_resumes_from(run, info)}")
        lines = _hand_over([run], window, lambda: owner.start(spec, [run], follow=wait, after=deps))
    print_started(lines, [run], wait)
    return _follow(spec, [run], owner, wait)


def _reopen(run: RunDir, info: RunRecord, owner: Executor) -> None:
    """The run pending again, as it was before its first start but for what it did."""
    retries: dict = {"retries": 0} if info.retries else {}  # a resume gives max_retries afresh
    run.update(runstate.reopen(), restarts=(info.restarts or 0) + 1, launcher=None, cancel_requested_at=None,
               **retries, **owner.reopened())


def _resume_all(target: control.Target, wait: bool, only: Optional[str]) -> int:
    """Resume the runs of a sweep (or folder) that did not complete and are not live:
    each sweep's as one submission (a Slurm sweep: one array per MaxArraySize runs), its
    claim held meanwhile; with ``wait``, followed to their end."""
    runs, found = control.selected(target, only)
    picked = [run for run, view in zip(runs, found)
              if view.record.status != runstate.COMPLETED and control.still_running(run, view) is None]
    if not picked:
        raise BadInput(f"{target.label}: nothing to resume: {control.state_counts(found)}"
                       + (f" (--only {only})" if only else "") + "; resume starts runs that stopped")
    groups: dict[tuple, list[RunDir]] = {}
    for run in picked:
        control.readable_record(run)  # before anything is started or written
        where = sweep.member(run.path)
        groups.setdefault((where.parent, where.stamp) if where else (str(run.path), ""), []).append(run)
    started = [_resume_group(group, wait) for group in groups.values()]
    codes = [_follow(spec, group, owner, wait) for spec, group, owner in started if group]
    return max(codes, default=0)


def _resume_group(runs: list[RunDir], wait: bool) -> tuple[Spec, list[RunDir], Executor]:
    """Resume runs of one sweep (they share its resources and executor); the spec, the
    runs handed over and their executor."""
    for run in runs:
        materialize(run.path)  # a run its task never made (its job ended first): made as it would have
    spec = load_spec(runs[0].spec_file)
    check_paths(spec)
    owner = _executor_of(runs[0])
    deps = dependencies(spec, [RunDir(Path(path)) for path in runs[0].read().after])
    owner.check(spec, len(runs), preflight=False, after=deps)
    where = sweep.member(runs[0].path)
    asked = runs
    with batched(), _group_claimed(runs, where), Window(runs=runs) as window:
        found = executor.views(runs)  # again, now that no other command can start them
        runs = [run for run, view in zip(runs, found) if view.record.status != runstate.COMPLETED
                and control.still_running(run, view) is None and claim.busy(run.path) is None]
        window.hold(runs)
        if not runs:
            label = sweep.sweep_id(os.path.basename(where.parent), where.stamp) if where else str(asked[0].path)
            print(f"{label}: nothing resumed: another command started its runs meanwhile", file=sys.stderr)
            return spec, [], owner
        for run, view in zip(runs, executor.views(runs)):
            _reopen(run, view.record, owner)
        name = sweep.sweep_id(runs[0].path.parent.name, where.stamp) if where else str(runs[0].path)
        print(f"resuming {len(runs)} run(s) of {name} ({owner.name})")
        lines = _hand_over(runs, window, lambda: owner.start(spec, runs, follow=wait, after=deps))
    print_started(lines, runs, wait)
    return spec, runs, owner


@contextlib.contextmanager
def _group_claimed(runs: list[RunDir], where: Optional[sweep.Member]) -> Iterator[None]:
    """The runs claimed for a resume: their sweep's claim (one lock, however many runs),
    or, for a run of no sweep, its own."""
    if where is None:
        with claim.claimed(runs[0].path, "clusterjob resume"):
            yield
        return
    claim.take_sweep(where.parent, where.stamp, "clusterjob resume")
    try:
        yield
    finally:
        claim.release_sweep(where.parent, where.stamp)


def _resumes_from(run: RunDir, info: RunRecord) -> str:
    """Where the resumed run starts, as far as its folder tells: its last checkpoint, or
    the beginning (it never started, or saved none; your own code may keep its
    checkpoints elsewhere)."""
    if not info.sessions and info.started_at is None:
        return "from the beginning: it never started"
    try:
        saved = any(path.is_file() for path in run.checkpoints.iterdir())
    except OSError:
        saved = False
    if saved:
        return "from its last checkpoint"
    if info.entrypoint is not None:
        return "with no checkpoint in its checkpoints/ folder: your code starts where its own checkpoints say"
    return "from the beginning: it saved no checkpoint"


def _executor_of(run: RunDir) -> Executor:
    """The executor the run had (one that adopts it, for a run started by hand), if it
    is available here."""
    owner = executor.of_record(run.read())
    if owner is None:
        raise BadInput(f"{run.path}: its run.json names executor {run.read().executor!r}, which this clusterjob "
                       "does not have; submit the spec again")
    return executor.choose(owner.name)


def _check_resumable(run: RunDir) -> None:
    """Bad input unless the run stopped: completed, or still running (its job in the
    queue, a process of it alive), it is refused. Reads only."""
    (view,) = executor.views([run])
    status = view.record.status
    if status == runstate.COMPLETED:
        raise BadInput(f"{run.path} is completed; there is nothing to resume")
    live = control.still_running(run, view)
    if live:
        raise BadInput(f"{run.path} is {status} ({live}); resume continues a run that stopped: "
                       f"`clusterjob cancel {run.path}` first")
