"""The run record (clusterjob.core.record): one typed record of run.json, read
tolerantly, written only through record fields, with run.json's layout unchanged."""

from __future__ import annotations

import json

import pytest

from clusterjob.core import record
from clusterjob.core.procs import ProcessRef
from clusterjob.core.record import Job, RunError, RunRecord
from clusterjob.core.rundir import RunDir, create_run

# A run.json as written before the record existed (a failed local run of a sweep).
OLD_RUN_JSON = {
    "run_id": "20240101-120000-ab12-001", "name": "exp", "status": "failed", "params": {"train.lr": 0.05},
    "slurm_job_id": None, "slurm_job_submitted": None, "hosts": ["node1"], "world_size": 2, "requeues": 0, "started_at": "2024-01-01T12:00:01",
    "finished_at": "2024-01-01T12:05:00", "final": {"epoch": 2, "val_acc": 0.5}, "submit_dir": "/home/u/proj",
    "git_sha": "abc123", "executor": "local",
    "launcher": {"host": "node1", "boot_id": "b", "pid": 4242, "start_ticks": 99},
    "master_addr": "127.0.0.1", "master_port": 29500, "versions": {"python": "3.11", "torch": "2.3"},
    "backend": "gloo", "amp": "off", "device": "cpu", "restarts": 1,
    "error": {"rank": 1, "message": "RuntimeError: boom", "traceback": "Traceback...", "at": "2024-01-01T12:04:59"},
    "entrypoint": {"script": "train.py", "args": ["--lr", "0.05"], "params": {"lr": 0.05}, "snapshot": True},
    "code_dir": "/r/code", "snapshot_of": "/home/u/proj", "log_dir": "/r/.slurm", "stopped_at": "2024-01-01T12:04",
    "cancel_requested_at": "2024-01-01T12:04:30", "retries": 1, "after": ["/r/train/20231231-090000-cd34"],
    "attempts": [{"at": "2024-01-01T12:02:00", "hosts": ["node1"], "why": "rank 1 was killed by SIGKILL", "retry": 1,
                  "job": None}],
    "sessions": [{"at": "2024-01-01T12:00:00+00:00", "job": "12_3", "checkpoint_at": None, "knows_checkpoints": True},
                 {"at": "2024-01-01T12:03:00+00:00", "job": "12_3", "checkpoint_at": "2024-01-01T12:01:30+00:00",
                  "knows_checkpoints": True}],
    "warnings": ["entrypoint.metrics.acc: the regex 'acc (\\S+)' never matched a number on rank 0's output"],
    "tensorboard_dir": "/r/tensorboard", "mlflow_tracking_uri": "file:///home/u/proj/mlruns",
    "mlflow_experiment_id": "1", "mlflow_run_id": "0a1b2c", "wandb_run_id": "k3j4h5g6",
    "wandb_url": "https://wandb.ai/u/exp/runs/k3j4h5g6",
    "stalls": [{"n": 1, "at": "2024-01-01T12:02:00+00:00", "since": "2024-01-01T12:01:00+00:00",
                "line": "rank 1 on node2: time.sleep at train.py:40; rank 0 in all_reduce", "rank": 1, "host": "node2",
                "action": "retry", "ended_at": None}],
    "excluded_hosts": ["node2"],
    "straggler": {"rank": 1, "host": "node2", "wait_pct": 45.5, "at": "2024-01-01T12:01:30+00:00"},
}


def _run(tmp_path) -> RunDir:
    return create_run(tmp_path, "exp", "r1", "name: exp\n", {"train.lr": 0.1})


def test_a_field_not_in_the_record_cannot_be_written(tmp_path):
    run = _run(tmp_path)
    before = run.info_file.read_bytes()
    with pytest.raises(TypeError):
        run.update(status="running", stauts="completed")
    assert run.info_file.read_bytes() == before


def test_the_record_is_frozen():
    with pytest.raises(AttributeError):
        RunRecord().status = "running"  # type: ignore[misc]


# The same run as this version writes it: its job (none) under ``job``, with the key of
# earlier versions, slurm_job_id, kept beside it; its spec's env (none recorded); its
# search and prune verdict (none: not a trial of a search); and the reason it ended so
# (none: no stall's verdict failed it); what its tasks run (none: the runner, one per rank).
NEW_RUN_JSON = {**OLD_RUN_JSON, "job": None, "env": None, "search": None, "pruned": None, "reason": None,
                "task": None}


