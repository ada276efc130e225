"""The commands with ``--cluster NAME``: run there, output here, exit status passed
through. ``submit`` first ships the code; ``--wait`` and ``--follow`` survive a lost
connection (``remote/detached.py``); ``report --out`` brings the report back; ``pull``
copies run folders back; ``clusters`` lists and checks the clusters.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from clusterjob.core.errors import Failure
from clusterjob.launch.snapshot import never_copied
from clusterjob.remote import clusters, detached
from clusterjob.remote.session import Session, local_spec, open_session, ship
from clusterjob.remote.ssh import LOST, Connection, remote_command, remote_path
from clusterjob.spec.yamlfile import read_spec_file


def _without(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` without ``FLAG VALUE`` and ``FLAG=VALUE``."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif _abbreviates(word.split("=", 1)[0], flag):
            skip = "=" not in word
        else:
            out.append(word)
    return out


def _abbreviates(word: str, flag: str) -> bool:
    """Whether ``word`` is ``flag`` as argparse reads it (a unique prefix of it too)."""
    return len(word) >= 4 and word.startswith("--") and flag.startswith(word)


def run(name: str, command: str, argv: Sequence[str], args: Any) -> int:
    """``clusterjob ARGV`` on cluster ``name``."""
    cluster = clusters.pick(name)
    argv = _without(argv, "--cluster")
    if command == "pull":
        return pull(open_session(cluster), args.target, args.checkpoints)
    raw = read_spec_file(args.spec) if command == "submit" else {}  # a bad spec: before any login
    session = open_session(cluster)
    if command == "submit":
        output, data = raw.get("output") or {}, raw.get("data") or {}
        never = never_copied(str(output.get("root", "results")), str(data.get("root", "./data")), session.source)
        ship(session, never, also=[local_spec(args.spec, session.source)])
        argv = _spec_here(_submit_argv(argv, raw, args.set, cluster), args.spec)
    if command == "report" and args.out:
        return _report(session, argv, args.out)
    # these outlive the connection: run detached there, followed from here
    if getattr(args, "wait", False) or getattr(args, "follow", False):
        base = detached.start(session.conn, session.scratch, session.command(argv))
        return detached.follow(session.conn, cluster.python, base, cluster.name)
    done = session.run(argv)
    if done.returncode == LOST:
        raise Failure(f"lost the connection to {cluster.name} ({cluster.host}); run the command again")
    if command == "submit" and done.returncode == 0 and not args.dry_run:
        print(f"clusterjob: the runs are on {cluster.name}: add --cluster {cluster.name} to status, logs, cancel, "
              "report and pull", file=sys.stderr)
    return done.returncode


def _submit_argv(argv: list[str], raw: Mapping, sets: Sequence[str], cluster: clusters.Cluster) -> list[str]:
    """The cluster's defaults as ``--set`` before the user's: each key the spec (``raw``)
    and the command line's ``sets`` leave unset (merged under the spec)."""
    given = {item.partition("=")[0] for item in sets}
    extra = [f"--set={key}={json.dumps(value)}" for key, value in _flat(cluster.defaults)
             if key not in given and not _holds(raw, key)]
    position = argv.index("submit") + 1
    return [*argv[:position], *extra, *argv[position:]]


def _spec_here(argv: list[str], spec: str) -> list[str]:
    """An absolute spec path made relative to the working folder, which is there too."""
    if not os.path.isabs(spec):
        return argv
    position = argv.index(spec, argv.index("submit") + 1)
    relative = os.path.relpath(os.path.realpath(spec), os.path.realpath(os.getcwd()))
    return [*argv[:position], relative, *argv[position + 1:]]


