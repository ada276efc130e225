"""Your own training code on the real local Slurm: an unmodified torchrun-style script on
2 nodes, preemption of the API example (checkpoint, requeue of that array task only,
resume, nothing lost), USR2 to a plain script, and a params sweep as one array."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from clirun import REPO, WAIT_S, cli
from datafiles import write_mnist
from slurmcluster import job_of, rank0_log, submit, wait_for

pytestmark = pytest.mark.slurm

EXAMPLES = REPO / "examples"
SMALL = ["--limit", "512", "--batch-size", "32"]
TWO_NODES = {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10}


def own_spec(folder: Path, name: str, entrypoint: dict, resources: dict = TWO_NODES, **extra) -> Path:
    spec = {"name": name, "entrypoint": entrypoint, "output": {"root": str(folder / "results")},
            "resources": resources, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def lines(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def diagnosis(run: Path) -> str:
    """run.json and the tails of the rank logs, for an assertion message."""
    logs = "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                   for p in sorted((run / "logs").glob("rank*.*")) if p.suffix in (".out", ".err"))
    return json.dumps(info(run), indent=1) + logs


def squeue(cluster, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-o", "%T", "-j", job], capture_output=True, text=True,
                          env=cluster.env()).stdout.strip()


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    write_mnist(folder / "data", n_train=512, n_test=256)
    return folder


def test_an_unmodified_torchrun_script_on_two_nodes(slurm_cluster, mnist_dir):
    spec = own_spec(mnist_dir, "plain", {"script": str(EXAMPLES / "mnist_ddp.py"),
                                         "args": ["--epochs", "2", "--data", "data", *SMALL],
                                         "metrics": {"acc_pct": r"Accuracy is ([0-9.]+)%"}})
    (run,) = submit(slurm_cluster, spec, "--wait")
    got = info(run)
    assert got["status"] == "completed", got
    assert got["hosts"] == ["node1", "node2"] and got["world_size"] == 2
    assert [r["step"] for r in lines(run)] == [1, 2] and 0 < lines(run)[-1]["acc_pct"] <= 100


def _api_spec(folder: Path, name: str, epochs: int = 4, **extra) -> Path:
    return own_spec(folder, name, {"script": str(EXAMPLES / "train_api.py"),
                                   "args": ["--data", "data", *SMALL, "--check-every", "1"]},
                    params={"epochs": epochs, "lr": 0.05}, **extra)


def test_usr2_preempts_the_api_example_requeues_its_task_only_and_loses_nothing(slurm_cluster, mnist_dir):
    # The uninterrupted run, with 2 local processes: the same world size, so the same sums.
    local = cli(mnist_dir, "submit", str(_api_spec(mnist_dir, "whole")), "--executor", "local", "--wait",
                "--set", "resources.nodes=1", "--set", "resources.tasks_per_node=2")
    assert local.returncode == 0, local.stdout + local.stderr
    spec = _api_spec(mnist_dir, "preempt", sweep={"params.seed": [0, 1]})
    first, second = submit(slurm_cluster, spec)
    job = job_of(first)
    wait_for(lambda: (first / "metrics.jsonl").exists(), WAIT_S, "the first epoch")
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm_cluster.env())
    wait_for(lambda: info(first).get("status") == "preempted", WAIT_S, "the preempted record")
    for run in (first, second):
        wait_for(lambda run=run: info(run).get("status") in ("completed", "failed", "cancelled"), WAIT_S, "the tasks to end")
        assert info(run)["status"] == "completed", diagnosis(run)
    assert info(first)["requeues"] == 1 and info(second)["requeues"] == 0  # the task, not the array
    steps = [r["step"] for r in lines(first)]
    assert steps == sorted(set(steps)) and [r["epoch"] for r in lines(first)] == [1, 2, 3, 4]
    (whole,) = [p for p in (mnist_dir / "results" / "whole").iterdir() if not p.name.startswith(".")]
    a, b = (torch.load(sorted((r / "checkpoints").glob("step-*.pt"))[-1], weights_only=True) for r in (whole, first))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert [r["val_acc"] for r in lines(first)] == [r["val_acc"] for r in lines(whole)]


PLAIN = str(REPO / "tests" / "scripts" / "plain_loop.py")


def test_usr2_requeues_a_plain_script_which_restarts_from_its_own_checkpoint(slurm_cluster, mnist_dir):
    spec = own_spec(mnist_dir, "plain-usr2", {"script": PLAIN, "args": ["--steps", "60", "--sleep", "0.1",
                                                                         "--ckpt", "{run_dir}/ckpt.pt"]})
    (run,) = submit(slurm_cluster, spec)
    job = job_of(run)
    wait_for(lambda: "iter 10:" in rank0_log(run), WAIT_S, "ten steps")
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm_cluster.env())
    wait_for(lambda: info(run).get("requeues") == 1, WAIT_S, "the requeue")
    wait_for(lambda: info(run).get("status") in ("completed", "failed", "cancelled"), WAIT_S, "the run to end")
    assert info(run)["status"] == "completed", diagnosis(run)
    starts = [int(x.split("at step ")[1].split()[0]) for x in rank0_log(run).splitlines() if x.startswith("starting at")]
    assert starts[-1] >= 10, diagnosis(run)  # the second start went on from the script's own checkpoint


def test_cancel_marks_a_plain_script_cancelled_once_its_job_left_the_queue(slurm_cluster, mnist_dir):
    spec = own_spec(mnist_dir, "plain-cancel", {"script": PLAIN, "args": ["--ckpt", "{run_dir}/ckpt.pt"]})
    (run,) = submit(slurm_cluster, spec)
    job = job_of(run)
    wait_for(lambda: "iter 3:" in rank0_log(run), WAIT_S, "training")
    done = cli(mnist_dir, "cancel", str(run), timeout=120, env=slurm_cluster.env())
    assert done.returncode == 0 and f"cancelled Slurm job {job}" in done.stdout, done.stdout + done.stderr
    assert not squeue(slurm_cluster, job)  # the job is gone before the run says cancelled
    assert info(run)["status"] == "cancelled" and info(run)["cancel_requested_at"]


def test_a_params_sweep_is_one_array_and_the_report_groups_by_lr(slurm_cluster, tmp_path):
    (tmp_path / "score.py").write_text(
        "import clusterjob\n"
        "def main():\n"
        "    p = clusterjob.params\n"
        "    clusterjob.log(step=1, val_acc=0.5 + p['lr'] + p['seed'] / 100)\n")
    spec = own_spec(tmp_path, "sweep", {"function": "score:main"},
                    resources={**TWO_NODES, "nodes": 1}, params={"lr": 0.1, "seed": 0},
                    sweep={"params.lr": [0.1, 0.2], "params.seed": [0, 1, 2]})
    runs = submit(slurm_cluster, spec, "--wait")
    jobs = [info(r)["slurm_job_id"] for r in runs]
    assert len(runs) == 6 and len({j.split("_")[0] for j in jobs}) == 1
    assert all(info(r)["status"] == "completed" for r in runs)
    report = cli(tmp_path, "report", str(tmp_path / "results" / "sweep"), "--format", "csv", env=slurm_cluster.env())
    assert report.returncode == 0, report.stderr
    header, *rows = [line.split(",") for line in report.stdout.strip().splitlines()]
    assert header[:3] == ["params.lr", "n", "val_acc_pct_mean"] and "params.seed" not in header  # in %
    table = {float(r[0]): (int(r[1]), float(r[2]), float(r[3])) for r in rows}
    assert table[0.2][:2] == (3, pytest.approx(71.0)) and table[0.1][:2] == (3, pytest.approx(61.0))
    assert table[0.1][2] == pytest.approx(1.0)  # std over the seeds
