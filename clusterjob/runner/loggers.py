"""The loggers a spec's ``logging:`` asks for: TensorBoard, MLflow and W&B, one small
class each (docs/design.md, "Metrics and loggers").

Each makes its own run once and keeps its identity in run.json (the TensorBoard folder,
the MLflow run id, the W&B run id), so a requeued or resumed run continues that run
rather than starting a second one; a restart from scratch (``fresh``) replaces it, as
metrics.jsonl is rewritten. The logger run is named after the run id, its config holds
the resolved spec and the params, and a sweep's runs share one experiment (or project)
and are grouped by their sweep. What to send is the courier's business
(clusterjob.runner.sinks); a logger opens its run, says what that run holds (read back
from the tool itself, each metric's highest step), says how it names a metric, sends and
closes. Each imports its library when it opens, never before: a spec that does not ask
for it never loads it.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import string
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Protocol

from clusterjob.core import runstate
from clusterjob.core.files import is_number, loads
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir, sweep_of
from clusterjob.spec.schema import MlflowSpec, Spec, WandbSpec, dump_spec, spec_to_dict

MLFLOW_STATUS = {runstate.COMPLETED: "FINISHED", runstate.FAILED: "FAILED"}  # any other end (a stop) is KILLED
MAX_PARAM_CHARS = 500  # what every MLflow version takes as a param value
MAX_KEY_CHARS = 250  # what every MLflow store takes as a metric or param name
MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit
SYSTEM_AXIS = "system_s"  # W&B's x axis of the system metrics: seconds since the run started


@dataclass(frozen=True)
class Target:
    """What every logger knows of the run it logs: the folder and its record, the
    resolved spec, and the name of the position its records are at ("epoch" for the
    built-in trainer, "step" for your own code)."""

    run: RunDir
    info: RunRecord
    spec: Spec
    axis: str

    @property
    def group(self) -> Optional[str]:
        """The sweep this run belongs to, if any: its runs are grouped by it."""
        return sweep_of(self.run.run_id, self.spec.name)

    @property
    def params(self) -> dict:
        return self.info.params or {}


class Logger(Protocol):
    """One logger: ``open`` makes or continues its run, ``held`` says what that run holds,
    ``key`` names a metric as the tool takes it, ``send`` one record's values (by those
    names) at one step, ``close`` ends the run's session."""

    name: str  # its key under logging: in the spec
    whole_steps: bool  # it takes whole steps only (below 2**63)
    reserved: tuple  # names it keeps for itself: no metric may take them
    naming: str  # how it takes names, for the warning about a name it does not take as is

    def open(self, fresh: bool) -> None:
        """Make its run, or continue the one run.json names (unless ``fresh``)."""

    def held(self) -> dict:
        """{metric name as the tool holds it: its highest step}, read from the tool
        (a new run: {})."""

    def key(self, name: str) -> str:
        """``name`` as the tool takes it; "" when nothing of it is left."""

    def send(self, step: float, values: dict) -> None: ...

    def send_system(self, step: float, values: dict) -> None:
        """System metrics (the GPUs' samples) at ``step``, the whole seconds since the run started."""

    def close(self, status: str) -> None: ...


def for_spec(target: Target) -> list[Logger]:
    """The loggers the spec asks for, in the order they are sent to."""
    logging = target.spec.logging
    found: list[Logger] = [TensorBoard(target)] if logging.tensorboard else []
    if logging.mlflow is not None:
        found.append(Mlflow(target, logging.mlflow))
    if logging.wandb is not None:
        found.append(Wandb(target, logging.wandb))
    return found


