"""--group-by through the CLI: a word that is both a spec key's last word and a run.json
field takes the spec's key and the legend says so; a key a run resolves as it starts
(train.amp: auto) shows what the run resolved it to, and a run that has not started yet
counts with the runs given the same value, never in a group of its own."""

from __future__ import annotations

import json
from pathlib import Path

from clirun import cli
from test_results import epoch_line


def amp_run(root: Path, run_id: str, amp: "str | None", acc: float, status: str = "completed") -> Path:
    """A run of a spec with train.amp: auto that resolved it to ``amp`` (None: not started)."""
    run = root / "results" / "exp" / run_id
    run.mkdir(parents=True)
    lines = [epoch_line(1, acc - 0.1), epoch_line(2, acc)] if amp else []
    info = {"run_id": run_id, "name": "exp", "status": status, "params": {}, "world_size": 1 if amp else None,
            "backend": "gloo" if amp else None, "amp": amp, "executor": "slurm", "slurm_job_id": None,
            "started_at": "2026-11-22T00:00:00+00:00" if amp else None,
            "finished_at": "2026-11-22T00:01:00+00:00" if amp else None, "final": lines[-1] if lines else None}
    (run / "run.json").write_text(json.dumps(info))
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "spec.yaml").write_text("name: exp\ntrain:\n  epochs: 2\n  lr: 0.1\n  amp: auto\n")
    return run


def test_group_by_amp_takes_the_spec_key_shows_the_resolved_value_and_keeps_an_unstarted_run_in(tmp_path):
    for i, acc in enumerate((0.8, 0.9)):
        amp_run(tmp_path, f"r{i}", "bf16", acc)
    amp_run(tmp_path, "r2", None, 0.0, status="pending")
    done = cli(tmp_path, "report", "results/exp", "--group-by", "amp", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["group_by"] == ["train.amp"]
    assert [(g["train.amp"], g["n"], g["completed"]) for g in data["groups"]] == [("bf16", 3, 2)]
    md = cli(tmp_path, "report", "results/exp", "--group-by", "amp", "--runs").stdout
    legend = " ".join(cli(tmp_path, "report", "results/exp", "--group-by", "amp").stdout.split())
    assert "Grouped by train.amp (--group-by amp: the spec's key). train.amp: what each run resolved it to " \
           "(run.json's amp); a run not started yet counts with the runs given the same value." in legend
    rows = [line.replace(" ", "") for line in md.splitlines() if line[:3] in ("|r0", "|r1", "|r2")]
    assert [row.split("|")[3] for row in rows] == ["bf16"] * 3, md


def test_a_run_json_field_groups_when_no_spec_key_ends_with_it(tmp_path):
    for i, acc in enumerate((0.8, 0.9)):
        amp_run(tmp_path, f"r{i}", "bf16", acc)
    done = cli(tmp_path, "report", "results/exp", "--group-by", "world_size", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["group_by"] == ["world_size"] and [g["world_size"] for g in data["groups"]] == [1]
