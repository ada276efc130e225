"""The one reader of Slurm's answers (clusterjob.core.slurmctl): tables by their header,
``scontrol show`` records by key, every number strict. On golden answers of Slurm 22.05
(tests/golden/slurm-22.05, captured from the local cluster by its capture.sh) and on
answers no Slurm would give."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.core import slurmctl
from clusterjob.core.errors import SlurmUnreachable
from clusterjob.core.slurmctl import Segment
from clusterjob.launch import preflight

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm-22.05"
JOBS = dict(pair.split("=") for pair in (GOLDEN / "jobs.txt").read_text().split())


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("3600", 3600), (" 42\t", 42), ("007", 7), (str(slurmctl.MOST), slurmctl.MOST),
    ("²", None), ("٣٦٠٠", None), ("+3", None), ("-1", None), ("1_0", None), ("3.0", None), ("1e3", None),
    ("N/A", None), ("Unknown", None), ("", None), (None, None), ("4294967294", None), ("9" * 19, None),
    ("9" * 400, None), ("1 2", None), ("3\n", None),
])
def test_a_number_is_ascii_digits_within_the_bound_or_unknown(text, value):
    assert slurmctl.number(text) == value


def test_a_number_has_a_bound_of_its_own():
    assert slurmctl.number("1001", most=1000) is None and slurmctl.number("1000", most=1000) == 1000


@pytest.mark.parametrize("text, seconds", [
    ("00:05:00", 300), ("1-00:00:00", 86400), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), ("59:59", 3599),
    ("30", 30), ("UNLIMITED", None), ("INVALID", None), ("", None), ("1:²:00", None), ("-5", None),
    ("1:60:00", None), ("1-2-3", None), ("1:2:3:4", None), ("9" * 400 + ":00", None),
])
def test_durations_are_read_strictly(text, seconds):
    assert slurmctl.parse_duration(text) == seconds


def test_a_table_is_read_by_its_header_and_a_row_of_another_width_is_left_out():
    rows = slurmctl.table("B|A\n1|2\n\n3|4|5\n6\n")
    assert rows == [{"B": "1", "A": "2"}]
    assert slurmctl.table("") == [] and slurmctl.table("A|B\n") == []


def test_records_keep_blanks_in_values_and_leave_out_a_key_said_twice():
    (record,) = slurmctl.records("JobId=5 JobName=a b StartTime=x UserId=root(0) StartTime=2026-01-01T00:00:00 "
                                 "TRES=cpu=1,mem=100M CPUs/Task=1 AllocNode:Sid=h:1 Power= \n")
    assert record == {"JobId": "5", "JobName": "a b", "UserId": "root(0)", "TRES": "cpu=1,mem=100M",
                      "CPUs/Task": "1", "AllocNode:Sid": "h:1", "Power": ""}


def test_settings_read_key_equals_value_lines():
    text = "Configuration data as of 2026\nMaxArraySize            = 1001\nSuspendRate = 60 nodes/min\nA = 1\nA = 2\n"
    assert slurmctl.settings(text) == {"MaxArraySize": "1001", "SuspendRate": "60 nodes/min"}


# ----------------------------------------------------------------------------- Slurm 22.05's own answers


def test_golden_sacct_sessions_are_read_by_header(slurm_shims):
    slurm_shims.answer("sacct", golden("sacct_segments.txt"))
    ids = [JOBS["ok"], JOBS["failed"], *(f"{JOBS['array']}_{task}" for task in range(3)), JOBS["odd_name"],
           JOBS["requeued"], JOBS["held"]]
    got = slurmctl.segments(ids)
    assert got is not None and sorted(got) == sorted(ids)
    ok, = got[JOBS["ok"]]
    assert (ok.state, ok.cpus, ok.gpus, ok.end - ok.start) == ("COMPLETED", 1, 0, ok.elapsed_s)
    assert [s.state for s in got[JOBS["requeued"]]] == ["REQUEUED", "CANCELLED"]  # "CANCELLED by 0"
    first, second = got[JOBS["requeued"]]
    assert first.end <= second.submit and second.start is not None
    held, = got[JOBS["held"]]
    assert held == Segment(JOBS["held"], "PENDING", held.submit, None, None, 0, None, None)
    assert [s.state for s in got[f"{JOBS['array']}_1"]] == ["COMPLETED"]
    assert slurm_shims.calls("sacct")[0][:6] == ["-D", "-X", "-P", "-o", "JobID,State,Submit,Start,End,ElapsedRaw,"
                                                                          "AllocTRES", "-j"]
    assert slurmctl.previous_state(JOBS["requeued"]) == "REQUEUED"  # segments()[-2]
    assert slurmctl.previous_state(JOBS["ok"]) is None


def test_golden_sacct_and_squeue_states(slurm_shims):
    slurm_shims.answer("sacct", golden("sacct_states.txt")).answer("squeue", golden("squeue.txt"))
    states = slurmctl.accounting_states([JOBS["ok"], JOBS["requeued"]])
    assert states is not None and states[JOBS["ok"]] == "COMPLETED" and states[JOBS["requeued"]] == "CANCELLED"
    assert states[JOBS["failed"]] == "FAILED" and states[f"{JOBS['array']}_2"] == "COMPLETED"
    assert slurmctl.queue_states([JOBS["held"]]) == {JOBS["held"]: "PENDING", JOBS["requeued"]: "RUNNING"}


def test_golden_scontrol_show_job(slurm_shims):
    slurm_shims.answer("scontrol", golden("scontrol_show_job_running.txt"), when=f"-o {JOBS['requeued']}")
    slurm_shims.answer("scontrol", golden("scontrol_show_job_pending.txt"), when=f"-o {JOBS['held']}")
    slurm_shims.answer("scontrol", golden("scontrol_show_job_odd_name.txt"), when=f"-o {JOBS['odd_name']}")
    (running,) = slurmctl.records(golden("scontrol_show_job_running.txt"))
    assert (running["JobId"], running["JobState"], running["Restarts"]) == (JOBS["requeued"], "RUNNING", "1")
    assert slurmctl.submit_time(JOBS["requeued"]) == running["SubmitTime"]
    assert slurmctl.submit_time(JOBS["held"]).startswith("20")
    (odd,) = slurmctl.records(golden("scontrol_show_job_odd_name.txt"))
    assert odd["JobName"] == "a b" and "StartTime" not in odd  # its name said StartTime= too: which one is Slurm's?
    assert slurmctl.submit_time(JOBS["odd_name"]) == odd["SubmitTime"]
    assert slurmctl.submit_time("999999") is None  # no rule: an empty answer


def test_golden_config_partitions_nodes_and_qos():
    assert slurmctl.settings(golden("scontrol_show_config.txt"))["MaxArraySize"] == "1001"
    debug, limited = preflight.parse_partitions(golden("scontrol_show_partition.txt"))
    assert (debug.name, debug.state, debug.total_nodes, debug.max_nodes, debug.max_time_min, debug.default) == \
        ("debug", "UP", 3, None, None, True)
    assert (limited.total_nodes, limited.max_nodes, limited.max_time_min, limited.unread) == (2, 1, 5, ())
    nodes = preflight.node_rows(golden("sinfo_nodes.txt"))
    assert [(n["name"], n["cpus"], n["gpus"], n["features"]) for n in nodes] == [
        (f"node{i}", 8, 0, set()) for i in (1, 2, 3)]
    rows = {row["Name"]: row for row in slurmctl.table(golden("sacctmgr_show_qos.txt"))}
    assert rows["normal"] == {"Name": "normal", "MaxWall": "", "MaxTRES": "", "MaxSubmitPU": "", "MaxSubmitPA": "",
                              "GrpSubmit": ""}
    assert preflight.parse_minutes(rows["golden"]["MaxWall"]) == 5
    assert preflight.parse_tres(rows["golden"]["MaxTRES"]) == {"cpu": 4, "node": 1}
    assert slurmctl.number(rows["golden"]["MaxSubmitPU"]) == 100  # MaxSubmitJobsPerUser, as the jobs check reads it


def test_max_array_size_never_guesses(slurm_shims):
    slurm_shims.answer("scontrol", golden("scontrol_show_config.txt"))
    assert slurmctl.max_array_size() == 1001
    slurm_shims.answer("scontrol", "MaxArraySize = 0\n")
    assert slurmctl.max_array_size() == 0
    for said in ("MaxArraySize = ²\n", "MaxArraySize = " + "9" * 400 + "\n", "SomethingElse = 1\n"):
        slurm_shims.answer("scontrol", said)
        with pytest.raises(slurmctl.Unreadable, match="could not be read: `scontrol show config` gave (no )?MaxArraySize"):
            slurmctl.max_array_size()
    slurm_shims.fail("scontrol")
    with pytest.raises(SlurmUnreachable, match="`scontrol show config` did not answer: error: Unable to contact"):
        slurmctl.max_array_size()


def test_time_left_and_reachable(slurm_shims):
    slurm_shims.answer("squeue", "TIME_LEFT\n1-00:00:10\n")
    assert slurmctl.time_left_s("5") == 86410
    slurm_shims.answer("squeue", "TIME_LEFT\nUNLIMITED\n")
    assert slurmctl.time_left_s("5") is None
    slurm_shims.answer("squeue", "TIME_LEFT\n٣:00\n")
    assert slurmctl.time_left_s("5") is None
    slurm_shims.answer("sinfo", "debug*\n").answer("sbatch")
    assert slurmctl.reachable()
    slurm_shims.answer("sinfo", delay=5)
    assert not slurmctl.reachable(timeout_s=0.5)