def test_an_old_run_json_reads_into_the_record_unchanged(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(OLD_RUN_JSON, indent=2))
    got, problems = record.read_record(tmp_path)
    assert problems == []
    assert got.to_dict() == {key: value for key, value in NEW_RUN_JSON.items() if key != "slurm_job_id"}
    assert got.launcher == ProcessRef("node1", "b", 4242, 99) and got.error.rank == 1


def test_every_field_written_reads_back_equal(tmp_path):
    run = _run(tmp_path)
    want = record.checked(OLD_RUN_JSON)[0]
    values = {name: getattr(want, name) for name in record.FIELDS}
    written = run.update(**values)
    assert written == want and run.read() == want
    assert json.loads(run.info_file.read_text()) == NEW_RUN_JSON  # the JSON layout of before, and the job


@pytest.mark.parametrize("raw, job", [
    ({"slurm_job_id": "12_3"}, Job("slurm", "12_3")),  # an earlier version's run of a Slurm job
    ({"slurm_job_id": 12}, Job("slurm", "12")),
    ({"job": {"executor": "slurm", "id": "40"}, "slurm_job_id": "40"}, Job("slurm", "40")),
    ({"job": {"executor": "toy", "id": "t-1"}, "slurm_job_id": None}, Job("toy", "t-1")),
    ({"job": None, "slurm_job_id": None}, None),
    ({}, None),
])
def test_the_job_is_read_from_either_key(raw, job):
    got, problems = record.checked(raw)
    assert (got.job, problems) == (job, [])
    assert got.slurm_job_id == (job.id if job is not None and job.executor == "slurm" else None)


def test_a_damaged_job_falls_back_to_the_key_of_earlier_versions():
    got, problems = record.checked({"job": {"executor": "slurm"}, "slurm_job_id": "77"})
    assert got.job == Job("slurm", "77")
    assert problems == ["run.json: job is {'executor': 'slurm'} (a mapping), not a job such as "
                        '{"executor": "slurm", "id": "123_4"}; ignored']


@pytest.mark.parametrize("job, old_key", [(Job("slurm", "5_1"), "5_1"), (Job("toy", "t-1"), None), (None, None)])
def test_writing_the_job_also_writes_the_key_earlier_versions_read(tmp_path, job, old_key):
    (tmp_path / "run.json").write_text(json.dumps({"status": "pending", "slurm_job_id": "3"}))
    record.update(tmp_path, job=job)
    written = json.loads((tmp_path / "run.json").read_text())
    assert written == {"status": "pending", "job": job.to_dict() if job else None, "slurm_job_id": old_key}


def test_update_writes_only_the_fields_given(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"status": "running", "later_key": [1]}))
    record.update(tmp_path, requeues=2)
    assert json.loads((tmp_path / "run.json").read_text()) == {"status": "running", "later_key": [1], "requeues": 2}


def test_a_cancelled_run_stays_cancelled_unless_reopened(tmp_path):
    run = _run(tmp_path)
    run.update(status="cancelled")
    late = run.update(status="completed", final={"epoch": 3}, error=RunError(0, "late"))
    assert late.status == "cancelled" and late.final == {"epoch": 3} and late.error is None
    assert run.update(reopen=True, status="pending").status == "pending"


def test_a_run_a_stall_failed_keeps_its_end_against_late_writes_but_for_its_retry(tmp_path):
    run = _run(tmp_path)
    run.update(status="failed", error=RunError(1, "stalled: rank 1 on n2: time.sleep at t.py:4; rank 0 in all_reduce"))
    late = run.update(status="preempted", error=RunError(0, "RuntimeError: Connection closed by peer"), stopped_at="x")
    assert (late.status, late.error.rank, late.stopped_at) == ("failed", 1, "x")
    retried = run.update(status="pending", error=None, retries=1)
    assert (retried.status, retried.error, retried.retries) == ("pending", None, 1)


def test_error_records_keep_their_layout():
    assert RunError(None, "gone").to_dict() == {"rank": None, "message": "gone", "traceback": ""}
    try:
        raise ValueError("bad")
    except ValueError as exc:
        error = RunError.of_exception(3, exc)
    assert list(error.to_dict()) == ["rank", "message", "traceback", "at"]
    assert error.message == "ValueError: bad" and "Traceback" in error.traceback


