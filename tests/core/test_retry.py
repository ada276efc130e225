"""Which failures point at the machine, the back-off, and run.json's record of each attempt
(clusterjob.core.retry)."""

from __future__ import annotations

import json

import pytest

from clusterjob.core import retry
from clusterjob.core.record import RunError, RunRecord
from clusterjob.core.rundir import create_run

GLOO_CLOSED = RunError(0, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                          "peer [10.200.0.12]:29500", "Traceback ...\nRuntimeError: ...", "2026-01-01T10:00:02")
NCCL_TIMEOUT = RunError(1, "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited",
                        "Traceback ...", "2026-01-01T10:00:01")
WATCHDOG = RunError(0, "RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
                       "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.", "", "2026-01-01T10:00:03")
WRAPPED = RunError(0, "RuntimeError: the step failed", "Traceback ...\ntorch.distributed.DistNetworkError: "
                                                        "Connection reset by peer")
USER_BUG = RunError(1, "KeyError: 'label'", "Traceback ...\nKeyError: 'label'", "2026-01-01T10:00:00")


@pytest.mark.parametrize("error", [GLOO_CLOSED, NCCL_TIMEOUT, WATCHDOG, WRAPPED])
def test_communication_errors_are_told_from_the_message_or_the_last_traceback_line(error):
    assert retry.communication_error(error)


def test_a_python_error_is_no_communication_error():
    assert not retry.communication_error(USER_BUG)


@pytest.mark.parametrize("killed, errors, codes, cause", [
    ("rank 1 was killed by SIGKILL", [GLOO_CLOSED], [0, -9], "rank 1 was killed by SIGKILL"),
    ("rank 1 was killed by SIGKILL", [], [], "rank 1 was killed by SIGKILL"),
    (None, [GLOO_CLOSED, NCCL_TIMEOUT], [1, 1], f"rank 1: {NCCL_TIMEOUT.message}"),  # the earliest
    (None, [WATCHDOG], [1], f"rank 0: {WATCHDOG.message}"),
    ("rank 1 was killed by SIGKILL", [USER_BUG, GLOO_CLOSED], [1, -9], None),  # the code's own error: never retried
    (None, [USER_BUG], [0, 1], None),
    (None, [GLOO_CLOSED], [2, 1], None),  # a rank with bad input
    (None, [], [1], None),  # nothing points at the machine
])
def test_a_failure_points_at_the_machine_only_without_a_python_error_or_bad_input(killed, errors, codes, cause):
    assert retry.machine_cause(killed, errors, codes) == cause


def test_the_backoff_doubles_up_to_an_hour():
    assert [retry.backoff_s(30, n) for n in (1, 2, 3)] == [30, 60, 120]
    assert retry.backoff_s(30, 20) == retry.MAX_BACKOFF_S and retry.backoff_s(0, 3) == 0


def test_the_next_retry_until_max_retries():
    assert retry.next_retry(RunRecord(), 2) == 1
    assert retry.next_retry(RunRecord(retries=1), 2) == 2
    assert retry.next_retry(RunRecord(retries=2), 2) is None
    assert retry.next_retry(RunRecord(), 0) is None


def test_each_attempt_is_recorded_and_a_retry_reopens_the_run(tmp_path):
    run = create_run(tmp_path, "exp", "r1", "name: exp\n", {})
    run.update(status="failed", hosts=["node1", "node2"], error=RunError(1, "killed"), finished_at="t")
    (run.logs / "rank0.error.json").write_text(json.dumps(GLOO_CLOSED.to_dict()))
    info = retry.record_attempt(run, "rank 1 was killed by SIGKILL", 1, job="7_1")
    assert (info.status, info.retries, info.error, info.finished_at) == ("pending", 1, None, None)
    (attempt,) = info.attempts
    assert (attempt.hosts, attempt.why, attempt.retry, attempt.job) == (["node1", "node2"],
                                                                      "rank 1 was killed by SIGKILL", 1, "7_1")
    assert not (run.logs / "rank0.error.json").exists()  # the next session's errors are its own
    assert json.loads((run.logs / "attempt-1" / "rank0.error.json").read_text())["message"] == GLOO_CLOSED.message
    run.update(status="failed", error=RunError(0, "again"))
    last = retry.record_attempt(run, "rank 0 was killed by SIGKILL", None, hosts=["vm"])
    assert last.status == "failed" and last.retries == 1 and [a.retry for a in last.attempts] == [1, None]
    assert json.loads(run.info_file.read_text())["attempts"][1] == {"at": last.attempts[1].at, "hosts": ["vm"],
                                               "why": "rank 0 was killed by SIGKILL", "retry": None, "job": None}


