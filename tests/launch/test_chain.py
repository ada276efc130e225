"""Runs that wait for runs (``submit --after``) with the local executor, through the real
command line: the run starts once the named runs completed and reads their folders; a
failed one fails it ("dependency failed"); what can never work is refused at submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli

from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import create_run
from clusterjob.launch import chain
from clusterjob.launch.executor import DONE, FAILED, WAITING
from clusterjob.spec.schema import entrypoint_args, spec_from_dict

FIRST = "import time, clusterjob\ntime.sleep(float(clusterjob.params.get('sleep', 2)))\nclusterjob.log(step=1, score=0.5)\n"
FAILING = "import time\ntime.sleep(1)\nraise ValueError('the first run broke')\n"
READER = (
    "import json, os, sys, clusterjob\n"
    "found = {'args': sys.argv[1:], 'api': [str(p) for p in clusterjob.after()],\n"
    "         'env': json.loads(os.environ['CLUSTERJOB_AFTER'])}\n"
    "open(os.path.join(os.environ['CLUSTERJOB_RUN_DIR'], 'found.json'), 'w').write(json.dumps(found))\n"
    "clusterjob.log(step=1, runs=float(len(found['api'])))\n")


def project(folder: Path, name: str, script: str, args=(), **extra) -> Path:
    (folder / f"{name}.py").write_text(script)
    spec = {"name": name, "entrypoint": {"script": f"{name}.py", "args": list(args)},
            "resources": {"cpus_per_task": 1}, "output": {"root": str(folder / "results")}, **extra}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return folder / f"{name}.yaml"


def runs(folder: Path, name: str) -> list[Path]:
    return sorted(p for p in (folder / "results" / name).iterdir() if not p.name.startswith("."))


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# ----------------------------------------------------------------------------- the pieces


def test_after_names_a_run_or_every_run_of_a_folder_once(tmp_path):
    first = create_run(tmp_path, "sweep", "r-000", "name: sweep\n", {})
    second = create_run(tmp_path, "sweep", "r-001", "name: sweep\n", {})
    found = chain.resolve([str(first.path), str(tmp_path / "sweep")])
    assert [r.path for r in found] == [first.path.resolve(), second.path.resolve()]
    with pytest.raises(BadInput, match="--after '.*nowhere': no run there"):
        chain.resolve([str(tmp_path / "nowhere")])


HOLDER = """
import sys, time
from clusterjob.core import claim
claim.take(sys.argv[1], "clusterjob submit")
print("held", flush=True)
time.sleep(120)
"""


def test_a_dependency_is_done_waiting_or_failed(tmp_path):
    made = {status: create_run(tmp_path, "dep", status, "name: dep\n", {}) for status in
            ("completed", "failed", "preempted", "pending")}
    made["completed"].update(status="completed")
    made["failed"].update(status="failed", error={"rank": 0, "message": "ValueError: boom", "traceback": ""})
    made["preempted"].update(status="preempted", executor="local")  # no process: nothing will run it
    made["pending"].update(executor="slurm")  # submitted, no job id yet: the submit is still handing it over
    submitting = subprocess.Popen(  # which is another live process (a claim of this one is no other's submit)
        [sys.executable, "-c", HOLDER, str(made["pending"].path)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert submitting.stdout is not None and submitting.stdout.readline() == "held\n"
        states = {dep.run.path.name: dep for dep in chain.states([r.path for r in made.values()])}
    finally:
        submitting.kill()
        submitting.wait()
    assert {name: dep.state for name, dep in states.items()} == {
        "completed": DONE, "failed": FAILED, "preempted": FAILED, "pending": WAITING}
    # with no live submit handing it over, nothing will ever give it a job: it never completes
    (gone,) = chain.states([made["pending"].path])
    assert gone.state == FAILED and "its submission ended before it handed the run over" in gone.why
    assert states["failed"].why == "failed: ValueError: boom"
    assert chain.failed(list(states.values())).startswith(
        f"dependency failed: {made['failed'].path} is failed: ValueError: boom (and 1 more of the 4 runs")
    assert chain.waiting_line(list(states.values())).startswith("waits for 3 of 4 run(s): ")


def test_after_placeholders_in_the_args():
    spec = spec_from_dict({"name": "e", "entrypoint": {"function": "json:dumps",
                                                       "args": ["{after.run_dir}/checkpoints", "{after.run_dirs}"]}})
    assert entrypoint_args(spec) == ("{after.run_dir}/checkpoints", "{after.run_dirs}")  # no run yet: as written
    assert entrypoint_args(spec, after=["/r/a"]) == ("/r/a/checkpoints", '["/r/a"]')
    with pytest.raises(BadInput, match=r"entrypoint.args\[0\]: \{after.run_dir\} is the folder of the one run .* "
                                       r"but --after names 2; use \{after.run_dirs\}"):
        entrypoint_args(spec, after=["/r/a", "/r/b"])
    with pytest.raises(BadInput, match="waits for, but --after names 0; submit with --after RUN"):
        entrypoint_args(spec, after=[])


# ----------------------------------------------------------------------------- real runs


def test_a_local_run_starts_once_the_run_it_waits_for_completed_and_reads_its_folder(tmp_path):
    project(tmp_path, "first", FIRST, params={"sleep": 4})
    project(tmp_path, "second", READER, args=["--from", "{after.run_dir}"])
    assert cli(tmp_path, "submit", "first.yaml", "--executor", "local").returncode == 0
    (first,) = runs(tmp_path, "first")
    done = cli(tmp_path, "submit", "second.yaml", "--executor", "local", "--after", str(first), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    (second,) = runs(tmp_path, "second")
    assert info(first)["status"] == "completed" and info(second)["status"] == "completed"
    assert info(second)["after"] == [str(first.resolve())]
    assert info(second)["started_at"] >= info(first)["finished_at"]  # it waited
    found = json.loads((second / "found.json").read_text())
    assert found == {"args": ["--from", str(first.resolve())], "api": [str(first.resolve())],
                     "env": [str(first.resolve())]}


def test_status_shows_what_a_run_waits_for_and_a_failed_dependency_fails_it(tmp_path):
    project(tmp_path, "first", FAILING)
    project(tmp_path, "second", READER, args=["{after.run_dirs}"])
    assert cli(tmp_path, "submit", "first.yaml", "--executor", "local").returncode == 0
    (first,) = runs(tmp_path, "first")
    assert cli(tmp_path, "submit", "second.yaml", "--executor", "local", "--after", str(tmp_path / "results" / "first")
               ).returncode == 0
    (second,) = runs(tmp_path, "second")
    shown = cli(tmp_path, "status", str(tmp_path / "results")).stdout
    if info(first)["status"] != "failed":  # (on a loaded machine the first run may have ended already)
        assert f"{second.name}: waits for 1 of 1 run(s): {first.resolve()} (" in shown, shown
    wait_for(lambda: info(second)["status"] == "failed", WAIT_S, "the waiting run to fail")
    error = info(second)["error"]["message"]
    assert error == f"dependency failed: {first.resolve()} is failed: ValueError: the first run broke"
    assert not (second / "found.json").exists() and not list((second / "logs").glob("rank*.proc.json"))  # never started
    shown = cli(tmp_path, "status", str(tmp_path / "results")).stdout
    assert f"{second.name}: failed: dependency failed" in shown and "None" not in shown


def test_what_can_never_work_is_refused_at_submit_and_writes_nothing(tmp_path):
    project(tmp_path, "first", FAILING)
    project(tmp_path, "second", READER, args=["{after.run_dir}"])
    assert cli(tmp_path, "submit", "first.yaml", "--executor", "local", "--wait").returncode == 1
    (first,) = runs(tmp_path, "first")
    refused = cli(tmp_path, "submit", "second.yaml", "--executor", "local", "--after", str(first))
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"clusterjob: error: --after: {first.resolve()} is failed: ValueError: the first run broke; resume")
    alone = cli(tmp_path, "submit", "second.yaml", "--executor", "local")
    assert alone.returncode == 2 and "{after.run_dir} is the folder of the one run" in alone.stderr
    nowhere = cli(tmp_path, "submit", "second.yaml", "--executor", "local", "--after", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 2 and "no run there" in nowhere.stderr
    assert not (tmp_path / "results" / "second").exists()
