"""The experiment spec: typed, frozen dataclasses; YAML only at the edge (``load_spec``).

Every section validates its own fields in ``__post_init__`` from the field metadata
(choices, bounds, patterns), so a spec built in code is checked like one read from YAML.
Errors are ``SpecError`` with the dotted key, the bad value and what is allowed; the CLI
prints them and exits 2. This module must not import torch (the CLI validates on login
nodes).
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import yaml

from clusterjob.errors import SpecError

_NAME = (r"[A-Za-z0-9._-]+", "letters, digits, '.', '_' and '-' only")
_SLURM_WORD = (r"[A-Za-z0-9._-]+", "letters, digits, '.', '_' and '-' (no spaces or shell characters)")
_CONSTRAINT = (r"[A-Za-z0-9._,&|\[\]()*:!-]+", "a Slurm feature expression without spaces or quotes")
_INIT = (r"env|tcp://[A-Za-z0-9._-]+:[0-9]{1,5}|file:///\S+", "env, tcp://HOST:PORT or file:///absolute/path")
_SCHEDULES = ("cosine", "step", "constant")


def opt(default: Any, doc: str = "", **checks: Any) -> Any:
    """A spec field: its default, a one-line doc, and checks run by ``Section.__post_init__``.

    checks: ``choices`` (allowed values), ``ge``/``gt``/``lt`` (bounds for numbers),
    ``pattern`` ((regex, words) that a string must match in full).
    """
    meta = {"doc": doc, **checks}
    if isinstance(default, type):  # a section: each spec gets its own instance
        return field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict)):
        factory = type(default)
        return field(default_factory=lambda: factory(default), metadata=meta)
    return field(default=default, metadata=meta)


class Section:
    """Base of every spec section: checks each field against its metadata, then ``check()``."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_value(f.name, getattr(self, f.name), f.metadata)
        self.check()

    def check(self) -> None:
        """Checks that involve several fields of the section (overridden where needed)."""


@dataclass(frozen=True)
class DataSpec(Section):
    dataset: str = opt("cifar10", "cifar10 | mnist | synthetic", choices=("cifar10", "mnist", "synthetic"))
    root: str = opt("./data", "where datasets are stored or downloaded")
    download: bool = opt(True, "rank 0 downloads first, the others wait at a barrier")
    num_workers: int = opt(4, "DataLoader worker processes per rank", ge=0)
    augment: bool = opt(True, "random crop (pad 4) + horizontal flip for CIFAR-shaped data")
    limit_train: Optional[int] = opt(None, "use only the first N training samples", ge=1)
    limit_val: Optional[int] = opt(None, "use only the first N validation samples", ge=1)
    drop_last: bool = opt(False, "drop the last partial training batch")
    pin_memory: Union[bool, str] = opt("auto", "auto: on when training on CUDA", choices=("auto", True, False))
    tta: str = opt("none", "none | flip: also log val_acc_tta with flip test-time augmentation",
                   choices=("none", "flip"))


@dataclass(frozen=True)
class ModelSpec(Section):
    arch: str = opt("resnet18", "resnet18 (CIFAR stem) | convnet | mlp", choices=("resnet18", "convnet", "mlp"))
    sync_bn: bool = opt(True, "SyncBatchNorm across ranks, applied only when training on GPU")


@dataclass(frozen=True)
class ParamGroupSpec(Section):
    match: str = opt("", "parameter-name prefix; the first matching group wins", pattern=(r".+", "a non-empty prefix"))
    lr_mult: float = opt(1.0, "multiplies the base learning rate", gt=0)
    weight_decay: Optional[float] = opt(None, "overrides train.weight_decay", ge=0)
    schedule: Optional[str] = opt(None, "overrides train.schedule", choices=_SCHEDULES)


