"""The HTML report links each run to its logger runs (run.json's TensorBoard folder,
MLflow run, W&B page), and makes a link of nothing else."""

from __future__ import annotations

import json
from pathlib import Path

from clusterjob.core.rundir import create_run
from clusterjob.report.build import build_report, render


def test_each_run_links_to_its_logger_runs(tmp_path):
    online = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    online.update(status="completed", tensorboard_dir=str(online.path / "tensorboard"),
                  mlflow_tracking_uri="http://mlflow.example:5000/", mlflow_experiment_id="7", mlflow_run_id="abc123def",
                  wandb_run_id="k3j4h5g6", wandb_url="https://wandb.ai/team/exp/runs/k3j4h5g6")
    offline = create_run(tmp_path, "exp", "r2", "name: exp\n", {})
    offline.update(status="completed", mlflow_tracking_uri=(tmp_path / "mlruns").as_uri(), mlflow_experiment_id="3",
                   mlflow_run_id="f00", wandb_run_id="zz9", wandb_url=None)
    create_run(tmp_path, "exp", "r3", "name: exp\n", {}).update(status="completed")  # no loggers
    for run in ("r1", "r2", "r3"):
        (tmp_path / "exp" / run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_acc": 0.5}) + "\n")
    page = render(build_report(tmp_path / "exp"), "html")
    section = page.split("<h2>Logger runs</h2>")[1]
    assert f'href="{Path(online.path / "tensorboard").as_uri()}"' in section
    assert 'href="http://mlflow.example:5000/#/experiments/7/runs/abc123def"' in section
    assert 'href="https://wandb.ai/team/exp/runs/k3j4h5g6"' in section and '>W&amp;B</a>' in section
    assert f'href="{(tmp_path / "mlruns").as_uri()}/3/f00"' in section
    assert "W&amp;B offline run zz9" in section and "wandb sync --id zz9" in section
    assert "<td>r3</td>" not in section


def test_only_web_and_file_addresses_become_links(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(status="completed", wandb_run_id="x", wandb_url='javascript:alert("hi")',
               tensorboard_dir='rel/"><script>x</script>')
    (run.path / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_acc": 0.5}) + "\n")
    section = render(build_report(tmp_path / "exp"), "html").split("<h2>Logger runs</h2>")[1]
    assert "javascript:" not in section.split("title=")[0] and 'href="javascript' not in section
    assert "<script>" not in section and "&lt;script&gt;" in section


def test_a_report_without_logger_runs_has_no_such_section(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(status="completed")
    (run.path / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_acc": 0.5}) + "\n")
    assert "Logger runs" not in render(build_report(tmp_path / "exp"), "html")
