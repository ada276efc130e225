"""The keys an executor declares for itself (clusterjob.spec.options): the Slurm executor's
stay where specs write them (resources.partition, ...), checked like every key, read back
typed by the executor, written out in a run's resolved spec."""

from __future__ import annotations

import pytest
import yaml

from clusterjob.core.errors import SpecError
from clusterjob.spec import options
from clusterjob.spec.schema import ResourcesSpec, Spec, dump_spec, load_spec, spec_from_dict
from clusterjob.taskenv.slurm import SlurmOptions

SLURM_KEYS = ("partition", "account", "qos", "constraint", "max_requeues")


def error_of(resources: dict) -> str:
    with pytest.raises(SpecError) as info:
        spec_from_dict({"name": "t", "resources": resources})
    return str(info.value)


def test_the_slurm_keys_are_the_slurm_executors_and_no_longer_resources_own():
    assert SlurmOptions.keys() == SLURM_KEYS
    assert options.built_in() == (SlurmOptions,)
    assert not set(SLURM_KEYS) & {name for name in ResourcesSpec.__dataclass_fields__ if name != "options"}
    assert "array_parallelism" in ResourcesSpec.__dataclass_fields__  # every executor honours it: resources' own


def test_a_spec_holds_them_where_it_always_wrote_them_and_the_executor_reads_them_typed():
    spec = spec_from_dict({"name": "t", "resources": {"partition": "gpu", "max_requeues": 1, "nodes": 2}})
    assert SlurmOptions.of(spec) == SlurmOptions(partition="gpu", max_requeues=1)
    held = SlurmOptions.of(spec)
    assert (held.partition, held.max_requeues, held.qos) == ("gpu", 1, None)
    assert spec.resources.nodes == 2
    assert SlurmOptions.of(spec_from_dict({"name": "t"})) == SlurmOptions()  # the defaults
    assert Spec(name="t") == spec_from_dict({"name": "t"})  # built in code or read: the same spec
    with pytest.raises(AttributeError, match="no attribute 'partiton'"):
        spec.resources.partiton  # noqa: B018


def test_the_resolved_spec_writes_them_under_resources_and_reads_them_back(tmp_path):
    spec = spec_from_dict({"name": "t", "resources": {"account": "lab", "array_parallelism": 4}})
    written = yaml.safe_load(dump_spec(spec))["resources"]
    assert {key: written[key] for key in SLURM_KEYS} == {"partition": None, "account": "lab", "qos": None,
                                                         "constraint": None, "max_requeues": 3}
    assert written["array_parallelism"] == 4
    path = tmp_path / "spec.yaml"
    path.write_text(dump_spec(spec))
    assert load_spec(path) == spec


@pytest.mark.parametrize("resources, message", [
    ({"partition": "gpu debug"}, "resources.partition: 'gpu debug' is not allowed; use letters, digits"),
    ({"max_requeues": -1}, "resources.max_requeues: -1 is out of range; it must be >= 0"),
    ({"array_parallelism": "2"}, "resources.array_parallelism: expected a whole number, got '2' (str)"),
    ({"partiton": "gpu"}, "resources.partiton: unknown key (did you mean 'partition'?)"),
    ({"zzz": 1}, "resources.zzz: unknown key; allowed keys in resources: nodes, tasks_per_node, "),
])
def test_their_errors_are_one_line_naming_the_key_the_value_and_the_fix(resources, message):
    assert error_of(resources).startswith(message)


def test_unknown_keys_elsewhere_point_at_them():
    with pytest.raises(SpecError, match=r"^partition: unknown key \(did you mean 'resources.partition'\?\)$"):
        spec_from_dict({"name": "t", "partition": "gpu"})
    with pytest.raises(SpecError, match="^sweep.resources.qos: .* per submission"):
        spec_from_dict({"name": "t", "sweep": {"resources.qos": ["a", "b"]}})


def test_set_keeps_a_text_key_as_typed(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\n")
    spec = load_spec(path, ["resources.partition=0123", "resources.max_requeues=5"])
    assert (SlurmOptions.of(spec).partition, SlurmOptions.of(spec).max_requeues) == ("0123", 5)
