"""Hostile CLUSTERJOB_PARAMS and CLUSTERJOB_AFTER: ``clusterjob.params`` and
``clusterjob.after()`` give one EnvError naming the variable, what is wrong and the fix,
never a RecursionError or a traceback from inside json; unset or empty they are {} and []."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import base_env

import clusterjob
from clusterjob.core.errors import EnvError
from clusterjob.runner import api

DEEP = 100_000  # nesting levels: far past the interpreter's recursion limit
DEEP_EXEC = 20_000  # what one variable handed to a process can hold (128 KiB at most on Linux)

HOSTILE = {
    "nested lists": "[" * DEEP + "]" * DEEP,
    "nested mappings": '{"a": ' * DEEP + "1" + "}" * DEEP,
    "cut-off nesting": "[" * DEEP,
    "not JSON": "lr=0.1",
    "a list": "[1, 2]",
    "a string": '"lr"',
    "a number": "0.1",
    "null": "null",
    "an int of 5,000 digits": '{"n": ' + "7" * 5000 + "}",
    "too many characters": '{"s": "' + "x" * (api.MAX_ENV_JSON_CHARS + 1) + '"}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_params_are_one_error_naming_the_variable(monkeypatch, case):
    monkeypatch.setenv(api.PARAMS_VAR, HOSTILE[case])
    with pytest.raises(EnvError) as caught:
        clusterjob.params  # noqa: B018  (read through the package, as a script does)
    message = str(caught.value)
    assert message.startswith("CLUSTERJOB_PARAMS: ") and "\n" not in message and len(message) < 400, message
    assert "JSON such as" in message


@pytest.mark.parametrize("value, says", [
    ('{"runs": ["a"]}', "holds a mapping where a list belongs"),
    ("[" * DEEP + "]" * DEEP, "is nested too deeply"),
    ('["results/a", 3]', "CLUSTERJOB_AFTER[1]: 3 (int) is not a folder path"),
    ('["results/a", ""]', "CLUSTERJOB_AFTER[1]: '' (str) is not a folder path"),
    ('["results/a", ["nested"]]', "CLUSTERJOB_AFTER[1]: ['nested'] (list) is not a folder path"),
    ("results/a", "is not JSON"),
])
def test_hostile_after_is_one_error_naming_the_variable(monkeypatch, value, says):
    monkeypatch.setenv(api.AFTER_VAR, value)
    with pytest.raises(EnvError, match="^CLUSTERJOB_AFTER") as caught:
        clusterjob.after()
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_unset_or_empty_is_no_params_and_no_runs_and_good_values_read(monkeypatch):
    for value in (None, "", "  "):
        if value is None:
            monkeypatch.delenv(api.PARAMS_VAR, raising=False)
            monkeypatch.delenv(api.AFTER_VAR, raising=False)
        else:
            monkeypatch.setenv(api.PARAMS_VAR, value)
            monkeypatch.setenv(api.AFTER_VAR, value)
        assert clusterjob.params == {} and clusterjob.after() == []
    monkeypatch.setenv(api.PARAMS_VAR, json.dumps({"lr": 0.1, "layers": [1, {"deep": [[[[True]]]]}]}))
    monkeypatch.setenv(api.AFTER_VAR, json.dumps(["results/a/1", "/abs/b"]))
    assert clusterjob.params == {"lr": 0.1, "layers": [1, {"deep": [[[[True]]]]}]}
    assert clusterjob.after() == [Path("results/a/1"), Path("/abs/b")]


def test_in_a_process_the_error_is_the_last_line_and_no_recursion_error(tmp_path):
    """What a script sees, run by hand with a hostile variable: its own traceback ending
    in the one EnvError line, nothing from inside json."""
    script = "import clusterjob\nprint(clusterjob.after())\nprint(clusterjob.params)\n"
    for name, value in ((api.PARAMS_VAR, '{"a": ' * DEEP_EXEC), (api.AFTER_VAR, "[" * DEEP_EXEC + "]" * DEEP_EXEC)):
        env = {**base_env(), name: value}
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1 and last.startswith(f"clusterjob.core.errors.EnvError: {name}: "), done.stderr
        assert "RecursionError" not in done.stderr and "json" not in done.stderr.replace(
            "give JSON such as", ""), done.stderr