def flat(value: Any, prefix: str = "") -> dict:
    """A nested mapping as {dotted key: value} (lists stay values)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict = {}
    for key, inner in value.items():
        out.update(flat(inner, f"{prefix}{key}" if not prefix else f"{prefix}.{key}"))
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def highest(items: Iterable[tuple], held: Optional[dict] = None) -> dict:
    """{name: its highest step} of (name, step) pairs."""
    held = {} if held is None else held
    for name, step in items:
        if step > held.get(name, -math.inf):
            held[name] = step
    return held


# ----------------------------------------------------------------------------- TensorBoard

FLUSH_S = 1.0  # TensorBoard's writer hands its events to the file this often (a live view)


class TensorBoard:
    """Event files under ``<run>/tensorboard/``, written with TensorBoard's own writer
    (no torch, no TensorFlow). The spec goes in as text and the params as hparams when
    the folder is made; a restart from scratch empties the folder."""

    name, whole_steps, reserved = "tensorboard", True, ()
    naming = "TensorBoard takes any name but an empty one"

    def __init__(self, target: Target):
        self.target, self.writer = target, None

    def open(self, fresh: bool) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        folder = self.target.run.tensorboard
        continues = not fresh and self.target.info.tensorboard_dir is not None and folder.is_dir()
        if not continues:
            shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(exist_ok=True)
        self.writer = EventFileWriter(str(folder), flush_secs=FLUSH_S)
        if not continues:
            self._config()
            self.target.run.update(tensorboard_dir=str(folder.resolve()))

    def held(self) -> dict:
        """Each scalar's highest step in the event files, read with TensorBoard's own
        reader (a record cut short by a kill ends its file's reading: it was not written)."""
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event

        held: dict = {}
        for path in sorted(self.target.run.tensorboard.glob("*tfevents*")):
            events = map(Event.FromString, RawEventFileLoader(str(path)).Load())
            highest(((v.tag, event.step) for event in events for v in event.summary.value
                     if v.HasField("simple_value")), held)
        return held

    def key(self, name: str) -> str:
        return name

    def _config(self) -> None:
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb
        from tensorboard.plugins.text.summary_v2 import text_pb

        spec = "".join(f"    {line}\n" for line in dump_spec(self.target.spec).splitlines())  # a code block
        self._event(0, text_pb("spec", spec))
        if self.target.params:
            self._event(0, hparams_pb({key: value if isinstance(value, (str, bool, int, float)) else _text(value)
                                       for key, value in self.target.params.items()}))

    def send(self, step: float, values: dict) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event(int(step), Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()]))

    send_system = send  # a scalar at the seconds since the run started

    def _event(self, step: int, summary: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        assert self.writer is not None  # opened before any event
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()


# ----------------------------------------------------------------------------- MLflow


DEFAULT_STORE = "file:./mlruns"  # a store mlflow-skinny can write; MLflow's own default needs the full package


def tracking_uri(given: Optional[str], submit_dir: str) -> str:
    """The spec's tracking URI (else MLFLOW_TRACKING_URI, else ./mlruns) with a relative
    file store (``file:./mlruns``, ``mlruns``) made absolute under the folder `submit` ran
    in, where the user expects it."""
    given = given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_STORE
    path = given[len("file:"):] if given.startswith("file:") and not given.startswith("file://") else None
    if path is None and not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", given):
        path = given  # a plain folder
    if path is None:
        return given
    return Path(submit_dir, os.path.expanduser(path)).resolve().as_uri()


def mlflow_key(name: str) -> str:
    """``name`` as MLflow takes a metric or param name: letters, digits, ``_ - . : /``
    and spaces (others become ``_``), at most 250 characters, and, as MLflow treats a
    name as a path, no empty, ``.`` or ``..`` part between slashes and no ``..`` at the
    start; "" when nothing is left."""
    key = "/".join(part for part in re.sub(r"[^\w\-. :/]", "_", name)[:MAX_KEY_CHARS].split("/")
                   if part not in ("", ".", ".."))
    return ("_" + key)[:MAX_KEY_CHARS] if key.startswith("..") else key


class Mlflow:
    """One MLflow run per run, through MlflowClient (never the global active run, which
    your own code may use), named after the run id, in the spec's experiment. Params:
    the resolved spec's keys; tags: the run id, its folder and its sweep."""

    name, whole_steps, reserved = "mlflow", True, ()
    naming = ("MLflow takes letters, digits, _ - . : / and spaces, at most 250 characters, and no empty, '.' or "
              "'..' part between slashes")

    def __init__(self, target: Target, spec: MlflowSpec):
        self.target, self.spec = target, spec
        self.client: Any = None
        self.run_id: Optional[str] = None

    def open(self, fresh: bool) -> None:
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(self.spec.tracking_uri, self.target.info.submit_dir or os.getcwd())
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the spec asks for a file store by name
        self.client = MlflowClient(tracking_uri=uri)
        info = self.target.info
        old = info.mlflow_run_id if info.mlflow_tracking_uri == self.client.tracking_uri else None
        if old is not None and not fresh and self._active(old):
            self.client.update_run(old, status="RUNNING")
            self.run_id = old
            return
        if old is not None:
            self._delete(old)  # a restart from scratch: its metrics start again
        self.run_id = self._create()

    def held(self) -> dict:
        """Each metric's highest step in the run's metric history (a store answers once
        it stored a call, so this is all it was sent)."""
        names = self.client.get_run(self.run_id).data.metrics
        return highest((name, metric.step) for name in names
                       for metric in self.client.get_metric_history(self.run_id, name))

    def key(self, name: str) -> str:
        return mlflow_key(name)

    def _active(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException:  # deleted from the store meanwhile
            return False

    def _delete(self, run_id: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.delete_run(run_id)
        except MlflowException:
            pass

    def _create(self) -> str:
        target, spec = self.target, self.target.spec
        tags = {"clusterjob.run_id": target.run.run_id, "clusterjob.run_dir": str(target.run.path.resolve()),
                **({"clusterjob.sweep": target.group} if target.group else {})}
        experiment = self._experiment(self.spec.experiment or spec.name)
        run_id = self.client.create_run(experiment, run_name=target.run.run_id, tags=tags).info.run_id
        target.run.update(mlflow_tracking_uri=self.client.tracking_uri, mlflow_experiment_id=experiment,
                          mlflow_run_id=run_id)  # at once: a job killed now must find it, not make a second
        self._params(run_id)
        self.client.log_text(run_id, dump_spec(spec), "spec.yaml")
        return run_id

    def _experiment(self, name: str) -> str:
        """The experiment's id, made if missing (a sweep's runs may race to make it)."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run of the sweep made it first
            return self.client.get_experiment_by_name(name).experiment_id

    def _params(self, run_id: str) -> None:
        from mlflow.entities import Param

        keys: dict = {}
        for key, value in {**flat(spec_to_dict(self.target.spec)), **self.target.params}.items():
            keys.setdefault(mlflow_key(key), value)  # the first of the names that MLflow takes alike
        params = [Param(key, _text(value)[:MAX_PARAM_CHARS]) for key, value in keys.items() if key]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per call
            self.client.log_batch(run_id, params=params[start:start + 100])

    def send(self, step: float, values: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        found = [Metric(k, v, now, int(step)) for k, v in values.items()]
        for start in range(0, len(found), MAX_METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=found[start:start + MAX_METRICS_PER_CALL])

    send_system = send  # a metric at the seconds since the run started

    def close(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(status, "KILLED"))


# ----------------------------------------------------------------------------- Weights & Biases


def new_wandb_id() -> str:
    """A run id as W&B makes them: 8 lowercase letters and digits."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class Wandb:
    """One W&B run per run (``id`` kept in run.json, resumed with ``resume="allow"``),
    named after the run id, grouped by its sweep; its x axis is the record's position
    (``define_metric``), so each metric keeps its own steps and W&B's own step only counts
    calls; the system metrics have their own axis, ``system_s``, each by its name. Offline
    it writes under ``<run>/wandb/`` (a folder per session, one run id: ``wandb sync --id
    ID <run>/wandb/offline-run-*`` uploads them as one run)."""

    name, whole_steps = "wandb", False
    naming = "W&B keeps names that begin with _ for itself, and the x axis"

    def __init__(self, target: Target, spec: WandbSpec):
        self.target, self.spec = target, spec
        self.reserved = (target.axis, SYSTEM_AXIS)
        self.handle: Any = None
        self._held: dict = {}
        self._continues = False
        self._system: set = set()  # the system metrics given their axis in this session

    def open(self, fresh: bool) -> None:
        import wandb

        run_id = self.target.info.wandb_run_id
        if run_id is not None and fresh:
            self._forget(run_id)
        self._continues = run_id is not None and not fresh
        if run_id is None or fresh:  # recorded before the run is made: a job killed while W&B starts makes no second
            run_id = new_wandb_id()
            self.target.run.update(wandb_run_id=run_id, wandb_url=None)
        elif self.spec.mode == "offline":
            self._held = offline_held(self.target.run.wandb, run_id, self.target.axis)  # before this session's folder
        # A W&B process handed down from the shell that submitted (WANDB_SERVICE) would outlive a killed rank,
        # keep its run open and write on: the rank's W&B process is its own, and dies with it.
        os.environ.pop("WANDB_SERVICE", None)
        self.handle = wandb.init(
            project=self.spec.project or self.target.spec.name, entity=self.spec.entity, id=run_id,
            name=self.target.run.run_id, group=self.target.group, resume="allow", mode=self.spec.mode,
            dir=str(self.target.run.path),
            config={"params": self.target.params, "spec": spec_to_dict(self.target.spec)},
            settings=wandb.Settings(console="off", quiet=True))  # console off: the run's logs/ keep the output
        self.handle.define_metric(self.target.axis)
        self.handle.define_metric(SYSTEM_AXIS)
        self.handle.define_metric("*", step_metric=self.target.axis)
        if self.spec.mode == "online" and self.handle.url != self.target.info.wandb_url:
            self.target.run.update(wandb_url=self.handle.url)

    def held(self) -> dict:
        """Offline: the history in the run's own files (read as it opened); online: the
        history W&B's server holds."""
        if self.spec.mode == "offline" or not self._continues:
            return self._held
        import wandb

        found = wandb.Api(timeout=60).run(f"{self.handle.entity}/{self.handle.project}/{self.handle.id}")
        return history_held(found.scan_history(page_size=1000), self.target.axis)

    def key(self, name: str) -> str:
        return name.lstrip("_")

    def _forget(self, run_id: str) -> None:
        """A restart from scratch: the old run's offline folders go (an online run stays in
        its project; the new run has the same name)."""
        for folder in self.target.run.wandb.glob(f"offline-run-*-{run_id}"):
            shutil.rmtree(folder, ignore_errors=True)

    def send(self, step: float, values: dict) -> None:
        self.handle.log({self.target.axis: step, **values})

    def send_system(self, step: float, values: dict) -> None:
        # Each system metric is put on its own axis by name, before its first value: W&B
        # picks any of the globs a name matches ("system/*" and "*" alike), not the first.
        for name in values.keys() - self._system:
            self.handle.define_metric(name, step_metric=SYSTEM_AXIS)
        self._system.update(values)
        self.handle.log({SYSTEM_AXIS: step, **values})

    def close(self, status: str) -> None:
        if self.handle is not None:
            self.handle.finish(exit_code=1 if status == runstate.FAILED else 0)


QUIET_S = 2.0  # a session's W&B writer outlives its killed rank by a moment: files left alone this long are done
QUIET_TRIES = 15  # files still written after this many quiet periods: someone else writes them


def offline_held(folder: Path, run_id: str, axis: str) -> dict:
    """What W&B run ``run_id`` holds in its offline sessions' files under ``folder``,
    read with W&B's own reader of its transaction log (``wandb-core leet inspect``; a
    record cut short by a kill is not read), once no writer of an earlier session still
    writes them."""
    files = sorted(folder.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    _wait_quiet(files)
    held: dict = {}
    for path in files:
        history_held(_history(path), axis, held)
    return held


def history_held(items: Iterable[dict], axis: str, held: Optional[dict] = None) -> dict:
    """{metric: its highest position} of W&B history rows (W&B's own keys, _step and the
    like, left out)."""
    return highest(((name, item[axis]) for item in items if is_number(item.get(axis))
                    for name in item if name != axis and not name.startswith("_")), held)


def _wait_quiet(files: list) -> None:
    """Until no file of ``files`` changed for QUIET_S (the files of a killed session's W&B
    writer are then complete)."""
    def state() -> list:
        return [(p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()]

    if not files:
        return
    before = state()
    for _ in range(QUIET_TRIES):
        time.sleep(QUIET_S)
        if (now := state()) == before:
            return
        before = now
    raise RuntimeError(f"the W&B files of an earlier session ({files[-1].parent}) are still being written; what "
                       "this run holds is read at the next start")


def _history(path: Path) -> Iterator[dict]:
    """The history rows of one .wandb file."""
    from wandb.util import get_core_path

    command = [get_core_path(), "leet", "inspect", "--no-observability", "--json", "--run-file", str(path),
               str(path.parent.parent)]
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL, text=True) as reader:
        assert reader.stdout is not None  # piped
        for line in reader.stdout:
            if '"history"' in line:
                record = loads(line)
                item = record.get("history", {}).get("item") if isinstance(record, dict) else None
                if isinstance(item, dict):
                    yield item
        if reader.wait() != 0:
            errors.seek(0)
            raise RuntimeError(f"W&B's reader could not read {path}: {' '.join(errors.read(2000).split())[:300]}")
