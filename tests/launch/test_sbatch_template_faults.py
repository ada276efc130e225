"""Templates of CLUSTERJOB_SBATCH_DIR that cannot be rendered: `clusterjob sbatch` exits 2
with one line naming the file, what is wrong and the fix; no traceback, nothing printed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clirun import base_env, cli
from trainutil import write_spec

from clusterjob.launch import sbatch

SRUN = sbatch.template_path("srun").read_text()


def without(text: str, start: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(start))


CASES = {
    "no #SBATCH lines": (without(without(SRUN, "#SBATCH"), "##SBATCH"), "has no #SBATCH lines"),
    "a header missing": (without(SRUN, "#SBATCH --nodes"), "has no #SBATCH line for nodes"),
    "headers not one block": (SRUN.replace("#SBATCH --nodes", "echo split\n#SBATCH --nodes", 1), "not one block"),
    "empty": ("", "is empty"),
    "only blank lines": ("\n \n\t\n", "is empty"),
    "args marker missing": (without(SRUN, sbatch.ARGS_MARKER), f"exactly one line starting with '{sbatch.ARGS_MARKER}'"),
    "setup marker twice": (SRUN.replace(sbatch.SETUP_END, f"{sbatch.SETUP_END}\n{sbatch.SETUP_END}", 1), "has 2"),
}


def sbatch_with(tmp_path: Path, content: "str | bytes", style: str = "srun") -> subprocess.CompletedProcess:
    folder = tmp_path / "templates"
    folder.mkdir(exist_ok=True)
    target = folder / sbatch.STYLES[style]
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    env = {**base_env(), "CLUSTERJOB_SBATCH_DIR": str(folder)}
    return cli(tmp_path, "sbatch", str(write_spec(tmp_path)), "--style", style, env=env, timeout=60)


def refused(done: subprocess.CompletedProcess, tmp_path: Path, style: str, says: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and done.stdout == "", done.stderr[-2000:]
    path = tmp_path / "templates" / sbatch.STYLES[style]
    assert lines[0].startswith(f"clusterjob: error: sbatch template {path}: "), lines[0]
    assert says in lines[0] and "unset CLUSTERJOB_SBATCH_DIR" in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_template_that_cannot_be_rendered_is_one_line_naming_the_file(tmp_path, case):
    content, says = CASES[case]
    refused(sbatch_with(tmp_path, content), tmp_path, "srun", says)


def test_a_template_that_is_not_utf8_is_one_line(tmp_path):
    content = SRUN.encode().replace(b"# clusterjob: DDP", b"# clusterj\xf6b: DDP", 1)
    assert content != SRUN.encode()
    refused(sbatch_with(tmp_path, content), tmp_path, "srun", "is not UTF-8 text (byte ")
    refused(sbatch_with(tmp_path, b"\xff\xfe#!/bin/bash\n", "torchrun"), tmp_path, "torchrun", "byte 0 is 0xff")


def test_a_huge_template_is_refused_before_it_is_read_whole(tmp_path):
    refused(sbatch_with(tmp_path, SRUN + "#" * (sbatch.MAX_TEMPLATE_BYTES + 1)), tmp_path, "srun", "is larger than")


def test_a_good_template_there_still_renders(tmp_path):
    done = sbatch_with(tmp_path, SRUN.replace("#SBATCH --requeue", "#SBATCH --requeue  # mine"))
    assert done.returncode == 0 and "#SBATCH --requeue  # mine" in done.stdout, done.stderr


def test_a_broken_template_of_clusterjob_itself_says_to_restore_it(tmp_path, monkeypatch):
    broken = tmp_path / "share"
    broken.mkdir()
    (broken / "ddp_srun.sbatch").write_text("")
    monkeypatch.delenv("CLUSTERJOB_SBATCH_DIR", raising=False)
    monkeypatch.setattr(sbatch, "template_dirs", lambda: [broken])
    from clusterjob.core.errors import BadInput
    from clusterjob.spec.schema import spec_from_dict

    with pytest.raises(BadInput, match=r"ddp_srun.sbatch: is empty; restore it from clusterjob's sources"):
        sbatch.render(spec_from_dict({"name": "t"}), "t.yaml")
