"""pyxis + enroot are not built here: pyxis's command line is run on the real local Slurm
(2 nodes) through a recorded ``srun`` shim, first on the PATH of the submitting shell and
so of the batch script. The shim answers ``srun --help`` as srun with pyxis in its
plugstack does (listing --container-image), records every call, checks each pyxis option
(the spec's image, mounts SRC:DST[:ro] whose source exists, clusterjob's own at the same
path inside, an absolute working directory, --container-env names), applies the image's
environment as pyxis does (the image's variables over the host's, except the names in
--container-env, which keep the host's value), then execs the real srun without the pyxis
options. Each rank must still see clusterjob's values, not the image's: Slurm's layout,
the spec's env, the shell's NCCL_* and OMP_NUM_THREADS and secret, a setup line's NCCL_*."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml
from chimage import PYTHON
from clirun import REPO
from slurmcluster import batch_script, submit
from trainutil import run_info

pytestmark = pytest.mark.slurm

REAL_SRUN = "/usr/bin/srun"
IMAGE = "nvcr.io#nvidia/pytorch:25.01-py3"
SHIM = r'''#!PYTHON
import json, os, re, subprocess, sys
args = sys.argv[1:]
with open(os.environ["PYXIS_SHIM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
HELP = """Options provided by plugins:
      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
                              [pyxis] the image to use for the container filesystem
      --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]
                              [pyxis] bind mount[s] inside the container
      --container-workdir=PATH
                              [pyxis] working directory inside the container
      --container-env=NAME[,NAME...]
                              [pyxis] names of environment variables to override with the host environment
