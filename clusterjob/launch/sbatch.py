"""``clusterjob sbatch SPEC``: a standalone sbatch script, filled in from a spec.

    clusterjob sbatch jobs/cifar.yaml > run.sbatch && sbatch run.sbatch
    clusterjob sbatch jobs/cifar.yaml --style torchrun --set resources.nodes=4 > run.sbatch

The raw templates in ``sbatch/`` (``ddp_srun.sbatch``, ``ddp_torchrun.sbatch``) are the
single source of truth; rendering changes three places of one and keeps the rest:

- the ``#SBATCH`` block: each line of an option the spec decides (nodes, tasks, gres, ...)
  gets the spec's value and keeps the template's comment, or is dropped when the spec
  leaves it unset (no gres without GPUs, no mem for mem_gb 0, no partition when null);
  ``##SBATCH`` lines are switched on when the spec sets them; other lines stay as written;
- the ``# @clusterjob-args`` line becomes ``set -- /abs/SPEC --set ... "$@"``, so the
  script runs without arguments (arguments given to sbatch are added after);
- the lines between the setup markers become ``resources.setup`` (kept when it is empty).

A sweep spec adds ``--array=0-(N-1)`` (``%P`` with resources.array_parallelism); each
array task's worker runs the sweep point of its SLURM_ARRAY_TASK_ID.

Stdlib and clusterjob.spec.schema only, never torch: this runs on login nodes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import site
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core.errors import BadInput
from clusterjob.launch.resources import sbatch_options
from clusterjob.spec import envvars
from clusterjob.spec.schema import Spec, expand_sweep, holds_text, load_spec
from clusterjob.spec.yamlfile import override_value

STYLES = {"srun": "ddp_srun.sbatch", "torchrun": "ddp_torchrun.sbatch"}
ARGS_MARKER = "# @clusterjob-args"
SETUP_BEGIN = "# >>> setup"
SETUP_END = "# <<< setup"
# Installed (non-editable) packages find the templates here, see template_dirs().
SHARE_DIR = Path("share") / "clusterjob" / "sbatch"
MAX_TEMPLATE_BYTES = 1024 * 1024  # the templates are about 4 KiB

# "#SBATCH --nodes=1   # comment" or "##SBATCH --partition=gpu" (switched off).
_HEADER = re.compile(r"(?P<off>#?)#SBATCH\s+--(?P<option>[A-Za-z-]+)(?:=(?P<value>\S*))?"
                     r"(?P<pad>\s*)(?P<comment>#.*)?")


@dataclass(frozen=True)
class Header:
    """One ``#SBATCH`` line of a template."""

    text: str
    option: str
    comment: Optional[str]
    comment_column: int  # where the comment starts, to keep the block aligned


def template_dirs() -> list[Path]:
    """Where the templates may be, in order: $CLUSTERJOB_SBATCH_DIR, the source checkout
    (``sbatch/`` beside the ``clusterjob/`` package, also an editable install), and
    ``<prefix>/share/clusterjob/sbatch`` of an installed package (pyproject's data-files;
    the prefix of the environment, of its base interpreter, or of ``pip install --user``)."""
    dirs = [Path(os.environ["CLUSTERJOB_SBATCH_DIR"])] if os.environ.get("CLUSTERJOB_SBATCH_DIR") else []
    dirs.append(Path(__file__).resolve().parents[2] / "sbatch")
    prefixes = dict.fromkeys((sys.prefix, sys.base_prefix, site.getuserbase()))
    return dirs + [Path(prefix) / SHARE_DIR for prefix in prefixes]


def template_path(style: str) -> Path:
    """The raw template of ``style`` ("srun" | "torchrun")."""
    if style not in STYLES:
        raise BadInput(f"--style {style!r}: choose one of {', '.join(STYLES)}")
    for folder in template_dirs():
        path = folder / STYLES[style]
        if path.is_file():
            return path
    searched = ", ".join(str(d) for d in template_dirs())
    raise BadInput(f"sbatch template {STYLES[style]} not found (searched {searched}); "
                   "set CLUSTERJOB_SBATCH_DIR to the folder holding the sbatch/ templates")