def test_damaged_attempts_are_problems_not_crashes(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"attempts": [{"at": 3, "hosts": "node1", "why": "x"}, "junk"]}))
    from clusterjob.core import record

    got, problems = record.read_record(tmp_path)
    assert [(a.at, a.hosts, a.why) for a in got.attempts] == [(None, [], "x")]
    assert len(problems) == 3 and all("attempts[" in p for p in problems)


# What a broken GPU or driver says (the node's fault: the same code runs on another node).
ECC = RunError(1, "RuntimeError: CUDA error: uncorrectable ECC error encountered", "Traceback ...", "2026-01-01T10:00:01",
               "node2")
BUSY = RunError(0, "torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
                "Traceback ...", "2026-01-01T10:00:02", "node3")
LOST = RunError(1, "RuntimeError: the step failed", "Traceback ...\npynvml.NVMLError_GPUIsLost: GPU is lost", None, "node2")


@pytest.mark.parametrize("errors, cause, hosts", [
    ([ECC, GLOO_CLOSED], f"rank 1: {ECC.message}", ["node2"]),  # the peers' collateral errors: still the node's
    ([BUSY], f"rank 0: {BUSY.message}", ["node3"]),
    ([LOST, ECC], f"rank 1: {LOST.message}", ["node2"]),  # one node, listed once
    ([ECC, USER_BUG], None, ["node2"]),  # beside the code's own error: never retried
    ([GLOO_CLOSED], f"rank 0: {GLOO_CLOSED.message}", []),  # a broken connection names no node
])
def test_a_node_fault_is_a_failure_of_the_machine_and_names_its_node(errors, cause, hosts):
    assert retry.machine_cause(None, errors, [1]) == cause
    assert retry.faulty_hosts(errors) == hosts


@pytest.mark.parametrize("message, log, found", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "", ("GPU OOM", "rank 1: out of GPU memory")),
    ("RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "", ("GPU OOM", "rank 1: out of GPU memory")),
    ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", "",
     ("GPU OOM", "rank 1: out of GPU memory")),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error; last "
     "error: Cuda failure 2 'out of memory'", "", ("GPU OOM", "rank 1: out of GPU memory")),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "", ("GPU OOM", "rank 1: out of GPU memory")),
    ("MemoryError", "", ("OOM", "rank 1: out of memory")),
    ("_ArrayMemoryError: Unable to allocate 74.5 GiB for an array with shape (100000, 100000) and data type float64",
     "", ("OOM", "rank 1: out of memory")),  # numpy's MemoryError
    ("MemoryError: Unable to allocate 80.0 GiB for an array with shape (10000000000,)", "", ("OOM", "rank 1: out of memory")),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
     "to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)", "", ("OOM", "rank 1: out of memory")),
    ("OSError: [Errno 12] Cannot allocate memory", "", ("OOM", "rank 1: out of memory")),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ", "", ("OOM", "rank 1: out of memory")),
    # a worker (or any process of the step) the kernel's OOM killer ended; the rank's own error says only that it is gone
    ("RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly",
     "slurmstepd: error: Detected 1 oom_kill event in StepId=12.0. Some of the step tasks have been OOM Killed.\n",
     ("OOM", "a process of the step was killed out of memory")),
    ("RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly", "", None),
    ("KeyError: 'OutOfMemory'", "", None),  # a word of the code's own error is no memory error
    ("NameError: name 'MemoryErrorHandler' is not defined", "", None),
])
def test_running_out_of_memory_is_told_from_the_ranks_errors_or_the_step_log(message, log, found):
    assert retry.out_of_memory([RunError(1, message, "Traceback ...")], log) == found


def test_the_nodes_of_ranks_that_raised_nccl_errors_are_suspects():
    nccl = [RunError(0, NCCL_TIMEOUT.message, "", None, "node1"), RunError(1, NCCL_TIMEOUT.message, "", None, "node2"),
            RunError(2, GLOO_CLOSED.message, "", None, "node3"), RunError(3, NCCL_TIMEOUT.message, "", None, None)]
    assert retry.nccl_hosts(nccl) == ["node1", "node2"]
