"""The bounded readers of a run folder's files (clusterjob.core.files: Tail, Head,
read_lines_text): a line over its cap is skipped unread and counted, a line keeps what
follows its last NUL byte, the holes of a sparse file are stepped over unread and read
as a dense file of NUL bytes would be, and no reading costs more than its limit."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from clusterjob.core.files import Head, Tail, read_lines_text

BLOCK = 4096


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_long_line_is_skipped_and_counted_and_a_nul_byte_ends_what_came_before(tmp_path):
    data = b'{"a": 1}\n' + b"x" * 5000 + b"\n" + b"cut off\0\0\0" + b'{"b": 2}\n' + b'{"c": 3}'
    path = written(tmp_path / "f", data)
    tail = Tail(path, 1 << 20, max_line=100, chunk=7)
    assert list(tail.pairs()) == [(b'{"c": 3}', False), (b'{"b": 2}', True), (b'{"a": 1}', False)]
    assert tail.skipped == 2 and not tail.cut
    head = Head(path, 1 << 20, max_line=100, chunk=7)
    assert list(head) == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}'] and head.skipped == 2


def test_a_limit_bounds_the_reading_of_a_line_without_an_end(tmp_path):
    path = written(tmp_path / "f", b"\0" * (8 << 20) + b"x" * 50)
    tail = Tail(path, 1 << 20, max_line=4096)
    assert list(tail) == [b"x" * 50] and tail.skipped == 1 and tail.cut  # the NUL bytes end what came before
    path = written(tmp_path / "g", b"y" * (8 << 20))
    tail = Tail(path, 1 << 20, max_line=4096)
    assert list(tail) == [] and tail.skipped == 1 and tail.cut
    head = Head(path, 1 << 20, max_line=4096)
    assert list(head) == [] and head.skipped == 1 and head.cut


def sparse_and_dense(tmp_path: Path, seed: int) -> tuple[Path, Path]:
    """The same bytes twice: with holes (blocks never written), and written out."""
    rng = random.Random(seed)
    sparse, content = tmp_path / f"sparse{seed}", bytearray()
    with open(sparse, "wb") as f:
        for block in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                data = bytes(rng.choice(b"ab\n" if rng.random() < 0.7 else b"ab") for _ in range(BLOCK))
                f.seek(block * BLOCK)
                f.write(data)
            else:
                data = b"\0" * BLOCK
            content += data
        f.truncate(len(content))
    with open(sparse, "ab") as f:
        end = bytes(rng.choice(b"ab\n") for _ in range(rng.randint(0, 100)))
        f.write(end)
    return sparse, written(tmp_path / f"dense{seed}", bytes(content + end))


@pytest.mark.parametrize("seed", range(40))
def test_a_sparse_file_reads_as_its_dense_twin(tmp_path, seed):
    sparse, dense = sparse_and_dense(tmp_path, seed)
    for reader in (Tail, Head):
        for chunk, max_line in ((7, 5), (100, 50), (5000, 5000), (1 << 16, 1 << 20)):
            a, b = reader(sparse, 1 << 30, max_line, chunk), reader(dense, 1 << 30, max_line, chunk)
            assert (list(a.pairs()), a.skipped) == (list(b.pairs()), b.skipped)


def test_a_sparse_file_of_300_mib_costs_no_read_of_its_holes(tmp_path):
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b'{"a": 1}\n')
        f.truncate(300 << 20)
    with open(path, "ab") as f:
        f.write(b'{"b": 2}\n')
    tail = Tail(path, 1 << 20, max_line=4096)
    assert list(tail)[:2] == [b"", b'{"b": 2}'] and not tail.cut
    head = Head(path, 1 << 20, max_line=4096)
    assert list(head) == [b'{"a": 1}', b'{"b": 2}'] and head.skipped == 1 and not head.cut
    text, problem = read_lines_text(path, 1 << 20)
    assert problem is None and text.startswith('{"a": 1}\n') and text.endswith('\n{"b": 2}\n') and len(text) < 9000


def test_read_lines_text_says_what_it_left_unread(tmp_path):
    path = written(tmp_path / "f", b"abc\ndef\n")
    assert read_lines_text(path, 100) == ("abc\ndef\n", None)
    assert read_lines_text(path, 8) == ("abc\ndef\n", None)
    text, problem = read_lines_text(path, 4)
    assert text == "abc\n" and problem.startswith("is larger than ")
    assert read_lines_text(tmp_path / "none", 4) == (None, "is missing")
    os.mkfifo(tmp_path / "fifo")
    assert read_lines_text(tmp_path / "fifo", 4) == (None, "is not a regular file")
