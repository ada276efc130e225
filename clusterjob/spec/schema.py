"""The experiment spec: typed, frozen dataclasses; YAML only at the edge (``load_spec``).
Every key and default: docs/design.md, "Spec".

Every section validates its own fields in ``__post_init__`` from the field metadata
(choices, bounds, patterns: spec/fields.py), so a spec built in code is checked like one
read from YAML. The keys an executor declares for itself sit in ``resources`` beside its
own (spec/options.py).
Errors are ``SpecError`` with the dotted key, the bad value and what is allowed; the CLI
prints them and exits 2. The YAML edge is bounded (file size, values after alias
expansion, nesting, sweep points), so a hostile spec fails fast instead of taking the
login node's memory. This module must not import torch (the CLI validates on login nodes).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import sys
from dataclasses import MISSING, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union, get_args, get_origin

import yaml

from clusterjob.core.errors import SpecError, brief, key_text, with_type
from clusterjob.core.units import default_mode
from clusterjob.spec import envvars, escalation
from clusterjob.spec import options as executoropts
from clusterjob.spec.catalog import DATASETS, DatasetName
from clusterjob.spec.container import ContainerSpec
from clusterjob.spec.escalation import OnGpuOomSpec, OnOomSpec, OnTimeoutSpec
from clusterjob.spec.fields import (
    HOLDS_OPTIONS,
    Section,
    check_kind,
    check_text,
    choices_of,
    did_you_mean,
    hints,
    key_fields,
    opt,
)
from clusterjob.spec.options import ExecutorOptions, Held
from clusterjob.spec.searchspec import SearchSpec
from clusterjob.spec.yamlfile import apply_overrides, read_spec_file

_NAME = (r"[A-Za-z0-9._-]+", "letters, digits, '.', '_' and '-' only")
_INIT = (r"env|tcp://[A-Za-z0-9._-]+:[0-9]{1,5}|file:///\S+", "env, tcp://HOST:PORT or file:///absolute/path")
Schedule = Literal["cosine", "step", "constant"]
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = (rf"{_IDENT}(?:\.{_IDENT})*", "a dotted module name such as mypkg.train")
_FUNCTION = (rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}", "module:function, such as mypkg.train:main")
_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_PLACEHOLDER = re.compile(r"\{params\.([^{}]*)\}")
_ARG_FIELD = re.compile(r"\{(params\.[^{}]*|run_dir|submit_dir|after\.run_dirs?)\}")  # what entrypoint.args may name
_AFTER_ONE, _AFTER_ALL = "{after.run_dir}", "{after.run_dirs}"
# Sections that only the built-in trainer reads; with an entrypoint they would do nothing.
TRAINER_SECTIONS = ("data", "model", "train")

MAX_SWEEP_POINTS = 10_000
MAX_NAME_LENGTH = 100  # <root>/<name>/<run_id> must stay within file system limits
MAX_AUTO_WORKERS = 8  # data.num_workers auto: beyond this, more workers rarely load faster



@dataclass(frozen=True)
class DataSpec(Section):
    dataset: DatasetName = opt("cifar10", "cifar10 | mnist | synthetic")
    root: str = opt("./data", "where datasets are stored or downloaded", path=True)
    download: bool = opt(True, "rank 0 downloads first, the others wait at a barrier")
    loader: Literal["auto", "tensor", "torchvision"] = opt("auto", "auto (tensor for datasets held in memory) | "
                                                           "tensor | torchvision")
    num_workers: Union[int, str] = opt("auto", "torchvision loader worker processes per rank; "
                                       "auto: resources.cpus_per_task - 1, at most 8")
    augment: bool = opt(True, "random crop (pad 4) + horizontal flip for CIFAR-shaped data")
    limit_train: Optional[int] = opt(None, "use only the first N training samples", ge=1)
    limit_val: Optional[int] = opt(None, "use only the first N validation samples", ge=1)
    drop_last: bool = opt(False, "drop the last partial training batch")
    pin_memory: Union[Literal["auto"], bool] = opt("auto", "auto: on when training on CUDA")
    tta: Literal["none", "flip"] = opt("none", "none | flip: also log val_acc_tta with flip test-time augmentation")

    def check(self) -> None:
        workers = self.num_workers
        if workers != "auto" and (isinstance(workers, str) or workers < 0):
            raise SpecError("num_workers", f"{brief(workers)} is not allowed; use auto or a whole number >= 0")
        if self.loader == "tensor" and not DATASETS[self.dataset].in_memory:
            raise SpecError("loader", f"tensor holds the whole dataset in memory, which {self.dataset} does not "
                            "fit; use loader: auto or torchvision")

    @property
    def loader_kind(self) -> str:
        """``loader`` resolved: "tensor" or "torchvision"."""
        if self.loader != "auto":
            return self.loader
        return "tensor" if DATASETS[self.dataset].in_memory else "torchvision"


@dataclass(frozen=True)
class ModelSpec(Section):
    arch: Literal["resnet18", "convnet", "mlp"] = opt("resnet18", "resnet18 (CIFAR stem) | convnet | mlp")
    sync_bn: bool = opt(True, "SyncBatchNorm across ranks, applied only on GPUs under NCCL")
    channels_last: Union[Literal["auto"], bool] = opt("auto", "channels_last memory format; auto: conv nets on CUDA")

    def check(self) -> None:
        if self.channels_last is True and self.arch == "mlp":
            raise SpecError("channels_last", "true does nothing for the mlp (it has no convolutions); "
                            "set channels_last: auto or false, or use arch: convnet or resnet18")


@dataclass(frozen=True)
class ParamGroupSpec(Section):
    match: str = opt("", "parameter-name prefix; the first matching group wins", pattern=(r".+", "a non-empty prefix"))
    lr_mult: float = opt(1.0, "multiplies the base learning rate", gt=0)
    weight_decay: Optional[float] = opt(None, "overrides train.weight_decay", ge=0)
    schedule: Optional[Schedule] = opt(None, "overrides train.schedule")


@dataclass(frozen=True)
class TrainSpec(Section):
    epochs: int = opt(30, "passes over the training set", ge=1)
    batch_size: int = opt(128, "per process; global = batch_size x world_size x grad_accum", ge=1)
    optimizer: Literal["sgd", "adamw"] = opt("sgd", "sgd | adamw")
    lr: float = opt(0.1, "base learning rate, before lr_scaling", gt=0)
    lr_scaling: Literal["none", "linear", "sqrt"] = opt("linear", "none | linear | sqrt, relative to world_size x "
                                                        "grad_accum")
    momentum: float = opt(0.9, "SGD momentum (AdamW: beta1)", ge=0, lt=1)
    nesterov: bool = opt(True, "Nesterov momentum for SGD")
    weight_decay: float = opt(5.0e-4, "decoupled for AdamW, L2 for SGD", ge=0)
    schedule: Schedule = opt("cosine", "cosine | step | constant, after warmup")
    warmup_epochs: float = opt(1.0, "linear warmup length in epochs", ge=0)
    label_smoothing: float = opt(0.0, "cross-entropy label smoothing", ge=0, lt=1)
    amp: Literal["auto", "fp16", "bf16", "off"] = opt("auto", "auto (bf16 on GPUs of compute capability >= "
                                                      "8.0, else fp16; on CPUs bf16 where they run it natively, "
                                                      "else off) | fp16 | bf16 | off")
    grad_accum: int = opt(1, "micro-batches per optimizer step", ge=1)
    ema_decay: Optional[float] = opt(None, "e.g. 0.999: also evaluate an EMA of the weights", gt=0, lt=1)
    param_groups: tuple[ParamGroupSpec, ...] = opt((), "per-layer overrides, first prefix match wins")
    seed: int = opt(0, "seeds weights, data order and augmentation", ge=0)
    log_every: int = opt(50, "optimizer steps between progress lines (one host sync each)", ge=1)
    compile: bool = opt(False, "torch.compile the model (the first steps compile it)")

    def check(self) -> None:
        if self.warmup_epochs > self.epochs:
            raise SpecError("warmup_epochs", f"{self.warmup_epochs} is longer than epochs ({self.epochs}); "
                            "set warmup_epochs <= epochs")


@dataclass(frozen=True)
class DistSpec(Section):
    backend: Literal["auto", "nccl", "gloo", "cuda:gloo"] = opt("auto", "auto (nccl on CUDA, else gloo) | nccl | "
                                                                "gloo | cuda:gloo (gloo with NCCL's device rule, "
                                                                "for tests: scripts/gpu-check)")
    init_method: str = opt("env", "env | tcp://HOST:PORT | file:///shared/path", pattern=_INIT)
    timeout_s: int = opt(600, "collective and rendezvous timeout in seconds", ge=1)

    def check(self) -> None:
        if self.init_method.startswith("tcp://"):
            port = int(self.init_method.rsplit(":", 1)[1])
            if not 1 <= port <= 65535:
                raise SpecError("init_method", f"{self.init_method!r}: port {port} is out of range; "
                                "use a TCP port in 1..65535, e.g. tcp://HOST:29500")


@dataclass(frozen=True)
class ResourcesSpec(Section):
    """What every run asks of the machines, whatever runs it; beside these keys, the keys
    each executor declares for itself (spec/options.py: ``resources.partition`` is the
    Slurm executor's), held in ``options``, one section per executor."""

    nodes: int = opt(1, "nodes per run", ge=1)
    tasks_per_node: int = opt(1, "processes per node; one per GPU on GPU nodes", ge=1)
    gpus_per_node: int = opt(0, "GPUs requested per node (gres); 0: CPU, the ranks see no GPU", ge=0)
    cpus_per_task: int = opt(2, "CPU cores per process", ge=1)
    mem_gb: float = opt(16.0, "memory per node in GB (0: the partition's default)", ge=0)
    time_min: int = opt(60, "wall-clock limit per job in minutes", ge=1)
    setup: tuple[str, ...] = opt((), "shell lines run before srun (module load, conda activate)")
    max_retries: int = opt(0, "restarts from the last checkpoint after a failure that points at the machine (a rank "
                              "killed by a signal, a NCCL or gloo communication error, Slurm's NODE_FAIL), counted "
                              "apart from the requeues; a Python error or bad input is never retried", ge=0)
    retry_backoff_s: float = opt(30.0, "the wait before the first retry, doubled for each further one (the local "
                                       "supervisor; on Slurm at least Slurm's own delay of a requeued job)", ge=0,
                                 lt=86400)
    array_parallelism: Optional[int] = opt(None, "at most this many runs of a sweep at once: a Slurm array's %N, the "
                                                 "local supervisor's runs side by side (null: Slurm's limits; "
                                                 "locally as many as fit)", ge=1)
    on_oom: Optional[OnOomSpec] = opt(None, "a run that ran out of memory is submitted again with more, from its "
                                            "last checkpoint: {retry, mem_factor, max_mem}; null: never")
    on_timeout: Optional[OnTimeoutSpec] = opt(None, "a run that timed out with no checkpoint is submitted again with "
                                                    "more time: {retry, time_factor, max_time}; null: never")
    on_gpu_oom: Optional[OnGpuOomSpec] = opt(None, "a run that ran out of GPU memory is submitted again with the keys "
                                                   "of set divided: {retry, set}; null: never")
    bad_node_ttl: str = opt("24h", "a node that failed a run is kept out of later jobs this long "
                                   "(<output.root>/.clusterjob/bad-nodes.json; 0h: never)")
    options: tuple[ExecutorOptions, ...] = field(default_factory=lambda: tuple(o() for o in executoropts.built_in()),
                                                 metadata={HOLDS_OPTIONS: True})

    def check(self) -> None:
        if self.gpus_per_node and self.tasks_per_node > self.gpus_per_node:
            raise SpecError("tasks_per_node", f"{self.tasks_per_node} tasks per node but gpus_per_node is "
                            f"{self.gpus_per_node}; run one task per GPU (tasks_per_node: {self.gpus_per_node})")
        escalation.ttl_s("bad_node_ttl", self.bad_node_ttl)
        self._check_ceilings()

    def _check_ceilings(self) -> None:
        """An escalation needs a request to grow, and a ceiling above it."""
        if self.on_oom is not None and not self.mem_gb:
            raise SpecError("on_oom", "needs a memory request to grow, but mem_gb is 0 (the partition's default); "
                                      "set resources.mem_gb")
        ceiling = self.on_oom.max_mem_gb if self.on_oom is not None else None
        if ceiling is not None and ceiling < self.mem_gb:
            raise SpecError("on_oom.max_mem", f"{self.on_oom.max_mem!r} is below mem_gb ({self.mem_gb:g} GB); "  # type: ignore[union-attr]
                                              "raise max_mem or lower mem_gb")
        limit = self.on_timeout.max_time_min if self.on_timeout is not None else None
        if limit is not None and limit < self.time_min:
            raise SpecError("on_timeout.max_time", f"{self.on_timeout.max_time!r} is below time_min "  # type: ignore[union-attr]
                                                   f"({self.time_min} min); raise max_time or lower time_min")

    @property
    def bad_node_ttl_s(self) -> float:
        return escalation.ttl_s("bad_node_ttl", self.bad_node_ttl)

    def held(self, declared: type[Held]) -> Held:
        """The options ``declared`` as this section holds them; their defaults where the
        spec names none of their keys."""
        found = next((held for held in self.options if type(held) is declared), None)
        return found if found is not None else declared()


@functools.cache
def resource_keys() -> frozenset:
    """The keys of resources itself (not an executor's)."""
    return frozenset(f.name for f in key_fields(ResourcesSpec))


def _declaring(key: str) -> Optional[type[ExecutorOptions]]:
    """The executor options that declare ``resources.<key>`` (spec/options.py)."""
    return executoropts.declaring(key, resource_keys())


@dataclass(frozen=True)
class CheckpointSpec(Section):
    every_epochs: int = opt(1, "write a checkpoint every N epochs (and at the end)", ge=1)
    keep_last: int = opt(2, "checkpoints kept on disk", ge=1)


@dataclass(frozen=True)
class OutputSpec(Section):
    root: str = opt("results", "runs go to <root>/<name>/<run_id>/", pattern=(r".+", "a non-empty path"),
                    path=True)


@dataclass(frozen=True)
class DebugSpec(Section):
    """Test hooks: stop or fail on purpose to exercise resume and failure handling."""

    exit_after_epoch: Optional[int] = opt(None, "exit (as if preempted) after this epoch's checkpoint", ge=1)
    fail_at_epoch: Optional[int] = opt(None, "raise on fail_rank at the start of this epoch", ge=1)
    fail_rank: int = opt(0, "which rank raises for fail_at_epoch", ge=0)
    slow_rank: Optional[int] = opt(None, "this rank waits slow_ms before each training batch: a straggler", ge=0)
    slow_ms: float = opt(200.0, "how long slow_rank waits before each batch", ge=0, lt=60_000)
    deterministic: bool = opt(False, "deterministic kernels (slower): exact resume checks on GPU")


@dataclass(frozen=True)
class EntrypointSpec(Section):
    """Your own training code, run on every task instead of the built-in trainer."""

    script: Optional[str] = opt(None, "a Python script, relative to the folder `submit` runs in", path=True)
    module: Optional[str] = opt(None, "a module run as `python -m`, e.g. mypkg.train", pattern=_MODULE)
    function: Optional[str] = opt(None, "module:function, called with no arguments", pattern=_FUNCTION)
    args: tuple[str, ...] = opt((), "the code's arguments; {params.NAME} becomes the run's value, {run_dir} "
                                    "the run folder, {submit_dir} the folder `submit` ran in")
    metrics: dict = opt({}, "metric name -> regex with one group around the number (and optionally one named "
                            "step around the step), matched on rank 0's output")
    metrics_file: Optional[str] = opt(None, "a CSV or JSON-lines file the code writes (relative to its working "
                                            "directory; {run_dir} and glob patterns allowed), read into the metrics",
                                      path=True)
    local_rank_arg: bool = opt(False, "append --local_rank=N, as torch.distributed.launch did")
    snapshot: bool = opt(False, "copy the code into <run>/code/ at submit and run that copy")
    workdir: Literal["submit", "run"] = opt("submit", "the code's working directory: submit (the folder `submit` "
                                                      "ran in) | run (the run folder, so ./checkpoints are per run)")
    stop_grace_s: float = opt(10.0, "a plain script (one that never asks clusterjob.should_stop()) is killed this "
                                    "long after SIGTERM, cancel or Ctrl-C reached it", gt=0, lt=3600)
    snapshot_max_file_mb: float = opt(10.0, "a snapshot skips files larger than this (MB), with a warning", gt=0)
    snapshot_max_total_mb: float = opt(100.0, "a snapshot larger than this in all (MB) is refused", gt=0)

    def check(self) -> None:
        given = [k for k in ("script", "module", "function") if getattr(self, k) is not None]
        if len(given) != 1:
            which = " and ".join(given) if given else "none"
            raise SpecError("", f"set exactly one of script, module or function (got {which}), "
                                "e.g. script: train.py")
        for name, regex in self.metrics.items():
            _check_metric_regex(name, regex)
        if self.metrics_file is not None:
            _check_metrics_file(self.metrics_file)
        if self.script is not None:
            object.__setattr__(self, "script", _existing_script(self.script))
            return
        target = self.module or self.function
        assert target is not None  # exactly one of script, module and function is set (above)
        if not _module_exists(target.split(":")[0]):
            key = "module" if self.module else "function"
            raise SpecError(key, f"{getattr(self, key)!r}: no such module from {os.getcwd()!r} or the Python path; "
                                 "run submit in the folder that holds the package, or install it")


def _check_metric_regex(name: Any, regex: Any) -> None:
    if not isinstance(name, str) or not _METRIC.fullmatch(name):
        raise SpecError(f"metrics.{key_text(name)}", "a metric name is letters, digits, '_' and '.', "
                                                     "starting with a letter, e.g. val_acc")
    where = f"metrics.{name}"
    if name == "step":
        raise SpecError(where, "step is each metric's position (the k-th match, or the regex's (?P<step>...) "
                               "group); name the metric otherwise")
    if not isinstance(regex, str):
        raise SpecError(where, f"expected a regex (a string), got {with_type(regex)}")
    check_text(where, regex)
    _check_groups(where, regex, _compiled(where, regex))


_STEP_GROUP = "step"  # the named group a metric's regex may take its step from
_GROUPS_HINT = ("e.g. 'Accuracy is ([0-9.]+)', or 'iter (?P<step>[0-9]+): loss ([0-9.]+)' to take the step from "
                "the line (write (?:...) for other groups)")


def _check_groups(where: str, regex: str, compiled: "re.Pattern") -> None:
    """One group around the number, and at most one more: ``(?P<step>...)``."""
    step = _STEP_GROUP in compiled.groupindex
    if compiled.groups == 1 + step:
        return
    if step and compiled.groups == 1:
        raise SpecError(where, f"{brief(regex)} has only the step group; add a group around the number, "
                               f"{_GROUPS_HINT}")
    other = " (a second group must be named step: (?P<step>...))" if compiled.groups == 2 and not step else ""
    raise SpecError(where, f"{brief(regex)} has {compiled.groups} groups{other}; it needs exactly one around the "
                           f"number, and may have one more named step, {_GROUPS_HINT}")


def _check_metrics_file(path: str) -> None:
    """Only {run_dir} is filled in; any other brace pair would be read as a file name."""
    for found in re.findall(r"\{[^{}]*\}", path):
        if found != "{run_dir}":
            raise SpecError("metrics_file", f"{brief(path)}: {found} is no placeholder; the only one is {{run_dir}} "
                                            "(the run folder), e.g. '{run_dir}/log.jsonl' or 'output/*/summary.csv'")


def _compiled(where: str, regex: str) -> "re.Pattern":
    """``re.compile(regex)``; every way it can fail is the spec's error: a syntax error,
    nesting too deep for the parser (RecursionError), a repeat count past C's limits
    (OverflowError), and whatever else the engine refuses."""
    try:
        compiled = re.compile(regex)
        _pump_engine_takes(regex)
        return compiled
    except RecursionError:
        why = "it nests too deeply for Python's regex parser"
    except Exception as err:  # re.error, OverflowError, MemoryError...: all bad input
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
    raise SpecError(where, f"{brief(regex)} is not a regex ({why}); e.g. 'Accuracy is ([0-9.]+)'")


def _pump_engine_takes(text: str) -> None:
    """The output pump matches with the ``regex`` engine (it has a time budget per line);
    a pattern ``re`` takes but it refuses is refused here, not switched off mid-run."""
    import regex  # only for specs with metric regexes

    try:
        regex.compile(text)
    except regex.error as err:
        raise ValueError(f"the output pump's regex engine refuses it: {err}") from None


def _existing_script(path: str) -> str:
    """The script as an absolute path (relative to the working directory: the folder
    `submit` runs in), which must be a file."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise SpecError("script", f"{path!r}: no such file (looked for {full!r}); give the path of your "
                                  "training script relative to the folder you submit from")
    return full


def _module_exists(name: str) -> bool:
    """Whether module ``name`` can be found, without running any of its code (and so
    without torch): importlib's find_spec on a dotted name would import the parent
    packages, so the path finder is asked one level at a time instead. The working
    directory comes first, as with ``python -m``."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    top, *rest = name.split(".")
    found = PathFinder.find_spec(top, [os.getcwd()]) or find_spec(top)  # a top-level lookup runs no code
    for part in rest:
        locations = list(found.submodule_search_locations or []) if found else []
        found = PathFinder.find_spec(part, locations) if locations else None
    return found is not None


# The loggers' packages, by the spec key that asks for them (the module, and the extra
# that installs it). Validation only looks them up, it never imports one.
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


@dataclass(frozen=True)
class MlflowSpec(Section):
    """MLflow: one MLflow run per run, named after the run id."""

    tracking_uri: Optional[str] = opt(None, "where MLflow keeps runs: file:./mlruns (relative to the folder `submit` "
                                            "ran in), http://host:5000, sqlite:////abs/mlflow.db (the full mlflow "
                                            "package), databricks; null: MLFLOW_TRACKING_URI, else file:./mlruns")
    experiment: Optional[str] = opt(None, "the MLflow experiment, shared by a sweep's runs; null: the spec's name",
                                    max_len=MAX_NAME_LENGTH)

    def check(self) -> None:
        uri = self.tracking_uri or ""
        scheme = uri.split(":", 1)[0].split("+", 1)[0] if ":" in uri else ""
        if scheme in _DATABASE_STORES and not all(_package_installed(name) for name in ("sqlalchemy", "alembic")):
            raise SpecError("tracking_uri", f"{brief(uri)} is a database store, which MLflow opens only with the full "
                                            "mlflow package (SQLAlchemy and alembic; mlflow-skinny has neither): pip "
                                            "install mlflow, or use file:./mlruns (the default) or an MLflow server "
                                            "(http://host:5000)")


_DATABASE_STORES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores


@dataclass(frozen=True)
class WandbSpec(Section):
    """Weights & Biases: one W&B run per run, named after the run id."""

    project: Optional[str] = opt(None, "the W&B project, shared by a sweep's runs; null: the spec's name",
                                 pattern=_NAME, max_len=MAX_NAME_LENGTH)
    entity: Optional[str] = opt(None, "the W&B team or user; null: your default entity", pattern=_NAME,
                                max_len=MAX_NAME_LENGTH)
    mode: Literal["online", "offline"] = opt("online", "online | offline (kept under <run>/wandb/; `wandb sync` "
                                                       "uploads it later)")


@dataclass(frozen=True)
class LoggingSpec(Section):
    """Where rank 0 also sends every metric record, after it is in metrics.jsonl."""

    tensorboard: bool = opt(False, "TensorBoard event files under <run>/tensorboard/")
    mlflow: Optional[MlflowSpec] = opt(None, "an MLflow run per run ({} for the defaults); null: off")
    wandb: Optional[WandbSpec] = opt(None, "a W&B run per run ({} for the defaults); null: off")

    def check(self) -> None:
        for key, module in LOGGER_PACKAGES.items():
            if getattr(self, key) not in (None, False) and not _package_installed(module):
                raise SpecError(key, f"asks for {module}, which is not installed in this Python "
                                     f"({sys.executable}); pip install \"clusterjob[{key}]\", or turn it off "
                                     f"(logging.{key}: {'false' if key == 'tensorboard' else 'null'})")

    @property
    def any(self) -> bool:
        """Whether any logger is on."""
        return bool(self.tensorboard or self.mlflow or self.wandb)


def _package_installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported, without importing it."""
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or a module whose spec is None
        return False


MAX_STALL_S = 1_000_000  # about 11.6 days: longer than any job's time limit
MAX_SAMPLE_S = 3600.0  # a GPU sampled less than once an hour tells nothing


@dataclass(frozen=True)
class HealthSpec(Section):
    """Hung and slow ranks (docs/design.md, "Hung and slow ranks"): a watchdog beside every
    rank that names and deals with a stall, and the wait of the ranks for the slowest."""

    stall_s: Optional[float] = opt(1800.0, "no progress on any rank for this long is a stall; null: no watchdog",
                                   ge=5, lt=MAX_STALL_S)
    on_stall: Literal["auto", "retry", "stop", "warn"] = opt(
        "auto", "auto (retry when resources.max_retries > 0, else stop) | retry (from the last checkpoint, as a retry) "
                "| stop (fail the run) | warn (record it and go on)")
    straggler_wait_pct: float = opt(30.0, "warn when the others wait for the slowest rank more than this share of "
                                          "their time over a minute", ge=1, lt=100)
    output_is_progress: Union[Literal["auto"], bool] = opt(
        "auto", "an output line of a rank is progress; auto: true for your own code without metrics or metrics_file")
    gpu_sample_s: Optional[float] = opt(10.0, "each rank's GPUs are sampled (utilisation, memory, power) this often "
                                              "into <run>/telemetry.jsonl; null: no sampling", ge=0.1, le=MAX_SAMPLE_S)
    low_util_pct: float = opt(30.0, "warn when a run's mean GPU utilisation stays under this % for 10 minutes",
                              ge=1, le=100)

    def action(self, max_retries: int) -> str:
        """``on_stall`` resolved: retry, stop or warn."""
        if self.on_stall != "auto":
            return self.on_stall
        return "retry" if max_retries > 0 else "stop"

    def output_counts(self, entrypoint: Optional["EntrypointSpec"]) -> bool:
        """``output_is_progress`` resolved: auto counts the output of code that logs no metric the runner reads
        (the built-in trainer beats at every step itself)."""
        if self.output_is_progress != "auto":
            return bool(self.output_is_progress)
        return entrypoint is not None and not entrypoint.metrics and entrypoint.metrics_file is None


@dataclass(frozen=True)
class Spec(Section):
    name: str = opt(MISSING, "run name: results go to <output.root>/<name>/", pattern=_NAME,
                    max_len=MAX_NAME_LENGTH)
    data: DataSpec = opt(DataSpec)
    model: ModelSpec = opt(ModelSpec)
    train: TrainSpec = opt(TrainSpec)
    dist: DistSpec = opt(DistSpec)
    resources: ResourcesSpec = opt(ResourcesSpec)
    env: dict = opt({}, "environment variables of every rank, NAME: value (text; numbers and true/false become "
                        "their text); a secret's value (KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL in the name) is "
                        "written *** and taken from the environment of the submitting shell")
    checkpoint: CheckpointSpec = opt(CheckpointSpec)
    sweep: dict = opt({}, "dotted key -> list of values; the grid of all lists, one run per point")
    search: Optional[SearchSpec] = opt(None, "random or tpe search over a space of keys, with ASHA pruning "
                                             "(docs/design.md, \"Search\"); null: no search")
    output: OutputSpec = opt(OutputSpec)
    debug: DebugSpec = opt(DebugSpec)
    logging: LoggingSpec = opt(LoggingSpec)
    health: Optional[HealthSpec] = opt(HealthSpec, "hung and slow ranks; null: no watchdog, no stack dumps, "
                                                   "no wait timing")
    entrypoint: Optional[EntrypointSpec] = opt(None, "your own training code instead of the built-in trainer")
    container: Optional[ContainerSpec] = opt(None, "the image every rank runs in (docs/design.md, \"Containers\"); "
                                                   "null: the ranks run on the host")
    params: dict = opt({}, "your code's settings (clusterjob.params, {params.NAME} in args); sweep as params.NAME")

    def check(self) -> None:
        if self.dist.backend in ("nccl", "cuda:gloo") and self.resources.gpus_per_node == 0:
            # gpus_per_node 0 means CPU: the runner hides every GPU from the ranks
            raise SpecError("dist.backend", f"{self.dist.backend} needs GPUs but resources.gpus_per_node is 0; "
                            "request GPUs or use backend: auto (gloo on CPU)")
        if self.name in (".", ".."):
            raise SpecError("name", f"{self.name!r} is not a folder name; use letters, digits, '.', '_', '-'")
        if self.name.startswith("."):
            raise SpecError("name", f"{self.name!r} starts with '.', which hides its results folder; "
                            "start it with a letter or digit")
        _check_sweep(self.sweep, self.entrypoint is not None)
        object.__setattr__(self, "env", envvars.checked_env(self.env))
        object.__setattr__(self, "sweep", _sweep_as_text(self.sweep))
        _check_params(self)
        if self.health is not None and self.health.on_stall == "retry" and self.resources.max_retries == 0:
            raise SpecError("health.on_stall", "retry restarts a stalled run as a retry, but resources.max_retries "
                                               "is 0; set resources.max_retries: 1 (or more), or on_stall: stop")
        if self.resources.on_gpu_oom is not None:
            for key in self.resources.on_gpu_oom.set:
                _check_shrunk_key(self, key)
        if self.entrypoint is None:
            _check_full_batches(self)
            _check_num_workers(self)
        if self.search is not None:
            _check_search(self)

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node


# ----------------------------------------------------------------------------- checks


def _check_sweep(sweep: dict, own_code: bool = False) -> None:
    """Sweep keys must be existing leaf keys (or params.NAME), their values non-empty
    lists, the grid bounded."""
    for key, values in sweep.items():
        where = f"sweep.{key_text(key)}"
        check_swept_key(where, key, own_code)
        if not isinstance(values, (list, tuple)):
            raise SpecError(where, f"{brief(values)} is not a list; write the values to try as a list, "
                            f"e.g. {key}: [{brief(values)}]")
        if not values:
            example = 0.1 if key.startswith("params.") else spec_to_dict(_leaf_default(key))
            raise SpecError(where, f"[] gives no runs; give at least one value to try, "
                                   f"e.g. {key}: [{json.dumps(example)}]")
    _check_sweep_size(sweep)


def check_swept_key(where: str, key: Any, own_code: bool) -> None:
    """What a sweep may set (and a search may search): an existing leaf key, params.NAME
    or env.NAME (no secret), none of what is per submission, and none of the trainer's
    sections beside your own code."""
    if isinstance(key, str) and key.split(".")[0] == "container":  # a Slurm array runs one script, one image
        unit = "trial" if where.startswith("search.") else "sweep point"
        raise SpecError(where, f"the container is per submission, not per {unit}; submit a spec per image instead")
    if isinstance(key, str) and key.startswith("params."):
        if not re.fullmatch(_IDENT, key[len("params."):]):
            raise SpecError(where, "a params key is a name (letters, digits, '_'), e.g. params.lr")
    elif isinstance(key, str) and key.startswith("env."):
        envvars.check_sweepable(where, key[len("env."):])
    elif not (isinstance(key, str) and _is_key(key)):
        raise SpecError(where, f"{brief(key)} is not a spec key{did_you_mean(key, _leaf_keys(Spec))}")
    if key in ("name", "sweep", "search") or key.startswith(("resources.", "output.", "entrypoint.", "logging.",
                                                             "search.")):
        unit = "trial" if where.startswith("search.") else "sweep point"
        raise SpecError(where, f"name, resources, output, entrypoint and logging are per submission, not per {unit}; "
                               "submit a spec per value instead")
    if own_code and key.split(".")[0] in TRAINER_SECTIONS:
        raise SpecError(where, _trainer_key_message(key))


def _check_shrunk_key(spec: "Spec", key: Any) -> None:
    """A key ``resources.on_gpu_oom.set`` divides: a number of the spec, as a sweep may set it."""
    where = f"resources.on_gpu_oom.set.{key_text(key)}"
    check_swept_key(where, key, spec.entrypoint is not None)
    value = escalation.leaf_value(spec, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(where, f"is {brief(value)}, not a number to divide; name a number such as "
                               "train.batch_size or params.batch_size")


def _sweep_as_text(sweep: dict) -> dict:
    """The sweep with the values of each swept variable (``env.NAME``) as the text the
    variable gets, so that run.json's params and the report hold what the ranks saw."""
    return {key: [envvars.env_text(f"sweep.{key}", key[len("env."):], v) for v in values]
            if key.startswith("env.") else values for key, values in sweep.items()}


def _trainer_key_message(key: str) -> str:
    leaf = key.rsplit(".", 1)[-1]
    return (f"has no effect with an entrypoint: data, model and train are the built-in trainer's; "
            f"put your code's settings in params and read them there, e.g. params.{leaf}")


def _check_params(spec: "Spec") -> None:
    """Params are names with plain values, for an entrypoint only; every {params.NAME} of
    its args names one (given directly or by the sweep)."""
    if spec.entrypoint is None:
        if spec.params:
            raise SpecError("params", "params go to your own code (entrypoint: script, module or function); "
                                      "the built-in trainer reads data, model and train")
        return
    for name, value in spec.params.items():
        if not isinstance(name, str) or not re.fullmatch(_IDENT, name):
            raise SpecError(f"params.{key_text(name)}", "a params key is a name (letters, digits, '_'), e.g. lr")
        _check_plain(f"params.{name}", value)
    varied = [*spec.sweep, *(spec.search.space if spec.search is not None else ())]
    known = set(spec.params) | {k[len("params."):] for k in varied if isinstance(k, str) and k.startswith("params.")}
    for index, arg in enumerate(spec.entrypoint.args):
        for name in _PLACEHOLDER.findall(arg):
            if name not in known:
                raise SpecError(f"entrypoint.args[{index}]", f"{{params.{name}}} names no params key (params has: "
                                f"{', '.join(sorted(known)) or 'none'}); add {name} to params or fix the name")


def _check_plain(key: str, value: Any) -> None:
    """A params value: text, numbers, booleans, null, and lists or mappings of them."""
    if isinstance(value, dict):
        for name, inner in value.items():
            if not isinstance(name, str):
                raise SpecError(f"{key}.{key_text(name)}", "keys are names (strings)")
            check_text(f"{key}.{key_text(name)}", name)  # a key may land in a shell line too
            _check_plain(f"{key}.{name}", inner)
    elif isinstance(value, (list, tuple)):
        for index, inner in enumerate(value):
            _check_plain(f"{key}[{index}]", inner)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise SpecError(key, f"{with_type(value)} is not plain data; use text, numbers, true/false or lists")
    else:
        check_kind(key, value, {})


def entrypoint_args(spec: "Spec", run_dir: str = "{run_dir}", submit_dir: str = "{submit_dir}",
                    after: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """The entrypoint's args with each {params.NAME} replaced by the run's value (text as
    is, other values as JSON: 0.01, true, [1, 2]), {run_dir} and {submit_dir} by those
    folders, and with ``after`` (the folders of the runs this one waited for)
    {after.run_dir} by the one such folder and {after.run_dirs} by all of them as a JSON
    list; in one pass, so a value holding a placeholder stays as it is."""
    folders = {"run_dir": run_dir, "submit_dir": submit_dir}
    if after is not None:
        check_after_args(spec, len(after))
        folders.update({"after.run_dirs": json.dumps(list(after)), "after.run_dir": after[0] if after else ""})

    def value(match: "re.Match") -> str:
        name = match.group(1)
        if name.startswith("after.") and after is None:
            return match.group(0)  # no run to name yet (validate, a dry run)
        if name in folders:
            return folders[name]
        found = spec.params[name[len("params."):]]
        return found if isinstance(found, str) else json.dumps(found)

    assert spec.entrypoint is not None  # only a spec with an entrypoint has args
    return tuple(_ARG_FIELD.sub(value, arg) for arg in spec.entrypoint.args)


def check_after_args(spec: "Spec", count: int) -> None:
    """{after.run_dir} names the one run this run waits for (``count`` runs, from
    ``submit --after``), {after.run_dirs} any number of them, at least one."""
    args = spec.entrypoint.args if spec.entrypoint is not None else ()
    for index, arg in enumerate(args):
        if _AFTER_ONE in arg and count != 1:
            fix = "use {after.run_dirs} (a JSON list of the folders)" if count else "submit with --after RUN"
            raise SpecError(f"entrypoint.args[{index}]", f"{_AFTER_ONE} is the folder of the one run this run waits "
                                                         f"for, but --after names {count}; {fix}")
        if _AFTER_ALL in arg and count == 0:
            raise SpecError(f"entrypoint.args[{index}]", f"{_AFTER_ALL} lists the runs this run waits for, but it "
                                                         "waits for none; submit with --after RUN")


def _check_sweep_size(sweep: dict) -> None:
    """The grid's size from the list lengths alone, before anything is expanded."""
    points = math.prod(len(values) for values in sweep.values())
    if points > MAX_SWEEP_POINTS:
        sizes = " x ".join(f"{len(v)} ({k})" for k, v in sweep.items())
        raise SpecError("sweep", f"{sizes} = {points} runs is more than {MAX_SWEEP_POINTS}; "
                                 "split the sweep into several specs or try fewer values")


def _check_full_batches(spec: "Spec") -> None:
    """With drop_last, a rank with less than one batch would train on nothing: refuse early."""
    data, batch, world = spec.data, spec.train.batch_size, spec.world_size
    if not data.drop_last:
        return
    known = DATASETS[data.dataset].train_size
    # Synthetic data is made to size; a real split is only cut.
    limited = data.limit_train is not None and (DATASETS[data.dataset].made or data.limit_train < known)
    samples = data.limit_train if limited and data.limit_train is not None else known
    if samples >= world * batch:
        return
    key, source = ("data.limit_train", f"limit_train is {samples}") if limited else (
        "train.batch_size", f"{data.dataset} has only {samples}")
    fixes = [f"set data.limit_train to at least {world * batch}"] if (
        DATASETS[data.dataset].made or world * batch <= known) else []
    fixes += [f"lower train.batch_size to at most {samples // world}"] if samples >= world else []
    raise SpecError(key, f"with drop_last, {world} ranks x batch_size {batch} need {world * batch} training "
                         f"samples, but {source}; {' or '.join(fixes + ['set data.drop_last: false'])}")


def _check_num_workers(spec: "Spec") -> None:
    """Each DataLoader worker is a process that wants a CPU of its own, beside the training
    process: more than cpus_per_task - 1 of them thrash. Only the torchvision loader has any."""
    workers, cpus = spec.data.num_workers, spec.resources.cpus_per_task
    if isinstance(workers, str) or spec.data.loader_kind != "torchvision" or workers <= cpus - 1:  # str: "auto" (check)
        return
    raise SpecError("data.num_workers", f"{workers} worker processes and the training process need {workers + 1} "
                    f"CPUs, but resources.cpus_per_task is {cpus}; set data.num_workers: auto (or at most {cpus - 1}), "
                    f"or resources.cpus_per_task: {workers + 1}")


def _leaf_default(key: str) -> Any:
    """The default value of a dotted leaf key such as ``train.lr``."""
    cls, *sections, name = [Spec, *key.split(".")]
    for section in sections:
        cls = hints(cls)[section]
    default = next(f for f in key_fields(cls) if f.name == name)
    return default.default if default.default is not MISSING else default.default_factory()



@functools.cache
def _leaf_keys(cls: type, prefix: str = "") -> tuple[str, ...]:
    """Dotted names of every scalar/list key below ``cls`` (sections excluded), the
    built-in executors' keys included."""
    keys: list[str] = []
    for f in key_fields(cls):
        hint = hints(cls)[f.name]
        if isinstance(hint, type) and is_dataclass(hint):
            keys += _leaf_keys(hint, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return tuple(keys) + tuple(prefix + key for key in _option_keys(cls))


def _is_key(key: str) -> bool:
    """Whether dotted ``key`` is a key of the spec: one of ``_leaf_keys``, or one an
    executor of another package declares (resources.NAME)."""
    section, _, name = key.partition(".")
    return key in _leaf_keys(Spec) or (section == "resources" and _declaring(name) is not None)


# ----------------------------------------------------------------------------- from plain data


def spec_from_dict(raw: Any) -> Spec:
    """Build and validate a Spec from plain data (a parsed YAML mapping)."""
    if isinstance(raw, dict) and raw.get("entrypoint") is not None:
        for section in TRAINER_SECTIONS:
            if section in raw:
                inner = raw[section]
                first = next(iter(inner), None) if isinstance(inner, dict) else None
                key = f"{section}.{key_text(first)}" if first is not None else section
                raise SpecError(key, _trainer_key_message(key))
    return _build(Spec, raw, "")


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise SpecError(path, f"expected a mapping of keys, got {with_type(raw)}")
    typed = hints(cls)
    kwargs = _executor_options(cls, raw, path)
    for f in key_fields(cls):
        if f.name in raw:
            kwargs[f.name] = _convert(typed[f.name], raw[f.name], _join(path, f.name))
        elif f.default is MISSING and f.default_factory is MISSING:
            raise SpecError(_join(path, f.name), "required; add it to the spec")
    try:
        return cls(**kwargs)
    except SpecError as err:
        raise (err.under(path) if path else err) from None


def _executor_options(cls: type, raw: dict, path: str) -> dict:
    """Refuse a key of ``raw`` that section ``cls`` does not have. In resources, the keys
    executors declare become their ``options``: one section per built-in executor (its
    defaults where the spec names none of its keys), and one per executor of another
    package whose keys the spec names."""
    names = [f.name for f in key_fields(cls)]
    given: dict[type, dict] = {declared: {} for declared in executoropts.built_in()} if cls is ResourcesSpec else {}
    for key in raw:
        if key in names:
            continue
        declared = _declaring(key) if cls is ResourcesSpec and isinstance(key, str) else None
        if declared is None:
            foreign = executoropts.foreign(resource_keys()) if cls is ResourcesSpec else ()
            allowed = names + [*_option_keys(cls), *(key for extra in foreign for key in extra.keys())]
            raise SpecError(_join(path, key_text(key)), "unknown key" + _where_else(str(key), allowed, path))
        given.setdefault(declared, {})[key] = raw[key]
    return {"options": tuple(_build(declared, keys, path) for declared, keys in given.items())} if given else {}


def _option_keys(cls: type) -> tuple[str, ...]:
    """The keys the built-in executors declare in section ``cls`` (resources only)."""
    return tuple(key for declared in executoropts.built_in() for key in declared.keys()) if cls is ResourcesSpec else ()


def _where_else(key: str, names: list[str], path: str) -> str:
    """Did-you-mean for an unknown key: a close name here, or the same name in another section."""
    near = did_you_mean(key, names)
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
    if isinstance(hint, type) and is_dataclass(hint):
        return _build(hint, value, key)
    if hint is float and isinstance(value, str):
        return _float_string(key, value)
    if hint is float and _is_instance(value, int):
        return _int_to_float(key, value)
    return value if _is_instance(value, hint) else _type_error(key, value, _type_word(hint))


def _int_to_float(key: str, value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise SpecError(key, f"{brief(value)} must be a finite number; write a number such as 0.1") from None


def _float_string(key: str, value: str) -> float:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; accept it for float keys."""
    try:
        return float(value)
    except ValueError:
        return _type_error(key, value, "a number")


def _is_instance(value: Any, hint: Any) -> bool:
    if get_origin(hint) is Literal:  # its kind here; which value is checked with the field's choices
        return _is_instance(value, type(get_args(hint)[0]))
    if hint is dict:
        return isinstance(value, dict)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_word(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return _type_word(type(get_args(hint)[0]))
    return {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
            dict: "a mapping"}.get(hint, str(hint))


def _type_error(key: str, value: Any, expected: str) -> Any:
    raise SpecError(key, f"expected {expected}, got {with_type(value)}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def spec_to_dict(spec: Any) -> Any:
    """Plain data (dicts, lists, scalars) for a spec or section; ``spec_from_dict`` inverts it."""
    if isinstance(spec, Spec):  # a secret's value never leaves the process: *** wherever a spec is written
        return {f.name: envvars.shown_env(spec.env) if f.name == "env" else spec_to_dict(getattr(spec, f.name))
                for f in key_fields(Spec) if _written(spec, f.name)}
    if is_dataclass(spec):
        own = {f.name: spec_to_dict(getattr(spec, f.name)) for f in key_fields(type(spec))}
        held = spec.options if isinstance(spec, ResourcesSpec) else ()
        return {**own, **{key: value for section in held for key, value in spec_to_dict(section).items()}}
    if isinstance(spec, (tuple, list)):
        return [spec_to_dict(v) for v in spec]
    if isinstance(spec, dict):
        return {k: spec_to_dict(v) for k, v in spec.items()}
    return spec


def _written(spec: Spec, name: str) -> bool:
    """Whether a resolved spec writes section ``name``: not the trainer's sections beside an
    entrypoint (they would be refused on reading), no empty entrypoint, params or search."""
    if name == "search":
        return spec.search is not None  # a spec without one is written as before searches existed
    if spec.entrypoint is not None:
        return name not in TRAINER_SECTIONS
    return name not in ("entrypoint", "params")


def dump_spec(spec: Spec) -> str:
    """The spec as YAML, every key written out (the resolved spec of a run).

    libyaml's emitter when present: the same text, four times faster. A sweep writes one
    spec per point, and its points share every section their values do not change
    (``expand_sweep``): each section is written once, and its text reused for the points
    that share it (a block mapping's text is the concatenation of its keys' texts)."""
    return "".join(spec_parts(spec))


def spec_parts(spec: Spec) -> list[str]:
    """``dump_spec``'s text as its sections' texts, in order: what a sweep's points share."""
    return [_section_text(spec, f.name) for f in key_fields(Spec) if _written(spec, f.name)]


_SECTION_TEXTS: dict = {}  # (name, id of a dataclass section, or a plain value's JSON) -> (what it holds, YAML)
_MOST_SECTION_TEXTS = 4096


def _section_text(spec: Spec, name: str) -> str:
    """``name: <section>`` as YAML, written once per section: a dataclass section once
    per object (held, so that its id stays its own), a plain value (the name, the sweep,
    params, env with its secrets shown as ***) once per content (in its order), as the
    points of a sweep each hold a copy of the same mapping."""
    section = getattr(spec, name)
    if is_dataclass(section):
        found = _SECTION_TEXTS.get((name, id(section)))
        if found is None or found[0] is not section:
            data = spec_to_dict(section)
            composed = _composed(name, data)
            found = _keep((name, id(section)), section, {name: data}, composed)
        return found[1]
    data = envvars.shown_env(spec.env) if name == "env" else spec_to_dict(section)
    key = (name, json.dumps(data, default=repr))
    found = _SECTION_TEXTS.get(key)
    return (found or _keep(key, key, {name: data}))[1]


def _keep(key: tuple, section: Any, data: dict, text: Optional[str] = None) -> tuple:
    if len(_SECTION_TEXTS) >= _MOST_SECTION_TEXTS:
        _SECTION_TEXTS.clear()
    found = _SECTION_TEXTS[key] = (section, text if text is not None else _yaml(data))
    return found


_ITEM_TEXTS: dict = {}  # (section, key, value's own key) -> the key's lines, indented as in its section
_SHORT = 40  # the longest key or word _composed takes
_NARROW = 70  # a line this long at the top is one line at the section's depth too (YAML folds past 80)


def _composed(name: str, data: dict) -> Optional[str]:
    """A section's text from the texts of its keys, each written once per value: the
    points of a sweep each change a key or two of a section (train.lr, train.seed), and
    writing the whole section again per point is most of what writing 10,000 spec.yaml
    costs. Only where the text is the same as the whole section's: every value a number,
    a bool, null, a short one-line word, or a list of them (no folding, no nesting); else
    None, and the section is written whole."""
    parts = []
    for key, value in data.items():
        own = _value_key(value)
        if own is None or not isinstance(key, str) or len(key) > _SHORT:
            return None
        found = _ITEM_TEXTS.get((name, key, own))
        if found is None:
            lines = _yaml({key: value}).splitlines()
            if len(lines) != 1 + (len(value) if isinstance(value, list) else 0) or max(map(len, lines)) > _NARROW:
                return None  # folded, or it might be at the section's depth: the section is written whole
            if len(_ITEM_TEXTS) >= _MOST_SECTION_TEXTS:
                _ITEM_TEXTS.clear()
            found = _ITEM_TEXTS[(name, key, own)] = "".join(f"  {line}\n" for line in lines)
        parts.append(found)
    return f"{name}:\n{''.join(parts)}" if parts else None


def _value_key(value: Any) -> Optional[tuple]:
    """What tells ``value``'s text apart (its type and repr: 0.0 and -0.0, 1 and True
    differ), for a value ``_composed`` may write on its own; None for any other."""
    if isinstance(value, list):
        items = [_value_key(v) for v in value]
        return None if any(item is None or item[0] == "list" for item in items) else ("list", tuple(items))
    if value is None or isinstance(value, (bool, int, float)):
        return (type(value).__name__, repr(value))
    if isinstance(value, str) and len(value) <= _SHORT and value.isprintable():
        return ("str", value)
    return None


def _yaml(data: dict) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read, override and validate a spec file. Raises SpecError (exit 2) on bad input."""
    return spec_from_dict(apply_overrides(read_spec_file(path), overrides, holds_text))


def holds_text(key: str) -> bool:
    """Whether dotted ``key`` holds text: a key typed str (or Optional[str], or a choice of
    words), or a metric's regex (``entrypoint.metrics.NAME``). ``--set`` keeps such a
    value as typed where YAML would read it as something else (yamlfile.override_value)."""
    *sections, name = key.split(".")
    if sections in (["entrypoint", "metrics"], ["env"]):
        return True
    cls: Optional[type] = Spec
    for section in sections:
        cls = _section_type(cls, section) if cls is not None else None
    if cls is None:
        return False
    hint = hints(cls).get(name)
    declared = _declaring(name) if hint is None and cls is ResourcesSpec else None
    hint = hints(declared).get(name) if declared is not None else hint
    words = choices_of(hint)
    return hint in (str, Optional[str]) or (words is not None and all(isinstance(c, str) for c in words))


def _section_type(cls: type, name: str) -> Optional[type]:
    """The section class of field ``name`` of section ``cls`` (Optional unwrapped), else None."""
    hint = hints(cls).get(name)
    inner = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) is Union else [hint]
    found = inner[0] if len(inner) == 1 else None
    return found if isinstance(found, type) and is_dataclass(found) else None


# ----------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: the values it sets (dotted keys) and its resolved spec."""

    index: int
    params: dict
    spec: Spec

    @property
    def run_params(self) -> dict:
        """What run.json records as ``params`` (docs/design.md, "Results layout"): the
        point's values, then every key of the run's own params as ``params.NAME``, so
        runs group by ``params.NAME`` whether it was swept or not."""
        return {**self.params, **{f"params.{name}": value for name, value in self.spec.params.items()}}


def expand_sweep(spec: Spec) -> list[SweepPoint]:
    """The grid of the sweep's lists, in the order written; a spec without sweep is one point.

    Every point is validated: its values are converted and checked, and the sections it
    changes and the spec itself run their checks again. Sections it leaves alone were
    checked with the spec already and are shared, not rebuilt.
    """
    keys = list(spec.sweep)
    if not keys:
        return [SweepPoint(0, {}, spec)]
    # Every point sets each swept params.NAME, so the base only needs the name to exist
    # (its {params.NAME} args are checked against it); None stands in for the value.
    swept = {key[len("params."):]: None for key in keys if key.startswith("params.")}
    base = replace(spec, sweep={}, params={**spec.params, **swept})
    points = []
    for index, values in enumerate(itertools.product(*(spec.sweep[k] for k in keys))):
        params = dict(zip(keys, values))
        points.append(SweepPoint(index, params, _apply_point(base, index, params)))
    return points


def _apply_point(base: Spec, index: int, params: dict) -> Spec:
    try:
        return _with_values(base, params, "")
    except SpecError as err:
        swept = any(err.key == k or err.key.startswith((f"{k}.", f"{k}[")) for k in params)
        where = f"(sweep point {index}: {brief(params)})"
        raise SpecError(f"sweep.{err.key}" if swept else err.key, f"{err.detail} {where}") from None


def _with_values(section: Any, values: dict, path: str) -> Any:
    """``section`` with the dotted keys of ``values`` set, converted and validated."""
    cls: type = type(section)  # plain type: mypy finds type[Any] not Hashable for the cache
    typed, changes = hints(cls), {}
    nested: dict[str, dict] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            changes[head] = _convert(typed[head], value, _join(path, head))
    for head, inner in nested.items():
        if isinstance(section, Spec) and head in ("params", "env"):  # a free mapping, not a section
            changes[head] = {**getattr(section, head), **inner}
            continue
        changes[head] = _with_values(getattr(section, head), inner, _join(path, head))
    try:
        return replace(section, **changes)
    except SpecError as err:
        raise (err.under(path) if path else err) from None


# ----------------------------------------------------------------------------- searches

# What the built-in trainer logs that a search may rank by (docs/design.md, "Metrics and loggers")
TRAINER_METRICS = ("val_acc", "val_loss", "train_loss", "train_acc")


def _check_search(spec: "Spec") -> None:
    """A search beside no sweep; keys a sweep may set; each bound (or choice) a value the
    key takes; the metric one the runs log (resolved, with its mode); a first rung
    before the trainer's last epoch."""
    search = spec.search
    assert search is not None  # only a spec with a search is checked here
    if spec.sweep:
        raise SpecError("search", "a spec has a sweep or a search, not both: move the swept keys into "
                                  "search.space (e.g. {choice: [...]}), or drop the search")
    own = spec.entrypoint is not None
    base = _without_search(spec)
    for key, distribution in search.space.items():
        where = f"search.space.{key_text(key)}"
        check_swept_key(where, key, own)
        (kind, values), = distribution.items()
        for value in values:
            _check_searched_value(base, where, str(key), kind, value)
    metric = search.metric or _default_search_metric(spec)
    if not own and metric not in _trainer_metrics(spec):
        raise SpecError("search.metric", f"{brief(metric)} is not logged by the built-in trainer; use one of "
                                         f"{', '.join(_trainer_metrics(spec))}")
    object.__setattr__(search, "metric", metric)
    object.__setattr__(search, "mode", search.mode or default_mode(metric))
    if search.prune is not None and not own and search.prune.min_epochs >= spec.train.epochs:
        raise SpecError("search.prune.min_epochs", f"{search.prune.min_epochs} is not below train.epochs "
                                                   f"({spec.train.epochs}), so no trial could be pruned; set "
                                                   f"min_epochs below {spec.train.epochs}, or prune: null")


def _trainer_metrics(spec: "Spec") -> tuple:
    extra = ("val_acc_ema", "val_loss_ema") if spec.train.ema_decay is not None else ()
    return TRAINER_METRICS + extra + (("val_acc_tta",) if spec.data.tta == "flip" else ())


def _default_search_metric(spec: "Spec") -> str:
    """val_acc for the built-in trainer; for your own code the first metric of
    entrypoint.metrics as the report would rank by it; none known otherwise (the names of
    a metrics file or clusterjob.log come as the code runs)."""
    if spec.entrypoint is None:
        return "val_acc"
    from clusterjob.core.metrics import default_metric  # numpy with it: only for a search of your own code

    if spec.entrypoint.metrics:
        return default_metric(list(spec.entrypoint.metrics))
    raise SpecError("search.metric", "is null, and your code's metrics come from a metrics file or clusterjob.log, "
                                     "whose names are known only as it runs; name the metric the search ranks by, "
                                     "e.g. search.metric: val_loss")


def _check_searched_value(base: "Spec", where: str, key: str, kind: str, value: Any) -> None:
    """The spec with ``key`` set to ``value`` (a bound or a choice) must be valid."""
    try:
        _with_values(base, {key: value}, "")
    except SpecError as err:
        hint = "; use int_uniform for a whole-number key" if "whole number" in err.detail and kind in (
            "uniform", "log_uniform") else ""
        raise SpecError(where, f"{err.detail} (at {brief(value)}){hint}") from None


def _without_search(spec: "Spec") -> "Spec":
    """The spec without its search; each searched params.NAME present (None stands in
    for its value), so that the args naming it stay valid, as ``expand_sweep`` does."""
    assert spec.search is not None  # only a search's spec
    searched = {key[len("params."):]: None for key in spec.search.space if key.startswith("params.")}
    return replace(spec, search=None, params={**spec.params, **searched})


def trial_spec(spec: "Spec", number: int, values: dict) -> "Spec":
    """The spec of trial ``number``: the search's spec without its search, with the
    trial's ``values`` (dotted keys) applied and checked."""
    base = _without_search(spec)
    try:
        return _with_values(base, values, "")
    except SpecError as err:
        raise SpecError(err.key, f"{err.detail} (trial {number}: {brief(values)})") from None


# ----------------------------------------------------------------------------- paths


def check_paths(spec: Spec) -> None:
    """Raise SpecError when the run folders or the rendezvous file cannot be made here:
    ``<output.root>/<name>`` exists and is not a folder, or it (or its nearest existing
    parent) is not writable (no permission, read-only file system); the folder of a
    ``file://`` init method is missing or not writable. Creates nothing.
    """
    _check_can_make("output.root", Path(spec.output.root) / spec.name)
    if spec.dist.init_method.startswith("file://"):
        check_rendezvous_file(spec.dist.init_method)


def _check_can_make(key: str, target: Path) -> None:
    """``target`` is a writable folder, or its nearest existing parent is one."""
    target = Path(os.path.abspath(target))
    existing = next(p for p in (target, *target.parents) if _exists(p))
    if not existing.is_dir():
        raise SpecError(key, f"{str(existing)!r} is a file, not a folder, so {str(target)!r} cannot be made; "
                             f"move the file or choose another {key}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecError(key, f"{str(existing)!r} is not writable (no permission or a read-only file system), "
                             f"so {str(target)!r} cannot be made; choose a writable {key}")


def check_rendezvous_file(init_method: str) -> None:
    """SpecError unless the folder of a ``file://`` init method exists and is writable."""
    path = Path(init_method[len("file://"):])
    folder = path.parent
    if not (_exists(folder) and folder.is_dir()):
        raise SpecError("dist.init_method", f"{init_method!r}: folder {str(folder)!r} does not exist; create it "
                                            "on a file system every node shares, or use init_method: env")
    if _exists(path) and path.is_dir():
        raise SpecError("dist.init_method", f"{init_method!r} is a folder; name a file inside it, "
                                            f"e.g. {init_method.rstrip('/')}/rendezvous")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError("dist.init_method", f"{init_method!r}: folder {str(folder)!r} is not writable (no "
                                            "permission or a read-only file system); choose a writable folder")


def _exists(path: Path) -> bool:
    """True when ``path`` can be stat'ed (a folder without search permission counts as absent)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True
