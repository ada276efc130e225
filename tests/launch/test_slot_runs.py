"""A search's slots are ordinary runs (docs/design.md, "Search"): ``<search>/.slots/slot-K``
with their run.json, spec.yaml and logs, started by the executor's ``start`` with a task per
allocation (``Task``, PER_ALLOCATION). Their folders: made, reopened, a link refused. The
Slurm executor renders such a task as the batch script's own command (no srun, no
teardown, one array never split). Through the real command line on this machine: each
slot run completes with the trials it supervised (their launcher is the slot's process),
and kill -9 of the supervisor of a detached search leaves no run running: its slot
processes stop their trials, and ``resume`` completes the search."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys

import pytest
from clirun import WAIT_S, cli, start
from slurmcluster import wait_for
from test_search import info, trials, write

from clusterjob.core.errors import BadInput
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.launch.executor import PER_ALLOCATION, PER_RANK, RANKS, Task, check_shape, get
from clusterjob.launch.executors.slurm import scripts
from clusterjob.search import slotruns
from clusterjob.search.trials import make
from clusterjob.spec.schema import load_spec

SLOT = Task("clusterjob.search.slotdriver", PER_ALLOCATION)


SEARCH = {"trials": 3, "parallel": 2, "seed": 0, "prune": None, "space": {"train.lr": {"log_uniform": [1e-3, 0.1]}}}
SHORT = {"epochs": 2, "log_every": 8}


# ----------------------------------------------------------------------------- the task and its folders


def test_a_task_is_read_back_from_its_record_and_the_runner_is_the_default():
    assert Task.of(RunRecord()) == RANKS and RANKS.per == PER_RANK and RANKS.module == "clusterjob.run"
    assert Task.of(RunRecord(task=SLOT.to_dict())) == SLOT
    for hostile in ({"module": 3, "per": "allocation"}, {"module": "x", "per": "node"}, {"per": "allocation"}):
        assert Task.of(RunRecord(task=hostile)) == RANKS  # a damaged record runs nothing of its own


def test_an_executor_runs_only_the_shapes_it_lists():
    assert set(get("local").shapes) == set(get("slurm").shapes) == {PER_RANK, PER_ALLOCATION}

    class Ranks:
        name, shapes = "ranks", (PER_RANK,)

    with pytest.raises(BadInput, match="--executor ranks: a search needs one task per allocation"):
        check_shape(Ranks(), SLOT, "a search")  # type: ignore[arg-type]
    check_shape(get("slurm"), SLOT, "a search")


def test_slot_runs_are_made_then_reopened_and_a_link_is_refused(tmp_path):
    spec = load_spec(write(tmp_path, SEARCH, train=SHORT))
    folder = make(spec, "local", claim_as="test")
    made = slotruns.prepared(folder, 2, "test", "local")
    assert [run.path for run in made] == [folder / ".slots" / "slot-0", folder / ".slots" / "slot-1"]
    assert [run.read().search for run in made] == [{"id": folder.name, "slot": 0}, {"id": folder.name, "slot": 1}]
    assert made[0].spec_file.read_text() == (folder / "spec.yaml").read_text()
    assert [run.path for run in slotruns.slot_runs(folder)] == [run.path for run in made]
    assert slotruns.search_of(made[1]) == (folder, 1)
    made[0].update(status="completed", job={"executor": "slurm", "id": "7_0"})
    again = slotruns.prepared(folder, 2, "test", "slurm", job=None)
    assert again[0].read().status == "pending" and again[0].read().job is None
    assert again[0].read().executor == "slurm"
    assert slotruns.search_of(RunDir(folder)) is None  # no slot: its folder is not in .slots

    other = tmp_path / "elsewhere"
    other.mkdir()
    (folder / ".slots" / "slot-1").rename(tmp_path / "moved")
    (folder / ".slots" / "slot-1").symlink_to(other)
    with pytest.raises(BadInput, match="slot-1: a search's slot folder is a link or a file"):
        slotruns.prepared(folder, 2, "test", "local")
    assert list(other.iterdir()) == []  # nothing written through the link
    assert [run.path.name for run in slotruns.slot_runs(folder)] == ["slot-0"]  # a link is no slot run
    for name in (".slots/slot-1", ".slots"):  # a file where a slot's folder (or all of them) would be
        path = folder / name
        path.unlink() if path.is_symlink() else shutil.rmtree(path)
        path.write_text("not a folder")
        with pytest.raises(BadInput, match=f"{name}: a search's slot folder is a link or a file"):
            slotruns.check_folders(folder, 2)


def test_a_task_per_allocation_is_the_batch_scripts_own_command_in_one_array(tmp_path):
    spec = load_spec(write(tmp_path, {**SEARCH, "trials": 2000, "parallel": 1500}, train=SHORT))
    (script,) = scripts(spec, 1500, tmp_path / "x", array_max=None, task=SLOT)  # one array above MaxArraySize
    assert "#SBATCH --array=0-1499%1500" in script and "#SBATCH --job-name=s\n" in script
    command = [line for line in script.splitlines() if "-m clusterjob.search.slotdriver" in line]
    assert len(command) == 1 and command[0].startswith(f"{sys.executable} -u -m clusterjob.search.slotdriver "
                                                       "--runs ")
    assert "srun" not in script and "finalize" not in script  # no step and no teardown: it records its own end
    (ranks,) = scripts(spec, 2, tmp_path / "x", array_max=5)
    assert "srun" in ranks and "-m clusterjob.run --runs" in ranks and "finalize" in ranks


def test_a_slots_trials_see_the_gpus_and_threads_of_its_share_of_the_machine():
    """The supervisor gives a slot's process its share (its GPUs, its threads); the slot's
    own supervisor starts each trial's ranks with that environment, changing neither."""
    from clusterjob.launch.slots import Slot, plan
    from clusterjob.launch.supervisor import rank_environ

    shares = plan(2, 2, 2, 2, 2, cores=range(8), gpus=["0", "1", "5", "7"])  # 2 slots of 2 ranks, a GPU each
    assert [share.gpus for share in shares] == [("0", "1"), ("5", "7")]
    base = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,5,7"}
    slot = rank_environ(base, 0, 1, 29500, shares[1])  # the slot's process, one per allocation
    assert slot["CUDA_VISIBLE_DEVICES"] == "5,7" and slot["OMP_NUM_THREADS"] == "2" and shares[1].cpus == (4, 5, 6, 7)
    for rank in (0, 1):
        trial = rank_environ(slot, rank, 2, 29611, Slot(1))  # a trial's rank, started by the slot
        assert trial["CUDA_VISIBLE_DEVICES"] == "5,7" and trial["OMP_NUM_THREADS"] == "2"
        assert (trial["RANK"], trial["WORLD_SIZE"], trial["MASTER_PORT"]) == (str(rank), "2", "29611")