@dataclass(frozen=True)
class TrainSpec(Section):
    epochs: int = opt(30, "passes over the training set", ge=1)
    batch_size: int = opt(128, "per process; global = batch_size x world_size x grad_accum", ge=1)
    optimizer: str = opt("sgd", "sgd | adamw", choices=("sgd", "adamw"))
    lr: float = opt(0.1, "base learning rate, before lr_scaling", gt=0)
    lr_scaling: str = opt("linear", "none | linear | sqrt, relative to world_size x grad_accum",
                          choices=("none", "linear", "sqrt"))
    momentum: float = opt(0.9, "SGD momentum (AdamW: beta1)", ge=0, lt=1)
    nesterov: bool = opt(True, "Nesterov momentum for SGD")
    weight_decay: float = opt(5.0e-4, "decoupled for AdamW, L2 for SGD", ge=0)
    schedule: str = opt("cosine", "cosine | step | constant, after warmup", choices=_SCHEDULES)
    warmup_epochs: float = opt(1.0, "linear warmup length in epochs", ge=0)
    label_smoothing: float = opt(0.0, "cross-entropy label smoothing", ge=0, lt=1)
    amp: str = opt("auto", "auto (fp16 on CUDA, bf16 on CPU) | fp16 | bf16 | off",
                   choices=("auto", "fp16", "bf16", "off"))
    grad_accum: int = opt(1, "micro-batches per optimizer step", ge=1)
    ema_decay: Optional[float] = opt(None, "e.g. 0.999: also evaluate an EMA of the weights", gt=0, lt=1)
    param_groups: tuple[ParamGroupSpec, ...] = opt((), "per-layer overrides, first prefix match wins")
    seed: int = opt(0, "seeds weights, data order and augmentation", ge=0)
    log_every: int = opt(50, "optimizer steps between progress lines (one host sync each)", ge=1)

    def check(self) -> None:
        if self.warmup_epochs > self.epochs:
            raise SpecError("warmup_epochs", f"{self.warmup_epochs} is longer than epochs ({self.epochs}); "
                            "set warmup_epochs <= epochs")


@dataclass(frozen=True)
class DistSpec(Section):
    backend: str = opt("auto", "auto (nccl on CUDA, else gloo) | nccl | gloo", choices=("auto", "nccl", "gloo"))
    init_method: str = opt("env", "env | tcp://HOST:PORT | file:///shared/path", pattern=_INIT)
    timeout_s: int = opt(600, "collective and rendezvous timeout in seconds", ge=1)


@dataclass(frozen=True)
class ResourcesSpec(Section):
    nodes: int = opt(1, "nodes per run", ge=1)
    tasks_per_node: int = opt(1, "processes per node; one per GPU on GPU nodes", ge=1)
    gpus_per_node: int = opt(0, "GPUs requested per node (gres)", ge=0)
    cpus_per_task: int = opt(2, "CPU cores per process", ge=1)
    mem_gb: float = opt(16, "memory per node in GB (0: the partition's default)", ge=0)
    time_min: int = opt(60, "wall-clock limit per job in minutes", ge=1)
    partition: Optional[str] = opt(None, "Slurm partition", pattern=_SLURM_WORD)
    account: Optional[str] = opt(None, "Slurm account", pattern=_SLURM_WORD)
    qos: Optional[str] = opt(None, "Slurm QOS", pattern=_SLURM_WORD)
    constraint: Optional[str] = opt(None, "Slurm node features, e.g. a100|h100", pattern=_CONSTRAINT)
    setup: tuple[str, ...] = opt((), "shell lines run before srun (module load, conda activate)")
    array_parallelism: Optional[int] = opt(None, "at most this many array tasks at once (sbatch %N)", ge=1)
    max_requeues: int = opt(3, "requeues after preemption or time limit before giving up", ge=0)

    def check(self) -> None:
        if self.gpus_per_node and self.tasks_per_node > self.gpus_per_node:
            raise SpecError("tasks_per_node", f"{self.tasks_per_node} tasks per node but gpus_per_node is "
                            f"{self.gpus_per_node}; run one task per GPU (tasks_per_node: {self.gpus_per_node})")


@dataclass(frozen=True)
class CheckpointSpec(Section):
    every_epochs: int = opt(1, "write a checkpoint every N epochs (and at the end)", ge=1)
    keep_last: int = opt(2, "checkpoints kept on disk", ge=1)


@dataclass(frozen=True)
class OutputSpec(Section):
    root: str = opt("results", "runs go to <root>/<name>/<run_id>/", pattern=(r".+", "a non-empty path"))


@dataclass(frozen=True)
class DebugSpec(Section):
    """Test hooks: stop or fail on purpose to exercise resume and failure handling."""

    exit_after_epoch: Optional[int] = opt(None, "exit (as if preempted) after this epoch's checkpoint", ge=1)
    fail_at_epoch: Optional[int] = opt(None, "raise on fail_rank at the start of this epoch", ge=1)
    fail_rank: int = opt(0, "which rank raises for fail_at_epoch", ge=0)


