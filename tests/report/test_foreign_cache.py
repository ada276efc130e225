"""A tampered or foreign ``.clusterjob-cache.npz`` under the real ``report``: the cache is
checked in full and rebuilt when it does not check out; the report never crashes, never
hangs, and shows what the run folders hold."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from clirun import cli
from test_hostile_results import CACHE, good_run

from clusterjob.report.reading import _load_cache


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    good_run(tmp_path / "results" / "exp", "r1", 0.1)
    good_run(tmp_path / "results" / "exp", "r2", 0.2)
    return tmp_path / "results" / "exp"


def tamper(change: Callable[[dict, np.ndarray], tuple]) -> Callable[[Path], None]:
    """Damage: the real cache's header and values changed by ``change`` (the stamps stay
    those of the run files, so only the checks can refuse it), written back as an npz."""
    def damage(path: Path) -> None:
        with np.load(path) as npz:
            header, values = json.loads(npz["header"].tobytes()), npz["values"]
        arrays = change(header, values)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    return damage


def header_bytes(header: object) -> np.ndarray:
    return np.frombuffer(json.dumps(header).encode(), np.uint8)


def entries(edit: Callable[[dict], None]) -> Callable[[dict, np.ndarray], dict]:
    """Each cached run's entry changed by ``edit``."""
    def change(header: dict, values: np.ndarray) -> dict:
        for entry in header["runs"]:
            edit(entry)
        return {"header": header_bytes(header), "values": values}
    return change


def values(make: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict, np.ndarray], dict]:
    return lambda header, matrix: {"header": header_bytes(header), "values": make(matrix)}


def raw(content: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content)


def a_zip(members: dict) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def put(**fields):
    return lambda entry: entry.update(fields)


def put_info(**fields):
    return lambda entry: entry["info"].update(fields)


# (case id, damage to the cache file)
FOREIGN = [
    ("header a list", tamper(lambda h, v: {"header": header_bytes([1, 2]), "values": v})),
    ("header a string", tamper(lambda h, v: {"header": header_bytes("x"), "values": v})),
    ("header without runs", tamper(lambda h, v: {"header": header_bytes({"version": h["version"]}), "values": v})),
    ("header runs a mapping", tamper(lambda h, v: {"header": header_bytes({**h, "runs": {"a": 1}}), "values": v})),
    ("header names numbers", tamper(lambda h, v: {"header": header_bytes({**h, "names": list(range(len(h["names"])))}),
                                                  "values": v})),
    ("header as floats", tamper(lambda h, v: {"header": header_bytes(h).astype(float), "values": v})),
    ("header not utf-8", tamper(lambda h, v: {"header": np.frombuffer(b"\xff\xfe" * 9, np.uint8), "values": v})),
    ("info a string", tamper(entries(put(info="done")))),
    ("info without status", tamper(entries(lambda e: e["info"].pop("status")))),
    ("info params a list", tamper(entries(put_info(params=[1, 2])))),
    ("info final text", tamper(entries(put_info(final={"val_acc": "high"})))),
    ("info status a number", tamper(entries(put_info(status=3)))),
    ("info path a list", tamper(entries(put_info(path=["x"])))),
    ("problems a string", tamper(entries(put(problems="oops")))),
    ("stamp of text", tamper(entries(lambda e: e.update(stamp=[str(s) for s in e["stamp"]])))),
    ("rows negative", tamper(entries(put(rows=-1)))),
    ("rows too many", tamper(entries(lambda e: e.update(rows=e["rows"] + 1)))),
    ("cols out of range", tamper(entries(lambda e: e.update(cols=[c + 5 for c in e["cols"]])))),
    ("cols text", tamper(entries(lambda e: e.update(cols=[str(c) for c in e["cols"]])))),
    ("same key twice", tamper(entries(put(key="r1")))),
    ("values as ints", tamper(values(lambda m: m.astype(np.int64)))),
    ("values as text", tamper(values(lambda m: m.astype(str)))),
    ("values complex", tamper(values(lambda m: m.astype(complex)))),
    ("values one column short", tamper(values(lambda m: m[:, :-1]))),
    ("values one row short", tamper(values(lambda m: m[:-1]))),
    ("values flat", tamper(values(lambda m: m.ravel()))),
    ("values 3-d", tamper(values(lambda m: m[None]))),
    ("values need pickle", tamper(values(lambda m: m.astype(object)))),
    ("values structured", tamper(values(lambda m: np.zeros(len(m), dtype=[("a", "f8"), ("b", "i4")])))),
    ("an extra array", tamper(lambda h, v: {"header": header_bytes(h), "values": v, "more": np.zeros(3)})),
    ("values missing", tamper(lambda h, v: {"header": header_bytes(h)})),
    ("a zip, not npz", raw(a_zip({"header.txt": "hello", "values.csv": "1,2"}))),
    ("a zip of pickles", raw(a_zip({"header.npy": npy(np.array([{"a": 1}], dtype=object), True),
                                    "values.npy": npy(np.zeros((4, 9)))}))),
    ("one npy, not npz", raw(npy(np.zeros((4, 9))))),
    ("a pickle", raw(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.")),
    ("empty", raw(b"")),
    ("garbage", raw(os.urandom(4096))),
    ("a fifo", fifo),
]


@pytest.mark.parametrize("damage", [c[1] for c in FOREIGN], ids=[c[0] for c in FOREIGN])
def test_a_cache_that_does_not_check_out_is_rebuilt(exp: Path, damage):
    root = exp.parent.parent
    clean = cli(root, "report", "results/exp", "--runs", "--format", "csv", errors="replace")
    assert clean.returncode == 0, clean.stderr
    cache = exp / CACHE
    damage(cache)
    done = cli(root, "report", "results/exp", "--runs", "--format", "csv", errors="replace")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout == clean.stdout
    assert cache.is_file() and _load_cache(exp) is not None  # rebuilt: whole and usable again
    again = cli(root, "report", "results/exp", "--format", "json", errors="replace")
    assert again.returncode == 0 and json.loads(again.stdout)["status_line"] == "2 runs: 2 completed"
