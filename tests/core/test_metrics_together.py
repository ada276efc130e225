"""metrics.read_matrices: files parsed together give exactly what read_matrix gives each
(every value's bits, every problem), whatever the files hold; the writer's files never
take the one-file way."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from clusterjob.core import metrics

CASES = {
    "writer": "".join(json.dumps({"epoch": e, "step": 391 * e, "val_acc": random.Random(e).random(), "lr": 1e-05})
                      + "\n" for e in range(1, 6)),
    "cut_in_a_key": '{"epoch": 1, "val_acc": 0.5}\n{"epoch": 2, "val_a',
    "cut_in_a_number": '{"epoch": 1, "val_acc": 0.5}\n{"epoch": 2, "val_acc": 0.',
    "keys_in_another_order": '{"epoch": 1, "val_acc": 0.5}\n{"val_acc": 0.6, "epoch": 2}\n',
    "keys_that_differ_by_a_digit": '{"step": 1, "loss_1": 0.5}\n{"step": 2, "loss_2": 0.6}\n',
    "text": '{"epoch": 1, "val_acc": "x"}\n',
    "null": '{"epoch": 1, "val_acc": null}\n',
    "nan": '{"epoch": 1, "val_acc": NaN}\n',
    "overflow": '{"epoch": 1, "val_acc": 1e999}\n{"epoch": 2, "val_acc": 0.1}\n',
    "empty_value": '{"epoch": 1, "val_acc": , "lr": 2}\n',
    "two_dots": '{"epoch": 1, "val_acc": 1.2.3}\n',
    "epoch_twice": '{"epoch": 1, "val_acc": 0.5}\n{"epoch": 1, "val_acc": 0.6}\n',
    "own_steps": '{"step": 1, "loss": 0.5}\n{"step": 2, "acc": 0.6}\n',
    "beyond_2_53": '{"epoch": 1, "n": 12345678901234567891}\n',
    "escaped_key": '{"epoch": 1, "\\u00e9": 0.5}\n',
    "utf8_key": '{"epoch": 1, "é": 0.5}\n',
    "bool": '{"epoch": 1, "val_acc": true}\n',
    "nul_bytes": '{"epoch": 1, "val_acc": 0.5}\n\x00\x00\x00\n',
    "no_line_end": '{"epoch": 1, "val_acc": 0.5}',
    "empty": "",
    "blank_lines": "\n\n",
    "crlf": '{"epoch": 1, "val_acc": 0.5}\r\n',
    "nested": '{"epoch": 1, "x": {"a": 1}}\n',
    "list": '{"epoch": 1, "x": [1, 2]}\n',
    "negative_and_tiny": '{"epoch": 1, "x": -1.5e-07}\n{"epoch": 2, "x": -0.0}\n',
    "no_spaces": '{"epoch":1,"val_acc":0.5}\n',
}


def same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[2] == b[2] and a[1].shape == b[1].shape and \
        np.array_equal(a[1].view(np.int64), b[1].view(np.int64))  # the same bits, NaN and -0.0 too


def test_files_parsed_together_are_what_each_alone_gives(tmp_path):
    paths = []
    for name, text in CASES.items():
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    paths.append(str(tmp_path / "absent"))
    together = metrics.read_matrices(paths * 2)
    assert len(together) == 2 * len(paths)
    for path, found in zip(paths * 2, together):
        assert same(found, metrics.read_matrix(path)), path


def test_the_writers_files_are_parsed_together_with_every_bit(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    values = rng.random((300, 3)) * 10.0 ** rng.integers(-9, 9, (300, 3))
    paths = []
    for i in range(3):
        rows = values[100 * i:100 * i + 100]
        text = "".join(json.dumps({"epoch": e + 1, "a": a, "b": b, "c": c}) + "\n" for e, (a, b, c) in enumerate(rows))
        (tmp_path / f"m{i}.jsonl").write_text(text)
        paths.append(str(tmp_path / f"m{i}.jsonl"))
    monkeypatch.setattr(metrics, "read_matrix", lambda path: pytest.fail(f"{path} read on its own"))
    found = metrics.read_matrices(paths)
    assert [names for names, _, _ in found] == [["epoch", "a", "b", "c"]] * 3
    matrix = np.concatenate([m for _, m, _ in found])
    assert matrix[:, 1:].tolist() == values.tolist() and matrix[:, 0].tolist() == [e + 1.0 for e in range(100)] * 3
    assert all(problems == [] for _, _, problems in found) and not any(math.isnan(v) for v in matrix.ravel())


@pytest.mark.parametrize("version,option", [("3.1.1", {}), ("3.2.0.dev0+12", {}), ("2.2.3", {"float_precision":
                                            "round_trip"}), ("1.5.0", {"float_precision": "round_trip"}),
                                            ("unknown", {"float_precision": "round_trip"})])
def test_floats_are_parsed_exactly_on_every_pandas(version, option):
    assert metrics._exact_floats(version) == option


def test_a_bad_file_among_good_ones_costs_only_a_slower_read(tmp_path):
    good = '{"epoch": 1, "val_acc": 0.5}\n{"epoch": 2, "val_acc": 0.25}\n'
    (tmp_path / "good").write_text(good)
    (tmp_path / "bad").write_text('{"epoch": 1, "val_acc": 1-2}\n')
    found = metrics.read_matrices([str(tmp_path / "good"), str(tmp_path / "bad"), str(Path(tmp_path / "good"))])
    assert found[0][1].tolist() == found[2][1].tolist() == [[1.0, 0.5], [2.0, 0.25]]
    assert same(found[1], metrics.read_matrix(str(tmp_path / "bad")))