@dataclass(frozen=True)
class Spec(Section):
    name: str = opt(MISSING, "run name: results go to <output.root>/<name>/", pattern=_NAME)
    data: DataSpec = opt(DataSpec)
    model: ModelSpec = opt(ModelSpec)
    train: TrainSpec = opt(TrainSpec)
    dist: DistSpec = opt(DistSpec)
    resources: ResourcesSpec = opt(ResourcesSpec)
    checkpoint: CheckpointSpec = opt(CheckpointSpec)
    sweep: dict = opt({}, "dotted key -> list of values; the grid of all lists, one run per point")
    output: OutputSpec = opt(OutputSpec)
    debug: DebugSpec = opt(DebugSpec)

    def check(self) -> None:
        if self.dist.backend == "nccl" and self.resources.gpus_per_node == 0:
            raise SpecError("dist.backend", "nccl needs GPUs but resources.gpus_per_node is 0; "
                            "request GPUs or use backend: auto (gloo on CPU)")
        if self.name in (".", ".."):
            raise SpecError("name", f"{self.name!r} is not a folder name; use letters, digits, '.', '_', '-'")
        _check_sweep(self.sweep)

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node


# ----------------------------------------------------------------------------- checks


def _check_value(key: str, value: Any, meta: Any) -> None:
    """Raise SpecError if ``value`` breaks the field's choices, bounds or pattern."""
    if value is None or value is MISSING:
        return
    choices = meta.get("choices")
    if choices is not None and not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise SpecError(key, f"{value!r} is not allowed; choose one of {_words(choices)}{_close(value, choices)}")
    for name, ok, words in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                            ("lt", lambda v, b: v < b, "<")):
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            raise SpecError(key, f"{value!r} is out of range; it must be {words} {bound}")
    pattern = meta.get("pattern")
    if pattern is not None and not re.fullmatch(pattern[0], value):
        raise SpecError(key, f"{value!r} is not allowed; use {pattern[1]}")


def _check_sweep(sweep: dict) -> None:
    """Sweep keys must be existing leaf keys and their values non-empty lists."""
    leaves = _leaf_keys(Spec)
    for key, values in sweep.items():
        where = f"sweep.{key}"
        if key not in leaves:
            raise SpecError(where, f"{key!r} is not a spec key{_close(key, leaves)}")
        if key in ("name", "sweep") or key.startswith(("resources.", "output.")):
            raise SpecError(where, "name, resources and output are per submission, not per sweep point; "
                            "submit a spec per value instead")
        if not isinstance(values, (list, tuple)) or not values:
            raise SpecError(where, f"{values!r} is not a list; write the values to try as a list, "
                            f"e.g. {key}: [{values!r}]")


def _words(choices: Any) -> str:
    return ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)


def _close(value: Any, choices: Any) -> str:
    """A did-you-mean suffix for a misspelled choice or key."""
    found = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every scalar/list key below ``cls`` (sections excluded)."""
    keys = []
    for f in fields(cls):
        hint = get_type_hints(cls)[f.name]
        if is_dataclass(hint):
            keys += _leaf_keys(hint, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


# ----------------------------------------------------------------------------- from plain data


def spec_from_dict(raw: Any) -> Spec:
    """Build and validate a Spec from plain data (a parsed YAML mapping)."""
    return _build(Spec, raw, "")


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise SpecError(path, f"expected a mapping of keys, got {_show(raw)}")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in raw:
        if key not in names:
            raise SpecError(_join(path, str(key)), "unknown key" + _where_else(str(key), names, path))
    kwargs = {}
    for f in fields(cls):
        if f.name in raw:
            kwargs[f.name] = _convert(hints[f.name], raw[f.name], _join(path, f.name))
        elif f.default is MISSING and f.default_factory is MISSING:
            raise SpecError(_join(path, f.name), "required; add it to the spec")
    try:
        return cls(**kwargs)
    except SpecError as err:
        raise err.under(path) if path else err


def _where_else(key: str, names: list[str], path: str) -> str:
    """Did-you-mean for an unknown key: a close name here, or the same name in another section."""
    near = _close(key, names)
    if near:
        return near
    elsewhere = [k for k in _leaf_keys(Spec) if k.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f" (did you mean {elsewhere[0]!r}?)"
    return f"; allowed keys{' in ' + path if path else ''}: {', '.join(names)}"


def _convert(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the type hint, converting lists to tuples and YAML number strings."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, key)
        if any(_is_instance(value, a) for a in inner):
            return value
        return _type_error(key, value, " or ".join(_type_word(a) for a in inner))
    if origin is tuple:
        if not isinstance(value, list):
            return _type_error(key, value, "a list")
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if is_dataclass(hint):
        return _build(hint, value, key)
    if hint is float and isinstance(value, str):
        return _float_string(key, value)
    if hint is float and _is_instance(value, int):
        return float(value)
    return value if _is_instance(value, hint) else _type_error(key, value, _type_word(hint))


def _float_string(key: str, value: str) -> float:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; accept it for float keys."""
    try:
        return float(value)
    except ValueError:
        return _type_error(key, value, "a number")


