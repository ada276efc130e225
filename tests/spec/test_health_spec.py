"""The spec's ``health:`` section: its defaults and how they resolve, and every bad value
is bad input at validate and submit (exit 2, one line naming the key, nothing written)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from trainutil import base_env

from clusterjob.spec.schema import HealthSpec, SpecError, load_spec, spec_from_dict


def test_health_is_on_by_default_and_resolves_its_autos():
    spec = spec_from_dict({"name": "x"})
    assert spec.health == HealthSpec(1800.0, "auto", 30.0, "auto")
    assert spec.health.action(0) == "stop" and spec.health.action(2) == "retry"
    assert HealthSpec(on_stall="warn").action(2) == "warn"
    own = spec_from_dict({"name": "x", "entrypoint": {"module": "json"}})
    assert own.health.output_counts(own.entrypoint) and not spec.health.output_counts(None)  # the trainer beats
    with_metrics = spec_from_dict({"name": "x", "entrypoint": {"module": "json", "metrics": {"a": "a ([0-9]+)"}}})
    assert not with_metrics.health.output_counts(with_metrics.entrypoint)
    assert HealthSpec(output_is_progress=True).output_counts(with_metrics.entrypoint)


def test_health_null_and_stall_s_null_turn_it_off(tmp_path):
    assert spec_from_dict({"name": "x", "health": None}).health is None
    assert spec_from_dict({"name": "x", "health": {"stall_s": None}}).health.stall_s is None
    path = tmp_path / "s.yaml"
    path.write_text("name: x\n")
    assert load_spec(path, ["health.on_stall=warn", "health.stall_s=60"]).health == HealthSpec(60.0, "warn")


@pytest.mark.parametrize("health, error", [
    ({"stall_s": -1}, "health.stall_s: -1.0 is out of range; it must be >= 5"),
    ({"stall_s": 1e300}, "health.stall_s: 1e+300 is out of range; it must be < 1000000"),
    ({"stall_s": "soon"}, "health.stall_s: expected a number, got 'soon'"),
    ({"on_stall": "maybe"}, "health.on_stall: 'maybe' is not allowed; choose one of auto, retry, stop, warn"),
    ({"straggler_wait_pct": 0}, "health.straggler_wait_pct: 0.0 is out of range; it must be >= 1"),
    ({"straggler_wait_pct": 150}, "health.straggler_wait_pct: 150.0 is out of range; it must be < 100"),
    ({"output_is_progress": "sometimes"}, "health.output_is_progress: 'sometimes' is not allowed"),
    ({"stal_s": 10}, "health.stal_s: unknown key (did you mean 'stall_s'?)"),
    ({"on_stall": "retry"}, "health.on_stall: retry restarts a stalled run as a retry, but resources.max_retries is 0"),
])
def test_a_bad_health_value_names_the_key_and_the_fix(health, error):
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "x", "health": health})
    assert error in str(err.value)


@pytest.mark.parametrize("value", ["health.stall_s=-1", "health.on_stall=maybe", "health.stall_s=abc",
                                   "health.stall_s=1e999", "health.straggler_wait_pct=1000"])
@pytest.mark.parametrize("command", ["validate", "submit"])
def test_bad_health_values_exit_2_with_one_line_and_write_nothing(tmp_path, value, command):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "output": {"root": str(tmp_path / "results")}}))
    extra = ["--executor", "local"] if command == "submit" else []
    done = subprocess.run([sys.executable, "-m", "clusterjob", command, str(spec), "--set", value, *extra],
                          cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob: error: {value.split('=')[0]}: ")
    assert done.stdout == "" and not (tmp_path / "results").exists()
