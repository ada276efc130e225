"""Your own code's metrics through `clusterjob submit` with real processes: metrics printed
at different rates all kept (each metric at its own steps, exactly once across a
resume), metrics read from a CSV or JSON-lines file the code writes, a warning for a
source that gave nothing, and the first metric shown by status, the --wait summary and
the live line."""

from __future__ import annotations

import pytest
from clirun import cli
from owncode import Project

from clusterjob.report.results import load_epochs

pytestmark = pytest.mark.slow

# nanoGPT's shape: a loss every iteration, train and val loss at every 10th; the first
# session dies at iteration 15 after logging one more metric through the API.
TWO_RATES = """
import os, sys, clusterjob
first = os.environ["CLUSTERJOB_RESTARTS"] == "0"
if first:
    clusterjob.log(step=100, once=1.0)
for it in range(1, 22):
    print(f"iter {it}: loss {10 / it:.4f}", flush=True)
    if it % 10 == 0:
        print(f"step {it}: train loss {10 / it:.4f}, val loss {5 / it:.4f}", flush=True)
    if first and it == 15:
        sys.exit(3)
"""
TWO_RATES_METRICS = {"train_loss": r"iter \d+: loss ([0-9.]+)",
                     "val_loss": r"step (?P<step>\d+): train loss [0-9.]+, val loss ([0-9.]+)"}