def _is_instance(value: Any, hint: Any) -> bool:
    if hint is dict:
        return isinstance(value, dict)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_word(hint: Any) -> str:
    return {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
            dict: "a mapping"}.get(hint, str(hint))


def _type_error(key: str, value: Any, expected: str) -> Any:
    raise SpecError(key, f"expected {expected}, got {_show(value)}")


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def spec_to_dict(spec: Any) -> Any:
    """Plain data (dicts, lists, scalars) for a spec or section; ``spec_from_dict`` inverts it."""
    if is_dataclass(spec):
        return {f.name: spec_to_dict(getattr(spec, f.name)) for f in fields(spec)}
    if isinstance(spec, (tuple, list)):
        return [spec_to_dict(v) for v in spec]
    if isinstance(spec, dict):
        return {k: spec_to_dict(v) for k, v in spec.items()}
    return spec


def dump_spec(spec: Spec) -> str:
    """The spec as YAML, every key written out (the resolved spec of a run)."""
    return yaml.safe_dump(spec_to_dict(spec), sort_keys=False, default_flow_style=False)


# ----------------------------------------------------------------------------- YAML edge


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is written twice in this mapping; keep one", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become SpecError naming the source and line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError("", f"{source}{where}: YAML syntax error: {problem}") from None


def read_spec_file(path: str | Path) -> dict:
    """The raw mapping of a spec file, with clear errors for a missing or empty file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError("", f"cannot read spec file {str(path)!r}: {err.strerror}") from None
    raw = parse_yaml(text, str(path))
    if not isinstance(raw, dict):
        raise SpecError("", f"{path}: a spec is a YAML mapping (name:, data:, train: ...), got {_show(raw)}")
    return raw


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``--set a.b=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    raw = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SpecError("", f"--set {item!r}: write --set key.path=value, e.g. --set train.lr=0.2")
        value = parse_yaml(text, f"--set {key}") if text else ""
        _set_path(raw, key, value)
    return raw


def _set_path(raw: dict, key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if head == "sweep" and rest:
        parts = ["sweep", rest]  # sweep keys are dotted names themselves
    else:
        parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError(key, f"--set cannot go below {part!r}, which holds {_show(child)}")
        node = child
    node[parts[-1]] = value


def _deep_copy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _deep_copy(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_deep_copy(v) for v in raw]
    return raw


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read, override and validate a spec file. Raises SpecError (exit 2) on bad input."""
    return spec_from_dict(apply_overrides(read_spec_file(path), overrides))


# ----------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: the values it sets (dotted keys) and its resolved spec."""

    index: int
    params: dict
    spec: Spec


def expand_sweep(spec: Spec) -> list[SweepPoint]:
    """The grid of the sweep's lists, in the order written; a spec without sweep is one point."""
    keys = list(spec.sweep)
    points = []
    for index, values in enumerate(itertools.product(*(spec.sweep[k] for k in keys))):
        params = dict(zip(keys, values))
        points.append(SweepPoint(index, params, _apply_point(spec, params)))
    return points


def _apply_point(spec: Spec, params: dict) -> Spec:
    raw = spec_to_dict(replace(spec, sweep={}))
    for key, value in params.items():
        _set_path(raw, key, value)
    try:
        return spec_from_dict(raw)
    except SpecError as err:
        raise SpecError(f"sweep.{err.key}", f"{err.detail} (sweep point {params})") from None