@pytest.mark.parametrize("text, problem, status", [
    ("", "cut off or not a JSON object (read: nothing)", None),
    ('{"run_id": "r9", "status": "running", "world_size": 4, "params": {"a": 1}, "fin', "read: params", "running"),
    ("[1, 2]", "not a JSON object", None),
    ("[" * 100000, "not a JSON object", None),
])
def test_a_damaged_run_json_is_salvaged_with_a_problem(tmp_path, text, problem, status):
    (tmp_path / "run.json").write_text(text)
    got, problems = record.read_record(tmp_path)
    assert got.status == status and len(problems) == 1 and problem in problems[0]


def test_mistyped_fields_become_problems_not_crashes(tmp_path):
    raw = {"status": 5, "hosts": "n1", "error": "boom", "final": {"a": "x", "b": 1}, "launcher": 3,
           "versions": [1], "world_size": True, "slurm_job_id": 12, "warnings": ["fine", 3]}
    got, problems = record.checked(raw)
    assert (got.status, got.hosts, got.error, got.final, got.launcher, got.versions, got.world_size) == (
        None, [], None, {"b": 1}, None, None, None)
    assert got.slurm_job_id == "12" and got.warnings == [] and len(problems) == 8
    assert "run.json: warnings is ['fine', 3] (a list), not a list of lines of text; ignored" in problems
    assert all(p.startswith("run.json: ") and p.endswith("; ignored") for p in problems)


def test_the_logger_runs_are_text_fields(tmp_path):
    got, problems = record.checked({"mlflow_run_id": 12, "wandb_url": None, "tensorboard_dir": "/r/tb"})
    assert (got.mlflow_run_id, got.wandb_url, got.tensorboard_dir) == (None, None, "/r/tb")
    assert problems == ["run.json: mlflow_run_id is 12 (int), not text; ignored"]


def test_a_missing_run_json_reads_as_an_empty_record(tmp_path):
    reading = record.read(tmp_path / "run.json")
    assert reading.record == RunRecord() and reading.empty
    assert reading.file_problems == ["run.json is missing; status unknown"]


@pytest.mark.parametrize("sessions, kept, problem", [
    ("often", [], "sessions is 'often' (str), not a list of sessions"),
    ([7, {"at": "2024-01-01T12:00:00+00:00"}], [record.Session("2024-01-01T12:00:00+00:00")],
     "sessions[0] is 7 (int), not a mapping"),
    ([{"at": 5, "job": "9", "knows_checkpoints": "yes"}], [record.Session(None, "9")],
     "sessions[0].knows_checkpoints is 'yes' (str), not true or false"),
])
def test_a_damaged_sessions_field_keeps_what_it_can_and_says_what_it_dropped(tmp_path, sessions, kept, problem):
    (tmp_path / "run.json").write_text(json.dumps({"status": "running", "sessions": sessions}))
    got, problems = record.read_record(tmp_path)
    assert got.sessions == kept and got.status == "running"
    assert any(problem in p for p in problems), problems


def test_the_health_fields_read_back_typed_and_a_damaged_one_is_a_problem(tmp_path):
    got, problems = record.checked({"stalls": [{"n": "one", "line": "x", "action": "warn"}, 3],
                                    "straggler": {"rank": 1, "host": "n2", "wait_pct": "much"},
                                    "excluded_hosts": "node2"})
    assert got.stalls == [record.Stall(None, None, None, "x", action="warn")]
    assert got.straggler == record.Straggler(1, "n2", None) and got.excluded_hosts == []
    assert sorted(p.split(" is ")[0] for p in problems) == [
        "run.json: excluded_hosts", "run.json: stalls[0].n", "run.json: stalls[1]", "run.json: straggler.wait_pct"]


def test_an_amended_record_is_the_record_replace_makes():
    """``amended`` skips the generated __init__ (status gives 10,000 runs their jobs
    through it): the same record as dataclasses.replace, the original unchanged, and an
    unknown field refused as replace refuses it."""
    import dataclasses

    base, _ = record.checked({"run_id": "r", "status": "pending", "hosts": ["n1"], "params": {"lr": 0.1}})
    fields = {"job": Job("slurm", "12_3"), "status": "failed", "error": RunError(0, "m", None, None)}
    new = record.amended(base, **fields)
    assert new == dataclasses.replace(base, **fields) and type(new) is RunRecord
    assert (base.status, base.job, new.hosts, new.slurm_job_id) == ("pending", None, ["n1"], "12_3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.status = "running"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'nope'"):
        record.amended(base, nope=1)
    assert vars(record.checked({})[0]) == vars(RunRecord())  # ``checked`` gives every field, as __init__ does
