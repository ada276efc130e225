"""The report of a search's folder (docs/design.md, "Search"), through ``clusterjob report``:
the one line of hours a search spent against what its trials would have cost run to the
end (from the run time and the spec's resources, or from sacct's accounting of the
slots' jobs), in md, json and the HTML page; the page's plot of the metric against each
searched key; a grid sweep's report without either; damaged folders still reported."""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from clirun import cli
from test_results import sweep

from clusterjob.report import plots

SID = "20261122-000000-abcd"
T0 = 1_795_000_000  # Unix seconds


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


TRAINER_SPEC = """name: s
train:
  epochs: 4
  lr: {lr}
resources:
  nodes: 1
  tasks_per_node: 1
  cpus_per_task: 2
  gpus_per_node: {gpus}
"""
OWN_SPEC = """name: s
entrypoint:
  script: train.py
params:
  lr: {lr}
resources:
  nodes: 1
  tasks_per_node: 1
  cpus_per_task: 2
  gpus_per_node: {gpus}
"""


def trial(folder: Path, number: int, lr: float, status: str, lines: list, wall_s: float, job=None,
          own: bool = False, gpus: int = 0, **more) -> Path:
    """Trial ``number`` of the search in ``folder``: run.json (one session of ``wall_s``),
    metrics.jsonl and spec.yaml."""
    run = folder / f"{SID}-{number:03d}"
    run.mkdir(parents=True)
    start = T0 + 100 * number + 10
    key = "params.lr" if own else "train.lr"
    info = {"run_id": run.name, "name": "s", "status": status, "params": {key: lr, **more}, "slurm_job_id": job,
            "world_size": 1, "requeues": 0, "amp": None if own else "off", "started_at": iso(start),
            "finished_at": iso(start + wall_s), "final": lines[-1] if lines else None, "error": None,
            "sessions": [{"at": iso(start), "job": job, "checkpoint_at": None, "knows_checkpoints": True}],
            "search": {"id": SID, "trial": number, "slot": number % 2}}
    if status == "pruned":
        info["pruned"] = {"rung": 0, "at": lines[-1].get("epoch", lines[-1].get("step")), "go": False}
    (run / "run.json").write_text(json.dumps(info))
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "spec.yaml").write_text((OWN_SPEC if own else TRAINER_SPEC).format(lr=lr, gpus=gpus))
    return run


def epochs(count: int, acc: float) -> list:
    return [{"epoch": e, "val_acc": acc * e / 4, "val_loss": 1.0 / e, "epoch_time_s": 10.0} for e in range(1, count + 1)]


def search(root: Path, job=None, gpus: int = 0) -> Path:
    """Three trials of 4 epochs of 10 s: one completed in 45 s, one pruned after epoch 1 (15 s),
    one after epoch 2 (25 s); 2 CPUs (or ``gpus`` GPUs) each."""
    folder = root / "results" / "s" / SID
    folder.mkdir(parents=True)
    (folder / "search.json").write_text(json.dumps({"id": SID, "name": "s", "method": "random", "trials": 3,
                                                    "space": {"train.lr": {"log_uniform": [1e-4, 0.3]}}}))
    trial(folder, 0, 0.01, "completed", epochs(4, 0.9), 45, job and f"{job}_0", gpus=gpus)
    trial(folder, 1, 0.0002, "pruned", epochs(1, 0.2), 15, job and f"{job}_1", gpus=gpus)
    trial(folder, 2, 0.2, "pruned", epochs(2, 0.5), 25, job and f"{job}_0", gpus=gpus)
    return folder


