"""Each runtime's command around a rank, the variables carried into the image and put
back inside it, and the image check at a rank's start (no runtime needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clirun import cli

from clusterjob.core.errors import BadInput
from clusterjob.launch.containers import plan as containers
from clusterjob.spec.schema import spec_from_dict
from clusterjob.taskenv import containerside
from clusterjob.taskenv.container import CARRIED_NAMES, CARRIED_PREFIXES, carried, host_command

HOME = str(containers.CLUSTERJOB_HOME)
SIDE = str(containers.CONTAINERSIDE)


@pytest.fixture(autouse=True)
def plain_shell(monkeypatch):
    """A submitting shell with none of the variables a container carries in (the test
    command's own CLUSTERJOB_REQUIRE_*, a developer's NCCL_*): the commands rendered here
    name only what each test sets."""
    for name in list(os.environ):
        if name.startswith(CARRIED_PREFIXES) or name in CARRIED_NAMES:
            monkeypatch.delenv(name)


def _spec(tmp_path, runtime, gpus=0, **box):
    return spec_from_dict({"name": "t", "output": {"root": str(tmp_path / "res")}, "env": {"NCCL_ALGO": "Ring"},
                           "resources": {"gpus_per_node": gpus},
                           "container": {"image": "img:1", "runtime": runtime, **box}})


def test_the_plan_mounts_results_code_and_clusterjob_at_the_same_paths_then_the_spec_mounts(tmp_path):
    spec = _spec(tmp_path, "podman", mounts=["/data:/datasets:ro"], python="/opt/py/bin/python")
    plan = containers.plan_of(spec, cwd=str(tmp_path))
    # the results folder is inside the code's folder here: mounted with it
    assert [(m.source, m.target, m.read_only) for m in plan.mounts] == [
        (str(tmp_path), str(tmp_path), False), (HOME, HOME, False), ("/data", "/datasets", True)]
    elsewhere = containers.plan_of(_spec(tmp_path / "a", "podman"), cwd=str(tmp_path / "b"))
    assert [m.source for m in elsewhere.mounts] == [str(tmp_path / "a" / "res"), str(tmp_path / "b"), HOME]
    assert plan.workdir == str(tmp_path) and plan.python == "/opt/py/bin/python"
    assert plan.names[0] == containerside.CARRIED_VAR and "NCCL_ALGO" in plan.names


def test_each_runtime_renders_its_own_documented_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cret")
    monkeypatch.chdir(tmp_path)
    code = str(tmp_path)
    inside = ["python", SIDE, "img:1", "--", "--runs", "R"]
    apptainer = containers.wrapped(_spec(tmp_path, "apptainer", gpus=1, mounts=["/d:/d:ro"]), "apptainer")
    assert apptainer.command(["--runs", "R"]) == [
        "apptainer", "exec", "--nv", "--bind", f"{code}:{code},{HOME}:{HOME},/d:/d:ro", "--pwd", code,
        "img:1", *inside]
    podman = containers.wrapped(_spec(tmp_path, "podman", gpus=1, workdir="/w"), "podman")
    assert podman.command(["--runs", "R"]) == [
        "podman", "run", "--rm", "--init", "--network", "host", "--ipc", "host", "--device", "nvidia.com/gpu=all",
        "-e", "CLUSTERJOB_CONTAINER_ENV", "-e", "HF_TOKEN", "-e", "NCCL_ALGO", "-v", f"{code}:{code}", "-v",
        f"{HOME}:{HOME}", "-w", "/w", "img:1", *inside]
    charlie = containers.wrapped(_spec(tmp_path, "charliecloud"), "charliecloud")
    assert charlie.command(["--runs", "R"]) == [
        "ch-run", f"--bind={code}:{code}", f"--bind={HOME}:{HOME}", f"--cd={code}", "img:1",
        "--", *inside]
    pyxis = containers.wrapped(_spec(tmp_path, "pyxis", mounts=["/d:/d:ro"]), "pyxis")
    assert pyxis.srun_options == (
        "--container-image=img:1", f"--container-mounts={code}:{code},{HOME}:{HOME},/d:/d:ro",
        f"--container-workdir={code}", "--container-env=HF_TOKEN,NCCL_ALGO")
    assert pyxis.command(["--runs", "R"])[:4] == ["python", SIDE, "img:1", "--unset"]
    assert not pyxis.carried_by_host and "RANK" in pyxis.unset and "MASTER_ADDR" in pyxis.unset
    assert all("s3cret" not in " ".join(w.command(["x"]) + list(w.srun_options))
               for w in (apptainer, podman, charlie, pyxis))


def test_pyxis_names_what_the_other_runtimes_carry_set_in_the_shell_or_exported_by_setup(tmp_path, monkeypatch):
    # pyxis keeps the host's value only of the names in --container-env: a setup line's
    # NCCL_* and the shell's OMP_NUM_THREADS would otherwise lose to an image's
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.chdir(tmp_path)
    spec = spec_from_dict({"name": "t", "output": {"root": str(tmp_path / "res")}, "env": {"NCCL_ALGO": "Ring"},
                           "resources": {"setup": ["module load nccl && export NCCL_IB_HCA=mlx5_0",
                                                   "export HF_HOME=/scratch/hf"]},
                           "container": {"image": "img:1", "runtime": "pyxis"}})
    assert containers.plan_of(spec).exported == ("HF_HOME", "NCCL_IB_HCA")
    (named,) = [o for o in containers.wrapped(spec, "pyxis").srun_options if o.startswith("--container-env=")]
    names = named.split("=", 1)[1].split(",")
    assert {"NCCL_ALGO", "NCCL_IB_HCA", "OMP_NUM_THREADS"} <= set(names) and names == sorted(names)
    # HF_HOME is carried by no runtime; GPUs are Slurm's per task; no launcher variable
    assert not {"HF_HOME", "CUDA_VISIBLE_DEVICES", "RANK", "SLURM_CONF"} & set(names)


def test_charliecloud_applies_the_image_environment_only_where_the_image_has_one(tmp_path):
    (tmp_path / "img" / "ch").mkdir(parents=True)
    spec = spec_from_dict({"name": "t", "container": {"image": str(tmp_path / "img"), "runtime": "charliecloud"}})
    assert "--set-env" not in containers.wrapped(spec, "charliecloud").prefix
    (tmp_path / "img" / "ch" / "environment").write_text("RANK=9\n")
    assert containers.wrapped(spec, "charliecloud").prefix[1] == "--set-env"


def test_auto_picks_the_first_runtime_found_and_says_why(tmp_path):
    spec = _spec(tmp_path, "auto")
    found = {"ch-run": "/usr/bin/ch-run", "podman": "/usr/bin/podman"}
    assert containers.pick(spec, slurm=False, which=found.get) == (
        "charliecloud", "container.runtime: auto picked charliecloud (ch-run at /usr/bin/ch-run; auto takes the "
                        "first of apptainer, charliecloud, podman found)")
    found["apptainer"] = "/opt/bin/apptainer"
    assert containers.pick(spec, slurm=False, which=found.get)[0] == "apptainer"
    with pytest.raises(BadInput, match="^container.runtime: auto found none of apptainer, charliecloud, podman here"):
        containers.pick(spec, slurm=False, which=lambda name: None)


def test_a_runtime_that_is_not_here_or_pyxis_without_srun_is_refused_in_one_line(tmp_path):
    with pytest.raises(BadInput, match=r"^container.runtime: podman is not installed here \(podman not found"):
        containers.pick(_spec(tmp_path, "podman"), slurm=False, which=lambda name: None)
    with pytest.raises(BadInput, match="^container.runtime: pyxis starts containers through srun"):
        containers.pick(_spec(tmp_path, "pyxis"), slurm=False)


def test_the_host_side_carries_what_clusterjob_set_and_unsets_the_launcher_names_it_did_not():
    environ = {"SLURM_PROCID": "3", "NCCL_DEBUG": "INFO", "HF_TOKEN": "s", "MY_FLAG": "1", "PATH": "/bin",
               "CLUSTERJOB_SUPERVISED": "1", "OMP_NUM_THREADS": "2", "HOME": "/root"}
    found = carried(environ, ["MY_FLAG"])
    assert {k: v for k, v in found.items() if v is not None} == {
        "SLURM_PROCID": "3", "NCCL_DEBUG": "INFO", "HF_TOKEN": "s", "MY_FLAG": "1", "CLUSTERJOB_SUPERVISED": "1",
        "OMP_NUM_THREADS": "2"}
    assert found["RANK"] is None and found["MASTER_ADDR"] is None and found["WORLD_SIZE"] is None
    assert host_command(["B", "A"])[-3:] == ["--names", "A,B", "--"]


def test_inside_the_values_clusterjob_set_win_over_the_image_and_its_launcher_variables_go():
    image_env = {"RANK": "99", "MASTER_ADDR": "wrong", "NCCL_DEBUG": "WARN", "WORLD_SIZE": "7", "PATH": "/img"}
    host = {"RANK": "1", "MASTER_ADDR": "10.0.0.1", "NCCL_DEBUG": "INFO", "WORLD_SIZE": None}
    environ = {**image_env, containerside.CARRIED_VAR: json.dumps(host)}
    containerside.restore(environ, [])
    assert environ == {"RANK": "1", "MASTER_ADDR": "10.0.0.1", "NCCL_DEBUG": "INFO", "PATH": "/img"}
    environ = {"RANK": "99", "SLURM_PROCID": "0"}
    containerside.restore(environ, ["RANK", "MASTER_ADDR"])
    assert environ == {"SLURM_PROCID": "0"}


def test_an_image_without_pyyaml_fails_in_one_line_naming_the_image_and_the_module():
    # -S: no site-packages, so neither yaml nor torch can be found
    done = subprocess.run([sys.executable, "-S", SIDE, "pytorch:24", "--", "--runs", "R"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"clusterjob: the image pytorch:24 lacks the Python module yaml ({sys.executable}); a "
                           "rank needs Python >= 3.9, torch and PyYAML in the image\n")


def _spec_file(tmp_path, runtime: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(f"name: c\nenv: {{NCCL_DEBUG: INFO}}\ncontainer: {{image: 'img:1', runtime: {runtime}}}\n")
    return str(path)


def test_the_sbatch_template_starts_each_task_in_the_container_as_submit_does(tmp_path):
    done = cli(tmp_path, "sbatch", _spec_file(tmp_path, "charliecloud"))
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if "ch-run" in x]
    assert line.strip().startswith('"$PYTHON" -m clusterjob.taskenv.container --names NCCL_DEBUG -- ch-run --bind=')
    assert line.strip().endswith(f"--cd={tmp_path} img:1 -- python {SIDE} img:1 -- \"$@\" || status=$?")
    pyxis = cli(tmp_path, "sbatch", _spec_file(tmp_path, "pyxis")).stdout
    assert "srun --container-image=img:1 --container-mounts=" in pyxis and "--container-env=NCCL_DEBUG " in pyxis
    assert f"python {SIDE} img:1 --unset " in pyxis and "clusterjob.taskenv.container" not in pyxis
    torchrun = cli(tmp_path, "sbatch", _spec_file(tmp_path, "podman"), "--style", "torchrun")
    assert torchrun.returncode == 2 and torchrun.stderr.count("\n") == 1
    assert "container: a run in a container is rendered with --style srun" in torchrun.stderr


def test_submits_dry_run_shows_the_runtimes_command_of_each_task(tmp_path):
    done = cli(tmp_path, "submit", _spec_file(tmp_path, "pyxis"), "--executor", "slurm", "--dry-run")
    assert done.returncode == 0, done.stderr
    (srun,) = [x for x in done.stdout.splitlines() if x.startswith("srun ")]
    assert "--kill-on-bad-exit=1 --container-image=img:1 --container-mounts=" in srun
    assert f"--container-env=NCCL_DEBUG python {SIDE} img:1 --unset CLUSTERJOB_SUPERVISED," in srun
    assert srun.endswith(" -- --runs 'results/c/.slurm/<stamp>.p<part>.runs.json'"), srun


def test_the_probe_warns_of_an_image_without_the_verbs_library_on_a_node_with_infiniband(tmp_path):
    devices = tmp_path / "infiniband"
    devices.mkdir()
    assert containerside.lacks_verbs("img:1", str(devices)) is None  # no device
    (devices / "mlx5_0").mkdir()
    assert containerside.lacks_verbs("img:1", str(devices), "libc.so.6") is None  # the library loads
    assert containerside.lacks_verbs("img:1", str(devices), "libibverbs-missing.so.1") == (
        f"clusterjob: warning: the node has InfiniBand devices ({devices}) but the image img:1 lacks "
        "libibverbs-missing.so.1: NCCL would fall back to TCP sockets; use an image with rdma-core (libibverbs)")
    assert containerside.lacks_verbs("img:1", str(tmp_path / "none")) is None
