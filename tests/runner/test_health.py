"""A rank's own part of the health watchdog (clusterjob.runner.health): beats at most once
a second, the sampler's view of a collective, the NCCL flight recorder's variables."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

import pytest
from clirun import wait_for

from clusterjob.core.rundir import RunDir
from clusterjob.runner import health


def test_a_beat_touches_the_file_at_most_once_a_second(tmp_path, monkeypatch):
    beat = tmp_path / "rank0.beat"
    beat.touch()
    os.utime(beat, (1, 1))
    clock = [100.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(health, "_beat_path", str(beat))
    monkeypatch.setattr(health, "_next_beat", 0.0)
    health.beat()
    assert beat.stat().st_mtime > 1
    os.utime(beat, (1, 1))
    clock[0] += 0.5
    health.beat()  # within the second: a compare, no touch
    assert beat.stat().st_mtime == 1
    clock[0] += 0.6
    health.beat()
    assert beat.stat().st_mtime > 1


def test_a_beat_outside_a_run_does_nothing(monkeypatch):
    monkeypatch.setattr(health, "_beat_path", None)
    health.beat()
    import clusterjob

    clusterjob.heartbeat()


@contextlib.contextmanager
def _sleeping_in(path: str) -> Iterator[threading.Thread]:
    """A started thread asleep (blocked reading a pipe, in C) in a function whose code says
    it is in ``path`` (a file of torch's, as the sampler reads frames), until the block ends."""
    space: dict = {}
    exec(compile("import os\ndef wait(fd):\n    os.read(fd, 1)\n", path, "exec"), space)
    wake, woken = os.pipe()
    thread = threading.Thread(target=space["wait"], args=(wake,))
    thread.start()
    try:
        wait_for(lambda: health._asleep(thread.native_id) and _innermost(thread).f_code.co_filename == path,
                 "the thread asleep in its wait")
        yield thread
    finally:
        os.write(woken, b"x")
        thread.join()
        os.close(wake)
        os.close(woken)


def _innermost(thread: threading.Thread):
    return sys._current_frames()[thread.ident]


def test_the_sampler_counts_a_main_thread_inside_torch_distributed_only():
    with _sleeping_in(f"/env/torch{os.sep}distributed{os.sep}c10d.py") as thread:
        frames = sys._current_frames()
        assert health._in_collective(frames[thread.ident]) is True
        assert health._in_collective(frames[threading.get_ident()]) is False
        assert health._in_collective(None) is False


def test_the_nccl_flight_recorder_goes_to_the_run_unless_set(tmp_path):
    run = RunDir(tmp_path)
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/mine/pipe",
               "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace"}
    health.nccl_environ(run, environ)
    assert environ == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/mine/pipe",
                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace"}  # the older names are still read
    assert health.nccl_dump_prefix(environ) == "/mine/trace"
    fresh: dict = {}
    health.nccl_environ(run, fresh)
    assert fresh == {"TORCH_FR_BUFFER_SIZE": "2000",  # torch 2.14: the names it reads without a warning
                     "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "logs" / "nccl-trace-rank"),
                     "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "logs" / "nccl-pipe-rank")}
    assert health.nccl_dump_prefix(fresh) == str(tmp_path / "logs" / "nccl-trace-rank")


@pytest.mark.parametrize("version, names", [
    ((2, 5), ["TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]),
    ((2, 11), ["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"]),
    ((3, 0), ["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"])])
def test_the_flight_recorder_is_set_under_the_names_the_torch_reads(tmp_path, monkeypatch, version, names):
    monkeypatch.setattr(health, "_torch_version", lambda: version)
    environ: dict = {}
    health.nccl_environ(RunDir(tmp_path), environ)
    assert sorted(environ) == sorted([*names, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]) and environ[names[0]] == "2000"
    assert health.nccl_dump_prefix(environ) == str(tmp_path / "logs" / "nccl-trace-rank")
    mine = {"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace"}
    health.nccl_environ(RunDir(tmp_path), mine)
    assert (mine["TORCH_FR_BUFFER_SIZE"], health.nccl_dump_prefix(mine)) == ("64", "/mine/trace")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in mine and "TORCH_FR_DUMP_TEMP_FILE" not in mine


def test_a_wait_clock_adds_what_is_still_on_a_device_when_read():
    clock = health.WaitClock("timed")
    clock.add(0.25)
    pending = [0.5]
    clock.settle = lambda: pending and clock.add(pending.pop())
    assert clock.read() == 0.75 and clock.read() == 0.75
    clock.settle = lambda: 1 / 0  # a device error is the training's to see, not the monitor's
    assert clock.read() == 0.75


def test_the_sampler_counts_a_backward_only_while_its_thread_sleeps():
    with _sleeping_in(f"/env/torch{os.sep}autograd{os.sep}graph.py") as thread:
        frame = _innermost(thread)
        assert health._waiting(frame, thread.native_id) is True  # DDP's wait for its all-reduce, in C++
        assert health._waiting(frame, threading.get_native_id()) is False  # running: computing its gradients
        assert health._waiting(sys._current_frames()[threading.get_ident()], thread.native_id) is False


def test_only_an_error_out_of_torch_distributed_is_blamed_on_a_rank_that_ended_first():
    from clusterjob.runner.health import _raised_in_collective

    def raised(code: str, filename: str) -> BaseException:
        try:
            exec(compile(code, filename, "exec"), {})
        except Exception as err:  # noqa: BLE001 -- the error under test
            return err
        raise AssertionError("nothing raised")

    collective = os.path.join("site-packages", "torch", "distributed", "distributed_c10d.py")
    assert _raised_in_collective(raised("raise RuntimeError('Connection closed by peer')", collective))
    assert not _raised_in_collective(raised("raise ValueError('rank one says no')", "train.py"))
    assert not _raised_in_collective(raised("raise RuntimeError('x')", os.path.join("torch", "nn", "modules.py")))
