"""The spec's ``env``: POSIX names, the launcher's and start-up variables refused in one
line, values as text, secrets written *** and never quoted in an error, sweeps of a
variable."""

from __future__ import annotations

import pytest
import yaml

from clusterjob.core.errors import SpecError
from clusterjob.spec.schema import dump_spec, expand_sweep, load_spec, spec_from_dict, spec_to_dict

SECRET = "s3cr3t-v4lue"


def spec_file(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "HF_HUB_OFFLINE", "LT_ACCELERATOR", "WANDB_MODE", "OMP_NUM_THREADS",
                                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "_private", "x1", "MLFLOW_TRACKING_URI"])
def test_a_posix_name_that_is_nobody_elses_is_taken(name):
    assert spec_from_dict({"name": "x", "env": {name: "1"}}).env == {name: "1"}


@pytest.mark.parametrize("name, says", [
    ("RANK", "the launcher's"), ("LOCAL_RANK", "the launcher's"), ("WORLD_SIZE", "the launcher's"),
    ("LOCAL_WORLD_SIZE", "the launcher's"), ("GROUP_RANK", "the launcher's"), ("NODE_RANK", "the launcher's"),
    ("GROUP_WORLD_SIZE", "the launcher's"), ("MASTER_ADDR", "the launcher's"), ("MASTER_PORT", "the launcher's"),
    ("SLURM_JOB_ID", "the launcher's"), ("SLURM_CONF", "the launcher's"), ("SRUN_CPUS_PER_TASK", "the launcher's"),
    ("TORCHELASTIC_RUN_ID", "the launcher's"), ("PMI_RANK", "the launcher's"), ("OMPI_COMM_WORLD_RANK", "the launcher's"),
    ("CLUSTERJOB_RUN_DIR", "the launcher's"), ("CLUSTERJOB_SUPERVISED", "the launcher's"),
    ("CUDA_VISIBLE_DEVICES", "resources.gpus_per_node"),
    ("LD_PRELOAD", "read as a process starts"), ("LD_LIBRARY_PATH", "read as a process starts"),
    ("PYTHONPATH", "read as a process starts"), ("PYTHONHASHSEED", "read as a process starts"),
    ("MALLOC_ARENA_MAX", "read as a process starts"), ("GLIBC_TUNABLES", "read as a process starts"),
    ("1ST", "not a variable name"), ("A-B", "not a variable name"), ("A B", "not a variable name"),
    ("", "not a variable name"), ("X" * 256, "not a variable name"),
])
def test_a_name_that_is_not_the_specs_to_set_is_one_line_naming_it(name, says):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"name": "x", "env": {name: "1"}})
    message = str(caught.value)
    assert caught.value.key.startswith("env.") and says in message and "\n" not in message, message


def test_start_up_variables_say_where_to_set_them_instead():
    with pytest.raises(SpecError, match=r"export it in the shell you submit from .* resources\.setup"):
        spec_from_dict({"name": "x", "env": {"LD_PRELOAD": "/lib/libfoo.so"}})


def test_bare_numbers_and_booleans_become_their_yaml_text_and_quotes_keep_what_was_typed(tmp_path):
    text = ("name: x\nenv: {A: 1, B: 0.5, C: true, D: yes, E: 0x10, F: 010, G: 1.10, H: 1e-3, I: '010', J: '',"
            " K: -7, L: False}\n")
    assert load_spec(spec_file(tmp_path, text)).env == {
        "A": "1", "B": "0.5", "C": "true", "D": "true", "E": "16", "F": "8", "G": "1.1", "H": "1e-3", "I": "010",
        "J": "", "K": "-7", "L": "false"}


@pytest.mark.parametrize("value, says", [
    (None, "null is no value; write '' for an empty variable"), ([1], "is a list"), ({"a": 1}, "is a mapping"),
    (float("inf"), "not a finite number"), ("a\x1bb", "control character '\\x1b'"), ("a\rb", "control character '\\r'"),
    ("x" * 10_001, "characters long"),
])
def test_a_value_that_is_not_text_is_one_line(value, says):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"name": "x", "env": {"MY_VAR": value}})
    assert caught.value.key == "env.MY_VAR" and says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [SECRET + "\x1b", [SECRET], {"k": SECRET}, SECRET * 1000])
def test_an_error_about_a_secrets_value_never_quotes_it(value):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"name": "x", "env": {"HF_TOKEN": value}})
    assert "a secret: not shown" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MY_PASSWD",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "hf_token", "Some_Key_Id"])
def test_a_secrets_value_is_written_as_stars_wherever_the_spec_is_written(name):
    spec = spec_from_dict({"name": "x", "env": {name: SECRET, "NCCL_DEBUG": "INFO"}})
    assert spec.env[name] == SECRET  # the process itself holds the value
    assert spec_to_dict(spec)["env"] == {name: "***", "NCCL_DEBUG": "INFO"}
    written = dump_spec(spec)
    assert SECRET not in written and yaml.safe_load(written)["env"] == {name: "***", "NCCL_DEBUG": "INFO"}
    assert spec_from_dict(yaml.safe_load(written)).env[name] == "***"  # read back: taken from the environment


