"""podman and Apptainer do not run a container on this machine (podman's crun refuses
the rlimits here; Apptainer is not packaged for Debian): their command lines are run
through shims on PATH that check every argument the runtime would get, apply the
image's environment the way that runtime does (podman: only the variables named with
-e; Apptainer: the host's, with the image's over them), then exec the rank without a
container. A local 2-rank run through each must still give the rank clusterjob's
values."""

from __future__ import annotations

import json
import stat
import sys

import pytest
import yaml
from clirun import REPO, base_env, cli

SHIM = r'''#!PYTHON
import json, os, sys
runtime, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["SHIM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
image_env = json.loads(os.environ["SHIM_IMAGE_ENV"])

def fail(why):
    sys.exit(f"{runtime} shim: {why}: {args}")

def take(flag):
    if not args or args[0] != flag:
        fail(f"expected {flag}")
    args.pop(0)
    return args.pop(0) if flag not in ("--rm", "--init", "--nv", "run", "exec") else None

def mounted(pairs):
    for pair in pairs:
        parts = pair.split(":")
        if len(parts) not in (2, 3) or parts[0] != parts[1] and not parts[1].startswith("/") \
                or not os.path.isdir(parts[0]) or parts[2:] not in ([], ["ro"]):
            fail(f"bad mount {pair!r}")

if runtime == "podman":
    for flag in ("run", "--rm", "--init"):
        take(flag)
    if take("--network") != "host" or take("--ipc") != "host":
        fail("not the host's network and IPC")
    names, volumes = [], []
    while args[0] in ("-e", "-v"):
        (names if args.pop(0) == "-e" else volumes).append(args.pop(0))
    mounted(volumes)
    workdir, image = take("-w"), args.pop(0)
    env = {**image_env, **{n: os.environ[n] for n in names if n in os.environ}}
elif runtime == "apptainer":
    take("exec")
    binds = take("--bind").split(",")
    mounted(binds)
    workdir, image = take("--pwd"), args.pop(0)
    if not os.path.isfile(image):
        fail(f"no image file {image}")
    env = {**os.environ, **image_env}
else:
    fail("unknown runtime")
if image != os.environ["SHIM_IMAGE"]:
    fail(f"image {image!r}")
os.chdir(workdir)
os.execve(args[0] if "/" in args[0] else "/usr/bin/" + args[0], args, env)
'''
SHOW_ENV = """import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "HF_TOKEN",
         "MY_SETTING"]
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({name: os.environ.get(name) for name in names}, f)
"""
WRONG = {"RANK": "99", "LOCAL_RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "wrong.invalid", "NCCL_DEBUG": "WARN",
         "NCCL_SOCKET_IFNAME": "eth9", "HF_TOKEN": "image-token", "MY_SETTING": "image",
         "PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize("runtime, named, image", [("podman", "podman", "localhost/torch:1"),
                                                   ("apptainer", "auto", "torch.sif")])  # auto: apptainer first
def test_a_run_through_the_runtimes_command_line_gets_clusterjobs_values(tmp_path, runtime, named, image):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / runtime).write_text(SHIM.replace("PYTHON", sys.executable, 1))
    (shims / runtime).chmod(stat.S_IRWXU)
    if image.endswith(".sif"):
        (tmp_path / image).write_text("an image file")
        image = str(tmp_path / image)
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    spec = tmp_path / "t.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "t", "output": {"root": str(tmp_path / "results")},
        "entrypoint": {"script": "show_env.py", "args": ["{run_dir}"]},
        "env": {"NCCL_DEBUG": "INFO", "MY_SETTING": "spec"}, "resources": {"tasks_per_node": 2, "cpus_per_task": 1},
        "container": {"image": image, "runtime": named, "python": sys.executable,
                      "mounts": [f"{REPO / 'jobs'}:/jobs:ro"]}}))
    env = {**base_env(), "PATH": f"{shims}:/usr/bin:/bin", "SHIM_LOG": str(tmp_path / "calls"),
           "SHIM_IMAGE": image, "SHIM_IMAGE_ENV": json.dumps(WRONG), "NCCL_SOCKET_IFNAME": "lo",
           "HF_TOKEN": "tok-from-shell"}
    dry = cli(tmp_path, "submit", str(spec), "--executor", "local", "--dry-run", env=env)
    why = (f"{runtime} (as the spec says; {runtime} at {shims / runtime})" if named == runtime
           else f"auto picked {runtime} ({runtime} at {shims / runtime}; auto takes the first of")
    assert f"container.runtime: {why}" in dry.stdout, dry.stdout
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in (tmp_path / "results" / "t").iterdir() if (p / "run.json").exists()]
    for rank in (0, 1):
        seen = json.loads((run / f"env-{rank}.json").read_text())
        assert seen == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-from-shell",
                        "MY_SETTING": "spec"}
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert len(calls) == 2 and calls[0] == calls[1]
    assert "tok-from-shell" not in json.dumps(calls)  # secrets go by name, never on a command line
    assert calls[0][-5:] == [sys.executable, str(REPO / "clusterjob" / "taskenv" / "containerside.py"), image, "--",
                             str(run / "spec.yaml")]