def test_metrics_printed_at_two_rates_are_all_kept_once_also_across_a_resume(tmp_path):
    own = Project(tmp_path, "rates")
    own.spec(TWO_RATES, metrics=TWO_RATES_METRICS)
    assert own.submit().returncode == 1  # the first session exits 3 at iteration 15
    assert [step for step, _ in own.series("train_loss")] == list(range(1, 16))
    resumed = cli(own.folder, "resume", str(own.run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert own.series("train_loss") == [(k, round(10 / k, 4)) for k in range(1, 22)]  # each step once
    assert own.series("val_loss") == [(10, 0.5), (20, 0.25)]  # the step from the line
    assert own.series("once") == [(100, 1.0)]  # not logged again, and not dropped by the others
    info = own.info()
    assert info["final"] == {"train_loss": 0.4762, "val_loss": 0.25, "once": 1.0} and info["warnings"] == []
    assert info["entrypoint"]["metrics"] == ["train_loss", "val_loss"]
    epochs = load_epochs(tmp_path / "results" / "rates")  # one row per step, each metric where it was logged
    assert epochs["step"].tolist() == list(range(1, 22)) + [100]
    assert epochs["val_loss"].notna().tolist() == [k in (10, 20) for k in range(1, 22)] + [False]
    summary = [line for line in resumed.stdout.splitlines() if "completed" in line]
    assert summary and "completed  train_loss 0.4762 (step 21)" in summary[0]
    status = cli(own.folder, "status", "results/rates")
    header, row = status.stdout.splitlines()[:2]
    assert header.split()[:4] == ["RUN", "STATUS", "EPOCH/STEP", "METRIC"], status.stdout
    assert row.split()[1:5] == ["completed", "21", "train_loss", "0.4762"], status.stdout
    assert (own.run / "logs/rank0.out").read_text().splitlines()[-1] == (
        f"completed {own.run}: once 1 train_loss 0.476 val_loss 0.250")  # in the units of core/units.py, not raw JSON


def test_a_regex_with_a_step_group_and_one_line_of_several_metrics(tmp_path):
    own = Project(tmp_path, "oneline")
    own.spec("for e in (1, 2, 5):\n    print(f'epoch {e} loss {1 / e} acc {e / 10}', flush=True)\n",
             metrics={"loss": r"epoch (?P<step>\d+) loss ([0-9.]+)", "acc": r"acc ([0-9.]+)"})
    assert own.submit().returncode == 0
    # the values of one printed line at one step are one line; the third: acc at step 3, loss at 5
    assert own.lines() == [{"step": 1, "acc": 0.1, "loss": 1.0}, {"step": 2, "acc": 0.2, "loss": 0.5},
                           {"step": 3, "acc": 0.5}, {"step": 5, "loss": 0.2}]


WAIT_FOR_STEP = """
import json, os, pathlib, time
def logged(name, step, wait=300):
    path = pathlib.Path(os.environ["CLUSTERJOB_RUN_DIR"]) / "metrics.jsonl"
    deadline = time.time() + wait
    while True:
        text = path.read_text() if path.exists() else ""
        if any(json.loads(l).get("step") == step and name in json.loads(l) for l in text.splitlines()):
            return True
        if time.time() > deadline:
            return False
        time.sleep(0.05)
"""

# timm's shape: summary.csv under a generated folder, a header row, a text column; each
# row is read while the script runs (it waits for it), a half-written row only once whole.
CSV_SCRIPT = WAIT_FOR_STEP + """
folder = pathlib.Path("out/20240101-resnet")
folder.mkdir(parents=True)
with open(folder / "summary.csv", "w") as f:
    f.write("epoch,train_loss,eval_loss,eval_top1,note\\n")
    for epoch in (0, 1):
        f.write(f"{epoch},{2 - epoch},{3 - epoch},{50 + epoch},fine\\n")
        f.flush()
        assert logged("eval_top1", epoch), f"row {epoch} was not read while the script ran"
    f.write("2,0.5,nan,")
    f.flush()
    time.sleep(2.5)  # two polls see the half row
    assert not logged("eval_top1", 2, wait=0) and not logged("train_loss", 2, wait=0)
    f.write("60,fine\\n3,0.25,1.5,70,last")  # and a last row without its newline
"""


def test_a_csv_file_the_code_writes_is_read_as_it_grows(tmp_path):
    own = Project(tmp_path, "csv")
    old = tmp_path / "out" / "19990101-earlier"  # another run's file beside it: never read
    old.mkdir(parents=True)
    (old / "summary.csv").write_text("epoch,train_loss\n7,99\n")
    own.spec(CSV_SCRIPT, metrics_file="out/*/summary.csv")
    done = own.submit()
    assert done.returncode == 0, done.stdout + done.stderr
    assert own.lines() == [
        {"step": 0, "train_loss": 2.0, "eval_loss": 3.0, "eval_top1": 50.0},
        {"step": 1, "train_loss": 1.0, "eval_loss": 2.0, "eval_top1": 51.0},
        {"step": 2, "train_loss": 0.5, "eval_top1": 60.0},  # nan dropped, with one warning
        {"step": 3, "train_loss": 0.25, "eval_loss": 1.5, "eval_top1": 70.0}]
    assert "'eval_loss' is nan, not a finite number" in (own.run / "logs/rank0.err").read_text()
    assert own.info()["final"] == {"step": 3, "train_loss": 0.25, "eval_loss": 1.5, "eval_top1": 70.0}
    assert own.info()["warnings"] == []


# A JSON-lines log under the run folder, replaced whole halfway (write and rename).
JSONL_SCRIPT = WAIT_FOR_STEP + """
log = pathlib.Path(os.environ["CLUSTERJOB_RUN_DIR"]) / "log.jsonl"
rows = [json.dumps({"iter": i, "loss": 1 / i, "tag": "x", "ok": True}) for i in range(1, 6)]
log.write_text("\\n".join(rows[:3]) + "\\n")
assert logged("loss", 3)
(log.parent / "log.tmp").write_text("\\n".join(rows) + "\\n")
os.replace(log.parent / "log.tmp", log)
"""


def test_a_json_lines_file_replaced_while_read_keeps_each_step_once(tmp_path):
    own = Project(tmp_path, "jsonl")
    own.spec(JSONL_SCRIPT, metrics_file="{run_dir}/log.jsonl")
    done = own.submit()
    assert done.returncode == 0, done.stdout + done.stderr
    assert own.series("loss") == [(i, 1 / i) for i in range(1, 6)]
    assert all(set(line) == {"step", "loss"} for line in own.lines())  # text and true are no metrics


def test_a_source_that_gave_nothing_is_a_warning_in_run_json_status_and_the_summary(tmp_path):
    own = Project(tmp_path, "silent")
    own.spec("print('Accuracy: 0.5', flush=True)\n", metrics={"acc": r"Accuracy is ([0-9.]+)"},
             metrics_file="never/*.csv")
    done = own.submit()
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = own.info()["warnings"]
    assert len(warnings) == 2
    assert warnings[0].startswith("entrypoint.metrics.acc: the regex 'Accuracy is ([0-9.]+)' never matched")
    assert warnings[1].startswith("entrypoint.metrics_file: no file matched ") and "never/*.csv" in warnings[1]
    summary = done.stdout.split("\n\n")[0]
    assert f"  warning: {warnings[0]}" in summary and f"  warning: {warnings[1]}" in summary
    status = cli(own.folder, "status", "results/silent").stdout
    assert f"{own.run.name}: warning: {warnings[0]}" in status
    assert (own.run / "logs/rank0.out").read_text().splitlines()[-1] == f"completed {own.run}"  # no "null"


def test_the_live_line_of_submit_wait_shows_the_first_metric(tmp_path):
    own = Project(tmp_path, "live")
    own.spec("import time\nprint('loss=5 acc=0.25', flush=True)\ntime.sleep(2)\nprint('loss=4', flush=True)\n",
             metrics={"acc": r"acc=([0-9.]+)", "loss": r"loss=([0-9.]+)"})
    done = own.submit()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "acc 0.25 (step 1)"  # on a pipe: the first live line, then one every 10 s at most
    assert lines[1].startswith(own.run.name) and "completed  acc 0.25 (step 1)" in lines[1]