def test_a_variable_can_be_swept_and_its_values_are_the_text_the_ranks_get():
    spec = spec_from_dict({"name": "x", "sweep": {"env.NCCL_ALGO": ["Ring", "Tree"], "env.N": [1, True]}})
    points = expand_sweep(spec)
    assert [p.run_params for p in points] == [
        {"env.NCCL_ALGO": "Ring", "env.N": "1"}, {"env.NCCL_ALGO": "Ring", "env.N": "true"},
        {"env.NCCL_ALGO": "Tree", "env.N": "1"}, {"env.NCCL_ALGO": "Tree", "env.N": "true"}]
    assert [p.spec.env for p in points][1] == {"NCCL_ALGO": "Ring", "N": "true"}
    assert "NCCL_ALGO: Tree" in dump_spec(points[3].spec)


@pytest.mark.parametrize("key, says", [
    ("env.HF_TOKEN", "is a secret"), ("env.RANK", "the launcher's"), ("env.LD_PRELOAD", "read as a process starts"),
    ("env.9", "not a variable name"),
])
def test_a_sweep_of_a_secret_or_a_refused_variable_is_one_line(key, says):
    with pytest.raises(SpecError) as caught:
        expand_sweep(spec_from_dict({"name": "x", "sweep": {key: ["a", "b"]}}))
    assert caught.value.key == f"sweep.{key}" and says in str(caught.value)


def test_set_keeps_a_variables_value_as_typed(tmp_path):
    path = spec_file(tmp_path, "name: x\nenv: {A: a}\n")
    spec = load_spec(path, ["env.B=1", "env.C=0x10", "env.D=true", "env.A=two words", "env.E="])
    assert spec.env == {"A": "two words", "B": "1", "C": "0x10", "D": "true", "E": ""}
    assert load_spec(path, ["env={X: 1}"]).env == {"X": "1"}  # the mapping as a whole, as YAML reads it


def test_env_is_a_mapping():
    with pytest.raises(SpecError, match="^env: expected a mapping"):
        spec_from_dict({"name": "x", "env": ["A=1"]})


def test_each_points_spec_text_is_the_whole_spec_written_out_whatever_it_shares():
    # plain values (name, env, params, sweep) are written once per content and reused: a
    # point's text must still be exactly its own spec's, in its own key order
    code = {"entrypoint": {"script": "tests/scripts/early_exit.py"}}
    spec = spec_from_dict({"name": "x", "env": {"HF_TOKEN": SECRET, "B": "1", "A": "2"}, "params": {"z": 1, "y": -0.0},
                           "sweep": {"env.NCCL_ALGO": ["Ring", "Tree"], "params.y": [0.0, -0.0, 0.5],
                                     "params.z": [1, 2]}, **code})
    points = expand_sweep(spec)
    again = spec_from_dict({"name": "x", "env": {"A": "2", "B": "1"}, "params": {"y": 0.0, "z": 1}, **code})
    for one in [*(p.spec for p in points), again, spec]:
        whole = yaml.dump(spec_to_dict(one), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                          default_flow_style=False)
        assert dump_spec(one) == whole and SECRET not in whole
    assert [yaml.safe_load(dump_spec(p.spec))["params"]["y"] for p in points[0:6:2]] == [0.0, -0.0, 0.5]
    assert str(yaml.safe_load(dump_spec(points[2].spec))["params"]["y"]) == "-0.0"


WORDS = ["", "yes", "null", "~", "1e3", "0x1F", "a: b", "#x", " a", "a ", "it's", "'" * 40, "\"q\"", "é" * 40,
         "a b " * 10, "x" * 40, "- a", "[1]", "{a: 1}", "*ref", "&a", "!tag", "%", "@", "`", "=", "<<", "2026-11-26"]
VALUES = [None, True, False, 0, -0, 1, -1, 10**20, 0.0, -0.0, 1e-300, float("inf"), float("-inf"), float("nan"), 0.1,
          [], [1, 2], ["yes", "no"], [None], [[1]], {}, {"a": 1}, *WORDS]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_section_written_key_by_key_is_the_same_text_as_written_whole(value):
    from clusterjob.spec import schema

    for key in ("lr", "k" * 40, "a key"):
        data = {"first": 1, key: value, "last": [0.5, "x"]}
        composed = schema._composed("train", data)
        whole = yaml.dump({"train": data}, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                          default_flow_style=False)
        assert composed in (None, whole), (composed, whole)
        assert schema._composed("train", data) == composed  # from the keys' texts kept the first time


def test_a_value_may_span_lines_and_hold_tabs():
    assert spec_from_dict({"name": "x", "env": {"KEY_PEM": "-----BEGIN-----\nabc\n-----END-----", "T": "a\tb"}}).env == \
        {"KEY_PEM": "-----BEGIN-----\nabc\n-----END-----", "T": "a\tb"}
