"""The commands on a search as a whole (docs/design.md, "Search"): ``status`` of its
folder (a summary of its trials above their table), ``cancel`` of its folder (every slot
stops; no trial is taken after it) and ``resume`` of its folder (the trials that did not
end go on from their checkpoints, then the slots take new ones; ``--set
search.trials=N`` raises the count). ``submit`` of a search is clusterjob.launch.submit's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from clusterjob.core import claim, runstate, units
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.files import now_iso
from clusterjob.core.runstate import STATUSES, UNKNOWN
from clusterjob.launch import executor
from clusterjob.search import record as searchmod
from clusterjob.search import trials as trialmod
from clusterjob.spec.schema import check_paths, load_spec
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
    from clusterjob.launch import searchslots

    record, _ = searchmod.read(folder)
    owner = executor.get(record.executor) if record.executor else None
    if owner is None:
        raise BadInput(f"{folder}: its search.json names no executor this clusterjob has; stop its processes by hand")
    slots = searchslots.of(owner)
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
    from clusterjob.launch import searchslots

    trials = _trials_override(overrides)
    record, _ = searchmod.read(folder)
    slots = searchslots.of(executor.choose(record.executor or "local"))
    spec = load_spec(folder / trialmod.SPEC_FILE)
    check_paths(spec)
    with claim.claimed(folder, "clusterjob resume"):
        live = slots.live(folder, record)
        if live:
            raise BadInput(f"{folder} still runs ({live}); `clusterjob cancel {folder}` first")
        _check_unfinished(folder, trials)
        reopened = trialmod.reopen(folder, trials)
        spec = load_spec(folder / trialmod.SPEC_FILE)
        slots.check(spec, preflight=False)
        print(f"resuming search {folder}: {len(reopened)} trial(s) go on from their checkpoints")
        lines = slots.start(spec, folder, follow=wait)
        for line in lines:
            print(line)
        if not wait:
            return 0
        from clusterjob.launch.submit import wait_search

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
