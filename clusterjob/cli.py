"""``clusterjob``: the command line (docs/design.md, "Command line"). Exit 0 ok, 2 bad
input, 1 otherwise, 141 when the output was closed early.

Used on login nodes: this module and the commands env/status/logs/report and spec
validation never import torch; each command imports its module when it runs, so
``--help`` and ``status`` start in a fraction of what ``import torch`` takes
(tests/test_cli_startup.py, bench/bench_cli_startup.py).

A closed output is a normal end (``clusterjob status | head``): the commands that only
print stop at once, quietly, with exit status 141 (128 + SIGPIPE, what a shell reports
for ``git log | head``); submit, resume and cancel finish what they do (a run is never
left half handed over, nor a local ``--wait`` run unsupervised) with their output
dropped, and exit as they would have.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import select
import sys
from typing import Callable, Iterator, NoReturn, Optional, TextIO

from clusterjob.core.errors import BadInput, Failure
from clusterjob.core.provenance import VERSION

PIPE_CLOSED = 141  # 128 + SIGPIPE: the exit status of a reader-less pipe's writer

Command = Callable[[argparse.Namespace], int]


def _reads_run_folders(command: Command) -> Command:
    """A run folder's file that cannot be read (a folder where run.json belongs, no
    permission, a broken disk) is bad input of these commands: one line naming the file,
    not a traceback. A closed output pipe is not the folder's fault and stays as it is."""
    @functools.wraps(command)
    def checked(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except BrokenPipeError:
            raise
        except OSError as err:
            where = f"{err.filename}: " if err.filename else ""
            raise BadInput(f"{where}{err.strerror or err}; check that the run folder's files are "
                           "readable files (not folders) and try again") from None
    return checked


class _OutputDropped:
    """A stream that, once its reader is gone, writes to /dev/null instead of raising:
    what submit, resume and cancel print to while their work goes on."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            _silence(self.stream.fileno())
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            _silence(self.stream.fileno())
            self.stream.flush()  # what was buffered goes to /dev/null now

    def __getattr__(self, name: str):  # isatty, fileno, encoding: the stream's own
        return getattr(self.stream, name)


def _silence(fd: int) -> None:
    """Point the file descriptor at /dev/null: what is still buffered for it, and the
    interpreter's last flush, then go nowhere instead of failing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@contextlib.contextmanager
def _output_may_close() -> Iterator[None]:
    """stdout and stderr dropped once their reader is gone, for the block (a command)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _OutputDropped(sys.stdout), _OutputDropped(sys.stderr)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = saved


def _closed_outputs() -> list[int]:
    """stdout and stderr where they are pipes (or sockets) whose reader is gone."""
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, select.POLLOUT)
    return [fd for fd, events in poller.poll(0) if events & (select.POLLERR | select.POLLHUP)]


def cmd_submit(args: argparse.Namespace) -> int:
    from clusterjob.spec.schema import load_spec

    if args.debug:
        return _submit_debug(args)
    spec = load_spec(args.spec, args.set)
    if spec.search is not None:  # a search: its slots run through its executor
        from clusterjob.search import commands

        return commands.submit(spec, args.executor, wait=args.wait, dry_run=args.dry_run,
                               preflight=not args.no_preflight, after=args.after)
    from clusterjob.launch.submit import submit

    return submit(spec, executor_name=args.executor, wait=args.wait, dry_run=args.dry_run,
                  preflight=not args.no_preflight, after=args.after)


def _submit_debug(args: argparse.Namespace) -> int:
    """``submit --debug``: one run, rank 0 in the foreground (world size 1 unless --set
    asks for more nodes or tasks)."""
    from clusterjob.launch import submit
    from clusterjob.spec.schema import load_spec

    for flag, given in (("--dry-run", args.dry_run), ("--after", args.after)):
        if given:
            raise BadInput(f"--debug and {flag} do not go together: --debug runs the run now, in the foreground; "
                           f"leave one out")
    spec = load_spec(args.spec, [*submit.DEBUG_WORLD, *args.set])
    if spec.search is not None:
        raise BadInput("--debug runs one run, and this spec is a search; debug a trial's values in a spec "
                       "without search:")
    return submit.debug(spec, executor_name=args.executor, preflight=not args.no_preflight)


@_reads_run_folders
def cmd_resume(args: argparse.Namespace) -> int:
    from clusterjob.search.record import is_search

    if is_search(args.run):
        from pathlib import Path

        from clusterjob.search import commands

        return commands.resume(Path(args.run), args.wait, args.set)
    if args.set:
        raise BadInput(f"--set {args.set[0]}: resume takes --set only for a search (search.trials=N); a run resumes "
                       "with the spec it has")
    from clusterjob.launch.submit import resume

    return resume(args.run, wait=args.wait, only=args.only)


def _validate_search(spec) -> int:
    """A search's resolved spec, its space and, for the random method, its first trials."""
    from clusterjob.search import record as searchmod
    from clusterjob.spec.schema import dump_spec

    assert spec.search is not None  # only a search's spec
    print("# resolved spec (a search)")
    print(dump_spec(spec))
    dims = searchmod.space_of(spec.search.space)
    for dim in dims:
        print(f"# searched: {dim.key}: {dim.kind} {list(dim.args)}")
    if spec.search.method == "random":
        for number in range(min(5, spec.search.trials)):
            print(f"# trial {number}: {json.dumps(searchmod.draw(dims, spec.search.seed, number))}")
    sys.stdout.flush()
    print(f"ok: a search of {spec.search.trials} trial(s), {spec.search.parallel} at once", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from clusterjob.spec import envvars
    from clusterjob.spec.schema import dump_spec, expand_sweep, load_spec

    spec = load_spec(args.spec, args.set)
    # What submit checks before it starts anything: a secret the spec holds as *** must be
    # in this environment. Checked on a copy: validate changes nothing.
    envvars.hand_down_secrets(spec.env, dict(os.environ))
    points = expand_sweep(spec)
    if args.cluster:
        from clusterjob.launch.submit import cluster_preflight

        return cluster_preflight(spec, spec.search.parallel if spec.search is not None else len(points))
    if spec.search is not None:
        return _validate_search(spec)
    for point in points:
        print(f"# run {point.index}: {json.dumps(point.params)}" if len(points) > 1 else "# resolved spec")
        print(dump_spec(point.spec))
    sys.stdout.flush()  # the specs first: a closed output ends the command before its verdict
    print(f"ok: {len(points)} run(s)", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from clusterjob.core.ranks import describe
    from clusterjob.taskenv.environment import detect
    from clusterjob.taskenv.slurmjob import job_port

    if args.port:
        print(job_port())
        return 0
    derived = detect()
    print(json.dumps(derived.to_dict(), indent=2) if args.json else describe(derived))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from clusterjob.launch.executor import records  # each run's state, as `status` derives it
    from clusterjob.report.build import ReportOptions

    options = ReportOptions(dir=args.dir, group_by=args.group_by, format=args.format, metric=args.metric,
                            mode=args.mode, out=args.out, runs=args.runs, interval=args.interval,
                            folders=_sweep_folders(args.dir))
    if args.suggest:
        return _suggest(args.dir, options.folders)
    if args.watch:
        from clusterjob.report import watch

        return watch.main(options, records)
    from clusterjob.report import build as report

    return report.main(options, records)


def _suggest(folder: str, folders: tuple[str, ...]) -> int:
    """``report --suggest``: the smallest request that fits each experiment, as a spec fragment."""
    from clusterjob.report import reading, suggest

    try:
        found = reading.collect(folders or folder, cache=False)
    except FileNotFoundError as err:
        raise BadInput(f"{err}; give results/<name>, results/ or one run folder") from None
    print(suggest.suggestion(found.infos))
    return 0


def _sweep_folders(text: str) -> tuple[str, ...]:
    """The run folders of the sweep ``text`` names by its id (as submit prints it, and as
    status, logs and cancel take it); () for a folder, which the report reads itself."""
    if os.path.isdir(text):
        return ()
    from clusterjob.launch.control import resolve_target

    try:
        return tuple(str(run.path) for run in resolve_target(text, for_status=True).runs)
    except BadInput:  # no runs: the report says so, once its other arguments are checked
        return ()


def _group_key(text: str) -> str:
    """One --group-by argument (a key, or keys joined by commas), each key named."""
    if any(not part.strip() for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: a key is empty; name a key of the runs' spec, e.g. "
                                         "--group-by train.lr, or leave --group-by out for the default grouping")
    return text


@_reads_run_folders
def cmd_status(args: argparse.Namespace) -> int:
    from clusterjob.launch import control
    from clusterjob.search.record import is_search

    if is_search(args.dir):
        from pathlib import Path

        from clusterjob.search.commands import summary

        return control.cmd_status(args.dir, summary(Path(args.dir)), listed=args.runs, only=args.only)
    return control.cmd_status(args.dir, listed=args.runs, only=args.only)


@_reads_run_folders
def cmd_logs(args: argparse.Namespace) -> int:
    from clusterjob.launch import control

    return control.cmd_logs(args.run, rank=args.rank, follow=args.follow, only=args.only)


@_reads_run_folders
def cmd_stack(args: argparse.Namespace) -> int:
    from clusterjob.launch import control, stack

    return stack.cmd_stack(control.resolve_run(args.run), rank=args.rank)


@_reads_run_folders
def cmd_attach(args: argparse.Namespace) -> int:
    from clusterjob.launch import attach, control

    return attach.cmd_attach(control.resolve_run(args.run), rank=args.rank)


@_reads_run_folders
def cmd_cancel(args: argparse.Namespace) -> int:
    from clusterjob.search.record import is_search

    if is_search(args.run):  # a search's folder: every slot of it
        from pathlib import Path

        from clusterjob.search import commands

        return commands.cancel(Path(args.run))
    from clusterjob.launch import control

    return control.cmd_cancel(args.run, only=args.only)


def cmd_nodes(args: argparse.Namespace) -> int:
    """The nodes that failed runs of a results root; ``--forget NODE`` takes one off."""
    from clusterjob.health import badnodes
    from clusterjob.spec.escalation import ttl_s

    if args.forget is not None:
        if not badnodes.forget(args.root, args.forget):
            raise BadInput(f"{args.forget} is not on the list of bad nodes ({badnodes.path_of(args.root)}); "
                           f"`clusterjob nodes {args.root}` lists them")
        print(f"forgot {args.forget}: later submits may run on it again")
        return 0
    print("\n".join(badnodes.table(args.root, ttl_s("--ttl", args.ttl))))
    return 0


def cmd_sbatch(args: argparse.Namespace) -> int:
    from clusterjob.launch import sbatch

    return sbatch.main(args.spec, args.set, style=args.style)


def cmd_data(args: argparse.Namespace) -> int:
    from clusterjob.launch import datafetch

    return datafetch.main(args.dataset, args.root)


def _add_data_parser(sub) -> None:
    from clusterjob.spec.catalog import FILED

    p = sub.add_parser("data", help="download a built-in dataset where there is internet (a login node)")
    fetch = p.add_subparsers(dest="action", required=True, metavar="ACTION").add_parser(
        "fetch", help="download DATASET into --root (what the specs' data.root names), unless it is there")
    fetch.add_argument("dataset", choices=FILED, help=" | ".join(FILED))
    fetch.add_argument("--root", help="the data.root of the runs that read it (default ./data); on a filesystem "
                                      "the compute nodes see")
    fetch.set_defaults(func=cmd_data)


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line bad input (exit 2) instead of its usage block."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message}; see `{self.prog} --help`")


def _executor_metavar() -> str:
    """auto|local|slurm: the built-in executors' names, none of their modules imported
    (nor importlib.metadata, which those of other packages need)."""
    from clusterjob.launch.executor import listed_names

    return "|".join(("auto", *listed_names()))


_TARGET = ("run folder, run id under results/, a sweep's id (as submit prints it) or a folder of runs "
           "(results/<name>: all its sweeps)")


def _add_only(p: argparse.ArgumentParser, what: str, states: str = "failed|cancelled|preempted") -> None:
    """--only STATE; ``states``: those the command narrows to (control.ONLY, control.CANCELLABLE)."""
    p.add_argument("--only", metavar=states, help=what)


def _add_cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", dest="cluster_name", metavar="NAME",
                   help="run it on this cluster of ~/.config/clusterjob/clusters.yaml over SSH, output here "
                        "(default: CLUSTERJOB_CLUSTER; see `clusterjob clusters`)")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="YAML spec file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec key, value parsed as YAML (repeatable), e.g. --set train.lr=0.2")


