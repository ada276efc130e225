"""rundir.last_words: the traceback recorded for a rank that ended without writing its
own is the end of its stderr, less torch's INFO and WARNING log lines (c10, c10d, glog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.core.rundir import LAST_WORDS, RunDir, last_words

TORCH_LINES = [
    "[W1206 12:00:00.123456789 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
    "[I1206 22:37:54.603292354 TCPStore.cpp:271] [c10d - debug] The server has started on port = 29731.",
    "[W socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
    "[rank1]:[W1206 12:00:00.123456 ProcessGroupGloo.cpp:12] Warning: find_unused_parameters=True",
    "[W1206 12:00:00.123  4242 torch/csrc/distributed/c10d/socket.cpp:207] a thread id after the time",
    "W1206 12:00:00.123456  1234 logging.cc:42] glog's own warning",
    "I1206 12:00:00.123 77 init.cc:9] glog's own info",
]


def a_run(tmp_path: Path, stderr: str) -> RunDir:
    run = RunDir(tmp_path / "r1")
    run.logs.mkdir(parents=True)
    (run.logs / "rank1.err").write_text(stderr)
    return run


@pytest.mark.parametrize("line", TORCH_LINES)
def test_a_torch_info_or_warning_line_is_never_the_traceback(tmp_path, line):
    assert last_words(a_run(tmp_path, line + "\n"), 1) == ""


def test_the_rank_s_own_lines_are_kept_in_order_around_torch_s(tmp_path):
    own = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
           "RuntimeError: [W] is how my code says warning", "W1206 is not a time", "[Warning] mine too"]
    stderr = "\n".join([TORCH_LINES[0], own[0], TORCH_LINES[1], *own[1:], *TORCH_LINES[2:]]) + "\n"
    assert last_words(a_run(tmp_path, stderr), 1) == "\n".join(own)


def test_torch_s_error_lines_stay_they_may_say_why_the_rank_ended(tmp_path):
    error = "[E1206 12:00:00.123456789 ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed with timeout"
    fatal = "F1206 12:00:00.123456  1234 logging.cc:42] Check failed: ok"
    assert last_words(a_run(tmp_path, f"{TORCH_LINES[0]}\n{error}\n{fatal}\n"), 1) == f"{error}\n{fatal}"


def test_the_last_lines_of_the_rank_s_own_after_a_flood_of_warnings(tmp_path):
    mine = [f"step {i}" for i in range(LAST_WORDS + 5)]
    stderr = "\n".join(mine + [TORCH_LINES[0]] * 300) + "\n"
    assert last_words(a_run(tmp_path, stderr), 1) == "\n".join(mine[-LAST_WORDS:])


def test_no_log_is_no_traceback(tmp_path):
    run = RunDir(tmp_path / "r1")
    assert last_words(run, 1) == ""
