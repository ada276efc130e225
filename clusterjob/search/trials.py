"""A search's folder and its trials as run folders (docs/design.md, "Search"): what
``submit`` makes, what its slots take (each slot run's ``Feed``: clusterjob.search.localslot
and clusterjob.search.slotdriver), and what ``resume`` reopens. The commands themselves
(submit, resume, cancel, status) are clusterjob.search.commands'; how each executor runs
the slots is clusterjob.search.slots'.

A trial is an ordinary run: a folder ``<search>/<id>-NNN`` with its spec.yaml (the
search's spec without its search, the trial's values applied), run.json (its params, and
``search``: the search, its number, its slot), metrics, logs, loggers and checkpoints.
Its folder is made when a slot first takes it, after the study recorded the take, and
made again if that take was cut short: a trial is never made twice with other values.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from clusterjob.core import claim, runstate
from clusterjob.core.errors import BadInput, SpecError
from clusterjob.core.files import is_number, now_iso, write_atomic
from clusterjob.core.provenance import git_sha
from clusterjob.core.record import RunError
from clusterjob.core.rundir import RunDir, create_run_at, new_run_id
from clusterjob.search import record as searchmod
from clusterjob.search.study import ENDS, Study, Trial, create, open_study
from clusterjob.spec import envvars
from clusterjob.spec.schema import Spec, dump_spec, load_spec, trial_spec

SPEC_FILE = "spec.yaml"
MADE_FILE = ".made"  # the folders above a search's that its submit made (removed with it when nothing started)


def search_record(spec: Spec, executor: str) -> dict:
    """search.json's first fields: the spec's search as resolved, and where it runs."""
    search = spec.search
    assert search is not None  # only a search's spec
    return {"name": spec.name, "method": search.method, "trials": search.trials, "parallel": search.parallel,
            "metric": search.metric, "mode": search.mode, "seed": search.seed, "space": search.space,
            "prune": None if search.prune is None else {"method": search.prune.method,
                                                        "min_epochs": search.prune.min_epochs,
                                                        "reduction": search.prune.reduction},
            "last": spec.train.epochs if spec.entrypoint is None else None, "executor": executor,
            "submit_dir": os.getcwd(), "git_sha": git_sha(), "created_at": now_iso(), "restarts": 0}


def make(spec: Spec, executor: str, claim_as: str) -> Path:
    """The folder of a new search, ``<output.root>/<name>/<id>``: its spec.yaml,
    search.json and study; claimed by this process (``claim_as``) before anything is in
    it. Whatever stops it removes what it made."""
    stamp = new_run_id()
    folder = Path(spec.output.root) / spec.name / stamp
    missing = [str(p) for p in (folder.parent, folder.parent.parent) if not p.exists()]
    try:
        folder.mkdir(parents=True)
        (folder / MADE_FILE).write_text("".join(f"{path}\n" for path in missing))
        claim.take(folder, claim_as)
        write_atomic(folder / SPEC_FILE, dump_spec(spec))
        record = searchmod.update(folder, id=stamp, **search_record(spec, executor))
        create(folder, record)
    except BaseException as err:
        claim.release(folder)
        remove(folder)
        if isinstance(err, OSError):
            raise BadInput(f"output.root: cannot make the search's folder {str(folder)!r}: {err.strerror or err}; "
                           "choose a writable output.root") from None
        raise
    return folder


def remove(folder: Path) -> None:
    """A search's folder that nothing started from, gone, and the folders above it that
    ``make`` made for it and that hold nothing else (bad input leaves nothing on disk)."""
    try:
        above = (folder / MADE_FILE).read_text().splitlines()
    except OSError:
        above = []
    shutil.rmtree(folder, ignore_errors=True)
    for path in above:
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only an empty folder


def trial_runs(folder: "str | os.PathLike") -> list[RunDir]:
    """The trials' run folders made so far, by number."""
    record, _ = searchmod.read(folder)
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(os.fspath(folder)):
            number = searchmod.trial_number(record.id or "", str(entry.name))
            if number is not None and entry.is_dir():
                found.append((number, RunDir(Path(entry.path))))
    return [run for _, run in sorted(found, key=lambda item: item[0])]


def started_lines(folder: Path) -> list[str]:
    """What ``submit`` of a search says once it started, ``--wait`` or not (a sweep's
    ``sweep <id>: ...`` line): ``search <id>: 12 trial(s), 2 at once (random, asha
    (min_epochs 1, reduction 2), val_acc max) in <folder>`` and how to follow it."""
    record, _ = searchmod.read(folder)
    return [f"search {record.id or folder.name}: {record.trials} trial(s), {record.parallel or 1} at once "
            f"({record.describe()}) in {folder}", f"follow with: clusterjob status {folder}"]


def find(text: str, root: str = "results") -> Optional[Path]:
    """The search a command names: its folder, or its id under ``root`` (``<name>/<id>``
    or ``<id>``); None when ``text`` names none."""
    if searchmod.is_search(text):
        return Path(text)
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            candidate = Path(entry.path) / text.split("/")[-1]
            if entry.is_dir() and searchmod.is_search(candidate) and text in (candidate.name, f"{entry.name}/"
                                                                                               f"{candidate.name}"):
                return candidate
    return None


# ----------------------------------------------------------------------------- what the slots take


