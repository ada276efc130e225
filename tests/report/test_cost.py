"""What runs cost on Slurm (clusterjob.report.cost): GPU- and CPU-hours over every
session, queue wait, work lost to stops; and the report's compute, queued and lost
columns. sacct is faked here (a fixed answer, or a shim on PATH); the local Slurm test
that checks the numbers against sacct's own is in tests/launch/test_slurm_submit.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from clirun import cli
from test_results import write_run

from clusterjob.core import slurmctl
from clusterjob.core.slurmctl import Segment
from clusterjob.report import build as report
from clusterjob.report import cost

T0 = 1_795_000_000  # Unix seconds


def iso(seconds: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def seg(job="5", state="COMPLETED", submit=0, start=10, end=310, cpus=4, gpus=2, elapsed=None) -> Segment:
    def at(offset):
        return None if offset is None else T0 + offset

    ran = (end - start) if elapsed is None and end is not None and start is not None else (elapsed or 0)
    return Segment(job, state, at(submit), at(start), at(end), ran, cpus, gpus)


def session(at, checkpoint_at=None, knows=True, job="5") -> dict:
    return {"at": iso(T0 + at), "job": job, "checkpoint_at": None if checkpoint_at is None else iso(T0 + checkpoint_at),
            "knows_checkpoints": knows}


def info(sessions, job="5", finished=None) -> dict:
    return {"sessions": sessions, "slurm_job_id": job, "finished_at": None if finished is None else iso(T0 + finished)}


REQUEUED = [seg(state="REQUEUED", submit=0, start=10, end=310), seg(submit=310, start=400, end=700)]


def test_a_requeued_run_costs_both_sessions_waits_twice_and_loses_the_time_since_its_checkpoint():
    run = info([session(12), session(402, checkpoint_at=250)])
    got = cost.cost_of(run, ["5"], {"5": REQUEUED}, now=T0 + 10_000)
    assert got.gpu_hours == pytest.approx(600 * 2 / 3600) and got.cpu_hours == pytest.approx(600 * 4 / 3600)
    assert got.queue_wait_s == 10 + 90
    assert got.lost_s == 310 - 250


def test_a_checkpoint_from_before_the_session_loses_the_whole_session():
    run = info([session(12), session(402, checkpoint_at=5)])
    assert cost.cost_of(run, ["5"], {"5": REQUEUED}, now=T0).lost_s == 300


def test_a_restart_from_scratch_loses_all_run_time_before_it():
    segments = [seg(state="REQUEUED", submit=0, start=10, end=110), seg(state="REQUEUED", submit=110, start=120,
                                                                        end=220), seg(submit=220, start=230, end=330)]
    run = info([session(12), session(122, checkpoint_at=100), session(232, checkpoint_at=None)])
    assert cost.cost_of(run, ["5"], {"5": segments}, now=T0).lost_s == (110 - 100) + (200 - 10)


def test_a_session_that_died_before_it_recorded_itself_is_lost_whole():
    segments = [seg(state="REQUEUED", submit=0, start=10, end=110), seg(state="NODE_FAIL", submit=110, start=120,
                                                                        end=150), seg(submit=150, start=160, end=400)]
    run = info([session(12), session(162, checkpoint_at=90)])
    assert cost.cost_of(run, ["5"], {"5": segments}, now=T0).lost_s == (110 - 90) + (150 - 120)


def test_your_code_with_checkpoints_elsewhere_has_a_cost_but_no_known_loss():
    run = info([session(12, knows=False), session(402, knows=False)])
    got = cost.cost_of(run, ["5"], {"5": REQUEUED}, now=T0)
    assert got.cpu_hours == pytest.approx(600 * 4 / 3600) and math.isnan(got.lost_s)


@pytest.mark.parametrize("answer", [None, {}, {"6": REQUEUED}])
def test_no_accounting_for_the_job_is_no_number_never_a_guess(answer):
    got = cost.cost_of(info([session(12)]), ["5"], answer, now=T0)
    assert all(math.isnan(getattr(got, name)) for name in cost.COLUMNS)


def test_a_run_that_ran_no_slurm_job_has_no_cost_and_nothing_is_asked():
    asked = []
    assert cost.columns([info([], job=None)], ask=asked.append) == {} and asked == []


def test_sessions_of_other_jobs_that_had_the_same_id_are_left_out():
    older = seg(state="COMPLETED", submit=-900, start=-890, end=-500)
    later = seg(state="COMPLETED", submit=5_000, start=5_010, end=5_100)
    run = info([session(12), session(402, checkpoint_at=250)], finished=700)
    got = cost.cost_of(run, ["5"], {"5": [older, *REQUEUED, later]}, now=T0 + 10_000)
    assert got.cpu_hours == pytest.approx(600 * 4 / 3600) and got.queue_wait_s == 100


def test_a_stop_in_the_second_the_run_started_is_matched_to_its_own_session():
    """sacct's times are whole seconds: a session that ended (209.9 -> 209) in the second
    its start was recorded (209.2) is still the one that start ran in."""
    segments = [seg(state="REQUEUED", submit=202, start=203, end=209, cpus=4, gpus=0),
                seg(submit=211, start=233, end=243, cpus=4, gpus=0)]
    run = info([session(209.246), session(239.7, checkpoint_at=209.783)])
    got = cost.cost_of(run, ["5"], {"5": segments}, now=T0 + 10_000)
    assert got.cpu_hours == pytest.approx((6 + 10) * 4 / 3600) and got.queue_wait_s == 1 + 22
    assert got.lost_s == 0  # checkpointed at the stop


def test_without_a_recorded_start_the_newest_requeue_chain_of_the_id_counts():
    older = seg(submit=-900, start=-890, end=-500)
    chain = [seg(state="REQUEUED", submit=0, start=10, end=110), seg(submit=112, start=130, end=230)]
    got = cost.cost_of(info([]), ["5"], {"5": [older, *chain]}, now=T0 + 10_000)
    assert got.cpu_hours == pytest.approx(200 * 4 / 3600) and got.queue_wait_s == 10 + 18


def test_a_pending_session_waits_until_now_and_a_running_one_counts_its_time_so_far():
    pending = [seg(submit=0, start=None, end=None, elapsed=0)]
    assert cost.cost_of(info([]), ["5"], {"5": pending}, now=T0 + 75).queue_wait_s == 75
    running = [seg(submit=0, start=10, end=None, elapsed=50, gpus=0, cpus=2)]
    got = cost.cost_of(info([session(12)]), ["5"], {"5": running}, now=T0 + 60)
    assert got.gpu_hours == 0 and got.cpu_hours == pytest.approx(100 / 3600) and got.lost_s == 0


def test_a_resumed_run_counts_the_jobs_of_every_session():
    first = [seg(job="5", state="FAILED", submit=0, start=10, end=310)]
    second = [seg(job="9", submit=400, start=420, end=720)]
    run = info([session(12, job="5"), session(422, checkpoint_at=300, job="9")], job="9")
    assert cost.slurm_jobs(run) == ["5", "9"]
    got = cost.cost_of(run, ["5", "9"], {"5": first, "9": second}, now=T0 + 10_000)
    assert got.gpu_hours == pytest.approx(600 * 2 / 3600) and got.queue_wait_s == 30 and got.lost_s == 10


# ---------------------------------------------------------------- sacct


SACCT_HEADER = "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES"


def test_segments_reads_every_session_in_unix_seconds_and_only_the_jobs_asked_for(slurm_shims, monkeypatch):
    slurm_shims.script("sacct", f'''[ "$SLURM_TIME_FORMAT" = "%s" ] || exit 3
echo "{SACCT_HEADER}"
case "$*" in *"-j 5") ;; *) exit 0;; esac
echo "5_1|REQUEUED|{T0}|{T0 + 10}|{T0 + 310}|300|billing=8,cpu=4,gres/gpu=2,gres/gpu:a100=2,mem=8G,node=1"
echo "5_1|PENDING|{T0 + 310}|Unknown|Unknown|0|"
echo "5_2|CANCELLED by 0|{T0}|{T0 + 5}|{T0 + 6}|1|cpu=1,node=1"
echo "5_3|RUNNING|{T0}|{T0 + 5}|Unknown|77|cpu=2,node=1"''')
    monkeypatch.setattr(slurmctl, "_IDS_PER_QUERY", 1)
    got = slurmctl.segments(["5_1", "5_2", "6"])
    assert got == {"5_1": [Segment("5_1", "REQUEUED", T0, T0 + 10, T0 + 310, 300, 4, 2),
                           Segment("5_1", "PENDING", T0 + 310, None, None, 0, None, None)],
                   "5_2": [Segment("5_2", "CANCELLED", T0, T0 + 5, T0 + 6, 1, 1, 0)]}
    calls = slurm_shims.calls("sacct")
    assert [call[-1] for call in calls] == ["5", "6"]  # an array once for all its tasks; a chunk per query
    slurm_shims.answer("sacct", stderr="sacct: error: Slurm accounting storage is disabled\n", exit_code=1)
    assert slurmctl.segments(["5_1"]) is None


# ---------------------------------------------------------------- the report's columns


def slurm_run(root: Path, run_id: str, lr: float, job: str, sessions: list) -> Path:
    lines = [{"epoch": 1, "val_acc": 0.5 + lr, "val_loss": 1.0, "train_loss": 1.0}]
    sessions = [{**s, "job": job} for s in sessions]
    return write_run(root, run_id, {"train.lr": lr}, lines, slurm_job_id=job, executor="slurm", sessions=sessions)


@pytest.fixture
def cost_sweep(tmp_path, slurm_shims):
    """Two lrs x two seeds on Slurm, one requeued (GPUs), plus one local run of lr 0.2."""
    slurm_run(tmp_path, "r1", 0.1, "5", [session(12), session(402, checkpoint_at=250)])
    slurm_run(tmp_path, "r2", 0.1, "6", [session(22)])
    slurm_run(tmp_path, "r3", 0.2, "7", [session(62)])
    write_run(tmp_path, "r4", {"train.lr": 0.2}, [{"epoch": 1, "val_acc": 0.7}], slurm_job_id=None, executor="local")
    slurm_shims.script("sacct", f'''echo "{SACCT_HEADER}"
for id in $(echo "$@" | sed 's/.*-j //; s/,/ /g'); do case $id in
5) echo "5|REQUEUED|{T0}|{T0 + 10}|{T0 + 310}|300|cpu=4,gres/gpu=2"; echo "5|COMPLETED|{T0 + 310}|{T0 + 400}|{T0 + 700}|300|cpu=4,gres/gpu=2";;
6) echo "6|COMPLETED|{T0}|{T0 + 20}|{T0 + 3620}|3600|cpu=4,gres/gpu=2";;
7) echo "7|COMPLETED|{T0}|{T0 + 60}|{T0 + 7260}|7200|cpu=8,node=1";;
esac; done''')
    return tmp_path


def test_the_runs_table_and_json_give_each_runs_cost_and_dash_without_accounting(cost_sweep):
    text = report.format_report(cost_sweep / "exp", fmt="json", runs=True)
    runs = {r["run_id"]: r for r in json.loads(text)["runs"]}
    assert runs["r1"]["gpu_hours"] == pytest.approx(600 * 2 / 3600) and runs["r1"]["queue_wait_s"] == 100
    assert runs["r1"]["lost_s"] == 60 and runs["r2"]["lost_s"] == 0
    assert runs["r3"]["gpu_hours"] == 0 and runs["r3"]["cpu_hours"] == pytest.approx(16.0)
    assert all(runs["r4"][name] is None for name in cost.COLUMNS)
    md = report.format_report(cost_sweep / "exp", runs=True, width=200)
    row = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| r")}
    assert "0.333 GPU-h" in row["r1"] and "1.7 min" in row["r1"] and "1.0 min" in row["r1"]
    assert "16.0 CPU-h" in row["r3"] and "compute" in md and "queued" in md and "lost" in md
    assert row["r4"].count(" - ") >= 3  # the local run: no accounting, no number
    assert "From sacct." in md


def test_groups_sum_every_runs_cost_and_a_group_with_an_unknown_run_is_unknown(cost_sweep):
    groups = json.loads(report.format_report(cost_sweep / "exp", fmt="json"))["groups"]
    by_lr = {g["train.lr"]: g for g in groups}
    assert by_lr[0.1]["gpu_hours_sum"] == pytest.approx((600 + 3600) * 2 / 3600)
    assert by_lr[0.1]["queue_wait_s_sum"] == 100 + 20 and by_lr[0.1]["lost_s_sum"] == 60
    assert by_lr[0.2]["cpu_hours_sum"] is None  # r4 ran locally: the sum would be a guess
    html = report.format_report(cost_sweep / "exp", fmt="html", runs=True)
    assert "2.33 GPU-h" in html and "0.333 GPU-h" in html and ">queued<" in html and ">lost<" in html


def test_a_cluster_without_accounting_shows_dashes_and_the_report_still_succeeds(cost_sweep, slurm_shims):
    slurm_shims.fail("sacct", stderr="sacct: error: Slurm accounting storage is disabled")
    runs = json.loads(report.format_report(cost_sweep / "exp", fmt="json", runs=True))["runs"]
    assert all(r[name] is None for r in runs for name in cost.COLUMNS)


def test_a_report_of_local_runs_has_no_cost_columns_and_asks_nothing(tmp_path, slurm_shims):
    slurm_shims.answer("sacct", exit_code=1)
    write_run(tmp_path, "r1", {"train.lr": 0.1}, [{"epoch": 1, "val_acc": 0.7}], slurm_job_id=None)
    md = report.format_report(tmp_path / "exp", runs=True, width=200)
    assert "compute" not in md and slurm_shims.calls("sacct") == []


# ---------------------------------------------------------------- what sacct says that cannot be read


def test_a_session_that_ran_without_a_word_of_what_it_held_has_no_compute_never_zero():
    ran = [seg(submit=0, start=10, end=3610, elapsed=3600, cpus=None, gpus=None)]
    got = cost.cost_of(info([session(12)]), ["5"], {"5": ran}, now=T0 + 10_000)
    assert math.isnan(got.gpu_hours) and math.isnan(got.cpu_hours) and got.queue_wait_s == 10
    waiting = [seg(submit=0, start=10, end=3610, elapsed=3600, cpus=2, gpus=0),
               seg(submit=3611, start=None, end=None, elapsed=0, cpus=None, gpus=None)]  # pending: held nothing yet
    assert cost.cost_of(info([session(12)]), ["5"], {"5": waiting}, now=T0 + 3700).cpu_hours == pytest.approx(2.0)


START = f"{T0}|{T0 + 10}|{T0 + 3610}"
# (case, sacct's row for job 5, whether the queue wait is still known)
UNREADABLE_SACCT = [
    ("ElapsedRaw of ²", f"5|COMPLETED|{START}|²|cpu=4,node=1", False),
    ("ElapsedRaw of 400 digits", f"5|COMPLETED|{START}|{'9' * 400}|cpu=4,node=1", False),
    ("ElapsedRaw past 32 bits", f"5|COMPLETED|{START}|4294967294|cpu=4,node=1", False),
    ("Arabic-Indic digits", f"5|COMPLETED|{START}|٣٦٠٠|cpu=4,node=1", False),
    ("empty AllocTRES after 3600 s", f"5|COMPLETED|{START}|3600|", True),
    ("a CPU count of ²", f"5|COMPLETED|{START}|3600|cpu=²,node=1", False),
    ("a GPU count that is no number", f"5|COMPLETED|{START}|3600|cpu=4,gres/gpu=four", False),
    ("a start that is no Unix time", f"5|COMPLETED|{T0}|2026-11-25T21:33:37|{T0 + 3610}|3600|cpu=4", False),
    ("a value holding |", f"5|COMPLETED|{START}|3600|cpu=4|x", False),
]


@pytest.mark.parametrize("row, queue_known", [c[1:] for c in UNREADABLE_SACCT], ids=[c[0] for c in UNREADABLE_SACCT])
def test_a_sacct_answer_that_cannot_be_read_is_a_dash_in_the_report(tmp_path, slurm_shims, row, queue_known):
    slurm_run(tmp_path, "r1", 0.1, "5", [session(12)])
    slurm_shims.answer("sacct", f"{SACCT_HEADER}\n{row}\n")
    done = cli(tmp_path, "report", "exp", "--runs", "--format", "json", env=slurm_shims.env(alone=True), errors="replace")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert run["gpu_hours"] is None and run["cpu_hours"] is None
    assert (run["queue_wait_s"], run["lost_s"]) == ((10, 0) if queue_known else (None, None))
    md = cli(tmp_path, "report", "exp", "--runs", env=slurm_shims.env(alone=True), errors="replace")
    assert md.returncode == 0 and "compute - ·" in md.stdout and not re.search(r"[0-9] [CG]PU-h", md.stdout), md.stdout


def test_a_run_that_never_started_has_the_job_its_sweeps_record_gives_it_and_a_local_one_none(tmp_path):
    from clusterjob.core import sweep
    from clusterjob.core.record import Job
    from clusterjob.core.rundir import make_runs

    def pending(executor: str, job):
        runs = make_runs(tmp_path / executor, "s", [(i, "name: s\n", {"train.seed": i}) for i in range(3)],
                         executor=executor)
        where, part = sweep.new_part([run.path for run in runs], job=job, array=job is not None)
        sweep.add_parts(where, [part])
        return [{"path": str(run.path), "slurm_job_id": None, "sessions": []} for run in runs]

    slurm = pending("slurm", Job("slurm", "77"))
    assert [cost.slurm_jobs(run, sweep.Records()) for run in slurm] == [["77_0"], ["77_1"], ["77_2"]]
    # a local sweep's record has no Slurm job: none, without its run.json read again
    local = pending("local", None)
    for run in local:
        (Path(run["path"]) / "run.json").unlink()
    assert [cost.slurm_jobs(run, sweep.Records()) for run in local] == [[], [], []]