def _flat(tree: Mapping, prefix: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        found += _flat(value, dotted + ".") if isinstance(value, dict) and value else [(dotted, value)]
    return found


def _holds(raw: Mapping, dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _report(session: Session, argv: list[str], out: str) -> int:
    """The report written there to a file of its own, then brought back to ``out``."""
    there = f"{session.scratch}/report-{os.getpid()}-{Path(out).name}"
    done = session.run([*_without(argv, "--out"), f"--out={there}"])
    if done.returncode != 0:
        return done.returncode
    back = session.conn.rsync(["-s", "-t", session.conn.target(there), out])
    if back.returncode != 0:
        raise Failure(f"could not bring the report back from {session.cluster.name}: "
                      f"{back.stderr.decode(errors='replace').strip()}")
    session.conn.run(f"rm -f {remote_path(there)}")
    print(f"clusterjob: report brought back to {out}", file=sys.stderr)
    return 0


# Asks the clusterjob there which run folders a target names (relative to its working folder).
_RESOLVE = """import json, os, sys
from clusterjob.core.errors import BadInput
from clusterjob.launch.control import resolve_target
try:
    runs = resolve_target(sys.argv[1]).runs
except BadInput as err:
    print(f"clusterjob: error: {err}", file=sys.stderr)
    sys.exit(2)
print(json.dumps([os.path.relpath(str(run.path)) for run in runs]))
"""


def pull(session: Session, target: str, checkpoints: bool) -> int:
    """Copy the run folders ``target`` names back here, in one rsync that goes on where
    an interrupted one stopped (--partial); checkpoints only when asked."""
    line = remote_command(["env", "-u", clusters.ENV_CLUSTER, session.cluster.python, "-c", _RESOLVE, target],
                          session.cwd)
    done = session.conn.run(line, capture=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr.decode(errors="replace"))
        return 2 if done.returncode == 2 else 1
    folders = json.loads(done.stdout.decode())
    sources = [session.conn.target(f"{session.cwd}/./{folder}") for folder in folders]
    excluded = [] if checkpoints else ["--exclude=checkpoints/"]
    copied = session.conn.rsync(["-s", "-rlptR", "--partial", *excluded, *sources, "./"], capture=False)
    if copied.returncode != 0:
        raise Failure(f"rsync from {session.cluster.name} stopped (exit {copied.returncode}); run the same pull "
                      "again: it goes on where it stopped")
    print(f"clusterjob: pulled {len(folders)} run folder(s) from {session.cluster.name}", file=sys.stderr)
    return 0


def list_clusters() -> int:
    """One line per cluster: reachable, the clusterjob and the Slurm there; exit 1 when
    any check fails."""
    known = clusters.load()
    if not known:
        print(f"no clusters: {clusters.config_path()} names none (see `clusterjob clusters --help`)")
        return 0
    failed = 0
    for cluster in known.values():
        line = _checked(cluster)
        failed += line.startswith("unreachable") or "no clusterjob" in line
        print(f"{cluster.name}  {cluster.host}  {cluster.workdir}  {line}", flush=True)
    return 1 if failed else 0


def _checked(cluster: clusters.Cluster) -> str:
    python = remote_path(cluster.python)
    # sinfo under the cluster's python: with the environment the clusterjob there has (SLURM_CONF)
    sinfo = shlex.quote("import os; os.execvp('sinfo', ['sinfo', '--version'])")
    line = (f"echo clusterjob-remote:; {python} -m clusterjob --version 2>/dev/null || echo no-clusterjob; "
            f"{python} -c {sinfo} 2>/dev/null || echo no-slurm")
    try:
        done = Connection.to(cluster.host).run(line, timeout=60)
    except Exception as err:  # noqa: BLE001  (one line per cluster, whatever happened)
        return f"unreachable: {err}"
    said = (done.stdout or b"").decode(errors="replace").split("clusterjob-remote:", 1)
    if done.returncode == LOST or len(said) < 2:
        lines = (done.stderr or b"").decode(errors="replace").strip().splitlines()
        return f"unreachable: {lines[-1] if lines else 'no answer'}"
    answers = said[1].split("\n")
    version = next((a.split()[1] for a in answers if a.startswith("clusterjob ")), None)
    slurm = next((a.strip() for a in answers if a.startswith("slurm")), None)
    # sinfo says "slurm 23.11.4", Debian's "slurm-wlm 22.05.8"
    return (f"reachable, {'clusterjob ' + version if version else 'no clusterjob'}, "
            f"{'Slurm ' + slurm.split()[-1] if slurm else 'no Slurm'}")

