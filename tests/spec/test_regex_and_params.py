"""Metric regexes the engine cannot compile, params keys with control characters, and
sweeps over params keys the spec does not list, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from clirun import cli

SCRIPT = "import sys, clusterjob\nprint('argv', sys.argv[1:], 'params', clusterjob.params)\n"


def write_spec(folder: Path, spec: "dict | str") -> None:
    (folder / "train.py").write_text(SCRIPT)
    text = spec if isinstance(spec, str) else yaml.safe_dump({"name": "t", **spec})
    (folder / "s.yaml").write_text(text)


def own_code(**entrypoint) -> dict:
    return {"entrypoint": {"script": "train.py", **entrypoint}}


def nested(depth: int) -> str:
    return "(" * depth + "x" + ")" * depth


BAD_REGEXES = [
    ("nested 1200", nested(1200), "nests too deeply"),
    ("nested 2000 non-capturing", "(" + "(?:" * 2000 + "x" + ")" * 2001, "nests too deeply"),
    ("repeat count huge", "(x{99999999999})", "repetition number is too large"),
    ("repeat range huge", "(x{1,4294967296})", "metrics.acc"),
    ("bad escape", r"(\q)", "bad escape"),
    ("unbalanced", "acc=([0-9]+", "missing )"),
    ("lookbehind of variable width", r"((?<=a+)b)", "look-behind"),
]


@pytest.mark.parametrize("regex, says", [c[1:] for c in BAD_REGEXES], ids=[c[0] for c in BAD_REGEXES])
@pytest.mark.parametrize("command", [("validate",), ("submit", "--dry-run", "--executor", "local")])
def test_a_regex_that_does_not_compile_is_one_line_exit_2(tmp_path: Path, regex: str, says: str, command: tuple):
    write_spec(tmp_path, own_code(metrics={"acc": regex}))
    done = cli(tmp_path, *command, "s.yaml", errors="replace")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: entrypoint.metrics.acc: ") and "is not a regex" in lines[0]
    assert says in lines[0] and len(lines[0]) < 1000, lines[0]
    assert not (tmp_path / "results").exists()


BAD_PARAMS = [
    ("key with a line break", 'params: {x: {"a\\nb": 1}}', "params.x.'a\\nb'"),
    ("key with an escape, deeper", 'params: {x: {y: [{"k\\e[2J": 1}]}}', "params.x.y[0].'k\\x1b[2J'"),
    ("key with a carriage return", 'params: {x: {"ok": {"a\\rb": true}}}', "params.x.ok.'a\\rb'"),
    ("key with a NUL", 'params: {cfg: {"a\\0": 1}}', "params.cfg.'a\\x00'"),
    ("value with a line break, deep", 'params: {x: {y: {z: "a\\nb"}}}', "params.x.y.z"),
    ("key with a line separator", 'params: {x: {"a\\u2028b": 1}}', "params.x.'a\\u2028b'"),
]


@pytest.mark.parametrize("params, where", [c[1:] for c in BAD_PARAMS], ids=[c[0] for c in BAD_PARAMS])
def test_every_string_in_params_is_one_line(tmp_path: Path, params: str, where: str):
    write_spec(tmp_path, "name: t\nentrypoint: {script: train.py}\n" + params + "\n")
    done = cli(tmp_path, "validate", "s.yaml", errors="replace")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"clusterjob: error: {where}: ") and "control character" in lines[0], lines[0]


SWEPT = [
    ("one swept key", {"args": ["--lr", "{params.lr}"]}, {}, {"params.lr": [0.01, 0.05]}, 2),
    ("two swept keys, one in params", {"args": ["--lr={params.lr}", "{params.bs}", "{params.seed}"]},
     {"seed": 1}, {"params.lr": [0.1], "params.bs": [8, 16]}, 2),
    ("swept key overrides params", {"args": ["{params.lr}"]}, {"lr": 0.5}, {"params.lr": [0.1, 0.2, 0.3]}, 3),
]


@pytest.mark.parametrize("entrypoint, params, sweep, runs", [c[1:] for c in SWEPT], ids=[c[0] for c in SWEPT])
def test_a_sweep_may_name_params_the_spec_does_not_list(tmp_path: Path, entrypoint, params, sweep, runs: int):
    write_spec(tmp_path, {**own_code(**entrypoint), "sweep": sweep, **({"params": params} if params else {})})
    done = cli(tmp_path, "validate", "s.yaml", errors="replace")
    assert done.returncode == 0 and f"ok: {runs} run(s)" in done.stderr, done.stderr
    assert len([line for line in done.stdout.splitlines() if line.startswith("# run ")]) == runs
    swept = [key[len("params."):] for key in sweep]
    assert not any(f"{name}: null" in done.stdout for name in swept), done.stdout  # no stand-in leaks out


def test_a_name_neither_listed_nor_swept_is_still_refused(tmp_path: Path):
    write_spec(tmp_path, {**own_code(args=["{params.lr}", "{params.typo}"]), "sweep": {"params.lr": [1, 2]}})
    done = cli(tmp_path, "validate", "s.yaml", errors="replace")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "{params.typo} names no params key" in lines[0], lines


def test_a_swept_params_key_reaches_the_code(tmp_path: Path):
    write_spec(tmp_path, {**own_code(args=["--lr", "{params.lr}"]), "sweep": {"params.lr": [0.01, 0.05]}})
    done = cli(tmp_path, "submit", "--executor", "local", "--wait", "s.yaml", errors="replace")
    assert done.returncode == 0, done.stdout + done.stderr
    outs = sorted((tmp_path / "results" / "t").glob("*/logs/rank0.out"))
    seen = [out.read_text().splitlines()[0] for out in outs]
    assert seen == [f"argv ['--lr', '{lr}'] params {{'lr': {lr}}}" for lr in (0.01, 0.05)]
    infos = [json.loads(out.parent.parent.joinpath("run.json").read_text()) for out in outs]
    assert [i["params"] for i in infos] == [{"params.lr": 0.01}, {"params.lr": 0.05}]


GROUP_SHAPES = [
    (r"iter (?P<step>[0-9]+): loss ([0-9.]+)", None),
    (r"(?P<step>\d+) (?P<loss>[0-9.]+)", None),  # the value group may have a name too
    (r"x (\d+) ([0-9.]+)", "has 2 groups (a second group must be named step: (?P<step>...)); it needs exactly one"),
    (r"(?P<step>\d+)", "has only the step group; add a group around the number"),
    (r"(?P<step>\d+) (a) (b)", "has 3 groups; it needs exactly one around the number, and may have one more named step"),
    (r"(?P<it>\d+) ([0-9.]+)", "has 2 groups (a second group must be named step"),
]


@pytest.mark.parametrize("regex, says", GROUP_SHAPES)
def test_a_metric_regex_may_take_its_step_from_a_named_group_and_no_other_shape(tmp_path: Path, regex: str,
                                                                              says: "str | None"):
    write_spec(tmp_path, own_code(metrics={"loss": regex}))
    done = cli(tmp_path, "validate", "s.yaml", errors="replace")
    if says is None:
        assert done.returncode == 0, done.stderr
        return
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
    assert lines[0].startswith("clusterjob: error: entrypoint.metrics.loss: ") and "(?P<step>" in lines[0]


@pytest.mark.parametrize("path, says", [("{run_dir}/log.jsonl", None), ("out/*/summary.csv", None),
                                        ("{params.lr}/log.csv", "{params.lr} is no placeholder"),
                                        ("a\tb.csv", "control character")])
def test_metrics_file_takes_run_dir_and_globs(tmp_path: Path, path: str, says: "str | None"):
    write_spec(tmp_path, own_code(metrics_file=path))
    done = cli(tmp_path, "submit", "--dry-run", "--executor", "local", "s.yaml", errors="replace")
    if says is None:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "entrypoint.metrics_file: " in done.stderr
    assert says in done.stderr and not (tmp_path / "results").exists()