def report_json(root: Path, folder: Path, *extra: str) -> dict:
    done = cli(root, "report", str(folder), "--format", "json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# ----------------------------------------------------------------------------- hours


def test_a_local_search_reports_the_hours_it_spent_against_its_trials_run_to_the_end(tmp_path):
    folder = search(tmp_path)
    # spent: (45 + 15 + 25) s x 2 CPUs; the pruned ones would have run 3 and 2 more epochs of 10 s
    spent, full = 170 / 3600, 270 / 3600
    hours = report_json(tmp_path, folder)["search_hours"]
    assert hours["unit"] == "CPU-hours" and hours["source"] == "run time" and hours["search"] == SID
    assert hours["hours_spent"] == pytest.approx(spent) and hours["hours_if_run_to_end"] == pytest.approx(full)
    assert hours["saved_share"] == pytest.approx(100 / 270)
    assert (hours["trials"], hours["pruned"], hours["pruned_unscaled"], hours["time_unknown"]) == (3, 2, 0, 0)
    md = cli(tmp_path, "report", str(folder)).stdout
    line = f"search {SID}: 0.0472 CPU-h spent; 0.0750 CPU-h had its 3 trial(s) run to the end: 37% saved by pruning"
    assert line in " ".join(md.split())
    assert md.index("3 runs: 1 completed, 2 pruned") < md.index(f"search {SID}:") < md.index("Grouped by train.lr")
    done = cli(tmp_path, "report", str(folder), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    assert line in (tmp_path / "r.html").read_text()


def test_gpu_runs_report_gpu_hours(tmp_path):
    folder = search(tmp_path, gpus=4)
    hours = report_json(tmp_path, folder)["search_hours"]
    assert hours["unit"] == "GPU-hours" and hours["hours_spent"] == pytest.approx(85 * 4 / 3600)
    assert hours["hours_if_run_to_end"] == pytest.approx((85 + 50) * 4 / 3600)
    assert "GPU-h spent" in cli(tmp_path, "report", str(folder)).stdout


def test_your_codes_pruned_trials_scale_to_the_steps_a_completed_trial_ran(tmp_path):
    folder = tmp_path / "results" / "s" / SID
    steps = [{"step": s, "score": s / 8} for s in range(1, 9)]
    trial(folder, 0, 0.01, "completed", steps, 16, own=True)
    trial(folder, 1, 0.3, "pruned", steps[:2], 4, own=True)  # 2 s a step, 6 steps short
    hours = report_json(tmp_path, folder)["search_hours"]
    assert hours["hours_spent"] == pytest.approx(20 * 2 / 3600)
    assert hours["hours_if_run_to_end"] == pytest.approx((20 + 6 * 2) * 2 / 3600)
    alone = tmp_path / "alone" / "results" / "s" / SID  # no completed trial: the full length is not known
    trial(alone, 1, 0.3, "pruned", steps[:2], 4, own=True)
    hours = report_json(tmp_path, alone)["search_hours"]
    assert hours["hours_if_run_to_end"] == pytest.approx(hours["hours_spent"]) and hours["pruned_unscaled"] == 1
    said = " ".join(cli(tmp_path, "report", str(alone)).stdout.split())
    assert "1 pruned trial(s) of unknown full length counted as run" in said


SACCT_HEADER = "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES"


def test_on_slurm_the_hours_spent_are_the_slots_jobs_from_sacct_asked_once(tmp_path, slurm_shims):
    folder = search(tmp_path, job="9")
    slurm_shims.script("sacct", f'''echo "{SACCT_HEADER}"
echo "9_0|COMPLETED|{T0}|{T0 + 5}|{T0 + 400}|395|cpu=2,node=1"
echo "9_1|COMPLETED|{T0}|{T0 + 5}|{T0 + 200}|195|cpu=2,node=1"''')
    hours = report_json(tmp_path, folder)["search_hours"]
    assert hours["source"] == "sacct" and hours["unit"] == "CPU-hours"
    assert hours["hours_spent"] == pytest.approx((395 + 195) * 2 / 3600)  # each slot's task once
    assert hours["hours_if_run_to_end"] == pytest.approx((590 + 50) * 2 / 3600)
    assert len(slurm_shims.calls("sacct")) == 1  # the cost columns and the hours share one query
    assert "from sacct" in cli(tmp_path, "report", str(folder)).stdout
    slurm_shims.fail("sacct", stderr="sacct: error: Slurm accounting storage is disabled")
    hours = report_json(tmp_path, folder)["search_hours"]  # no accounting: the run time
    assert hours["source"] == "run time" and hours["hours_spent"] == pytest.approx(170 / 3600)


def test_a_damaged_search_folder_is_still_reported(tmp_path):
    folder = search(tmp_path)
    (folder / "search.json").unlink()
    with open(folder / f"{SID}-002" / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "val_a')  # cut off mid-line
    (folder / f"{SID}-001" / "run.json").write_text('{"run_id": "x", "status": "pru')
    done = cli(tmp_path, "report", str(folder), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["warnings"] and data["search_hours"] is None  # one run is no trial of it now: no line, no error
    (folder / f"{SID}-001" / "run.json").unlink()
    (folder / f"{SID}-001" / "metrics.jsonl").unlink()
    (folder / f"{SID}-001" / "spec.yaml").unlink()
    hours = report_json(tmp_path, folder)["search_hours"]
    assert hours["hours_spent"] == pytest.approx(140 / 3600) and hours["trials"] == 2
    assert cli(tmp_path, "report", str(folder), "--format", "html").returncode == 0


def test_a_grid_sweeps_report_has_no_search_line_nor_search_plots(tmp_path):
    folder = sweep(tmp_path)
    data = report_json(tmp_path, folder)
    assert data["search_hours"] is None and data["experiments"][0]["search_hours"] is None
    md = cli(tmp_path, "report", str(folder)).stdout
    assert "spent;" not in md
    page = cli(tmp_path, "report", str(folder), "--format", "html").stdout
    assert "Metric against each searched key" not in page and "data-key=" not in page


# ----------------------------------------------------------------------------- the page's plots


def svgs(page: str) -> dict:
    """{searched key: its panel's SVG text} of a report page."""
    found = re.findall(r'<img alt="[^"]*" width="\d+" height="\d+" data-key="([^"]+)" '
                       r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    return {key: base64.b64decode(data).decode() for key, data in found}


@pytest.mark.skipif(not plots.available(), reason="the plots need matplotlib")
def test_the_page_plots_the_metric_against_each_searched_key(tmp_path):
    folder = tmp_path / "results" / "s" / SID
    folder.mkdir(parents=True)
    (folder / "search.json").write_text(json.dumps({"id": SID, "space": {
        "train.lr": {"log_uniform": [1e-4, 0.3]}, "train.optimizer": {"choice": ["sgd", "adamw"]}}}))
    trial(folder, 0, 0.01, "completed", epochs(4, 0.9), 45, **{"train.optimizer": "sgd"})
    trial(folder, 1, 0.0002, "pruned", epochs(1, 0.2), 15, **{"train.optimizer": "adamw"})
    trial(folder, 2, 0.05, "completed", epochs(4, 0.7), 45, **{"train.optimizer": "adamw"})
    done = cli(tmp_path, "report", str(folder), "--format", "html")
    assert done.returncode == 0, done.stderr
    assert "Metric against each searched key" in done.stdout
    panels = svgs(done.stdout)
    assert list(panels) == ["train.lr", "train.optimizer"]  # one panel per key
    lr, optimizer = panels["train.lr"], panels["train.optimizer"]
    assert "train.lr (log)" in lr and "(log)" not in optimizer  # log_uniform: a log x-axis
    assert ">sgd<" in optimizer and ">adamw<" in optimizer  # a choice: one tick per value
    for svg in panels.values():  # completed and pruned trials drawn apart, the best marked
        assert "completed" in svg and "pruned (at its rung)" in svg and "best" in svg and "val_acc (%)" in svg
    assert "failed, cancelled or unfinished" not in lr
    (folder / "search.json").unlink()  # without the space: every axis linear, still a page
    page = cli(tmp_path, "report", str(folder), "--format", "html").stdout
    assert list(svgs(page)) == ["train.lr", "train.optimizer"] and "(log)" not in svgs(page)["train.lr"]
