"""The commands on a search as a whole (docs/design.md, "Search"): ``status`` of its
folder (a summary of its trials above their table), ``cancel`` of its folder (every slot
stops; no trial is taken after it) and ``resume`` of its folder (the trials that did not
end go on from their checkpoints, then the slots take new ones; ``--set
search.trials=N`` raises the count) and ``submit`` of a search (its folder, study and
slots, followed with ``--wait``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core import claim, runstate, units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.files import now_iso
from clusterjob.core.record import RunRecord
from clusterjob.core.rundir import RunDir
from clusterjob.core.runstate import STATUSES, UNKNOWN
from clusterjob.launch import executor
from clusterjob.launch import submit as submitting
from clusterjob.launch.executor import Watch
from clusterjob.launch.progress import LiveLine
from clusterjob.search import record as searchmod
from clusterjob.search import slotruns
from clusterjob.search import slots as slotsmod
from clusterjob.search import trials as trialmod
from clusterjob.search.slots import Slots
from clusterjob.spec import envvars
from clusterjob.spec.schema import Spec, check_paths, load_spec
from clusterjob.spec.yamlfile import override_value

COUNTED = (runstate.COMPLETED, runstate.RUNNING, runstate.PRUNED, runstate.FAILED, runstate.CANCELLED)


def summary(folder: Path) -> list[str]:
    """``search 2026...: 12 of 12 trials taken: 5 completed, 7 pruned`` and the best
    trial so far with its values; reads only."""
    record, _ = searchmod.read(folder)
    runs = trialmod.trial_runs(folder)
    infos = [view.record for view in executor.views(runs)]  # as the table below shows them
    statuses = [str(info.status or UNKNOWN) for info in infos]
    order = [*COUNTED, *(s for s in (*STATUSES, UNKNOWN) if s not in COUNTED), *sorted(set(statuses))]
    said = ", ".join(f"{statuses.count(state)} {escape(state)}" for state in dict.fromkeys(order)
                     if state in statuses)
    lines = [f"search {record.id}: {len(infos)} of {record.trials} trial(s) taken ({said or 'none yet'}); "
             f"{record.describe()}"]
    best = best_trial(folder)
    if best is not None:
        run, value = best
        params = ", ".join(f"{key}={_shown(val)}" for key, val in (run.read().params or {}).items())
        lines.append(f"best so far: {run.run_id} {record.metric} {units.quantity(record.metric or '', value)} "
                     f"({params})")
    return lines


def _shown(value: object) -> str:
    """A trial's value of a key as the report's tables write it: 0.00932326, sgd."""
    return escape(f"{value:g}" if isinstance(value, float) else str(value))


def best_trial(folder: Path) -> Optional[tuple]:
    """(run, value) of the completed trial best by the search's metric and mode; a pruned
    trial is never the best."""
    record, _ = searchmod.read(folder)
    scored = []
    for run in trialmod.trial_runs(folder):
        info = run.read()
        value = (info.final or {}).get(record.metric or "")
        if info.status == runstate.COMPLETED and isinstance(value, (int, float)) and not isinstance(value, bool):
            scored.append((float(value), run))
    if not scored:
        return None
    value, run = (max if record.mode != "min" else min)(scored, key=lambda item: item[0])
    return run, value


def cancel(folder: Path) -> int:
    """``clusterjob cancel SEARCH``: the request in search.json (no slot takes a trial
    after it), then every unfinished trial cancelled through the search's executor."""
    record, _ = searchmod.read(folder)
    owner = executor.get(record.executor) if record.executor else None
    if owner is None:
        raise BadInput(f"{folder}: its search.json names no executor this clusterjob has; stop its processes by hand")
    slots = slotsmod.of(owner)
    if all(run.read().status in runstate.FINAL_STATUSES for run in trialmod.trial_runs(folder)) \
            and slots.live(folder, record) is None:
        raise BadInput(f"{folder}: the search runs no trial; there is nothing to cancel")
    searchmod.update(folder, cancel_requested_at=now_iso())
    for line in slots.cancel(folder, record, wait_s=30.0):
        print(line)
    print(f"{folder}: cancelled; `clusterjob resume {folder}` continues it")
    return 0