"""

def fail(why):
    sys.exit(f"srun shim: {why}: {args}")

if args == ["--help"]:
    done = subprocess.run(["REAL"] + args, capture_output=True, text=True)
    sys.stdout.write(done.stdout + HELP)
    sys.exit(done.returncode)
options = {a.partition("=")[0]: a.partition("=")[2] for a in args if a.startswith("--container-")}
rest = [a for a in args if not a.startswith("--container-")]
if not options:
    os.execv("REAL", ["REAL"] + rest)
if set(options) - {"--container-image", "--container-mounts", "--container-workdir", "--container-env"} \
        or len(options) != len([a for a in args if a.startswith("--container-")]):
    fail("an unknown or repeated pyxis option")
last = max(i for i, a in enumerate(args) if a.startswith("--container-"))
if args[last + 1] != os.environ["PYXIS_SHIM_PYTHON"]:
    fail("the rank's interpreter does not follow the pyxis options")
if options["--container-image"] != os.environ["PYXIS_SHIM_IMAGE"]:
    fail("not the spec's image")
spec_mounts = os.environ["PYXIS_SHIM_SPEC_MOUNTS"].split(",")
for pair in options["--container-mounts"].split(","):
    parts = pair.split(":")
    if len(parts) not in (2, 3) or parts[2:] not in ([], ["ro"]) or not os.path.exists(parts[0]) \
            or not parts[1].startswith("/") or (parts[0] != parts[1] and pair not in spec_mounts):
        fail(f"bad mount {pair!r}")
workdir = options["--container-workdir"]
if not os.path.isabs(workdir) or not os.path.isdir(workdir):
    fail(f"bad working directory {workdir!r}")
names = [n for n in options.get("--container-env", "").split(",") if n]
if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names):
    fail("bad --container-env names")
env = {**os.environ, **json.loads(os.environ["PYXIS_SHIM_IMAGE_ENV"])}
env.update({n: os.environ[n] for n in names if n in os.environ})
os.chdir(workdir)
os.execve("REAL", ["REAL"] + rest, env)
'''
SHOW_ENV = """import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "HF_TOKEN",
         "MY_SETTING", "IMAGE_ONLY", "OMP_NUM_THREADS", "NCCL_IB_TIMEOUT"]
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({name: os.environ.get(name) for name in names}, f)
"""
WRONG = {"RANK": "99", "LOCAL_RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "wrong.invalid", "MASTER_PORT": "1",
         "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth9", "HF_TOKEN": "image-token", "MY_SETTING": "image",
         "IMAGE_ONLY": "from-image", "OMP_NUM_THREADS": "64", "NCCL_IB_TIMEOUT": "1"}


def test_ranks_through_pyxiss_command_line_on_two_nodes_see_clusterjobs_values(slurm_cluster, tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "srun").write_text(SHIM.replace("PYTHON", PYTHON, 1).replace("REAL", REAL_SRUN))
    (shims / "srun").chmod(stat.S_IRWXU)
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    spec_mount = f"{REPO / 'jobs'}:/jobs:ro"
    spec = tmp_path / "pyxis.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "pyxis", "output": {"root": str(tmp_path / "results")},
        "resources": {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 2, "time_min": 10,
                      "setup": ["export NCCL_IB_TIMEOUT=22"]},
        "entrypoint": {"script": str(tmp_path / "show_env.py"), "args": ["{run_dir}"]},
        "env": {"NCCL_DEBUG": "INFO", "MY_SETTING": "spec", "HF_TOKEN": "***"},
        "container": {"image": IMAGE, "runtime": "pyxis", "python": PYTHON, "mounts": [spec_mount]}}))
    log = tmp_path / "srun-calls"
    shell = {"PATH": f"{shims}:{os.environ['PATH']}", "PYXIS_SHIM_LOG": str(log), "PYXIS_SHIM_IMAGE": IMAGE,
             "PYXIS_SHIM_PYTHON": PYTHON, "PYXIS_SHIM_SPEC_MOUNTS": spec_mount,
             "PYXIS_SHIM_IMAGE_ENV": json.dumps(WRONG), "XDG_CACHE_HOME": str(tmp_path / "cache"),
             "NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-shell", "OMP_NUM_THREADS": "1"}
    (run,) = submit(slurm_cluster, spec, "--wait", extra_env=shell)
    info = run_info(run)
    assert info["status"] == "completed" and info["hosts"] == ["node1", "node2"] and info["world_size"] == 2, info
    # the image's RANK, MASTER_ADDR, NCCL_*, OMP_NUM_THREADS and token lost to clusterjob's, the shell's, the
    # setup line's and Slurm's; IMAGE_ONLY, set by the image alone, shows the image's environment was applied
    for rank in (0, 1):
        assert json.loads((run / f"env-{rank}.json").read_text()) == {
            "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node1", "NCCL_DEBUG": "INFO",
            "NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-shell", "MY_SETTING": "spec", "IMAGE_ONLY": "from-image",
            "OMP_NUM_THREADS": "1", "NCCL_IB_TIMEOUT": "22"}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert ["--help"] in calls  # the preflight's question: is pyxis in srun's plugstack?
    boxed = [c for c in calls if any(a.startswith("--container-image=") for a in c)]
    probe, ranks = ([c for c in boxed if ("--job-name=clusterjob-probe" in c) == probed] for probed in (True, False))
    assert len(probe) == 1 and len(ranks) == 1, calls
    options = [a for a in ranks[0] if a.startswith("--container-")]
    names = options[3].partition("=")[2].split(",")
    assert options[:3] == [f"--container-image={IMAGE}",
                           f"--container-mounts={tmp_path}:{tmp_path},{REPO}:{REPO},{spec_mount}",
                           f"--container-workdir={tmp_path}"]
    assert {"HF_TOKEN", "MY_SETTING", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_TIMEOUT", "OMP_NUM_THREADS"} <= set(
        names) and names == sorted(names)
    assert [a for a in ranks[0] if not a.startswith("--container-")][:6] == [  # srun's own options, unchanged
        "--unbuffered", "--output", f"{run.parent}/.slurm/%j_%t_log.out", "--error",
        f"{run.parent}/.slurm/%j_%t_log.err", "--kill-on-bad-exit=1"]
    assert options == [a for a in probe[0] if a.startswith("--container-")]
    assert "tok-shell" not in log.read_text()  # a secret goes by name, never on a command line
    start = ranks[0].index(options[-1]) + 1
    assert ranks[0][start:start + 3] == [PYTHON, str(REPO / "clusterjob" / "taskenv" / "containerside.py"), IMAGE]
    assert "\nsrun --unbuffered " in batch_script(slurm_cluster, info["slurm_job_id"])  # srun by name: the shim