class Feed:
    """The trials of the search in ``folder`` as run folders, for ``slots`` slots that take
    them one at a time (a slot run's task: its supervisor on this machine, or its Slurm
    driver). ``fields`` go into each trial's run.json (its executor, the supervisor that
    runs it); with ``claim_as`` each trial is claimed by this process as it is made."""

    def __init__(self, folder: Path, slots: int, claim_as: Optional[str] = None, **fields: Any):
        self.folder, self.slots, self.claim_as, self.fields = Path(folder), slots, claim_as, fields
        self.record, _ = searchmod.read(folder)
        self.spec = load_spec(self.folder / SPEC_FILE)
        self.study: Study = open_study(self.folder, self.record)
        self.stopping = False  # the supervisor was asked to stop: nothing more is taken
        self.exhausted = False

    def cancelled(self) -> bool:
        return searchmod.read(self.folder)[0].cancel_requested_at is not None

    def take(self, slot: int) -> Optional[RunDir]:
        """The run folder of the trial slot ``slot`` runs next (one it holds and did not
        finish, or a new one); None once every trial is taken, or the search was
        cancelled. A trial whose run ended (the slot was stopped before it told the
        study) is told now, and the next one taken: no trial runs twice."""
        while not (self.stopping or self.exhausted or self.cancelled()):
            trial = self.study.take(slot, self.slots)
            if trial is None:
                self.exhausted = True
                return None
            run = self._run_of(trial, slot)
            info = run.read()
            if info.pruned is not None and info.status not in ENDS:
                info = run.update(runstate.prune())  # stopped before it recorded its end
            if info.status in ENDS:
                self.ended(run, info)
                continue
            return run
        return None

    def ended(self, run: RunDir, info: Any) -> None:
        """A trial's run ended: the study learns how, unless the run stopped to go on
        (preempted, timeout: its slot continues it) or was cancelled with the whole search
        or by a stop of the supervisor (``resume`` of the search continues it)."""
        found = info.search or {}
        number = found.get("trial") if found.get("id") == self.record.id else None
        if not isinstance(number, int) or info.status not in ENDS:
            return
        if info.status == runstate.CANCELLED and (self.stopping or self.cancelled()):
            return
        value = (info.final or {}).get(self.record.metric or "")
        self.study.finish(number, info.status, float(value) if value is not None and is_number(value) else None)

    def _run_of(self, trial: Trial, slot: int) -> RunDir:
        """The trial's run folder, made if the take that recorded it made none yet."""
        run = RunDir(self.folder / searchmod.trial_id(self.record.id or "", trial.number))
        marker = {"id": self.record.id, "trial": trial.number, "slot": slot}
        if run.exists():
            if (run.read().search or {}).get("slot") != slot:
                run.update(search=marker)
            if self.claim_as is not None:
                claim.take(run.path, self.claim_as)
            return run
        try:
            spec = trial_spec(self.spec, trial.number, trial.params)
        except SpecError as err:  # a combination the space allowed key by key, refused as a whole
            return self._refused(run, trial, marker, err)
        params = {**trial.params, **{f"params.{name}": value for name, value in spec.params.items()}}
        return create_run_at(run.path, self.spec.name, dump_spec(spec), params, self.claim_as, search=marker,
                             env=envvars.shown_env(spec.env), submit_dir=self.record.submit_dir,
                             git_sha=self.record.git_sha, **self.fields)

    def _refused(self, run: RunDir, trial: Trial, marker: dict, err: SpecError) -> RunDir:
        """A trial whose values make a spec that is bad input: failed at once, its error
        the spec's line (the search goes on with the next trial)."""
        made = create_run_at(run.path, self.spec.name, dump_spec(self.spec), dict(trial.params), self.claim_as,
                             search=marker, **self.fields)
        made.update(runstate.fail(RunError(None, f"bad input: {err}", "", now_iso())))
        return made


# ----------------------------------------------------------------------------- resume


def reopen(folder: Path, trials: Optional[int]) -> list[RunDir]:
    """Make a stopped search ready to go on: ``trials`` (``--set search.trials=N``) raised
    in its spec.yaml and search.json, its cancel request dropped, and every trial that was
    taken but did not end by itself (preempted, cancelled with the search, stopped with
    its supervisor) reopened as ``resume`` reopens a run. The reopened trials."""
    record, _ = searchmod.read(folder)
    if trials is not None:
        _raise_trials(folder, record, trials)
    searchmod.update(folder, cancel_requested_at=None, restarts=(record.restarts or 0) + 1, job=None)
    held = {t.number for t in open_study(folder, record).trials() if t.state == runstate.RUNNING}
    reopened = []
    for run in trial_runs(folder):
        info = run.read()
        number = (info.search or {}).get("trial")
        if number in held and info.status != runstate.COMPLETED and info.pruned is None:
            run.update(runstate.reopen(), restarts=(info.restarts or 0) + 1, launcher=None, cancel_requested_at=None,
                       job=None)
            reopened.append(run)
    return reopened


def _raise_trials(folder: Path, record: searchmod.SearchRecord, trials: int) -> None:
    taken = len(trial_runs(folder))
    if trials < max(taken, record.trials or 0):
        raise BadInput(f"search.trials: {trials} is fewer than the search has ({record.trials}, {taken} taken); "
                       "resume can only raise it")
    spec = load_spec(folder / SPEC_FILE, [f"search.trials={trials}"])
    write_atomic(folder / SPEC_FILE, dump_spec(spec))
    searchmod.update(folder, trials=trials)