def resume(folder: Path, wait: bool, overrides: list[str]) -> int:
    """``clusterjob resume SEARCH [--set search.trials=N]``: refused while a slot of it
    runs; else its stopped trials reopened and its slots started again."""
    trials = _trials_override(overrides)
    record, _ = searchmod.read(folder)
    slots = slotsmod.of(executor.choose(record.executor or "local"))
    spec = load_spec(folder / trialmod.SPEC_FILE)
    check_paths(spec)
    with claim.claimed(folder, "clusterjob resume"):
        live = slots.live(folder, record)
        if live:
            raise BadInput(f"{folder} still runs ({live}); `clusterjob cancel {folder}` first")
        _check_unfinished(folder, trials)
        slotruns.check_folders(folder, record.parallel or 1)  # before anything is reopened
        reopened = trialmod.reopen(folder, trials)
        spec = load_spec(folder / trialmod.SPEC_FILE)
        slots.check(spec, preflight=False)
        print(f"resuming search {folder}: {len(reopened)} trial(s) go on from their checkpoints")
        lines = slots.start(spec, folder, follow=wait)
        for line in lines:
            print(line)
        if not wait:
            return 0
        return wait_search(spec, folder, slots)


def _check_unfinished(folder: Path, trials: Optional[int]) -> None:
    """Bad input for a search with nothing left to run: every trial taken and ended, and
    no higher count asked."""
    record, _ = searchmod.read(folder)
    if trials is not None and trials != record.trials:
        return  # a new count: reopen raises it, or refuses to lower it
    runs = trialmod.trial_runs(folder)
    states = [run.read().status for run in runs]
    told = (runstate.COMPLETED, runstate.PRUNED, runstate.FAILED)  # the ends a trial tells its study
    if all(state in told for state in states) and len(runs) >= (record.trials or 0):
        said = ", ".join(f"{states.count(state)} {state}" for state in COUNTED if state in states)
        raise BadInput(f"{folder}: the search asked for {record.trials} trial(s) and took {len(runs)}; every one of "
                       f"its {len(runs)} trial(s) ended ({said or 'none taken'}); to run more, raise search.trials "
                       f"above {len(runs)}: clusterjob resume {folder} --set search.trials=N")


def _trials_override(overrides: list[str]) -> Optional[int]:
    """The one override resume takes: ``search.trials=N``."""
    trials = None
    for text in overrides:
        key, _, raw = text.partition("=")
        value = override_value(key, raw, False)
        if key != "search.trials" or not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadInput(f"--set {text}: resume of a search takes only search.trials=N (a whole number above 0)")
        trials = value
    return trials


def submit(spec: Spec, executor_name: str, wait: bool, dry_run: bool, preflight: bool,
           after: Sequence[str]) -> int:
    """A search (docs/design.md, "Search"): its folder, study and slots, which its
    executor runs (clusterjob.search.slots); its trials are made as the slots take
    them (clusterjob.search.trials)."""
    if after:
        raise BadInput("--after: a search cannot wait for other runs yet; submit it once they completed")
    check_paths(spec)
    chosen = submitting.dry_run_executor(executor_name) if dry_run else executor.choose(executor_name)
    slots = slotsmod.of(chosen)
    slots.check(spec, preflight=preflight and not dry_run)
    if dry_run:
        for line in slots.preview(spec, Path(spec.output.root) / spec.name / "<search-id>"):
            print(line)
        return 0
    envvars.hand_down_secrets(spec.env)
    folder = trialmod.make(spec, chosen.name, claim_as="clusterjob submit")
    try:
        lines = slots.start(spec, folder, follow=wait)
    except BaseException:  # nothing started (sbatch refused the array, Ctrl-C): nothing left behind
        claim.release(folder)
        trialmod.remove(folder)
        raise
    for line in [*lines, *trialmod.started_lines(folder)]:
        print(line, flush=True)
    return wait_search(spec, folder, slots) if wait else 0


def wait_search(spec: Spec, folder: Path, slots: Slots) -> int:
    """Follow a search in this process: each trial's summary as it ends, then the report
    of its trials; 0 when every trial completed or was pruned."""
    live = LiveLine(sys.stdout)

    def ended(run: RunDir, info: RunRecord) -> None:
        live.clear()
        print(submitting.summary_line(info, run))

    try:
        waited = slots.wait(spec, folder, Watch(progress=live.show, ended=ended))
    finally:
        claim.release(folder)
    runs = trialmod.trial_runs(folder)
    if runs:
        submitting.print_report(runs)
    if waited.stop_signal:
        return 128 + waited.stop_signal
    return 0 if all(run.read().status in (runstate.COMPLETED, runstate.PRUNED) for run in runs) else 1
