"""report/specfile.py: a run's spec.yaml as flat dotted keys, read fast for a sweep and
never trusted: what the report groups by when runs differ by --set or an edited spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.report import specfile

BASE = """name: t
train:
  lr: 0.05
  seed: 0
  amp: 'off'
  schedule: cosine
resources:
  setup: []
  partition: null
params:
  tags: [a, b]
  note: "x: y"
logging:
  mlflow: null
"""


def spec(folder: Path, text: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.yaml").write_text(text)
    return str(folder)


def test_a_spec_is_flat_dotted_keys(tmp_path):
    assert specfile.flat_spec(spec(tmp_path / "r", BASE)) == {
        "name": "t", "train.lr": 0.05, "train.seed": 0, "train.amp": "off", "train.schedule": "cosine",
        "resources.setup": "[]", "resources.partition": None, "params.tags": '["a", "b"]', "params.note": "x: y",
        "logging.mlflow": None}


VARIANTS = [
    ("one value", BASE.replace("lr: 0.05", "lr: 0.5")),
    ("two values", BASE.replace("lr: 0.05", "lr: 0.01").replace("seed: 0", "seed: 3")),
    ("a value of another type", BASE.replace("seed: 0", "seed: '0'")),
    ("a yes that YAML 1.1 reads as true", BASE.replace("schedule: cosine", "schedule: yes")),
    ("a list", BASE.replace("tags: [a, b]", "tags: [c]")),
    ("a mapping where a value was", BASE.replace("schedule: cosine", "schedule: {kind: step}")),
    ("a line more", BASE.replace("  seed: 0\n", "  seed: 0\n  epochs: 3\n")),
    ("a key renamed", BASE.replace("seed: 0", "sed: 0")),
    ("an anchor used elsewhere", BASE.replace("lr: 0.05", "lr: &x 0.2").replace("partition: null", "partition: *x")),
    ("a comment", BASE.replace("lr: 0.05", "lr: 0.07  # tried")),
    ("a date", BASE.replace("schedule: cosine", "schedule: 2026-11-22")),
    ("no mapping", "- a\n- b\n"),
    ("no YAML", "train: [unclosed\n"),
]


@pytest.mark.parametrize("text", [v[1] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_a_sweeps_next_spec_reads_as_if_composed_in_full(tmp_path, text):
    reader = specfile.Reader()
    assert reader.read(spec(tmp_path / "a", BASE)) == specfile.flat_spec(str(tmp_path / "a"))
    assert reader.read(spec(tmp_path / "b", text)) == specfile.flat_spec(str(tmp_path / "b"))


def test_a_hostile_spec_costs_a_bounded_read(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    flat = specfile.flat_spec(spec(tmp_path / "bomb", bomb))
    assert flat is not None and len(flat) <= 10  # 10**9 values, read as at most MAX_VALUES
    deep = "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v: 1\n"
    assert specfile.flat_spec(spec(tmp_path / "deep", deep)) == {}  # deeper than MAX_DEPTH: left out
    assert specfile.flat_spec(str(tmp_path / "none")) is None
    (tmp_path / "fifo").mkdir()
    import os
    os.mkfifo(tmp_path / "fifo" / "spec.yaml")
    assert specfile.flat_spec(str(tmp_path / "fifo")) is None  # never opened for a read that blocks


def test_the_cache_keeps_what_differs_from_the_first_spec_of_a_name():
    base = {"a": 1, "b": "x", "c": None}
    spec_ = {"a": 1.0, "b": "x", "d": True}  # 1.0 is not 1: kept
    stored = specfile.encode(spec_, base)
    assert stored == {"set": {"a": 1.0, "d": True}, "unset": ["c"]} and specfile.is_encoded(stored)
    decoded = specfile.decode(stored, base)
    assert decoded == spec_ and type(decoded["a"]) is float
    assert specfile.encode(None, base) is None and specfile.decode(None, base) is None
    assert not specfile.is_encoded({"set": {"a": [1]}, "unset": []})  # a list is stored as JSON text
    assert not specfile.is_encoded({"set": {}, "unset": [1]})