# ----------------------------------------------------------------------------- on this machine


@pytest.mark.slow
def test_each_slot_run_completes_with_the_trials_it_supervised(tmp_path):
    write(tmp_path, SEARCH, train=SHORT)
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "local", "--wait", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = (tmp_path / "results" / "s").iterdir()
    slots = [found / ".slots" / f"slot-{k}" for k in (0, 1)]
    assert sorted(p.name for p in (found / ".slots").iterdir() if p.is_dir()) == ["slot-0", "slot-1"]
    ran = {}
    for k, slot in enumerate(slots):
        record = info(slot)
        assert record["status"] == "completed" and record["search"] == {"id": found.name, "slot": k}
        assert record["task"] == {"module": "clusterjob.search.localslot", "per": "allocation"}
        pid = json.loads((slot / "logs" / "rank0.proc.json").read_text())["pid"]
        ran[pid] = k
        assert (slot / "spec.yaml").read_text() == (found / "spec.yaml").read_text()
    for trial in trials(found):
        record = info(trial)
        assert record["status"] == "completed"
        assert ran[record["launcher"]["pid"]] == record["search"]["slot"]  # supervised by its slot's process
        output = (slots[record["search"]["slot"]] / "logs" / "rank0.out").read_text()
        assert f"{trial.name}  completed" in output and f"{trial.name}  completed" in done.stdout
    status = cli(tmp_path, "status", str(tmp_path / "results"))
    assert status.returncode == 0 and ".slots" not in status.stdout and "slot-0" not in status.stdout
    report = cli(tmp_path, "report", str(found), "--runs", "--format", "json")
    assert sorted(row["run_id"] for row in json.loads(report.stdout)["runs"]) == [t.name for t in trials(found)]
    alone = cli(tmp_path, "resume", str(slots[0]))
    assert alone.returncode == 2 and f"is a slot of a search: the search starts it; resume the search as a " \
        f"whole: clusterjob resume {found}" in alone.stderr


