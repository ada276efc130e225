"""``train.amp: auto`` through the command line, on both kinds of CPU: a 2-rank local run
whose CPU flags come from a cpuinfo file of each kind (CLUSTERJOB_CPUINFO), checked in
the submit's first line, rank 0's log, run.json and the report."""

from __future__ import annotations

import pytest
from clirun import base_env, cli
from trainutil import run_info, write_spec

NO_BF16 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n"
BF16 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16\n"


@pytest.mark.slow
@pytest.mark.parametrize("cpuinfo, mode, why", [
    (NO_BF16, "off", "this CPU has no native bf16"),
    (BF16, "bf16", "this CPU runs bf16 natively"),
])
def test_amp_auto_follows_the_cpu_and_every_first_line_says_so(tmp_path, cpuinfo, mode, why):
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    env = {**base_env(), "CLUSTERJOB_CPUINFO": str(tmp_path / "cpuinfo")}
    spec = write_spec(tmp_path, "amp", train={"amp": "auto"}, resources={"tasks_per_node": 2})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    line = f"amp auto -> {mode} ({why})"
    assert done.stdout.splitlines()[0] == line
    (run,) = [p for p in (tmp_path / "results" / "amp").iterdir() if not p.name.startswith(".")]
    assert (run / "logs" / "rank0.out").read_text().splitlines()[0] == line
    assert run_info(run)["amp"] == mode
    table = cli(tmp_path, "report", str(tmp_path / "results"), "--group-by", "amp", env=env)
    rows = [line.split("|") for line in table.stdout.splitlines() if line.startswith("|*|")]
    assert table.returncode == 0 and [row[2].strip() for row in rows] == [mode]  # what auto became, never "auto"


def test_a_named_amp_or_your_own_code_says_nothing_at_submit(tmp_path, monkeypatch):
    from clusterjob.launch.submit import amp_lines
    from clusterjob.spec.schema import spec_from_dict

    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    named = spec_from_dict({"name": "n", "train": {"amp": "off"}})
    own = spec_from_dict({"name": "o", "entrypoint": {"script": "train.py"}})
    gpu = spec_from_dict({"name": "g", "resources": {"gpus_per_node": 1, "tasks_per_node": 1}})
    assert amp_lines([named, own], ranks_here=True) == []
    assert amp_lines([gpu, gpu], ranks_here=True) == [
        "amp auto -> decided where the ranks start (bf16 on GPUs of compute capability >= 8.0, else fp16)"]
    assert amp_lines([named, spec_from_dict({"name": "c"})], ranks_here=False) == [
        "amp auto -> decided where the ranks start (bf16 where their CPUs run it natively, else off)"]
