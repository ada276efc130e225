"""The raw sbatch templates on the local Slurm cluster (scripts/local-slurm, 2 of its nodes).

One tiny spec (gloo on CPU, 2 nodes x 2 tasks) runs both templates at once:
  - "srun": sbatch/ddp_srun.sbatch as users run it, the spec and a --set override as its
    arguments, flags on the command line beating the (GPU) headers;
  - "torchrun": sbatch/ddp_torchrun.sbatch rendered from the same spec and override by
    `clusterjob sbatch --style torchrun`, submitted without flags or arguments.
Together they cover both template bodies, both ways of passing the spec, and rendered
headers that Slurm accepts (the rendered body is the template's, see
test_sbatch_render.py). Each must complete with world_size 4 on [node1, node2], every
epoch logged once, and the same final val_loss. A third job (the raw torchrun template
with flags) would add a third of the CPU time of this module for little coverage.
The jobs are polled with scontrol rather than `sbatch --wait`, which checks after
2, 10, 42, 74 s ... and so adds up to half a minute per run. A last job reuses the id
of an earlier run folder (it is held while that folder is made) and is requeued once.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from clirun import cli

from clusterjob.core.ranks import clean_environ
from clusterjob.launch import sbatch
from clusterjob.spec.schema import load_spec

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
NODES = "node[1-2]"
WAIT_S = 420
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE")
# What the spec's resources say, as command-line flags for the raw templates (GPU headers).
RAW_FLAGS = ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1", "--mem=3G", "--time=10",
             "--gres=none"]
OVERRIDE = "train.epochs=2"  # passed as script arguments (raw) or baked in (rendered)


def tiny_spec(root):
    return {
        "name": "templates",
        "data": {"dataset": "synthetic", "limit_train": 256, "limit_val": 101, "num_workers": 0},
        "model": {"arch": "mlp"},
        "train": {"epochs": 3, "batch_size": 16, "amp": "off", "lr_scaling": "none", "log_every": 4},
        "dist": {"backend": "gloo", "timeout_s": 120},
        "resources": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 3, "time_min": 10},
        "output": {"root": str(root)},
    }


def job_env(cluster):
    """This environment without any job layout, plus the cluster and this checkout's code."""
    return {**clean_environ(os.environ), "SLURM_CONF": cluster.conf, "CLUSTERJOB_PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT)}


def submit(cluster, workdir, name, script, flags=(), script_args=()):
    workdir.mkdir()
    cmd = ["sbatch", "--parsable", f"--chdir={workdir}", f"--job-name={name}", f"--nodelist={NODES}",
           *flags, str(script), *script_args]
    res = subprocess.run(cmd, env=job_env(cluster), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
    return res.stdout.strip().split(";")[0]


def job_state(cluster, job_id):
    out = cluster.run("scontrol", "show", "job", "-o", job_id, check=False)
    m = re.search(r"\bJobState=(\S+)", out)
    return m[1] if m else "UNKNOWN"


def wait_all(cluster, job_ids):
    deadline = time.monotonic() + WAIT_S
    states = {}
    while time.monotonic() < deadline:
        states = {j: job_state(cluster, j) for j in job_ids}
        if all(s in DONE for s in states.values()):
            return states
        time.sleep(1)
    return states


def logs(workdir):
    parts = []
    for path in sorted(workdir.glob("*.out")) + sorted(workdir.glob("*.err")):
        tail = "\n".join(path.read_text(errors="replace").splitlines()[-25:])
        parts.append(f"--- {path.name}\n{tail}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    """Submit both jobs together; {way: (job id, state, workdir, run folder)}."""
    missing = {"node1", "node2"} - set(slurm_cluster.nodes)
    if missing:
        pytest.skip(f"the local cluster lacks {sorted(missing)} (has {slurm_cluster.nodes})")
    base = tmp_path_factory.mktemp("templates")
    spec_file = base / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec(base / "results")))
    rendered = base / "rendered.sbatch"
    rendered.write_text(sbatch.render(load_spec(spec_file, [OVERRIDE]), str(spec_file), "torchrun", [OVERRIDE]))
    ways = {
        "srun": (sbatch.template_path("srun"), RAW_FLAGS, [str(spec_file), "--set", OVERRIDE]),
        "torchrun": (rendered, [], []),
    }
    jobs = {}
    try:
        for way, (script, flags, args) in ways.items():
            workdir = base / way
            jobs[way] = (submit(slurm_cluster, workdir, f"cj-tpl-{way}", script, flags, args), workdir)
        states = wait_all(slurm_cluster, [job for job, _ in jobs.values()])
    finally:
        for job, _ in jobs.values():  # only ours, and only if still there
            if job_state(slurm_cluster, job) not in DONE:
                slurm_cluster.run("scancel", job, check=False)
    return {way: (job, states.get(job), workdir, base / "results" / "templates" / f"slurm-{job}")
            for way, (job, workdir) in jobs.items()}


@pytest.mark.parametrize("way", ["srun", "torchrun"])
def test_template_run_completes(runs, way):
    job, state, workdir, run_dir = runs[way]
    assert state == "COMPLETED", f"job {job} ({way}) ended {state}\n{logs(workdir)}"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "completed", info
    assert info["world_size"] == 4 and info["hosts"] == ["node1", "node2"], info
    assert info["slurm_job_id"] == job
    epochs = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2], f"{way}: epochs logged {epochs} (the --set {OVERRIDE} override must reach the worker)"
    per_task = {"srun": "*.[0-3].out", "torchrun": "*.node[01].out"}[way]
    assert len(list(workdir.glob(per_task))) == {"srun": 4, "torchrun": 2}[way], "one log per srun task (%t, %n)"
    for rank in range(4):  # the worker links each rank's log into the run folder for `clusterjob logs`
        assert (run_dir / "logs" / f"rank{rank}.out").resolve().parent == workdir
    if way == "srun":
        assert "epoch 2/2 train_loss" in (run_dir / "logs" / "rank0.out").read_text()


def test_templates_agree_with_each_other_and_the_submitit_run(runs, slurm_cluster):
    losses = {}
    for way, (job, state, workdir, run_dir) in runs.items():
        assert state == "COMPLETED", f"job {job} ({way}) ended {state}\n{logs(workdir)}"
        losses[way] = json.loads((run_dir / "run.json").read_text())["final"]["val_loss"]
    spec_file = runs["srun"][3].parents[2] / "tiny.yaml"  # <base>/results/templates/slurm-<id>
    done = cli(os.getcwd(), "submit", str(spec_file), "--executor", "slurm", "--set", OVERRIDE, "--wait",
               env=job_env(slurm_cluster), timeout=WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "  completed  " in line]
    info = json.loads((Path(line.split(" -> ")[1]) / "run.json").read_text())
    assert info["world_size"] == 4 and len(info["hosts"]) == 2
    losses["submitit"] = info["final"]["val_loss"]
    assert max(losses.values()) - min(losses.values()) <= 1e-6, losses


def test_rendered_srun_headers_are_accepted(slurm_cluster, tmp_path):
    """Slurm takes every header a CPU spec renders to (sbatch --test-only: nothing runs)."""
    spec_file = tmp_path / "tiny.yaml"
    raw = tiny_spec(tmp_path / "results")
    raw["resources"].update(partition="debug", time_min=1500, mem_gb=1.5)
    raw["sweep"] = {"train.seed": [0, 1, 2]}
    raw["resources"]["array_parallelism"] = 2
    spec_file.write_text(yaml.safe_dump(raw))
    script = tmp_path / "run.sbatch"
    script.write_text(sbatch.render(load_spec(spec_file), str(spec_file), "srun"))
    res = subprocess.run(["sbatch", "--test-only", f"--chdir={tmp_path}", str(script)],
                         env=job_env(slurm_cluster), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "to start at" in res.stderr, res.stdout + res.stderr


def files_of(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_job_id_used_before_never_reopens_that_run(slurm_cluster, tmp_path):
    """A raw sbatch job whose id an earlier job's completed run of another spec holds (ids
    start again when Slurm loses its state, or two clusters share a results folder) runs
    in a folder of its own, slurm-<id>-2, from epoch 1, and leaves the old run as it was;
    a requeue of the job (a new SubmitTime) finds slurm-<id>-2 again and continues it."""
    spec_file = tmp_path / "tiny.yaml"
    raw = tiny_spec(tmp_path / "results")
    raw["data"]["limit_train"] = 8192
    raw["train"]["epochs"] = 4
    raw["resources"].update(nodes=1, tasks_per_node=1)
    spec_file.write_text(yaml.safe_dump(raw))
    workdir = tmp_path / "job"
    workdir.mkdir()
    cmd = ["sbatch", "--parsable", "--hold", f"--chdir={workdir}", "--job-name=cj-reuse", "--nodes=1",
           "--ntasks-per-node=1", "--cpus-per-task=1", "--mem=1G", "--time=10", "--gres=none",
           str(sbatch.template_path("srun")), str(spec_file)]
    res = subprocess.run(cmd, env=job_env(slurm_cluster), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().split(";")[0]
    try:
        old = tmp_path / "results" / "templates" / f"slurm-{job}"  # the earlier job's run, of another spec
        (old / "checkpoints").mkdir(parents=True)
        (old / "spec.yaml").write_text(yaml.safe_dump({**raw, "train": {**raw["train"], "lr": 0.5}}))
        (old / "run.json").write_text(json.dumps({
            "run_id": f"slurm-{job}", "name": "templates", "status": "completed", "slurm_job_id": job,
            "slurm_job_submitted": "2020-01-01T00:00:00", "final": {"epoch": 2, "val_acc": 0.5}}))
        (old / "metrics.jsonl").write_text('{"epoch": 1, "val_acc": 0.4}\n{"epoch": 2, "val_acc": 0.5}\n')
        (old / "checkpoints" / "epoch-0002.pt").write_bytes(b"the old weights")
        before = files_of(old)
        slurm_cluster.run("scontrol", "release", job)
        new = old.parent / f"slurm-{job}-2"
        deadline = time.monotonic() + WAIT_S
        while not (new / "metrics.jsonl").exists() and time.monotonic() < deadline:
            assert job_state(slurm_cluster, job) not in DONE, f"job {job} ended early\n{logs(workdir)}"
            time.sleep(0.2)
        slurm_cluster.run("scontrol", "requeue", job)  # ends this start; the next has SLURM_RESTART_COUNT=1
        states = wait_all(slurm_cluster, [job])
    finally:
        if job_state(slurm_cluster, job) not in DONE:
            slurm_cluster.run("scancel", job, check=False)
    assert states[job] == "COMPLETED", f"job {job} ended {states[job]}\n{logs(workdir)}"
    assert files_of(old) == before
    info = json.loads((new / "run.json").read_text())
    assert info["status"] == "completed" and info["slurm_job_id"] == job and info["requeues"] == 1, info
    assert [json.loads(line)["epoch"] for line in (new / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert (new / "spec.yaml").read_text() != (old / "spec.yaml").read_text()
    assert not (old.parent / f"slurm-{job}-3").exists()  # the requeued start found its own folder
    said = "".join(path.read_text(errors="replace") for path in workdir.glob("*.0.out"))
    assert f"{old} is a run of another job with the same id; this job runs in {new}" in said


@pytest.mark.parametrize("style", ["srun", "torchrun"])
def test_a_rank_killed_in_a_template_job_is_named_in_status_within_seconds(slurm_cluster, tmp_path, style):
    """The templates' teardown line: a SIGKILLed rank ends the job within seconds (srun
    --kill-on-bad-exit; under torchrun its agent first), and the run records it as the
    cause, as srun or torchrun reported it, instead of "left the queue without the run
    recording its end"; the job fails (exit 1), so a job waiting for it never starts."""
    raw = tiny_spec(tmp_path / "results")
    raw["data"]["limit_train"] = 8192
    raw["train"]["epochs"] = 50
    raw["dist"]["timeout_s"] = 600  # what a rank waiting for the dead one would wait without the launcher
    raw["resources"].update(nodes=1, tasks_per_node=2)
    spec_file = tmp_path / "long.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    workdir = tmp_path / "job"
    workdir.mkdir()
    cmd = ["sbatch", "--parsable", f"--chdir={workdir}", f"--job-name=cj-kill-{style}", "--nodelist=node1",
           "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--mem=3G", "--time=10", "--gres=none",
           str(sbatch.template_path(style)), str(spec_file)]
    res = subprocess.run(cmd, env=job_env(slurm_cluster), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().split(";")[0]
    run_dir = tmp_path / "results" / "templates" / f"slurm-{job}"
    try:
        deadline = time.monotonic() + WAIT_S
        while not ((run_dir / "logs" / "rank1.proc.json").exists() and (run_dir / "logs" / "rank0.out").exists()
                   and "[progress]" in (run_dir / "logs" / "rank0.out").read_text()):
            assert time.monotonic() < deadline and job_state(slurm_cluster, job) not in DONE, \
                f"job {job} did not get to train\n{logs(workdir)}"
            time.sleep(0.2)
        rank1 = json.loads((run_dir / "logs" / "rank1.proc.json").read_text())["pid"]  # one PID namespace
        os.kill(rank1, 9)
        killed = time.monotonic()
        while job_state(slurm_cluster, job) not in DONE and time.monotonic() - killed < WAIT_S:
            time.sleep(0.2)
        took = time.monotonic() - killed
        state = job_state(slurm_cluster, job)
    finally:
        if job_state(slurm_cluster, job) not in DONE:
            slurm_cluster.run("scancel", job, check=False)
    shown = cli(tmp_path, "status", str(tmp_path / "results"), env=job_env(slurm_cluster), timeout=60)
    info = json.loads((run_dir / "run.json").read_text())
    assert state == "FAILED" and took < 180, (state, took, logs(workdir))  # not at dist.timeout_s (600 s)
    said = {"srun": r"task 1 on node1: Killed \(ended by a signal, no traceback\)",
            "torchrun": r"rank 1 on \S+ was killed by SIGKILL \(no traceback\)"}[style]
    assert info["status"] == "failed" and info["error"]["rank"] == 1, (info, logs(workdir))
    assert re.fullmatch(said, info["error"]["message"]), info["error"]
    assert f"failed on rank 1: {info['error']['message'].split(' (')[0]}" in shown.stdout, shown.stdout
    assert "without the run recording its end" not in shown.stdout
