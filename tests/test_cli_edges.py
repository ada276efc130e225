"""The command line's edge: a closed output pipe is a quiet end (exit 141) for every command
that only prints, and drops only the output of one that changes state; every bad flag is
one line (exit 2), never argparse's usage block; status and report say a missing or empty
results folder the same way. The pipes are real CLI processes; the one-line errors run as
tests/clirun.py runs them."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest
from clirun import base_env, cli, start
from trainutil import write_spec

from clusterjob import cli as clusterjob_cli
from clusterjob.core import procs
from clusterjob.core.files import now_iso
from clusterjob.core.rundir import RunDir, make_runs
from clusterjob.launch import executor, sbatch

F_SETPIPE_SZ = 1031  # Linux: a pipe of one page, so that a few KiB of output fill it


def closed_early(argv: list, cwd: Path, keep: int = 0, stderr_too: bool = False, unbuffered: bool = False,
                 timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with its stdout a one-page pipe whose reader takes ``keep`` bytes and
    closes it (at once with 0, before the command printed anything); (exit status, stderr).
    With ``stderr_too`` stderr goes into the same pipe (``2>&1 | head``). Output is
    buffered, as in a user's shell, unless ``unbuffered`` (PYTHONUNBUFFERED=1)."""
    env = {key: value for key, value in base_env().items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = start(cwd, *argv, env=env, stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE, text=False)
    try:
        fcntl.fcntl(proc.stdout.fileno(), F_SETPIPE_SZ, 4096)
        got = proc.stdout.read(keep) if keep else b""
        assert len(got) == keep
        proc.stdout.close()
        err = b"" if stderr_too else proc.stderr.read()
        return proc.wait(timeout=timeout), err.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def quiet_end(result: tuple[int, str]) -> None:
    code, err = result
    assert (code, err) == (clusterjob_cli.PIPE_CLOSED, ""), err[-2000:]


def one_run(tmp_path: Path, status: str = "completed", **fields) -> RunDir:
    (run,) = make_runs(tmp_path / "results", "exp", [(0, "name: exp\n", {})], executor="local",
                       started_at=now_iso(), world_size=1)
    run.update(status=status, **fields)
    return run


def running_run(tmp_path: Path) -> RunDir:
    """A local run that stays running while the test runs: its supervisor is this process."""
    return one_run(tmp_path, "running", launcher=procs.current())


# ----------------------------------------------------------------------------- closed pipes


def test_status_piped_into_head_ends_quietly_after_a_few_bytes(tmp_path):
    one_run(tmp_path, warnings=[f"warning {i}: " + "x" * 3000 for i in range(5)])  # 15 KB of table
    quiet_end(closed_early(["status", "results/exp"], tmp_path, keep=100))
    quiet_end(closed_early(["status", "results/exp"], tmp_path))
    quiet_end(closed_early(["status", "results/exp"], tmp_path, keep=100, stderr_too=True))


def test_logs_and_logs_follow_end_quietly(tmp_path):
    run = running_run(tmp_path)
    (run.logs / "rank0.out").write_text("line of output\n" * 20_000)  # 300 KB
    quiet_end(closed_early(["logs", str(run.path)], tmp_path, keep=50))
    quiet_end(closed_early(["logs", "-f", str(run.path)], tmp_path, keep=50))
    assert run.read().status == "running"  # read-only, the early end too


def test_report_and_report_watch_end_quietly(tmp_path):
    run = running_run(tmp_path)
    (run.path / "metrics.jsonl").write_text('{"epoch": 1, "val_acc": 0.5}\n')
    quiet_end(closed_early(["report", "results/exp"], tmp_path))
    quiet_end(closed_early(["report", "results/exp", "--runs", "--watch", "--interval", "0.1"], tmp_path, keep=20))


@pytest.mark.parametrize("unbuffered", [False, True])
def test_help_version_validate_sbatch_env_and_a_dry_run_end_quietly(tmp_path, unbuffered):
    spec = str(write_spec(tmp_path))
    for argv in (["--help"], ["--version"], ["submit", "--help"], ["validate", spec], ["sbatch", spec], ["env"],
                 ["env", "--json"]):
        quiet_end(closed_early(argv, tmp_path, unbuffered=unbuffered))
    # submit's printing: the closed pipe drops it, the command still ends as it would have
    assert closed_early(["submit", spec, "--executor", "local", "--dry-run"], tmp_path, unbuffered=unbuffered) == (0, "")
    assert not (tmp_path / "results").exists()


def test_a_command_that_changes_state_finishes_its_work_when_its_output_is_closed(tmp_path):
    run = one_run(tmp_path, "pending")  # no rank started yet: cancel marks it cancelled
    assert closed_early(["cancel", str(run.path)], tmp_path) == (0, "")
    assert run.read().status == "cancelled"


def test_a_broken_pipe_that_is_not_the_output_stays_an_error(tmp_path, monkeypatch):
    from clusterjob.launch import control

    def broken(folder, **options):
        raise BrokenPipeError(32, "Broken pipe")  # a child's stdin, say: not our reader gone

    monkeypatch.setattr(control, "cmd_status", broken)
    with pytest.raises(BrokenPipeError):
        clusterjob_cli.main(["status", str(tmp_path)])


# ----------------------------------------------------------------------------- one line for every bad flag


def one_line(done: subprocess.CompletedProcess, *says: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and done.stdout == "", done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: ") and "usage:" not in done.stderr
    for text in says:
        assert text in lines[0], lines[0]


def test_every_bad_flag_is_one_line_naming_the_flag_the_value_and_the_choices(tmp_path):
    spec = str(write_spec(tmp_path))
    one_line(cli(tmp_path, "submit", spec, "--executor", "nope"),
             "--executor 'nope'", "choose one of: auto, slurm, local")
    one_line(cli(tmp_path, "sbatch", spec, "--style", "mpi"), "--style 'mpi'", "srun, torchrun")
    one_line(cli(tmp_path, "report", "results", "--format", "xml"), "--format: 'xml'", "md, csv, html, json")
    one_line(cli(tmp_path, "report", "results", "--mode", "best"), "--mode", "best")
    one_line(cli(tmp_path, "logs", "somerun", "--rank", "x"), "--rank", "'x'", "clusterjob logs --help")
    one_line(cli(tmp_path, "report", "results", "--watch", "--interval", "soon"), "--interval", "'soon'")
    one_line(cli(tmp_path, "status", "--colour"), "--colour")
    one_line(cli(tmp_path, "frobnicate"), "'frobnicate'", "submit")
    one_line(cli(tmp_path), "COMMAND")
    one_line(cli(tmp_path, "submit"), "spec", "clusterjob submit --help")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # nothing written


def test_the_help_lists_the_choices_the_commands_check():
    submit = cli(Path("."), "submit", "--help").stdout
    assert f"--executor {'|'.join(['auto', *executor.listed_names()])}" in submit
    assert sorted(executor.listed_names()) == sorted(executor.names())  # listed without import = registered
    style = cli(Path("."), "sbatch", "--help").stdout
    assert f"--style {'|'.join(sbatch.STYLES)}" in style


@pytest.mark.parametrize("where", ["nope", "empty", "afile"])
def test_status_and_report_say_a_folder_without_runs_the_same_way(tmp_path, where):
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("not a folder\n")
    status, report = cli(tmp_path, "status", where), cli(tmp_path, "report", where)
    watch = cli(tmp_path, "report", where, "--watch")
    one_line(status, where)
    assert status.stderr == report.stderr == watch.stderr
    word = "no runs under empty: " if where == "empty" else f"no such results folder: {where}; "
    assert word in status.stderr
