"""Runs a Slurm sweep's tasks make (clusterjob.core.unmade): submit writes one store,
every reader sees each run as its folder will hold it, and the first writer (the task,
a cancel, a resume) makes the folder exactly as submit would have."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

from clusterjob.core import sweep, unmade
from clusterjob.core.record import Job, materialize
from clusterjob.core.rundir import RunDir, find_runs, make_runs, scan_runs

POINTS = [(i, ["name: exp\n", f"train:\n  lr: {0.1 * (i + 1):g}\n", "model:\n  arch: mlp\n"],
           {"train.lr": round(0.1 * (i + 1), 6)}, {"env": {"A": "1"}}) for i in range(12)]


def made(tmp_path: Path, by_tasks: bool, where: str) -> list[RunDir]:
    return make_runs(tmp_path / where, "exp", POINTS, executor="slurm", by_tasks=by_tasks, submit_dir="/home/u")


def files_of(run: RunDir) -> tuple[str, dict]:
    return run.spec_file.read_text(), json.loads(run.info_file.read_text())


def test_a_sweep_made_by_its_tasks_writes_its_record_and_one_store_and_no_run_folder(tmp_path):
    runs = made(tmp_path, True, "lazy")
    parent = tmp_path / "lazy" / "exp"
    assert sorted(p.name for p in parent.iterdir()) == [".sweeps"]
    stamp = sweep.member(runs[0].path).stamp
    assert sorted(p.name for p in (parent / ".sweeps").iterdir()) == [f"{stamp}.json",
                                                                     f"{stamp}.points"]
    assert [run.run_id for run in runs] == [f"{stamp}-{i:03d}" for i in range(12)]
    # every reader finds them, in their order, as pending runs with their params and fields
    assert [r.run_id for r in find_runs(parent)] == [r.run_id for r in runs]
    assert [r.key for r in scan_runs(tmp_path / "lazy")] == [f"exp/{r.run_id}" for r in runs]
    assert all(run.exists() for run in runs) and not RunDir(parent / f"{stamp}-012").exists()
    info = runs[3].read()
    assert (info.status, info.params, info.executor, info.run_id, info.name) == (
        "pending", {"train.lr": 0.4}, "slurm", runs[3].run_id, "exp")
    assert runs[3].read_checked()[1] == []


def test_a_run_made_by_its_task_holds_what_submit_would_have_written(tmp_path):
    eager, lazy = made(tmp_path, False, "eager"), made(tmp_path, True, "lazy")
    for index in (0, 7, 11):
        assert materialize(lazy[index].path) is True
        assert materialize(lazy[index].path) is False  # once
        spec_e, info_e = files_of(eager[index])
        spec_l, info_l = files_of(lazy[index])
        assert spec_l == spec_e == "".join(POINTS[index][1])
        assert {**info_l, "run_id": None} == {**info_e, "run_id": None}
        assert lazy[index].logs.is_dir() and not [p for p in lazy[index].path.iterdir() if p.name.endswith(".tmp")]
    assert lazy[7].read() == RunDir(lazy[7].path).read()  # the made file is the record now


def test_a_write_to_an_unmade_run_makes_it_first(tmp_path):
    runs = made(tmp_path, True, "lazy")
    runs[2].update(status="cancelled", job=Job("slurm", "77_2"))
    spec_text, raw = files_of(runs[2])
    assert spec_text == "".join(POINTS[2][1])
    assert (raw["status"], raw["slurm_job_id"], raw["params"]) == ("cancelled", "77_2", {"train.lr": 0.3})
    assert not runs[3].path.exists() and runs[3].read().status == "pending"


def _make(folder: str) -> None:
    materialize(folder)


def test_ranks_making_the_same_run_at_once_make_it_once_and_whole(tmp_path):
    runs = made(tmp_path, True, "lazy")
    with multiprocessing.get_context("fork").Pool(6) as pool:
        pool.map(_make, [str(runs[5].path)] * 24)
    spec_text, raw = files_of(runs[5])
    assert spec_text == "".join(POINTS[5][1]) and raw["status"] == "pending"
    assert sorted(p.name for p in runs[5].path.iterdir()) == ["logs", "run.json", "spec.yaml"]


def test_a_damaged_or_missing_store_lists_no_run_and_raises_nothing(tmp_path):
    runs = made(tmp_path, True, "lazy")
    where = sweep.member(runs[0].path)
    store = unmade.store_file(where.parent, where.stamp)
    store.write_text('{"count": 12, "texts": [')
    assert find_runs(where.parent) == [] and not runs[0].exists()
    assert runs[0].read().status is None and materialize(runs[0].path) is False
    store.unlink()
    assert find_runs(where.parent) == [] and not os.path.exists(runs[0].path)


def test_a_made_run_reads_its_own_files_and_the_others_stay_unmade(tmp_path):
    runs = made(tmp_path, True, "lazy")
    materialize(runs[0].path)
    runs[0].update(status="completed")
    assert [r.read().status for r in find_runs(runs[0].path.parent)] == ["completed"] + ["pending"] * 11
    assert not runs[1].path.exists() and unmade.listed(runs[1].path) and runs[0].info_file.exists()


HOSTILE_STORES = [
    "[]", "null", '"x"', '{"count": 1}',
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [{}], "points": [[0, [1], 0, 0]]}',  # a text past the end
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [{}], "points": [[0, [0], 0, 3]]}',  # a value past it
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [[]], "points": [[0, [0], 0, 0]]}',  # params no mapping
    '{"count": 1, "fields": {}, "texts": [7], "values": [{}], "points": [[0, [0], 0, 0]]}',
    '{"count": 1, "fields": [], "texts": ["a"], "values": [{}], "points": [[0, [0], 0, 0]]}',
    '{"count": "1", "fields": {}, "texts": ["a"], "values": [{}], "points": [[0, [0], 0, 0]]}',
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [{}], "points": [["0", [0], 0, 0]]}',
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [{}], "points": [[0, [0], 0]]}',
    '{"count": 1, "fields": {}, "texts": ["a"], "values": [{}], "points": {"0": 1}}',
    '{"count":1,"fields":{},"texts":["a"],"values":[{}],"points":[[0,[0],0,0],[1,[0],0,0]]}',  # past its count
    '{"count":2,"fields":{},"texts":["a"],"values":[{}],"points":[[0,[0],0,0],[1,[0],0,0]],',  # cut off
    '{"count":0,"fields":{},"texts":["a"],"values":[{}],"points":[]}',
    '{"count":9999999,"fields":{},"texts":["a"],"values":[{}],"points":[[0,[0],0,0],[1,[0],0,0]]}',
]


def test_a_hostile_store_lists_no_run_and_makes_nothing(tmp_path):
    for number, text in enumerate(HOSTILE_STORES):
        runs = make_runs(tmp_path / str(number), "exp", POINTS[:2], executor="slurm", by_tasks=True)
        where = sweep.member(runs[0].path)
        unmade.store_file(where.parent, where.stamp).write_text(text)
        assert find_runs(where.parent) == [], text
        assert materialize(runs[0].path) is False and not runs[0].path.exists(), text
        assert runs[0].read().status is None, text


def test_only_the_names_the_sweep_gives_are_its_runs(tmp_path):
    runs = made(tmp_path, True, "lazy")
    stamp = sweep.member(runs[0].path).stamp
    for name in (f"{stamp}-0005", f"{stamp}-5", f"{stamp}-012", f"{stamp}-999", stamp):
        assert not RunDir(runs[0].path.parent / name).exists(), name
        assert materialize(runs[0].path.parent / name) is False and not (runs[0].path.parent / name).exists()


def test_the_report_reads_an_unmade_run_as_the_same_run_made(tmp_path):
    from clusterjob.report import specfile
    from clusterjob.report.results import load_runs

    made(tmp_path, False, "eager")
    made(tmp_path, True, "lazy")
    eager = load_runs(tmp_path / "eager" / "exp", cache=False)
    lazy = load_runs(tmp_path / "lazy" / "exp", cache=False)
    assert len(lazy) == 12 and list(lazy.columns) == list(eager.columns)
    same = [c for c in eager.columns if c not in ("run_id", "path")]
    assert lazy[same].astype(str).equals(eager[same].astype(str)), (lazy[same], eager[same])
    assert list(lazy["train.lr"]) == [round(0.1 * (i + 1), 6) for i in range(12)]
    # the report groups by any key of each run's spec.yaml: an unmade run's is its store's
    lazy_run, eager_run = (next(r for r in find_runs(tmp_path / where / "exp") if r.run_id.endswith("-007"))
                           for where in ("lazy", "eager"))
    assert not lazy_run.path.exists()
    assert specfile.Reader().read(str(lazy_run.path)) == specfile.Reader().read(str(eager_run.path)) \
        == {"name": "exp", "train.lr": 0.8, "model.arch": "mlp"}


def test_a_run_that_started_and_lost_its_run_json_is_no_unmade_run(tmp_path):
    runs = made(tmp_path, True, "lazy")
    materialize(runs[4].path)
    (runs[4].path / "metrics.jsonl").write_text('{"epoch": 0, "val_acc": 0.5}\n')
    runs[4].info_file.unlink()  # damage: its record is gone, not reborn pending from the store
    record, problems = runs[4].read_checked()
    assert record.status is None and problems == ["run.json is missing; status unknown"]
    assert materialize(runs[4].path) is False and not runs[4].info_file.exists()
    assert [r.read().status for r in find_runs(runs[0].path.parent)][3:6] == ["pending", None, "pending"]
    half = runs[6].path
    (half / "logs").mkdir(parents=True)
    (half / "spec.yaml").write_text("half made\n")  # a task killed while it made the folder: made again, as it was
    assert runs[6].read().status == "pending" and materialize(half) is True
    assert (half / "spec.yaml").read_text() == "half made\n" and runs[6].read().status == "pending"


def test_a_scan_of_a_sweep_whose_runs_are_all_made_does_not_read_its_store(tmp_path, monkeypatch):
    """Its count, at the head of the file, tells that all are there: a status of 10,000
    started runs does not parse 4 MB for names it found already."""
    runs = made(tmp_path, True, "lazy")
    for run in runs[:-1]:
        materialize(run.path)
    read = []
    real = unmade._store
    monkeypatch.setattr(unmade, "_store", lambda *args: read.append(args) or real(*args))
    parent = runs[0].path.parent
    assert [r.run_id for r in find_runs(parent)] == [r.run_id for r in runs] and read  # one unmade: read
    materialize(runs[-1].path)
    read.clear()
    assert [r.run_id for r in find_runs(parent)] == [r.run_id for r in runs] and read == []
    assert unmade.names(parent, present={r.run_id for r in runs}) == [] and read == []
    assert sorted(unmade.names(parent, present={r.run_id for r in runs[1:]})) == [runs[0].run_id]