def _add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="tables (and curves) over the runs in a results folder")
    p.add_argument("dir", help="results/<name>, results/, or one run folder")
    p.add_argument("--group-by", nargs="+", metavar="KEY", type=_group_key,
                   help="group keys: any key of the runs' resolved spec (e.g. train.lr, or lr), name, status, "
                        "world_size, backend, amp, git_sha (default: every key of the runs' params and every spec "
                        "key whose value differs between runs of one experiment, but the seeds train.seed and "
                        "params.seed). Each experiment (spec name) is reported apart")
    # --format and --mode are checked by the report itself: one error line, like every bad input
    p.add_argument("--format", metavar="md|csv|html|json", help="default md (or from --out's suffix)")
    p.add_argument("--metric", metavar="NAME", help="primary metric of each experiment whose runs logged it "
                                                    "(default: val_acc if logged, else the first metric logged)")
    p.add_argument("--mode", metavar="max|min", help="which way is better (default: min for names with loss or "
                                                     "err, else max)")
    p.add_argument("--out", help="write to this file instead of the terminal")
    p.add_argument("--runs", action="store_true", help="one row per run instead of per group")
    p.add_argument("--watch", action="store_true",
                   help="redraw the report in the terminal while runs run (read-only; ends once every run "
                        "ended, Ctrl-C leaves)")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="with --watch: seconds between redraws "
                                                                       "(default 5)")
    _add_cluster(p)
    p.add_argument("--suggest", action="store_true",
                   help="print the smallest resources (mem_gb, time_min) that would have fit each experiment's "
                        "completed runs on Slurm, with a 20%% margin, as a spec fragment (sacct)")
    p.set_defaults(func=cmd_report)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="clusterjob", description="DDP + AMP training on Slurm from a YAML spec.")
    parser.add_argument("--version", action="version", version=f"clusterjob {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("submit", help="run a spec (one run, or one per sweep point)")
    _add_spec_args(p)
    # the executors (like --style, --format and --mode) check their own names: one error line
    p.add_argument("--executor", default="auto", metavar=_executor_metavar(),
                   help="auto (the default): Slurm if sbatch works, else local processes; or the name an "
                        "installed package registers (entry point group clusterjob.executors)")
    p.add_argument("--wait", action="store_true", help="block until the runs end; print summaries")
    p.add_argument("--debug", action="store_true",
                   help="run one run with rank 0 in the foreground, stdin attached, so breakpoint() in the code "
                        "works (locally, or in an salloc with --executor slurm); world size 1 unless --set "
                        "resources.nodes=N / resources.tasks_per_node=N asks for more")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted, submit nothing")
    p.add_argument("--no-preflight", action="store_true",
                   help="on Slurm, skip the cluster checks (validate --cluster) that run before anything is queued")
    p.add_argument("--after", action="append", default=[], metavar="RUN",
                   help="start only once this run (a run folder) or every run of this folder (results/<name>) "
                        "completed; repeatable. Its folders are {after.run_dir} / {after.run_dirs} in the args")
    _add_cluster(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("resume", help="restart a stopped, failed or timed-out run (or a sweep's) from its last "
                                      "checkpoint")
    p.add_argument("run", help=_TARGET)
    p.add_argument("--wait", action="store_true", help="block until the runs end; print their summaries")
    _add_only(p, "of a sweep, resume only its runs in this state (default: every run that did not complete)")
    p.add_argument("--set", action="append", default=[], metavar="search.trials=N",
                   help="a search's folder only: raise its number of trials")
    _add_cluster(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("sbatch", help="print a standalone sbatch script for a spec")
    _add_spec_args(p)
    p.add_argument("--style", default="srun", metavar="srun|torchrun",
                   help="srun (the default): one task per GPU; torchrun: one task per node running torchrun")
    p.set_defaults(func=cmd_sbatch)

    p = sub.add_parser("status", help="runs and their states (run.json, then squeue, then sacct)")
    p.add_argument("dir", nargs="?", default="results",
                   help="results folder, run folder or sweep id (default: results)")
    p.add_argument("--runs", action="store_true",
                   help="list every run (a folder of more than 20 runs shows a summary line instead)")
    _add_only(p, "list only the runs in this state")
    _add_cluster(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="a run's per-rank output (of a sweep: each run's)")
    p.add_argument("run", help=_TARGET)
    p.add_argument("--rank", type=int, default=0, help="which rank (default 0)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing what is appended until the run ends (Ctrl-C stops); one run only")
    _add_only(p, "of a sweep, only its runs in this state")
    _add_cluster(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("stack", help="the current Python stacks of a running run's ranks (read-only)")
    p.add_argument("run", help="run folder (or run id under results/)")
    p.add_argument("--rank", type=int, help="only this rank (default: all)")
    _add_cluster(p)
    p.set_defaults(func=cmd_stack)

    p = sub.add_parser("attach", help="an interactive shell on the node of a running run's rank, with its "
                                      "environment and GPUs (exit leaves it; the rank goes on)")
    p.add_argument("run", help="run folder (or run id under results/)")
    p.add_argument("--rank", type=int, default=0, help="which rank (default 0)")
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("cancel", help="cancel a pending or running run, or every run of a sweep")
    p.add_argument("run", help=_TARGET)
    _add_only(p, "of a sweep, cancel only its runs in this state", "pending|running|timeout|preempted")
    _add_cluster(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("validate", help="check a spec and print the resolved spec of every run")
    _add_spec_args(p)
    p.add_argument("--cluster", action="store_true",
                   help="also ask the Slurm cluster, read-only, whether the jobs fit (partition, limits, QOS, "
                        "GPUs, array size, sbatch --test-only); exit 2 if any check fails")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("env", help="print the distributed environment derived from this process's variables")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--port", action="store_true",
                   help="print only the master port of this Slurm job (MASTER_PORT if set)")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("nodes", help="the nodes that failed runs, which later submits keep their jobs off")
    p.add_argument("root", nargs="?", default="results", help="the results root (output.root; default results)")
    p.add_argument("--forget", metavar="NODE", help="take NODE off the list: later submits may run on it again")
    p.add_argument("--ttl", default="24h", help="list as excluded what was listed within this long (default 24h, "
                                               "as resources.bad_node_ttl)")
    p.set_defaults(func=cmd_nodes)

    _add_report_parser(sub)
    _add_data_parser(sub)
    _add_remote_parsers(sub)
    return parser


def _add_remote_parsers(sub) -> None:
    p = sub.add_parser("pull", help="copy run folders back from a cluster (metrics, logs, report; resumable)")
    p.add_argument("target", metavar="RUN_OR_SWEEP", help=_TARGET)
    p.add_argument("--checkpoints", action="store_true", help="bring the checkpoints too")
    _add_cluster(p)
    p.set_defaults(func=cmd_pull)
    p = sub.add_parser("clusters", help="the clusters of ~/.config/clusterjob/clusters.yaml, each checked: reachable, "
                                        "its clusterjob, its Slurm")
    p.set_defaults(func=cmd_clusters)


def cmd_pull(args: argparse.Namespace) -> int:
    raise BadInput("pull copies run folders from a cluster: name it with --cluster NAME (or CLUSTERJOB_CLUSTER)")


def cmd_clusters(args: argparse.Namespace) -> int:
    from clusterjob.remote.commands import list_clusters

    return list_clusters()


def _on_cluster(args: argparse.Namespace, argv: list[str]) -> Optional[Command]:
    """The command run on the cluster that --cluster or CLUSTERJOB_CLUSTER names, if any."""
    if not hasattr(args, "cluster_name"):
        return None
    from clusterjob.remote.clusters import chosen

    name = chosen(args.cluster_name)
    if name is None:
        return None

    def remote(args: argparse.Namespace) -> int:
        from clusterjob.remote.commands import run

        return run(name, args.command, argv, args)
    return remote


# Commands that change state: they go on to their end when their output is closed, so a
# closed pipe drops what they print, never what they do.
_FINISH_THEIR_WORK = (cmd_submit, cmd_resume, cmd_cancel, cmd_nodes)


def _failed(err: BadInput | Failure) -> int:
    print(f"clusterjob: error: {err}", file=sys.stderr)
    return err.exit_code


def _run(argv: Optional[list[str]]) -> int:
    """The command's exit status; bad input and failures as one line on stderr. What was
    printed is flushed here, so that a closed output shows inside ``main``."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except BadInput as err:
        return _failed(err)
    except SystemExit:  # --help, --version: printed (argparse drops a write that fails)
        sys.stdout.flush()
        if 1 in _closed_outputs():
            return _quiet_end()
        raise
    with _output_may_close() if args.func in _FINISH_THEIR_WORK else contextlib.nullcontext():
        try:
            func = _on_cluster(args, argv) or args.func
            code = func(args) or 0
        except (BadInput, Failure) as err:
            code = _failed(err)
        except KeyboardInterrupt:
            code = 130
        sys.stdout.flush()
    return code


def main(argv: Optional[list[str]] = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        if not _closed_outputs():  # not our output's reader that went: a real error, shown as one
            raise
        return _quiet_end()


def _quiet_end() -> int:
    """PIPE_CLOSED, once the closed outputs point at /dev/null (nothing more to say)."""
    for fd in _closed_outputs():
        _silence(fd)
    return PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
