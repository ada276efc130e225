"""The spec's ``logging:`` section: every logger off by default, one key each, and a
logger whose package is missing is bad input at validate and submit (exit 2, naming the
extra to install), found without importing any logger."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from clirun import base_env

from clusterjob.core.errors import SpecError
from clusterjob.spec.schema import LoggingSpec, MlflowSpec, WandbSpec, holds_text, load_spec, spec_from_dict

# The CLI in a Python where ``sys.argv[1]``'s package cannot be found (find_spec gives None).
WITHOUT = ("import sys; sys.modules[sys.argv.pop(1)] = None; from clusterjob.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


def test_every_logger_is_off_unless_asked_for():
    assert spec_from_dict({"name": "x"}).logging == LoggingSpec(tensorboard=False, mlflow=None, wandb=None)
    on = spec_from_dict({"name": "x", "logging": {"tensorboard": True, "mlflow": {}, "wandb": {"mode": "offline"}}})
    assert on.logging == LoggingSpec(True, MlflowSpec(None, None), WandbSpec(None, None, "offline")) and on.logging.any


@pytest.mark.parametrize("logging, error", [
    ({"wandb": {"mode": "local"}}, "logging.wandb.mode: 'local' is not allowed; choose one of online, offline"),
    ({"mlflow": {"experimnt": "a"}}, "logging.mlflow.experimnt: unknown key (did you mean 'experiment'?)"),
    ({"tensorboard": "yes"}, "logging.tensorboard: expected true or false, got 'yes'"),
    ({"wandb": {"project": "a/b"}}, "logging.wandb.project: 'a/b' is not allowed"),
    ({"mlflow": True}, "logging.mlflow: expected a mapping of keys, got True"),
])
def test_a_bad_logging_key_names_the_key_and_the_fix(logging, error):
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "x", "logging": logging})
    assert error in str(err.value)


def test_loggers_are_per_submission_not_swept():
    with pytest.raises(SpecError, match="sweep.logging.tensorboard: name, resources, output, entrypoint and logging"):
        spec_from_dict({"name": "x", "sweep": {"logging.tensorboard": [True, False]}})


def test_set_turns_a_logger_on_and_keeps_a_uri_as_typed(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\n")
    spec = load_spec(path, ["logging.mlflow.tracking_uri=file:./runs", "logging.wandb.mode=offline"])
    assert spec.logging.mlflow == MlflowSpec("file:./runs", None) and spec.logging.wandb.mode == "offline"
    assert holds_text("logging.mlflow.tracking_uri") and holds_text("logging.wandb.project")


@pytest.mark.parametrize("key, logging", [
    ("wandb", {"wandb": {"mode": "offline"}}),
    ("mlflow", {"mlflow": {}}),
    ("tensorboard", {"tensorboard": True}),
])
@pytest.mark.parametrize("command", ["validate", "submit"])
def test_a_missing_logger_package_exits_2_naming_the_extra_and_writes_nothing(tmp_path, key, logging, command):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "output": {"root": str(tmp_path / "results")}, "logging": logging}))
    extra = ["--executor", "local"] if command == "submit" else []
    done = subprocess.run([sys.executable, "-c", WITHOUT, key, command, str(spec), *extra], cwd=tmp_path,
                          env=base_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob: error: logging.{key}: asks for {key}, which is not installed")
    assert f'pip install "clusterjob[{key}]"' in line
    assert not (tmp_path / "results").exists()


def test_validation_imports_no_logger():
    code = ("import sys; from clusterjob.spec.schema import spec_from_dict; "
            "spec_from_dict({'name': 'x', 'logging': {'tensorboard': True, 'mlflow': {}, 'wandb': {}}}); "
            "print(sorted(m for m in ('tensorboard', 'mlflow', 'wandb') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
