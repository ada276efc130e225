"""Job control without a cluster: reconciling run.json with the queue, requeue caps,
array chunking, truncated checkpoints (Slurm commands faked, files real)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
from clirun import cli
from fakeslurm import in_job
from trainutil import run_info

from clusterjob.core import procs, slurmctl
from clusterjob.core.record import Job
from clusterjob.core.rundir import RunDir, create_run
from clusterjob.launch import control, executor, resources
from clusterjob.launch.executors import slurm as slurm_launch
from clusterjob.runner import checkpoint
from clusterjob.spec.schema import dump_spec, expand_sweep, spec_from_dict


def make_run(tmp_path, run_id="r1", **fields) -> RunDir:
    run = create_run(tmp_path, "exp", run_id, dump_spec(spec_from_dict({"name": "exp"})), {})
    run.update(**fields)
    return run


@pytest.fixture
def fake_slurm(monkeypatch):
    state = SimpleNamespace(queue={}, sacct={})
    monkeypatch.setattr(slurmctl, "queue_states", lambda ids: {i: s for i, s in state.queue.items() if i in ids})
    monkeypatch.setattr(slurmctl, "accounting_states", lambda ids: {i: s for i, s in state.sacct.items() if i in ids})
    return state


def test_a_job_gone_without_accounting_is_failed_not_unknown(tmp_path, fake_slurm):
    run = make_run(tmp_path, status="running", job=Job("slurm", "77"), executor="slurm")
    before = run.info_file.read_bytes()
    (view,) = executor.views([run])
    assert view.record.status == "failed" and "no accounting record" in view.record.error.message
    assert run.info_file.read_bytes() == before  # status shows it, writes nothing
    (view,) = executor.views([run], write_back=True)
    written = run_info(run.path)
    assert written["status"] == "failed" and "no accounting record" in written["error"]["message"]
    assert view.record.status == "failed" and written["finished_at"] is not None


def test_a_job_gone_while_sacct_does_not_answer_is_shown_failed_and_never_written(tmp_path, fake_slurm, monkeypatch):
    run = make_run(tmp_path, status="running", job=Job("slurm", "79"), executor="slurm")
    before = run.info_file.read_bytes()
    monkeypatch.setattr(slurmctl, "accounting_states", lambda ids: None)  # sacct failed or hung
    (view,) = executor.views([run], write_back=True)
    assert view.record.status == "failed" and "sacct did not answer" in (view.unanswered or "")
    assert run.info_file.read_bytes() == before  # a guess is never written
    monkeypatch.setattr(slurmctl, "accounting_states", lambda ids: {"79": "CANCELLED"})
    (view,) = executor.views([run], write_back=True)
    assert view.record.status == run_info(run.path)["status"] == "cancelled"  # what Slurm said, once it answers


def test_write_back_keeps_an_end_the_run_recorded_meanwhile(tmp_path, monkeypatch):
    run = make_run(tmp_path, status="running", job=Job("slurm", "78"), executor="slurm")

    def queue_while_the_run_ends(ids):
        run.update(status="completed", final={"epoch": 3, "val_acc": 0.9})  # the run's own last write
        return {}

    monkeypatch.setattr(slurmctl, "queue_states", queue_while_the_run_ends)
    monkeypatch.setattr(slurmctl, "accounting_states", lambda ids: {"78": "COMPLETED"})
    (view,) = executor.views([run], write_back=True)
    assert view.record.status == "completed" and run_info(run.path)["status"] == "completed"
    assert run_info(run.path)["error"] is None


def test_queue_and_accounting_states(tmp_path, fake_slurm):
    queued = make_run(tmp_path, "a", status="preempted", job=Job("slurm", "5_1"), executor="slurm")
    cancelled = make_run(tmp_path, "b", status="running", job=Job("slurm", "6"), executor="slurm")
    timed_out = make_run(tmp_path, "c", status="running", job=Job("slurm", "7"), executor="slurm")
    done = make_run(tmp_path, "d", status="completed", job=Job("slurm", "8"), executor="slurm")
    fake_slurm.queue = {"5_1": "PENDING"}
    fake_slurm.sacct = {"6": "CANCELLED", "7": "TIMEOUT", "8": "FAILED"}
    found = executor.views([queued, cancelled, timed_out, done])
    assert [view.record.status for view in found] == ["preempted", "cancelled", "timeout", "completed"]
    table = control.status_table([queued, cancelled, timed_out, done], found)
    assert "preempted (pending)" in table and "exp/d" in table


def test_status_shows_the_failing_rank_and_traceback(tmp_path, fake_slurm):
    run = make_run(tmp_path, status="failed", error={"rank": 1, "message": "RuntimeError: boom",
                                                     "traceback": "Traceback...\n  line\nRuntimeError: boom"})
    text = control.status_table([run], executor.views([run]))
    assert "failed on rank 1: RuntimeError: boom" in text and text.count("RuntimeError: boom") == 1  # not twice


def test_status_shows_your_codes_first_metric_beside_the_trainers_epoch(tmp_path, fake_slurm):
    trainer = make_run(tmp_path, "a", status="completed", final={"epoch": 3, "val_acc": 0.9})
    own = make_run(tmp_path, "b", status="running", entrypoint={"script": "t.py", "metrics": ["loss", "acc"]},
                   warnings=["entrypoint.metrics.acc: never matched", "\x1b[2Jsecond"])
    own.metrics_file.write_text('{"step": 7, "loss": 0.25}\n{"step": 2, "acc": 0.5}\n')
    lines = control.status_table([trainer, own], executor.views([trainer, own])).splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "EPOCH/STEP", "METRIC", "JOB"]
    assert lines[1].split() == ["exp/a", "completed", "3", "val_acc", "90.00%", "-"]
    assert lines[2].split() == ["exp/b", "running", "7", "loss", "0.25", "-"]
    assert lines[3:] == ["b: warning: entrypoint.metrics.acc: never matched", "b: warning: \\x1b[2Jsecond"]
    alone = control.status_table([trainer], executor.views([trainer])).splitlines()
    assert alone[0].split()[2:4] == ["EPOCH", "VAL_ACC"] and alone[1].split()[2:4] == ["3", "90.00%"]


CHAINED = """Traceback (most recent call last):
  File "/x/a.py", line 3, in f
    return g()
           ^^^
