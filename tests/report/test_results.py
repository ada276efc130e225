"""clusterjob.report.results: run folders into pandas tables.

The helpers ``write_run`` and ``sweep`` build run folders exactly as the worker
writes them; tests/report/test_report.py uses them too.
"""

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clusterjob.core.rundir import find_runs
from clusterjob.report import reading
from clusterjob.report.results import ResultsWarning, load_epochs, load_runs

T0 = "2026-11-21T23:59:00+00:00"


def epoch_line(epoch: int, val_acc: float, val_loss: float = 1.0, **extra) -> dict:
    """One metrics.jsonl object with every documented key."""
    line = {"epoch": epoch, "step": 100 * epoch, "train_loss": 2.0 / epoch, "train_acc": val_acc + 0.05,
            "val_loss": val_loss, "val_acc": val_acc, "lr": 0.1, "epoch_time_s": 10.0,
            "samples_per_s": 500.0 + epoch}
    line.update(extra)
    return line


def write_run(root: Path, run_id: str, params: dict, lines: list, status: str = "completed",
              name: str = "exp", wall_s=None, **fields) -> Path:
    """A run folder with run.json and metrics.jsonl (``lines``: epoch dicts)."""
    run = root / name / run_id
    run.mkdir(parents=True)
    finished = None if wall_s is None else f"2026-11-22T00:{wall_s // 60:02d}:{wall_s % 60:02d}+00:00"
    info = {"run_id": run_id, "name": name, "status": status, "params": params,
            "slurm_job_id": f"77_{run_id}", "hosts": ["n1"], "world_size": 2, "backend": "gloo", "amp": "bf16",
            "master_addr": "n1", "master_port": 29500, "requeues": 0, "versions": {}, "git_sha": None,
            "started_at": "2026-11-22T00:00:00+00:00", "finished_at": finished,
            "final": lines[-1] if lines else None, "error": None, **fields}
    (run / "run.json").write_text(json.dumps(info, indent=2))
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "spec.yaml").write_text(spec_yaml(params))
    return run


def spec_yaml(params: dict) -> str:
    """A resolved spec holding the sweep point's values."""
    train = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("train.")}
    body = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in train.items())
    return f"name: exp\ntrain:\n{body}"


# The known sweep: 2 lrs x 3 seeds. Final val_acc, val_loss and wall time per run;
# every run peaks one epoch before the end at final + 0.01.
FINAL = {0.1: [0.80, 0.82, 0.84], 0.05: [0.70, 0.74, 0.78]}
LOSS = {0.1: [0.5, 0.6, 0.7], 0.05: [0.9, 1.0, 1.1]}
WALL = {0.1: [100, 110, 120], 0.05: [None, None, None]}  # None: sum of epoch_time_s = 30 s


def sweep(root: Path) -> Path:
    """Write the known sweep under root/exp and return that folder."""
    index = 0
    for lr in (0.1, 0.05):
        for seed in range(3):
            acc, loss = FINAL[lr][seed], LOSS[lr][seed]
            lines = [epoch_line(1, 0.5), epoch_line(2, acc + 0.01), epoch_line(3, acc, loss)]
            write_run(root, f"r{index}", {"train.lr": lr, "train.seed": seed}, lines, wall_s=WALL[lr][seed])
            index += 1
    return root / "exp"


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    return sweep(tmp_path / "results")


