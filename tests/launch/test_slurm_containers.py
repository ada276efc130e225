"""Ranks in a real Charliecloud container on the real local Slurm (2 nodes): the built-in
trainer completes with the numbers of the same run on the host, although the image's
environment sets RANK, WORLD_SIZE and MASTER_ADDR to wrong values; a USR2 preemption
mid-epoch checkpoints inside, the host side requeues, and the run resumes bit-exact;
cancel stops it; `clusterjob stack` shows the ranks' stacks; an unmodified script runs
the same way and sees clusterjob's variables; the preflight's probe refuses an image
without PyYAML. Requeue, the teardown and the signals stay on the host side (srun, the
batch script)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from chimage import PYTHON, container, make_image, require_ch_run
from clirun import REPO, WAIT_S, cli
from datafiles import write_mnist
from slurmcluster import batch_script, rank0_log, submit, wait_for
from trainutil import epochs_of, final_state, max_abs_diff, run_info, write_spec

pytestmark = pytest.mark.slurm

WRONG = {"RANK": "99", "LOCAL_RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "wrong.invalid", "NCCL_DEBUG": "WARN",
         "NCCL_SOCKET_IFNAME": "eth9", "HF_TOKEN": "image-token"}
# 2 nodes x 1 rank: a sum of two values is exact in either order, so a resume is bit-exact.
LONG = dict(model={"arch": "convnet"}, data={"limit_train": 1024, "limit_val": 64},
            train={"epochs": 3, "batch_size": 16, "log_every": 2},
            resources={"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10})


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    require_ch_run()
    return make_image(tmp_path_factory.mktemp("image"), environment=WRONG)


def _boxed(folder: Path, name: str, image: Path) -> Path:
    return write_spec(folder, name, **LONG, container=container(image))


@pytest.fixture(scope="module")
def boxed_run(slurm_cluster, image, tmp_path_factory):
    """An uninterrupted run of LONG in the container, for the other tests to match."""
    (run,) = submit(slurm_cluster, _boxed(tmp_path_factory.mktemp("boxed"), "boxed", image), "--wait")
    return run


def test_a_two_node_run_in_a_container_completes_as_on_the_host(slurm_cluster, boxed_run, image, tmp_path):
    info = run_info(boxed_run)
    assert info["status"] == "completed", info
    # the image's RANK=99, WORLD_SIZE=7 and MASTER_ADDR did not reach the rendezvous: Slurm's layout did
    assert info["world_size"] == 2 and info["hosts"] == ["node1", "node2"] and info["master_addr"] == "node1"
    script = batch_script(slurm_cluster, info["slurm_job_id"])
    assert "-m clusterjob.taskenv.container -- ch-run --set-env --bind=" in script, script
    checked = cli(tmp_path, "validate", str(_boxed(tmp_path, "boxed", image)), "--cluster", env=slurm_cluster.env())
    assert "ok    container: container.runtime: charliecloud (as the spec says; ch-run at " in checked.stdout
    (host,) = submit(slurm_cluster, write_spec(tmp_path, "host", **LONG), "--wait")
    assert [(e["val_acc"], e["val_loss"]) for e in epochs_of(boxed_run)] == [
        (e["val_acc"], e["val_loss"]) for e in epochs_of(host)]
    assert max_abs_diff(final_state(boxed_run)["model"], final_state(host)["model"]) == 0


def _start(cluster, folder: Path, name: str, image: Path) -> tuple[Path, str]:
    (run,) = submit(cluster, _boxed(folder, name, image))
    wait_for(lambda: "[progress] epoch 1/3 step 4/" in rank0_log(run), WAIT_S, "training to start")
    return run, run_info(run)["slurm_job_id"]


def test_usr2_preemption_in_a_container_requeues_on_the_host_and_resumes_bit_exact(slurm_cluster, boxed_run,
                                                                                       image, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "boxed", image)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm_cluster.env())
    wait_for(lambda: run_info(run).get("status") == "preempted", WAIT_S, "the preempted record")
    wait_for(lambda: run_info(run).get("status") == "completed", WAIT_S, "the requeued job to finish")
    info = run_info(run)
    assert info["requeues"] == 1 and info["slurm_job_id"] == job and "resuming" in rank0_log(run)
    assert [e["epoch"] for e in epochs_of(run)] == [1, 2, 3]
    assert max_abs_diff(final_state(run)["model"], final_state(boxed_run)["model"]) == 0
    assert [e["val_loss"] for e in epochs_of(run)] == [e["val_loss"] for e in epochs_of(boxed_run)]


def test_stack_and_cancel_reach_the_ranks_in_a_container(slurm_cluster, image, tmp_path):
    run, job = _start(slurm_cluster, tmp_path, "stopped", image)
    stacks = cli(tmp_path, "stack", str(run), env=slurm_cluster.env())
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    rank0, rank1 = stacks.stdout.split("==> rank 1 on ")
    assert rank0.startswith("==> rank 0 on node1") and re.search(r"train\.py\", line \d+ in ", rank0), rank0
    assert rank1.startswith("node2") and "clusterjob/run.py" in rank1, rank1
    done = cli(tmp_path, "cancel", str(run), env=slurm_cluster.env())
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                                        env=slurm_cluster.env()).stdout.strip(), WAIT_S, "the job to leave the queue")
    assert run_info(run)["status"] == "cancelled"


def test_an_unmodified_script_runs_in_a_container_on_two_nodes(slurm_cluster, image, tmp_path):
    write_mnist(tmp_path / "data", n_train=256, n_test=128)
    own = yaml.safe_load((REPO / "jobs" / "own_script.yaml").read_text())
    own["entrypoint"]["script"] = str(REPO / own["entrypoint"]["script"])
    spec = tmp_path / "own.yaml"
    spec.write_text(yaml.safe_dump({
        **own, "name": "own", "output": {"root": str(tmp_path / "results")},
        "params": {**own["params"], "epochs": 2, "data": "data"}, "container": container(image),
        "resources": {**own["resources"], **LONG["resources"]}}))
    (run,) = submit(slurm_cluster, spec, "--wait")
    info = run_info(run)
    assert info["status"] == "completed" and info["hosts"] == ["node1", "node2"] and info["world_size"] == 2, info
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(0 < m["accuracy_pct"] <= 100 for m in metrics)


def test_the_preflight_probe_refuses_an_image_without_pyyaml_in_one_line(slurm_cluster, image, tmp_path):
    python = image / "opt" / "python-without-site"  # the image's Python, without its site-packages
    python.write_text(f"#!/bin/sh\nexec {PYTHON} -S \"$@\"\n")
    python.chmod(0o755)
    spec = write_spec(tmp_path, "bare", **LONG, container=container(image, python="/opt/python-without-site"))
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", env=slurm_cluster.env())
    assert done.returncode == 2 and not (tmp_path / "results").exists()
    assert done.stderr.splitlines()[-1] == (
        f"clusterjob: error: container probe on a node: the image {image} lacks the Python module yaml ({PYTHON}); "
        "a rank needs Python >= 3.9, torch and PyYAML in the image")


SHOW_ENV = """import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "HF_TOKEN"]
seen = {name: os.environ.get(name) for name in names}
seen["in_image"] = os.path.exists("/ch/environment")
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(seen, f)
"""


def test_ranks_on_two_nodes_see_clusterjobs_values_over_the_images(slurm_cluster, image, tmp_path):
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    spec = tmp_path / "vars.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "vars", "output": {"root": str(tmp_path / "results")}, "resources": LONG["resources"],
        "entrypoint": {"script": str(tmp_path / "show_env.py"), "args": ["{run_dir}"]},
        "env": {"NCCL_DEBUG": "INFO", "HF_TOKEN": "***"}, "container": container(image)}))
    (run,) = submit(slurm_cluster, spec, "--wait", extra_env={"NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-shell"})
    assert run_info(run)["status"] == "completed", run_info(run)
    for rank in (0, 1):
        assert json.loads((run / f"env-{rank}.json").read_text()) == {
            "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node1", "NCCL_DEBUG": "INFO",
            "NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-shell", "in_image": True}