@pytest.mark.slow
def test_kill_9_of_a_detached_search_supervisor_leaves_no_run_running(tmp_path):
    write(tmp_path, {**SEARCH, "parallel": 2}, train={"epochs": 20, "log_every": 64}, data={"limit_train": 1024})
    proc = start(tmp_path, "submit", "s.yaml", "--executor", "local")
    assert proc.wait(timeout=WAIT_S) == 0
    wait_for(lambda: (tmp_path / "results" / "s").is_dir() and any((tmp_path / "results" / "s").iterdir()), 30,
             "the search's folder")
    (found,) = (tmp_path / "results" / "s").iterdir()
    wait_for(lambda: len(trials(found)) == 2 and all(
        (t / "checkpoints").exists() and any((t / "checkpoints").iterdir()) for t in trials(found)), 180,
        "both trials' first checkpoints")
    supervisor = info(found / ".slots" / "slot-0")["launcher"]["pid"]
    assert info(found / ".slots" / "slot-1")["launcher"]["pid"] == supervisor
    os.kill(supervisor, signal.SIGKILL)
    ended = ("cancelled", "completed", "failed")
    wait_for(lambda: all(info(run)["status"] in ended for run in [*trials(found), *found.glob(".slots/slot-*")]),
             120, "every trial and slot run to end")
    assert "cancelled" in [info(run)["status"] for run in trials(found)]  # stopped by its slot, as a Ctrl-C does
    status = cli(tmp_path, "status", str(found))
    assert status.returncode == 0 and not any(" running " in line for line in status.stdout.splitlines()[1:])
    done = cli(tmp_path, "resume", str(found), "--wait", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(trials(found)) == 3 and all(info(run)["status"] == "completed" for run in trials(found))
    assert all(info(found / ".slots" / f"slot-{k}")["status"] == "completed" for k in (0, 1))


@pytest.mark.slurm
def test_on_slurm_each_slot_run_is_an_array_task_that_records_its_own_end(slurm_cluster, tmp_path):
    """The slot runs are the tasks of one array (their jobs ``<array>_K``), each running
    its driver with no srun step of its own; each records its start and its end, its log
    is the job's, and ``status`` of the slot runs reads them as any runs."""
    write(tmp_path, {**SEARCH, "trials": 2}, train={"epochs": 1, "log_every": 8},
          resources={"cpus_per_task": 1, "gpus_per_node": 0, "mem_gb": 1, "time_min": 10})
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "slurm", "--wait", env=slurm_cluster.env(), timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (found,) = (tmp_path / "results" / "s").iterdir()
    array = json.loads((found / "search.json").read_text())["job"]["id"]
    assert done.stdout.splitlines()[0] == f"{array}  {found}  (a Slurm array of 2 slot(s))"
    for k in (0, 1):
        slot = found / ".slots" / f"slot-{k}"
        record = info(slot)
        assert record["status"] == "completed" and record["job"] == {"executor": "slurm", "id": f"{array}_{k}"}
        assert record["task"] == {"module": "clusterjob.search.slotdriver", "per": "allocation"}
        assert record["started_at"] <= record["finished_at"]
        log = (slot / "logs" / "rank0.err").read_text()  # a link to the job's own log
        assert f"clusterjob: slot {k} of search {found} (job {array}_{k}, start 1)" in log
    assert sorted(info(t)["search"]["slot"] for t in trials(found)) in ([0, 1], [0, 0], [1, 1])
    assert all(info(t)["status"] == "completed" and info(t)["job"]["id"].startswith(f"{array}_")
               for t in trials(found))
    status = cli(tmp_path, "status", str(found / ".slots"), env=slurm_cluster.env())
    assert status.returncode == 0 and sum(" completed " in line for line in status.stdout.splitlines()) == 2
