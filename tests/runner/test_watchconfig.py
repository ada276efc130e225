"""What a rank tells its watcher (clusterjob.runner.watchconfig): the config goes to
JSON and back unchanged, and a value that is not allowed is refused at either end,
the error naming its field, the value and what to give."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusterjob.runner.watchconfig import WatchConfig, WatchConfigError

GOOD = WatchConfig("/results/exp/r1", rank=1, world=2, session="a1b2c3", stall_s=1800.0, action="retry",
                   output=False, straggler_pct=30.0, nccl_pipe="/results/exp/r1/logs/nccl-pipe-rank",
                   nccl_trace="/results/exp/r1/logs/nccl-trace-rank")


@pytest.mark.parametrize("config", [GOOD, replace(GOOD, stall_s=None, nccl_pipe=None, nccl_trace=None),
                                    replace(GOOD, rank=0, world=1, stall_s=5, action="warn", straggler_pct=100)])
def test_the_config_goes_to_json_and_back_unchanged(config):
    text = config.to_json()
    assert WatchConfig.of(text) == config
    assert text.startswith(f'{{"run": "{config.run}", "rank": {config.rank}, ')  # a watcher is found by these


@pytest.mark.parametrize("field, value, said", [
    ("run", "", "''"),
    ("run", None, "None"),
    ("rank", -1, "-1"),
    ("rank", 2, "2 is not a rank of world 2"),
    ("rank", True, "True"),
    ("rank", 1.0, "1.0"),
    ("world", 0, "0"),
    ("session", "", "''"),
    ("stall_s", 0, "0"),
    ("stall_s", float("inf"), "inf"),
    ("stall_s", "30", "'30'"),
    ("action", "auto", "'auto'"),
    ("action", "none", "'none'"),
    ("output", "auto", "'auto'"),
    ("output", 1, "1"),
    ("straggler_pct", 0, "0"),
    ("straggler_pct", 101.0, "101.0"),
    ("straggler_pct", None, "None"),
    ("nccl_pipe", "", "''"),
    ("nccl_trace", 3, "3"),
])
def test_each_bad_value_is_refused_naming_its_field_the_value_and_the_fix(field, value, said):
    with pytest.raises(WatchConfigError) as made:
        replace(GOOD, **{field: value})
    message = str(made.value)
    assert made.value.field == field and message.startswith(f"watch config: {field}: {said}")
    assert "; give " in message or "; use " in message  # what to give instead
    raw = json.loads(GOOD.to_json())
    raw[field] = value  # Python's JSON writes and reads infinity as Infinity
    with pytest.raises(WatchConfigError) as read:
        WatchConfig.of(json.dumps(raw))
    assert read.value.field == field


def test_a_missing_or_unknown_field_and_text_that_is_no_config_are_refused():
    raw = json.loads(GOOD.to_json())
    del raw["session"]
    with pytest.raises(WatchConfigError, match=r"^watch config: session: missing; give it") as missing:
        WatchConfig.of(json.dumps(raw))
    assert missing.value.field == "session"
    with pytest.raises(WatchConfigError, match=r"^watch config: nccl: no such field; the fields are run, rank, "):
        WatchConfig.of(json.dumps({**json.loads(GOOD.to_json()), "nccl": True}))
    with pytest.raises(WatchConfigError, match=r"^watch config: not JSON"):
        WatchConfig.of("{")
    with pytest.raises(WatchConfigError, match=r"^watch config: \[1\] is not a JSON object"):
        WatchConfig.of("[1]")
    optional = json.loads(GOOD.to_json())
    del optional["nccl_pipe"], optional["nccl_trace"]
    assert WatchConfig.of(json.dumps(optional)) == replace(GOOD, nccl_pipe=None, nccl_trace=None)
