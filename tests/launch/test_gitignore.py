"""The .gitignore matcher of snapshots taken outside a git repository, held to git itself:
over one tree, the files the snapshot's walk keeps are the files git lists as untracked
and not ignored."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clusterjob.launch import snapshot

ROOT_IGNORE = """\
# a comment, then a blank line

*.log
!keep.log
build/
/top.txt
docs/*.md
!docs/README.md
**/cache
a/**/deep.txt
out/**
file?.txt
[bc]at.py
x[!0-9].py
\\#hash.txt
\\!bang.txt
nested/sub/
"""  # and "trail.txt" with trailing spaces, below

NESTED_IGNORE = """\
!important.log
/local.txt
*.tmp
"""

FILES = [
    "main.py", "run.log", "keep.log", "sub/deeper/run.log", "build/out.o", "src/build/x.o", "build.py",
    "top.txt", "src/top.txt", "docs/guide.md", "docs/README.md", "docs/api/ref.md", "cache/c.bin", "src/cache/c.bin",
    "a/deep.txt", "a/b/c/deep.txt", "b/deep.txt", "out/x/y.txt", "outside.txt", "file1.txt", "file12.txt",
    "bat.py", "cat.py", "rat.py", "xa.py", "x1.py", "#hash.txt", "!bang.txt", "trail.txt", "nested/sub/f.py",
    "nested/other.py", "pkg/important.log", "pkg/local.txt", "pkg/inner/local.txt", "pkg/a.tmp", "a.tmp",
]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_walk_keeps_what_git_keeps(tmp_path):
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    (tmp_path / ".gitignore").write_text(ROOT_IGNORE + "trail.txt   \n")
    (tmp_path / "pkg" / ".gitignore").write_text(NESTED_IGNORE)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    listed = subprocess.run(["git", "-c", "core.excludesFile=/dev/null", "ls-files", "-z", "--others",
                             "--exclude-standard"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    shutil.rmtree(tmp_path / ".git")  # the walk's own question: no repository here
    walked = set(snapshot._walk(Path(tmp_path)))
    assert walked == {name for name in listed if name}
    assert {"keep.log", "docs/README.md", "pkg/important.log", "pkg/inner/local.txt", "src/top.txt"} <= walked
    assert not {"run.log", "top.txt", "a/b/c/deep.txt", "#hash.txt", "!bang.txt", "pkg/local.txt", "trail.txt",
                "nested/sub/f.py", "xa.py"} & walked