KeyError: 'lr'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/run.py", line 73, in run_task
    outcome = target(run, stop)
              ^^^^^^^^^^^^^^^^^
  File "/x/train.py", line 279, in take_window
    raise DivergedError(
clusterjob.trainer.train.DivergedError: the loss is not finite
"""


@pytest.mark.parametrize("traceback, excerpt", [
    (CHAINED, ['File "/x/train.py", line 279, in take_window', "  raise DivergedError(",
               "clusterjob.trainer.train.DivergedError: the loss is not finite"]),
    ('  File "<string>", line 1, in <module>\nValueError: x\n', ['File "<string>", line 1, in <module>',
                                                                  "ValueError: x"]),
    ("rank 1 was killed by SIGKILL\nsome\nstderr\nlines\ntail", ["some", "stderr", "lines", "tail"]),
])
def test_status_shows_the_last_frame_its_source_and_the_exception(tmp_path, fake_slurm, traceback, excerpt):
    run = make_run(tmp_path, status="failed", error={"rank": 0, "message": "E: m", "traceback": traceback})
    lines = control.status_table([run], executor.views([run])).splitlines()
    at = next(i for i, line in enumerate(lines) if "failed on rank 0: E: m" in line)
    assert lines[at + 1:] == ["    " + line for line in excerpt]  # no caret line, not mid-traceback


def test_cancel_marks_cancelled_and_later_writes_keep_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(slurmctl, "cancel", lambda job: calls.append(job) or True)
    monkeypatch.setattr(slurmctl, "queue_states", lambda jobs: {})  # the job left the queue
    run = make_run(tmp_path, status="running", job=Job("slurm", "9"), executor="slurm")
    assert control.cancel(run) == ["cancelled Slurm job 9"] and calls == ["9"]
    assert run_info(run.path)["status"] == "cancelled"
    run.update(status="completed", final={"epoch": 3})  # a dying task's late write
    assert run_info(run.path)["status"] == "cancelled" and run_info(run.path)["final"] == {"epoch": 3}
    with pytest.raises(Exception, match="already cancelled"):
        control.cancel(run)


def test_requeue_cap_fails_the_run_instead_of_requeueing(tmp_path, monkeypatch):
    from clusterjob.runner import runrecord
    from clusterjob.taskenv.slurmjob import SlurmJob

    requeued = []
    monkeypatch.setattr(runrecord.taskenv, "current", lambda: in_job(SlurmJob("40")))
    monkeypatch.setattr(slurmctl, "requeue", lambda job: requeued.append(job) or True)
    monkeypatch.setattr(slurmctl, "time_left_s", lambda job: 3000)
    run = make_run(tmp_path, status="running", requeues=0)
    assert runrecord.record_stop(run, spec_from_dict({"name": "t", "resources": {"max_requeues": 1}}), "SIGUSR2").requeue
    assert run_info(run.path)["status"] == "preempted" and run_info(run.path)["requeues"] == 1 and requeued == ["40"]
    runrecord.record_stop(run, spec_from_dict({"name": "t", "resources": {"max_requeues": 1}}), "SIGUSR2")
    info = run_info(run.path)
    assert info["status"] == "failed" and "max_requeues=1 reached" in info["error"]["message"]
    assert "clusterjob resume" in info["error"]["message"]
    assert requeued == ["40"]


@pytest.mark.parametrize("signal, requeues, cap, left, in_slurm, expected", [
    ("SIGUSR2", 0, 3, 3000, True, ("preempted", True)),
    ("SIGUSR2", 0, 3, 100, True, ("timeout", True)),        # the time limit's warning
    ("SIGUSR2", 0, 3, None, True, ("preempted", True)),     # no time limit known
    ("SIGUSR2", 3, 3, 100, True, ("failed", False)),        # cap reached
    ("SIGUSR2", 0, 0, 100, True, ("failed", False)),
    ("SIGTERM", 0, 3, 100, True, ("timeout", False)),       # Slurm requeues or ends it itself
    ("SIGTERM", 9, 3, 3000, True, ("preempted", False)),
    (None, 0, 3, None, True, ("preempted", True)),          # debug.exit_after_epoch in a job
    ("SIGUSR2", 0, 3, 100, False, ("timeout", False)),      # outside Slurm nothing requeues
    (None, 5, 3, None, False, ("preempted", False)),
])
def test_stop_outcome(signal, requeues, cap, left, in_slurm, expected):
    from clusterjob.runner.runrecord import stop_outcome

    outcome = stop_outcome(signal, requeues, cap, left, can_requeue=in_slurm)
    assert (outcome.status, outcome.requeue) == expected
    assert (outcome.error is not None) == (expected[0] == "failed")


def test_sweeps_larger_than_max_array_size_are_chunked(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(slurmctl, "max_array_size", lambda: 2)
    spec = spec_from_dict({"name": "exp", "sweep": {"train.seed": [0, 1, 2, 3, 4]},
                           "resources": {"array_parallelism": 4}, "output": {"root": str(tmp_path)}})
    out = "\n".join(slurm_launch.scripts(spec, len(expand_sweep(spec)), tmp_path / ".slurm"))
    assert out.count("#!/bin/bash") == 3
    # the last part's one run is one job, as submit sends it (the dry run is what is submitted)
    assert out.count("#SBATCH --array=0-1%2") == 2 and out.count("#SBATCH --array") == 2
    assert not any(tmp_path.iterdir())
    assert slurm_launch.chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


def test_slurm_parameters_follow_the_spec():
    spec = spec_from_dict({"name": "exp", "resources": {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4,
                                                       "cpus_per_task": 8, "mem_gb": 1.5, "time_min": 90,
                                                       "partition": "gpu", "qos": "high", "setup": ["module load x"]}})
    params = resources.submitit_parameters(spec, [])
    assert (params["nodes"], params["ntasks_per_node"], params["cpus_per_task"]) == (2, 4, 8)
    # the same renderings as the sbatch templates' headers
    assert params["additional_parameters"] == {"requeue": True, "gres": "gpu:4", "mem": "1536M", "time": "01:30:00",
                                               "partition": "gpu", "qos": "high"}
    assert resources.sbatch_options(spec)["mem"] == "1536M" and resources.sbatch_options(spec)["time"] == "01:30:00"
    assert params["setup"] == [f'echo "{resources.SESSION_MARK}" >&2', "module load x",
                               "export SRUN_CPUS_PER_TASK=8"] and "account" not in params
    assert "--kill-on-bad-exit=1" in params["srun_args"]
    cpu = resources.submitit_parameters(spec_from_dict({"name": "c", "resources": {"mem_gb": 0}}), [])
    assert cpu["additional_parameters"] == {"requeue": True, "time": "01:00:00"}


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    for epoch in (1, 2):
        checkpoint.save(tmp_path, epoch, {"epoch": epoch, "w": torch.full((64,), float(epoch))}, keep_last=2)
    latest = checkpoint.path_for(tmp_path, 2)
    latest.write_bytes(latest.read_bytes()[:100])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = checkpoint.load_latest(tmp_path)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(64))
    assert any("epoch-0002.pt does not load" in str(w.message) for w in caught)


def test_checkpoints_sort_mid_epoch_after_their_epoch_and_keep_last(tmp_path):
    for epoch, batches in ((1, 0), (1, 40), (2, 0), (2, 8)):
        checkpoint.save(tmp_path, epoch, {"epoch": epoch}, keep_last=3, batches=batches)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "epoch-0001-000040.pt", "epoch-0002.pt", "epoch-0002-000008.pt"]
    assert not list(tmp_path.glob(".*"))  # no temp files left


def test_finalize_names_a_killed_task(tmp_path):
    run = make_run(tmp_path, status="failed", job=Job("slurm", "12"), log_dir=str(tmp_path),
                   error={"rank": 0, "message": "gloo: connection closed"})
    (tmp_path / "12_0_log.err").write_text("srun: error: node2: task 1: Terminated\n"
                                           "srun: error: node2: task 3: Killed\n")
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([str(run.path)]))
    assert slurm_launch.finalize(str(runs_file), "0", "137") == 1  # the job fails: a job waiting with afterok never starts
    error = run_info(run.path)["error"]
    assert error["rank"] == 3 and error["message"].startswith("task 3 on node2: Killed")


# ----------------------------------------------------------------------------- Slurm that does not answer


def test_queries_tell_a_failed_query_from_an_answer(slurm_shims, monkeypatch):
    slurm_shims.fail("squeue", stderr="slurm_load_jobs error: Unable to contact slurm controller")
    slurm_shims.fail("sacct", stderr="sacct: error: Problem talking to the database")
    assert slurmctl.queue_states(["5"]) is None and slurmctl.accounting_states(["5"]) is None
    assert slurmctl.queue_states([]) == {}  # nothing to ask: an empty answer, no query
    slurm_shims.fail("squeue", stderr="slurm_load_jobs error: Invalid job id specified")
    assert slurmctl.queue_states(["5"]) == {}  # the job left the controller's memory
    slurm_shims.answer("squeue", "JOBID|STATE\n5_1|RUNNING\n6|PENDING\n")
    slurm_shims.answer("sacct", "JobID|State\n7|CANCELLED by 0\n8|TIMEOUT\n")
    assert slurmctl.queue_states(["5_1", "6"]) == {"5_1": "RUNNING", "6": "PENDING"}
    assert slurmctl.accounting_states(["7", "8"]) == {"7": "CANCELLED", "8": "TIMEOUT"}
    slurm_shims.answer("squeue", delay=30)
    monkeypatch.setattr(slurmctl, "TIMEOUT_S", 0.5)
    start = time.monotonic()
    assert slurmctl.queue_states(["5"]) is None and time.monotonic() - start < 20  # at TIMEOUT_S, not the 30 s
    monkeypatch.setenv("PATH", str(slurm_shims.folder / "nowhere"))  # no Slurm on this machine
    assert slurmctl.queue_states(["5"]) is None and slurmctl.accounting_states(["5"]) is None


@pytest.mark.parametrize("squeue", [
    {"stderr": "slurm_load_jobs error: Unable to contact slurm controller\n", "exit_code": 1},
    {"delay": 30},  # past TIMEOUT_S
])
def test_status_without_an_answer_shows_the_recorded_state_and_writes_nothing(tmp_path, slurm_shims, monkeypatch,
                                                                             capsys, squeue):
    slurm_shims.answer("squeue", **squeue)
    slurm_shims.answer("sacct", exit_code=1)
    monkeypatch.setattr(slurmctl, "TIMEOUT_S", 0.5)
    run = make_run(tmp_path, status="running", job=Job("slurm", "41"), executor="slurm")
    before = run.info_file.read_bytes()
    assert control.cmd_status(str(tmp_path / "exp")) == 0
    out, err = capsys.readouterr()
    assert "running (Slurm unreachable)" in out and "squeue did not answer" in err
    assert run.info_file.read_bytes() == before
    (view,) = executor.views([run], write_back=True)  # submit --wait: nothing learnt, nothing written
    assert view.record.status == "running" and run.info_file.read_bytes() == before
    with pytest.raises(RuntimeError, match="scancel 41 failed"):  # cancel still tries: the run is not final
        slurm_shims.answer("scancel", exit_code=1)
        control.cancel(run)


def test_status_through_the_cli_with_squeue_failing(tmp_path, slurm_shims):
    slurm_shims.fail("squeue", stderr="error: Unable to contact slurm controller")
    slurm_shims.answer("sacct", exit_code=1)
    run = make_run(tmp_path, status="running", job=Job("slurm", "42"), executor="slurm")
    before = run.info_file.read_bytes()
    done = cli(tmp_path, "status", "exp", env=os.environ, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "exp/r1  running (Slurm unreachable)" in done.stdout
    assert run.info_file.read_bytes() == before


def _ended_ref() -> procs.ProcessRef:
    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    ref = procs.current(ended.pid)
    ended.wait()  # the recorded process is gone (its pid may be another's by now)
    return ref


def test_a_local_run_whose_supervisor_is_gone_while_a_rank_lives_on(tmp_path, fake_slurm):
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = make_run(tmp_path, status="running", executor="local", launcher=_ended_ref().to_dict())
        run.proc_file(0).write_text(json.dumps(procs.current(rank.pid).to_dict()))
        before = run.info_file.read_bytes()
        (view,) = executor.views([run])
        assert view.record.status == "running" and view.note == "supervisor gone"
        assert "running (supervisor gone)" in control.status_table([run], [view])
        assert control.still_running(run, executor.views([run])[0]) == f"its processes are alive: rank 0 pid {rank.pid}"
        assert run.info_file.read_bytes() == before
    finally:
        rank.kill()


def test_a_local_run_whose_every_process_ended_is_failed(tmp_path, fake_slurm):
    supervisor, rank = _ended_ref(), _ended_ref()
    run = make_run(tmp_path, status="running", executor="local", launcher=supervisor.to_dict())
    run.proc_file(0).write_text(json.dumps(rank.to_dict()))
    before = run.info_file.read_bytes()
    (view,) = executor.views([run])
    assert view.record.status == "failed" and run.info_file.read_bytes() == before  # status shows it, writes nothing
    assert view.record.error.message.startswith(
        f"every process of the run ended before it recorded its end (supervisor pid {supervisor.pid} ")
    assert f"rank 0 pid {rank.pid} " in view.record.error.message
    assert control.still_running(run, executor.views([run])[0]) is None
    (view,) = executor.views([run], write_back=True)
    assert view.record.status == "failed" and run_info(run.path)["status"] == "failed"
    assert "every process of the run ended" in run_info(run.path)["error"]["message"]


def test_a_pending_run_counts_its_supervisor_only(tmp_path, fake_slurm):
    """The rank records of a pending run are of an earlier start: a resumed run waiting
    for its new supervisor is not failed for them."""
    run = make_run(tmp_path, status="pending", executor="local")
    run.proc_file(0).write_text(json.dumps(_ended_ref().to_dict()))
    assert executor.views([run])[0].record.status == "pending"
    run.update(launcher=_ended_ref())
    assert executor.views([run])[0].record.status == "failed"
    run.update(status="preempted")  # stopped: its ranks recorded it, whatever became of them
    assert executor.views([run])[0].record.status == "preempted"


def old_job_id(run: RunDir, value) -> RunDir:
    """The run with run.json's key of earlier versions, slurm_job_id, set to ``value``."""
    info = json.loads(run.info_file.read_text())
    (info["job"], info["slurm_job_id"]) = (None, value)
    run.info_file.write_text(json.dumps(info))
    return run


def test_status_of_mistyped_fields_names_them(tmp_path, fake_slurm):
    runs = [old_job_id(make_run(tmp_path, "a", status="running", final="epoch 3", requeues="3"), ["7"]),
            make_run(tmp_path, "b", status="failed", error="boom", final=[1, 2], launcher="x",
                     executor="local"),
            make_run(tmp_path, "c", status=5, final={"epoch": 2, "val_acc": "high"}, hosts="n1")]
    found = executor.views(runs)
    problems = [p for view in found for p in view.problems]
    assert "run.json: final is 'epoch 3' (str), not a mapping of metrics; ignored" in problems
    assert "run.json: requeues is '3' (str), not a whole number; ignored" in problems
    assert "run.json: slurm_job_id is ['7'] (a list), not a Slurm job id such as 123 or 123_4; ignored" in problems
    assert any(p.startswith("run.json: error is 'boom'") for p in problems)
    assert any(p.startswith("run.json: final.val_acc is 'high'") for p in problems)
    assert len(problems) == 9  # and launcher, status, final (a list), hosts
    lines = control.status_table(runs, found).splitlines()
    assert lines[1].split() == ["exp/a", "running", "-", "-", "-"]
    assert lines[2].split() == ["exp/b", "failed", "-", "-", "-"]
    assert lines[3].split() == ["exp/c", "unknown", "2", "-", "-"]


def test_cancel_signals_only_processes_it_verified(tmp_path, monkeypatch):
    """A stale record naming a pid that another process now holds is never signalled."""
    unrelated = subprocess.Popen(["setsid", "sleep", "60"])
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = make_run(tmp_path, status="running", executor="local")
        stale = procs.current(unrelated.pid).to_dict()
        stale["start_ticks"] -= 1  # recorded from an earlier process with that pid
        (run.proc_file(0)).write_text(json.dumps(stale))
        (run.proc_file(1)).write_text(json.dumps(procs.current(ours.pid).to_dict()))
        (run.proc_file(2)).write_text(json.dumps({**stale, "host": "node9"}))
        lines = control.cancel(run)
        assert lines[0] == f"rank 0: not signalled: pid {unrelated.pid} now belongs to another process " \
                           "(the recorded one exited)"
        assert lines[1].startswith(f"rank 1: sent SIGTERM to pid {ours.pid}")
        assert lines[2].startswith("rank 2: it runs on node9") and "its rank 0 reads the cancel" in lines[2]
        assert ours.wait(timeout=10) == -15 and unrelated.poll() is None
        # rank 2 may still live elsewhere: the run is not cancelled before its rank 0 says so
        assert run_info(run.path)["status"] == "running" and run_info(run.path)["cancel_requested_at"]
    finally:
        unrelated.kill()
        ours.kill()