def quiet_load(root, **kw) -> pd.DataFrame:
    """load_runs, failing on any warning (clean input must give none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_runs(root, **kw)


def test_load_runs_values_and_dtypes(exp):
    runs = quiet_load(exp)
    assert list(runs["run_id"]) == [f"r{i}" for i in range(6)]
    assert list(runs.columns[:5]) == ["run_id", "name", "status", "train.lr", "train.seed"]
    assert isinstance(runs["status"].dtype, pd.CategoricalDtype)
    assert runs["train.lr"].dtype == np.float64 and runs["train.seed"].dtype == np.int64
    assert runs["epochs"].dtype == np.int64 and list(runs["epochs"]) == [3] * 6
    assert runs["val_acc"].tolist() == pytest.approx(FINAL[0.1] + FINAL[0.05])
    assert runs["best_val_acc"].tolist() == pytest.approx([a + 0.01 for a in FINAL[0.1] + FINAL[0.05]])
    assert list(runs["best_epoch"]) == [2] * 6
    assert runs["val_loss"].tolist() == pytest.approx(LOSS[0.1] + LOSS[0.05])
    assert runs["wall_time_s"].tolist() == pytest.approx([100, 110, 120, 30, 30, 30])
    assert runs["samples_per_s"].tolist() == pytest.approx([502.0] * 6)  # mean of 501, 502, 503
    assert runs["world_size"].tolist() == [2] * 6 and runs["requeues"].tolist() == [0] * 6
    assert runs["slurm_job_id"].iloc[0] == "77_r0" and runs["warnings"].isna().all()
    assert str(runs["started_at"].dtype).startswith("datetime64") and runs["finished_at"].iloc[3] is pd.NaT
    assert runs.attrs["warnings"] == []


def test_load_epochs_one_row_per_run_and_epoch(exp):
    epochs = load_epochs(exp)
    assert len(epochs) == 18
    assert list(epochs.columns[:4]) == ["run_id", "name", "train.lr", "train.seed"]
    assert epochs["epoch"].dtype == np.int64 and epochs["step"].dtype == np.int64
    assert epochs["epoch"].tolist()[:3] == [1, 2, 3]
    r4 = epochs[epochs["run_id"] == "r4"]
    assert r4["val_acc"].tolist() == pytest.approx([0.5, 0.75, 0.74])
    assert (r4["train.lr"] == 0.05).all() and (r4["train.seed"] == 1).all()
    for metric in ("train_loss", "train_acc", "val_loss", "lr", "epoch_time_s", "samples_per_s"):
        assert epochs[metric].dtype == np.float64


def test_extra_metrics_are_kept_with_nan_where_absent(tmp_path):
    write_run(tmp_path, "a", {}, [epoch_line(1, 0.5, val_acc_ema=0.55, lr_fc=1.0)])
    write_run(tmp_path, "b", {}, [epoch_line(1, 0.6)])
    write_run(tmp_path, "c", {}, [epoch_line(1, 0.7, note="resumed"), epoch_line(2, 0.8, note=None)])
    with pytest.warns(ResultsWarning, match=r"exp/c: metrics.jsonl: note is 'resumed' \(not a number\) on line 1"):
        epochs = load_epochs(tmp_path / "exp")
    assert epochs["note"].isna().all() and epochs["val_acc"].tolist()[-2:] == [0.7, 0.8]
    assert epochs["val_acc_ema"].tolist()[0] == 0.55 and np.isnan(epochs["val_acc_ema"].iloc[1])
    assert "lr_fc" in epochs.columns
    with pytest.warns(ResultsWarning):
        runs = load_runs(tmp_path / "exp")
    assert runs["val_acc_ema"].iloc[0] == 0.55


def test_truncated_last_line_warns_and_keeps_whole_lines(exp):
    metrics = exp / "r0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"epoch": 4, "val_a')
    with pytest.warns(ResultsWarning, match=r"r0: metrics.jsonl: last line is cut off"):
        runs = load_runs(exp)
    r0 = runs.iloc[0]
    assert r0["epochs"] == 3 and r0["val_acc"] == pytest.approx(0.80) and r0["status"] == "completed"
    assert "cut off" in r0["warnings"] and len(runs.attrs["warnings"]) == 1


def test_bad_middle_line_and_repeated_epochs(tmp_path):
    run = write_run(tmp_path, "a", {}, [epoch_line(1, 0.1), epoch_line(2, 0.2)])
    text = json.dumps(epoch_line(1, 0.1)) + "\nnot json\n" + json.dumps(epoch_line(2, 0.2)) + "\n"
    (run / "metrics.jsonl").write_text(text + json.dumps(epoch_line(2, 0.3)) + "\n")
    with pytest.warns(ResultsWarning) as caught:
        epochs = load_epochs(tmp_path / "exp")
    messages = " ".join(str(w.message) for w in caught)
    assert "line 2" in messages and "repeated" in messages
    assert epochs["epoch"].tolist() == [1, 2] and epochs["val_acc"].tolist() == [0.1, 0.3]


def test_missing_run_json_is_unknown_with_params_from_spec(exp):
    (exp / "r1" / "run.json").unlink()
    with pytest.warns(ResultsWarning, match=r"r1: run.json is missing"):
        runs = load_runs(exp)
    r1 = runs.set_index("run_id").loc["r1"]
    assert r1["status"] == "unknown" and r1["name"] == "exp"
    assert r1["train.lr"] == 0.1 and r1["train.seed"] == 1  # read back from spec.yaml
    assert r1["epochs"] == 3 and r1["val_acc"] == pytest.approx(0.82)


def test_partial_run_json_keeps_what_is_readable(exp):
    path = exp / "r2" / "run.json"
    path.write_text(path.read_text()[:150])
    with pytest.warns(ResultsWarning, match="run.json is cut off"):
        runs = load_runs(exp)
    r2 = runs.set_index("run_id").loc["r2"]
    assert r2["status"] == "completed" and r2["train.lr"] == 0.1 and r2["train.seed"] == 2
    assert r2["wall_time_s"] == 30  # finished_at was lost: sum of epoch_time_s


def test_unreadable_run_json_and_no_metrics(tmp_path):
    run = tmp_path / "exp" / "x"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{")
    with pytest.warns(ResultsWarning, match="both unreadable"):
        runs = load_runs(tmp_path / "exp")
    assert runs["status"].tolist() == ["unknown"] and runs["epochs"].tolist() == [0]
    assert np.isnan(runs["val_acc"].iloc[0])


def test_running_run_shows_latest_epoch_and_epoch_time_sum(tmp_path):
    lines = [epoch_line(e, 0.1 * e) for e in range(1, 5)]
    write_run(tmp_path, "a", {}, lines, status="running")
    runs = quiet_load(tmp_path / "exp")
    assert runs["status"].tolist() == ["running"]
    assert runs["epochs"].tolist() == [4] and runs["val_acc"].tolist() == pytest.approx([0.4])
    assert runs["wall_time_s"].tolist() == [40.0]


def test_pending_run_without_metrics_and_final_only(tmp_path):
    write_run(tmp_path, "p", {}, [], status="pending")
    run = write_run(tmp_path, "f", {}, [epoch_line(1, 0.3), epoch_line(2, 0.4)])
    (run / "metrics.jsonl").unlink()
    runs = quiet_load(tmp_path / "exp").set_index("run_id")
    assert runs.loc["p", "epochs"] == 0 and np.isnan(runs.loc["p", "val_acc"])
    assert runs.loc["f", "epochs"] == 2 and runs.loc["f", "val_acc"] == 0.4  # from run.json "final"


def test_error_fields(tmp_path):
    error = {"rank": 1, "message": "RuntimeError: boom", "traceback": "..."}
    write_run(tmp_path, "a", {}, [epoch_line(1, 0.1)], status="failed", error=error)
    runs = quiet_load(tmp_path / "exp")
    assert runs["error"].iloc[0] == "RuntimeError: boom" and runs["error_rank"].iloc[0] == 1


def test_find_runs_at_three_depths(tmp_path):
    sweep(tmp_path)
    write_run(tmp_path, "z", {}, [epoch_line(1, 0.1)], name="other")
    assert [r.run_id for r in find_runs(tmp_path / "exp")] == [f"r{i}" for i in range(6)]
    assert len(find_runs(tmp_path)) == 7  # results/: every name
    assert [r.path for r in find_runs(tmp_path / "exp" / "r3")] == [tmp_path / "exp" / "r3"]
    runs = load_runs(tmp_path)
    assert sorted(runs["name"].unique()) == ["exp", "other"]
    assert load_runs(tmp_path / "exp" / "r3")["run_id"].tolist() == ["r3"]


def test_natural_run_order(tmp_path):
    for run_id in ("r10", "r9", "r1"):
        write_run(tmp_path, run_id, {}, [epoch_line(1, 0.1)])
    assert load_runs(tmp_path / "exp")["run_id"].tolist() == ["r1", "r9", "r10"]


def test_missing_root_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path / "nope")


def test_cache_is_used_and_invalidated(exp, monkeypatch):
    first = load_runs(exp)
    assert (exp / reading.CACHE_NAME).is_file()

    def no_parsing(run):
        raise AssertionError(f"{run.path} parsed again")

    monkeypatch.setattr(reading, "_parse_run", no_parsing)
    pd.testing.assert_frame_equal(load_runs(exp), first)
    assert len(load_epochs(exp)) == 18
    monkeypatch.undo()

    with open(exp / "r5" / "metrics.jsonl", "a") as f:  # the run goes on: one more epoch
        f.write(json.dumps(epoch_line(4, 0.99)) + "\n")
    runs = load_runs(exp)
    assert runs["epochs"].iloc[5] == 4 and runs["val_acc"].iloc[5] == 0.99
    assert runs["val_acc"].iloc[:5].tolist() == first["val_acc"].iloc[:5].tolist()


def test_cache_keeps_warnings_and_survives_corruption(exp):
    (exp / "r0" / "run.json").unlink()
    with pytest.warns(ResultsWarning):
        load_runs(exp)
    with pytest.warns(ResultsWarning, match="run.json is missing"):
        load_runs(exp)  # from the cache, same warning
    (exp / reading.CACHE_NAME).write_bytes(b"garbage")
    with pytest.warns(ResultsWarning):
        assert len(load_runs(exp)) == 6


def test_no_cache_writes_nothing(exp):
    quiet_load(exp, cache=False)
    assert not (exp / reading.CACHE_NAME).exists()


def test_cache_is_written_only_by_a_finished_read(exp, monkeypatch):
    got = reading.collect(exp)
    assert not (exp / reading.CACHE_NAME).exists()  # collect reads; the caller saves on success
    got.save_cache()
    assert (exp / reading.CACHE_NAME).is_file()
    (exp / reading.CACHE_NAME).unlink()
    monkeypatch.setattr(reading.os, "access", lambda path, mode: False)  # a folder we may not write
    load_runs(exp)
    assert sorted(p.name for p in exp.iterdir()) == [f"r{i}" for i in range(6)]


def test_values_that_are_no_numbers_are_nan_and_named(tmp_path):
    lines = [{"epoch": 1, "val_acc": 0.5, "accuracy": "high", "flag": True},
             {"epoch": 2, "val_acc": "0.6", "accuracy": 0.7, "flag": False},
             {"epoch": 3, "val_acc": [0.7], "accuracy": {"top1": 0.8}, "flag": 1}]
    write_run(tmp_path, "a", {}, lines)
    with pytest.warns(ResultsWarning) as caught:
        epochs = load_epochs(tmp_path / "exp")
    messages = [str(w.message) for w in caught]
    assert any("exp/a: metrics.jsonl: accuracy is 'high' (not a number) on line 1, 3" in m for m in messages)
    assert any("val_acc is '0.6' (not a number) on line 2, 3" in m for m in messages)
    assert any("flag is True (not a number) on line 1, 2" in m for m in messages)
    assert np.isnan(epochs["val_acc"].iloc[1]) and epochs["val_acc"].iloc[0] == 0.5  # "0.6" is text
    assert epochs["accuracy"].tolist()[1] == 0.7 and np.isnan(epochs["accuracy"].iloc[0])
    assert np.isnan(epochs["flag"].iloc[0]) and epochs["flag"].iloc[2] == 1.0  # true is no 100%


def test_user_lines_keep_the_last_of_a_repeated_step(tmp_path):
    lines = [{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.5}, {"loss": 9.9},
             {"step": 20, "loss": 1.4}, {"step": 30, "loss": 1.0, "accuracy": 0.6}]
    write_run(tmp_path, "u", {"params.lr": 0.1}, lines)
    with pytest.warns(ResultsWarning, match=r"metrics.jsonl: steps repeated \(20\); kept the last value of each"):
        epochs = load_epochs(tmp_path / "exp")
    assert epochs["step"].tolist() == [10, pd.NA, 20, 30]  # file order; a line without a step stays
    assert epochs["loss"].tolist() == [2.0, 9.9, 1.4, 1.0]
    with pytest.warns(ResultsWarning, match="steps repeated"):
        runs = load_runs(tmp_path / "exp")
    assert runs["epochs"].tolist() == [4]  # no epoch logged: the number of lines
    assert runs["train_loss"].isna().all() and runs["params.lr"].tolist() == [0.1]


def test_resumed_epochs_keep_the_last_line_in_epoch_order(tmp_path):
    run = write_run(tmp_path, "a", {}, [])
    lines = [epoch_line(1, 0.1), epoch_line(2, 0.2), epoch_line(3, 0.3), epoch_line(2, 0.25), epoch_line(3, 0.35)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(ResultsWarning, match=r"epochs repeated \(2, 3\)"):
        epochs = load_epochs(tmp_path / "exp")
    assert epochs["epoch"].tolist() == [1, 2, 3] and epochs["val_acc"].tolist() == [0.1, 0.25, 0.35]


def test_lines_that_are_no_objects_and_deep_nesting(tmp_path):
    run = write_run(tmp_path, "a", {}, [])
    deep = "[" * 100_000 + "]" * 100_000
    text = "\n".join([json.dumps(epoch_line(1, 0.1)), "[1, 2, 3]", deep, "7",
                      json.dumps(epoch_line(2, 0.2, extra=[[[1]]])), ""])
    (run / "metrics.jsonl").write_text(text)
    (run / "run.json").write_text('{"status": "completed", "final": ' + deep + "}")
    with pytest.warns(ResultsWarning) as caught:
        runs = load_runs(tmp_path / "exp")
    messages = " ".join(str(w.message) for w in caught)
    assert "3 line(s) not a JSON object (line 2, 3, 4); skipped" in messages
    assert "extra is [[[1]]] (not a number) on line 5" in messages
    assert "run.json is cut off or not a JSON object (read: status)" in messages
    assert runs["status"].tolist() == ["completed"] and runs["val_acc"].tolist() == [0.2]


@pytest.mark.parametrize("info, problem", [
    ("[1, 2]", "run.json and metrics.jsonl are both unreadable"),
    ('{"status": "completed", "final": "done"}', "final is 'done' (str), not a mapping of metrics"),
    ('{"status": "failed", "error": ["boom"]}', "error is ['boom'] (a list), not a mapping"),
    ('{"status": "completed", "requeues": "3", "world_size": 2.5}', "requeues is '3' (str), not a whole number"),
    ('{"status": "completed", "params": {"train.lr": ' + "[" * 40 + "]" * 40 + "}}", "params.train.lr nests deeper"),
    ('{"status": "completed", "started_at": 5, "epochs": 10}', "started_at is 5 (int), not text"),
    ('{"status": "completed", "final": {"epoch": 1e300, "val_acc": 0.5}}', None),
])
def test_mistyped_run_json_fields_are_named_and_ignored(tmp_path, info, problem):
    run = write_run(tmp_path, "a", {}, [])
    (run / "metrics.jsonl").unlink()
    (run / "run.json").write_text(info)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path / "exp")
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, ResultsWarning))
    assert (problem in messages) if problem else messages == ""
    assert len(runs) == 1 and runs["run_id"].tolist() == ["a"]
    assert not [w for w in caught if not issubclass(w.category, ResultsWarning)]  # no numpy noise either


def test_runs_are_found_by_one_rule(tmp_path):
    write_run(tmp_path, "r10", {}, [epoch_line(1, 0.1)])
    write_run(tmp_path, "r9", {}, [epoch_line(1, 0.1)])
    only_metrics = tmp_path / "exp" / "r11"
    only_metrics.mkdir()
    (only_metrics / "metrics.jsonl").write_text(json.dumps(epoch_line(1, 0.1)) + "\n")
    hidden = tmp_path / "exp" / ".slurm" / "x"
    hidden.mkdir(parents=True)
    (hidden / "run.json").write_text("{}")
    (tmp_path / "exp" / "r12").mkdir()  # neither file: no run
    assert [r.run_id for r in find_runs(tmp_path / "exp")] == ["r9", "r10", "r11"]
    with pytest.warns(ResultsWarning, match="r11: run.json is missing"):
        assert load_runs(tmp_path / "exp")["run_id"].tolist() == ["r9", "r10", "r11"]


def test_atomic_files_get_the_usual_mode_not_the_temp_files_private_one(tmp_path):
    from clusterjob.core.files import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "run.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == 0o666 & ~0o022  # others on a shared folder read it
