"""The CLI's start-up, guarded by what it imports (not by a clock, which a shared machine
makes flaky): `clusterjob --help` and `status` of finished runs load none of the heavy
modules, `import clusterjob` none of what only a run's start needs, and a run's executor
is imported for its own runs only. bench/bench_cli_startup.py measures the time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clirun import REPO, base_env

from clusterjob.core import procs
from clusterjob.core.files import now_iso
from clusterjob.core.rundir import make_runs

# What a login node's --help or status must not pay for: torch and the libraries of the
# report and of Slurm submission, the installed packages' metadata, the spec's YAML, and
# every executor's module (each is imported when a run of it is looked at; their package
# is where their names are listed)
HEAVY = ("torch", "submitit", "pandas", "numpy", "yaml", "importlib.metadata", "clusterjob.spec.schema",
         "clusterjob.launch.supervisor")
EXECUTOR_MODULES = "clusterjob.launch.executors."


PROBE = """
import json, sys
from clusterjob import cli
for argv in json.loads(sys.argv[1]):
    try:
        cli.main(argv)
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded(tmp_path: Path, *argvs: list) -> set:
    """The modules one process holds after running each CLI command line of ``argvs``."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=tmp_path, env=base_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy(modules: set) -> list:
    """The modules of ``modules`` that are (or are inside) one of HEAVY, or an executor's."""
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY)
                  or m.startswith(EXECUTOR_MODULES))


def finished_runs(tmp_path: Path, count: int = 3) -> Path:
    points = [(i, "name: exp\n", {"train.lr": 0.1 * (i + 1)}) for i in range(count)]
    for run in make_runs(tmp_path / "results", "exp", points, executor="local"):
        run.update(status="completed", started_at=now_iso(), finished_at=now_iso(), world_size=1,
                   final={"epoch": 2, "val_acc": 0.5})
    return tmp_path / "results" / "exp"


def test_help_and_status_of_finished_runs_import_nothing_heavy(tmp_path):
    results = finished_runs(tmp_path)
    found = loaded(tmp_path, ["--help"], ["submit", "--help"], ["status", str(results)])
    assert heavy(found) == []
    assert "clusterjob.launch.control" in found  # the probe did run status


def test_import_clusterjob_loads_only_its_api():
    code = "import json, sys, clusterjob; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True,
                          check=True, timeout=60)
    modules = set(json.loads(done.stdout))
    assert not modules & {"importlib.metadata", "platform", "subprocess", "torch", "numpy", "yaml"}


def test_status_imports_the_executor_of_its_live_runs_only(tmp_path):
    results = finished_runs(tmp_path, 1)
    (run,) = make_runs(tmp_path / "results", "exp", [(0, "name: exp\n", {})], executor="local")
    run.update(status="running", launcher=procs.current(), started_at=now_iso())  # alive: this process
    found = loaded(tmp_path, ["status", str(results)])
    assert "clusterjob.launch.executors.local" in found
    assert "clusterjob.launch.executors.slurm" not in found and "submitit" not in found


def test_the_heavy_check_sees_what_it_looks_for():
    assert heavy({"torch", "torch.nn", "numpy.linalg", "clusterjob.launch.executors.slurm", "yaml",
                  "importlib.metadata._adapters"}) == sorted({"torch", "torch.nn", "numpy.linalg", "yaml",
                                                              "clusterjob.launch.executors.slurm",
                                                              "importlib.metadata._adapters"})
    assert heavy({"torchvision", "numpyish", "clusterjob.launch.executor", "clusterjob.launch.executors",
                  "importlib.util"}) == []