class TemplateError(ValueError):
    """A template that cannot be rendered: what is wrong with it, in words."""


def render(spec: Spec, spec_path: str, style: str = "srun", overrides: Sequence[str] = ()) -> str:
    """The template of ``style`` filled in from ``spec`` (already overridden), running
    ``spec_path`` (made absolute) with ``overrides`` (passed on to the worker as --set).
    A template that cannot be rendered is bad input naming its file."""
    path = template_path(style)
    values = sbatch_options(spec, len(expand_sweep(spec)))
    try:
        lines = _render_headers(_template_lines(path), values)
        lines = _render_setup(lines, spec.resources.setup)
        lines = _render_args(lines, os.path.abspath(spec_path), overrides)
        lines = _render_container(lines, spec, style)
    except TemplateError as err:
        raise BadInput(f"sbatch template {path}: {err}; {_template_fix(path, style)}") from None
    # json.dumps escapes what could end the comment line (the CLI's path may hold anything)
    note = f"# Rendered by `clusterjob sbatch --style {style}` from {json.dumps(os.path.abspath(spec_path))}."
    return "\n".join([lines[0], note, *lines[1:]]) + "\n"


def _template_fix(path: Path, style: str) -> str:
    own = os.environ.get("CLUSTERJOB_SBATCH_DIR")
    if own and path.parent == Path(own):
        return (f"start from clusterjob's own sbatch/{STYLES[style]} (it has every #SBATCH line and marker that "
                "clusterjob fills in), or unset CLUSTERJOB_SBATCH_DIR")
    return "restore it from clusterjob's sources (the sbatch/ folder) or reinstall clusterjob"


def _template_lines(path: Path) -> list[str]:
    """The template's lines: UTF-8 text with something in it, of a sane size."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as err:
        raise TemplateError(f"cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise TemplateError(f"is larger than {MAX_TEMPLATE_BYTES} bytes; a template is a few kilobytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TemplateError(f"is not UTF-8 text (byte {err.start} is {data[err.start]:#04x})") from None
    if not text.strip():
        raise TemplateError("is empty")
    return text.splitlines()


def parse_headers(lines: Sequence[str]) -> tuple[int, int, list[Header]]:
    """(first, last + 1, headers) of the template's one contiguous block of #SBATCH lines."""
    matches = [(i, _HEADER.fullmatch(line.rstrip())) for i, line in enumerate(lines)]
    found = [(i, m) for i, m in matches if m]
    if not found:
        raise TemplateError("has no #SBATCH lines")
    start, end = found[0][0], found[-1][0] + 1
    if len(found) != end - start:
        raise TemplateError(f"its #SBATCH lines {start + 1}..{end} are not one block")
    headers = [Header(text=lines[i].rstrip(), option=m["option"], comment=m["comment"],
                      comment_column=m.start("comment") if m["comment"] else 0) for i, m in found]
    return start, end, headers


def _render_headers(lines: list[str], values: dict[str, Optional[str]]) -> list[str]:
    start, end, headers = parse_headers(lines)
    missing = set(values) - {h.option for h in headers}
    if missing:
        raise TemplateError(f"has no #SBATCH line for {', '.join(sorted(missing))}")
    block = []
    for h in headers:
        if h.option not in values:
            block.append(h.text)
        elif (value := values[h.option]) is not None:
            block.append(_header_line(h, value))
    return lines[:start] + block + lines[end:]


def _header_line(h: Header, value: str) -> str:
    text = f"#SBATCH --{h.option}={value}"
    if not h.comment:
        return text
    return f"{text.ljust(h.comment_column - 1)} {h.comment}"


