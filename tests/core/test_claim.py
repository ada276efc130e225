"""The claim on a run folder (clusterjob.core.claim) and the turns run.json updates take,
with real processes: one holder at a time, named when refused; a claim dies with its
holder (kill -9) and passes to a child whole; concurrent updates lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli

from clusterjob.core import claim
from clusterjob.core.rundir import RunDir, create_run

REPO = Path(__file__).resolve().parents[2]

# A process that claims the run folder argv[1] (or adopts descriptor argv[2]), says so, and sleeps.
HOLDER = """
import sys, time
from clusterjob.core import claim
if len(sys.argv) > 2:
    claim.adopt(int(sys.argv[2]), sys.argv[1], claim.SUPERVISOR)
else:
    claim.take(sys.argv[1], "clusterjob resume")
print("held", flush=True)
time.sleep(120)
"""


def spawn(*argv: str, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *argv], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True, **kwargs)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.fixture
def run(tmp_path) -> RunDir:
    return create_run(tmp_path, "exp", "r1", "name: exp\n", {})


def test_a_second_claim_is_refused_naming_the_holder_until_the_holder_is_killed(run):
    holder = spawn(str(run.path))
    try:
        with pytest.raises(claim.Claimed) as refused:
            claim.take(run.path, "clusterjob resume")
        assert refused.value.doing == "clusterjob resume"
        assert str(refused.value).startswith(f"{run.path} is claimed by clusterjob resume (pid {holder.pid} on ")
        assert claim.held(run.path) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with claim.claimed(run.path, "clusterjob resume") as mine:  # the lock died with its holder
        assert mine is not None and claim.held(run.path) is mine
    assert claim.held(run.path) is None


def test_a_claim_handed_to_a_child_stays_held_after_the_parent_let_go(run):
    mine = claim.take(run.path, "clusterjob submit")
    assert mine is not None
    child = spawn(str(run.path), str(mine.fd), pass_fds=[mine.fd])
    try:
        claim.release(run.path)
        with pytest.raises(claim.Claimed, match=f"claimed by local supervisor \\(pid {child.pid} "):
            claim.take(run.path, "clusterjob resume")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert claim.take(run.path, "clusterjob resume") is not None
    claim.release(run.path)


def test_a_claim_that_names_no_live_holder_says_another_process(run, monkeypatch):
    holder = spawn(str(run.path))
    try:
        claim.lock_path(run.path).write_text("")  # its words gone: the lock is what counts
        monkeypatch.setattr(claim, "NAME_WAIT_S", 0.2)
        with pytest.raises(claim.Claimed, match="is claimed by another process"):
            claim.take(run.path, "clusterjob resume")
    finally:
        holder.kill()
        holder.wait()


def test_cancel_without_a_lock_file_makes_none(tmp_path):
    run = RunDir(tmp_path / "exp" / "old")
    run.path.mkdir(parents=True)
    assert claim.take(run.path, "clusterjob cancel", create=False) is None
    assert not claim.lock_path(run.path).exists()


UPDATER = """
import sys
from clusterjob.core.rundir import RunDir
run, field = RunDir(sys.argv[1]), sys.argv[2]
for i in range(150):
    run.update(**{field: {"i": i}})
"""


def test_concurrent_updates_of_different_fields_lose_none(run):
    """Each update reads run.json and writes it whole: without turns, one process would
    write back the other's field as it read it before."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", UPDATER, str(run.path), field], env=env)
               for field in ("final", "versions", "entrypoint")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    info = json.loads(run.info_file.read_text())
    assert info["final"] == info["versions"] == info["entrypoint"] == {"i": 149}
    assert json.loads(run.info_file.read_text())["status"] == "pending"


def test_status_logs_and_report_make_no_lock_files(tmp_path):
    run = tmp_path / "results" / "exp" / "r1"
    (run / "logs").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "name": "exp", "status": "running",
                                              "executor": "local", "final": {"epoch": 1, "val_acc": 0.5}}))
    (run / "metrics.jsonl").write_text('{"epoch": 1, "val_acc": 0.5}\n')
    (run / "logs" / "rank0.out").write_text("epoch 1\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for argv in (("status", "results"), ("logs", str(run)), ("report", "results")):
        done = cli(tmp_path, *argv, env=os.environ, timeout=120)
        assert done.returncode == 0, done.stderr
    after = sorted(p.name for p in tmp_path.rglob("*") if not p.name.startswith(".clusterjob-cache"))
    assert after == before  # the report's own cache aside


def test_a_claim_this_process_holds_is_no_other_command_handing_the_run_over(tmp_path):
    """A resume holding a sweep's claim (or a run's) looks at the runs a dead submit left:
    it is handing nothing over yet, so they are its to start; another process's claim is."""
    from clusterjob.core.rundir import make_runs

    (first, _) = make_runs(tmp_path, "exp", [(0, "name: exp\n", {}), (1, "name: exp\n", {})])
    parent, stamp = first.path.parent, first.run_id.rsplit("-", 1)[0]
    claim.take_sweep(parent, stamp, "clusterjob resume")
    try:
        assert claim.handing_over(first.path) is None
    finally:
        claim.release_sweep(parent, stamp)
    with claim.claimed(first.path, "clusterjob resume"):
        assert claim.handing_over(first.path) is None
    holder = spawn(str(first.path))
    try:
        said = claim.handing_over(first.path)
        assert said is not None and said.startswith(f"clusterjob resume (pid {holder.pid} on ")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_resume_handing_a_run_to_its_local_supervisor_keeps_saying_resume(run, monkeypatch):
    """What a second resume is told while the first starts the run's supervisor: the
    words of the command that holds the claim, never those of a submit it is not."""
    from clusterjob.launch.executors import local
    from clusterjob.spec.schema import spec_from_dict

    said = []
    monkeypatch.setattr(local, "detach", lambda runs, world: said.append(claim.holder(runs[0].path)) or 1)
    spec = spec_from_dict({"name": "exp"})
    with claim.claimed(run.path, "clusterjob resume"):
        local.LocalExecutor().start(spec, [run], follow=False)
    local.LocalExecutor().start(spec, [run], follow=False)  # a submit: the claim is taken here
    assert [who[0] for who in said] == ["clusterjob resume", "clusterjob submit"]
    assert claim.held(run.path) is None
