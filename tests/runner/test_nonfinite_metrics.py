"""Non-finite metric values (nan, inf in any spelling float() takes, overflow) through
the real command line: what a run writes stays strict JSON, each metric is warned about
once, and the report never ranks an infinity best, also over files written by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from clirun import cli

SPELLINGS = ["nan", "NaN", "-nan", "inf", "-inf", "+INF", "Infinity", "-infinity", "1e999", "-1e999", "infinity"]

SCRIPT = f"""
import math, clusterjob
bad = clusterjob.params["bad"]
for value in ([0.1] + {SPELLINGS!r} if bad else [0.5]):
    print(f"acc={{value}} done", flush=True)
if bad:
    clusterjob.log(step=100, other=float("inf"), fine=1.0)
    clusterjob.log(step=101, other=float("nan"), huge=10**400)
    clusterjob.log(step=102, other=-math.inf)
"""


def strict(text: str):
    """json.loads that refuses NaN and Infinity, as any JSON parser but Python's does."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nonfinite")
    (root / "train.py").write_text(SCRIPT)
    spec = {"name": "t", "entrypoint": {"script": "train.py", "metrics": {"acc": r"acc=(\S+) done"}},
            "sweep": {"params.bad": [True, False]}}
    (root / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(root, "submit", "--executor", "local", "--wait", "s.yaml", env=os.environ, errors="replace")
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def runs(root: Path) -> list:
    return sorted(p for p in (root / "results" / "t").iterdir() if not p.name.startswith("."))


def test_metrics_and_run_json_stay_strict_json(swept: Path):
    bad, good = runs(swept)
    lines = [strict(line) for line in (bad / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 1, "acc": 0.1}
    assert all(set(line) == {"step"} | ({"acc"} & set(line)) for line in lines[1:-3])
    assert [line for line in lines if line.get("step", 0) >= 100] == [{"step": 100, "fine": 1.0}]
    assert [line["acc"] for line in lines if "acc" in line] == [0.1]
    for run in (bad, good):
        info = strict((run / "run.json").read_text())
        assert info["status"] == "completed"
        assert all(isinstance(v, (int, float)) for v in (info.get("final") or {}).values())


def test_each_metric_is_warned_about_once(swept: Path):
    bad, _ = runs(swept)
    err = "".join(path.read_text() for path in (bad / "logs").glob("rank0.*"))
    warnings = [line for line in err.splitlines() if "not a finite number" in line]
    named = sorted(line.split(": ")[3].split()[0] for line in warnings)
    assert named == ["'acc'", "'huge'", "'other'"], warnings


def test_the_report_never_ranks_an_infinity_best(swept: Path):
    done = cli(swept, "report", "results/t", "--metric", "acc", "--format", "json", env=os.environ, errors="replace")
    assert done.returncode == 0, done.stderr
    assert strict(done.stdout)["best"] == {"params.bad": False}


def good_run(exp: Path, run_id: str, acc: str) -> None:
    """A finished run whose val_acc is written as the text ``acc`` (a JSON token or not)."""
    run = exp / run_id
    run.mkdir(parents=True)
    lines = ['{"epoch": 1, "val_acc": 0.5, "val_loss": 1.0}', f'{{"epoch": 2, "val_acc": {acc}, "val_loss": 0.9}}']
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "run.json").write_text(f'{{"run_id": "{run_id}", "name": "exp", "status": "completed", '
                                  f'"params": {{"params.lr": {0.1 if run_id == "a" else 0.2}}}, '
                                  f'"final": {{"epoch": 2, "val_acc": {acc}, "val_loss": 0.9}}}}')


@pytest.mark.parametrize("token", ["Infinity", "1e999", "1E400", "NaN", "-Infinity"])
@pytest.mark.parametrize("fmt", ["json", "md"])
def test_hand_written_non_finite_values_do_not_rank_best(tmp_path: Path, token: str, fmt: str):
    exp = tmp_path / "results" / "exp"
    good_run(exp, "a", token)
    good_run(exp, "b", "0.6")
    done = cli(tmp_path, "report", "results/exp", "--format", fmt, env=os.environ, errors="replace")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    if fmt == "json":
        report = strict(done.stdout)
        assert report["best"] == {"params.lr": 0.2}
    else:
        assert "inf" not in done.stdout.lower().replace("info", "")
    if token not in ("NaN",):
        assert "not a finite number" in done.stderr, done.stderr