def _render_setup(lines: list[str], setup: Sequence[str]) -> list[str]:
    begin = _marker(lines, SETUP_BEGIN)
    end = _marker(lines, SETUP_END)
    if not setup:
        return lines
    return lines[:begin + 1] + list(setup) + lines[end:]


def _render_args(lines: list[str], spec_path: str, overrides: Sequence[str]) -> list[str]:
    index = _marker(lines, ARGS_MARKER)
    words = [spec_path] + [w for item in overrides for w in ("--set", without_secrets(item))]
    command = "set -- " + " ".join(shlex.quote(w) for w in words) + ' "$@"'
    return lines[:index] + [command] + lines[index + 1:]


RANK_COMMAND = '"$PYTHON" -m clusterjob.run "$@"'  # each task's command in the srun template


def _render_container(lines: list[str], spec: Spec, style: str) -> list[str]:
    """With ``container:``, each task's command in the image, as submit renders it
    (clusterjob.launch.containers): the host side, the runtime, the rank's first step,
    then the task's arguments; pyxis's options go on srun's line."""
    if spec.container is None:
        return lines
    if style != "srun":
        raise BadInput("container: a run in a container is rendered with --style srun (one task per rank, each "
                       "started in the image); torchrun's agent would run inside the image")
    from clusterjob.launch.containers import plan as containers
    from clusterjob.taskenv.container import host_command

    wrapped = containers.wrapped(spec, containers.chosen(spec, slurm=True))
    hits = [i for i, line in enumerate(lines) if RANK_COMMAND in line]
    if len(hits) != 1:
        raise TemplateError(f"needs exactly one line holding {RANK_COMMAND!r} to put the container around, "
                            f"has {len(hits)}")
    host = ['"$PYTHON"', *map(shlex.quote, host_command(spec.env)[1:])] if wrapped.carried_by_host else []
    inside = [*host, *map(shlex.quote, wrapped.command([])), '"$@"']
    lines = [*lines]
    lines[hits[0]] = lines[hits[0]].replace(RANK_COMMAND, " ".join(inside))
    if wrapped.srun_options:
        srun = max(i for i in range(hits[0] + 1) if lines[i].lstrip().startswith("srun "))
        lines[srun] = lines[srun].replace("srun ", f"srun {shlex.join(wrapped.srun_options)} ", 1)
    return lines


def without_secrets(override: str) -> str:
    """A ``--set`` as a script (a file) may hold it: a secret's value (``env.HF_TOKEN=...``,
    or inside ``env={...}``) as ``***``, which the job takes from the environment sbatch
    passes on; a note on stderr says to export it there."""
    key, _, text = override.partition("=")
    if key.startswith("env.") and envvars.is_secret(key[len("env."):]):
        hidden = [key[len("env."):]]
        override = f"{key}={envvars.HIDDEN}"
    elif key == "env":
        given = envvars.checked_env(override_value(key, text, holds_text(key)))  # load_spec took it already
        hidden = [name for name, value in given.items() if envvars.is_secret(name) and value != envvars.HIDDEN]
        override = f"env={json.dumps(envvars.shown_env(given))}" if hidden else override
    else:
        return override
    for name in hidden:
        print(f"note: env.{name} is written {envvars.HIDDEN} in the script (a secret never goes into a file); "
              f"export {name} in the shell that runs sbatch: the job takes it from there", file=sys.stderr)
    return override


def _marker(lines: Sequence[str], marker: str) -> int:
    hits = [i for i, line in enumerate(lines) if line.startswith(marker)]
    if len(hits) != 1:
        raise TemplateError(f"needs exactly one line starting with {marker!r}, has {len(hits)}")
    return hits[0]


def main(spec_path: str, overrides: Sequence[str] = (), style: str = "srun") -> int:
    """``clusterjob sbatch SPEC [--set ...] [--style srun|torchrun]``: print the script."""
    spec = load_spec(spec_path, list(overrides))
    sys.stdout.write(render(spec, spec_path, style, overrides))
    return 0
