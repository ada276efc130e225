"""Spec loading, overrides, sweeps and every class of bad input."""

import pytest

from clusterjob.core.errors import EnvError, SpecError
from clusterjob.spec.schema import (
    Spec,
    TrainSpec,
    dump_spec,
    expand_sweep,
    load_spec,
    spec_from_dict,
    spec_to_dict,
)
from clusterjob.spec.yamlfile import apply_overrides, parse_yaml
from clusterjob.taskenv.slurm import SlurmOptions


def build(**sections):
    return spec_from_dict({"name": "t", **sections})


def error_of(raw) -> str:
    with pytest.raises(SpecError) as info:
        spec_from_dict(raw)
    return str(info.value)


def test_defaults_match_the_design():
    spec = build()
    assert (spec.data.dataset, spec.data.root, spec.data.download, spec.data.num_workers) == ("cifar10", "./data", True,
                                                                                              "auto")
    assert spec.data.loader == "auto"
    assert spec.data.pin_memory == "auto" and spec.data.tta == "none" and spec.data.limit_train is None
    assert (spec.model.arch, spec.model.sync_bn) == ("resnet18", True)
    t = spec.train
    assert (t.epochs, t.batch_size, t.optimizer, t.lr, t.lr_scaling) == (30, 128, "sgd", 0.1, "linear")
    assert (t.momentum, t.nesterov, t.weight_decay, t.schedule, t.warmup_epochs) == (0.9, True, 5e-4, "cosine", 1.0)
    assert (t.label_smoothing, t.amp, t.grad_accum, t.ema_decay, t.param_groups, t.seed) == (0.0, "auto", 1, None, (), 0)
    assert (spec.dist.backend, spec.dist.init_method, spec.dist.timeout_s) == ("auto", "env", 600)
    r = spec.resources
    assert (r.nodes, r.tasks_per_node, r.gpus_per_node, r.cpus_per_task, r.mem_gb, r.time_min) == (1, 1, 0, 2, 16, 60)
    slurm = SlurmOptions.of(spec)
    assert (slurm.partition, slurm.account, slurm.qos, slurm.constraint, r.setup) == (None, None, None, None, ())
    assert (spec.checkpoint.every_epochs, spec.checkpoint.keep_last) == (1, 2)
    assert spec.sweep == {} and spec.output.root == "results"


def test_round_trip_through_yaml(tmp_path):
    spec = build(train={"lr": 0.2, "param_groups": [{"match": "fc.", "lr_mult": 10, "weight_decay": 0,
                                                      "schedule": "constant"}]},
                 resources={"setup": ["module load cuda"]}, sweep={"train.seed": [0, 1]})
    path = tmp_path / "s.yaml"
    path.write_text(dump_spec(spec))
    assert load_spec(path) == spec
    assert spec.train.param_groups[0].lr_mult == 10.0 and spec.train.param_groups[0].schedule == "constant"


def test_yaml_number_strings_are_numbers_for_float_keys():
    assert build(train={"lr": "1e-3"}).train.lr == 0.001  # YAML 1.1 reads 1e-3 as a string


def test_overrides_parse_values_as_yaml(tmp_path):
    raw = apply_overrides({"name": "t"}, ["train.lr=0.2", "train.nesterov=false", "sweep.train.seed=[1, 2]",
                                          "resources.setup=[a, b]"])
    spec = spec_from_dict(raw)
    assert spec.train.lr == 0.2 and spec.train.nesterov is False
    assert spec.sweep == {"train.seed": [1, 2]} and spec.resources.setup == ("a", "b")


def test_override_errors():
    with pytest.raises(SpecError, match="write --set key.path=value"):
        apply_overrides({"name": "t"}, ["train.lr"])
    with pytest.raises(SpecError, match="train.lrr: unknown key"):
        spec_from_dict(apply_overrides({"name": "t"}, ["train.lrr=1"]))


def test_sweep_expands_to_the_grid_in_order():
    spec = build(train={"epochs": 2}, sweep={"train.lr": [0.05, 0.1], "train.seed": [0, 1, 2]})
    points = expand_sweep(spec)
    assert [p.params for p in points][:4] == [{"train.lr": 0.05, "train.seed": 0}, {"train.lr": 0.05, "train.seed": 1},
                                              {"train.lr": 0.05, "train.seed": 2}, {"train.lr": 0.1, "train.seed": 0}]
    assert len(points) == 6 and [p.index for p in points] == list(range(6))
    assert points[4].spec.train.lr == 0.1 and points[4].spec.train.seed == 1 and points[4].spec.sweep == {}
    assert points[4].spec.train.epochs == 2


def test_no_sweep_is_one_point():
    (point,) = expand_sweep(build())
    assert point.params == {} and point.spec == build()


@pytest.mark.parametrize("raw, expected", [
    ({"name": "t", "trian": {}}, "trian: unknown key (did you mean 'train'?)"),
    ({"name": "t", "train": {"lrr": 1}}, "train.lrr: unknown key (did you mean 'lr'?)"),
    ({"name": "t", "train": {"nodes": 2}}, "train.nodes: unknown key (did you mean 'resources.nodes'?)"),
    ({"name": "t", "train": {"epochs": "ten"}}, "train.epochs: expected a whole number, got 'ten' (str)"),
    ({"name": "t", "train": {"epochs": 2.5}}, "train.epochs: expected a whole number, got 2.5 (float)"),
    ({"name": "t", "train": {"nesterov": "yes"}}, "train.nesterov: expected true or false, got 'yes'"),
    ({"name": "t", "train": {"lr": "fast"}}, "train.lr: expected a number, got 'fast'"),
    ({"name": "t", "train": "fast"}, "train: expected a mapping of keys, got 'fast'"),
    ({"name": "t", "resources": {"setup": "module load x"}}, "resources.setup: expected a list"),
    ({"name": "t", "train": {"epochs": 0}}, "train.epochs: 0 is out of range; it must be >= 1"),
    ({"name": "t", "train": {"batch_size": 0}}, "train.batch_size: 0 is out of range; it must be >= 1"),
    ({"name": "t", "resources": {"nodes": 0}}, "resources.nodes: 0 is out of range; it must be >= 1"),
    ({"name": "t", "resources": {"tasks_per_node": 0}}, "resources.tasks_per_node: 0 is out of range"),
    ({"name": "t", "train": {"lr": 0}}, "train.lr: 0.0 is out of range; it must be > 0"),
    ({"name": "t", "train": {"lr": -0.1}}, "train.lr: -0.1 is out of range; it must be > 0"),
    ({"name": "t", "data": {"dataset": "cifar100"}}, "data.dataset: 'cifar100' is not allowed; choose one of "
                                                     "cifar10, mnist, synthetic (did you mean 'cifar10'?)"),
    ({"name": "t", "model": {"arch": "resnet50"}}, "model.arch: 'resnet50' is not allowed; choose one of resnet18"),
    ({"name": "t", "train": {"optimizer": "adam"}}, "train.optimizer: 'adam' is not allowed; choose one of sgd, adamw"),
    ({"name": "t", "train": {"amp": "fp8"}}, "train.amp: 'fp8' is not allowed; choose one of auto, fp16, bf16, off"),
    ({"name": "t", "dist": {"backend": "mpi"}}, "dist.backend: 'mpi' is not allowed; choose one of auto, nccl, gloo"),
    ({"name": "t", "dist": {"init_method": "tcp://host"}}, "dist.init_method: 'tcp://host' is not allowed"),
    ({"name": "my run"}, "name: 'my run' is not allowed; use letters, digits"),
    ({"name": "a/b"}, "name: 'a/b' is not allowed"),
    ({"name": ".."}, "name: '..' is not a folder name"),
    ({"name": ".hidden"}, "name: '.hidden' starts with '.', which hides its results folder"),
    ({"name": "a" * 101}, "name: 'aaaa"),
    ({"name": "t", "train": {"lr": float("inf")}}, "train.lr: inf must be a finite number"),
    ({"name": "t", "train": {"lr": "nan"}}, "train.lr: nan must be a finite number"),
    ({"name": "t", "train": {"lr": 10**400}}, "train.lr: 1000"),
    ({"name": "t", "train": {"seed": 2**63}}, "train.seed: 9223372036854775808 is too large"),
    ({"name": "t", "dist": {"init_method": "tcp://h:0"}}, "dist.init_method: 'tcp://h:0': port 0 is out of range"),
    ({"name": "t", "dist": {"init_method": "tcp://h:65536"}}, "port 65536 is out of range; use a TCP port in 1..65535"),
    ({"name": "t", "sweep": {1: [1]}}, "sweep.1: 1 is not a spec key"),
    ({"name": "t", "sweep": {"train.lr": [0.1] * 101, "train.seed": list(range(100))}},
     "sweep: 101 (train.lr) x 100 (train.seed) = 10100 runs is more than 10000"),
    ({"name": "t", 1: 2}, "1: unknown key"),
    ({}, "name: required"),
    ({"name": "t", "sweep": {"train.lr": 0.1}}, "sweep.train.lr: 0.1 is not a list"),
    ({"name": "t", "sweep": {"train.lr": []}}, "sweep.train.lr: [] gives no runs; give at least one value to "
                                               "try, e.g. train.lr: [0.1]"),
    ({"name": "t", "sweep": {"train.lrr": [0.1]}}, "sweep.train.lrr: 'train.lrr' is not a spec key (did you mean 'train.lr'?)"),
    ({"name": "t", "sweep": {"train": [1]}}, "sweep.train: 'train' is not a spec key"),
    ({"name": "t", "sweep": {"resources.nodes": [1, 2]}}, "sweep.resources.nodes: name, resources, output, entrypoint and logging are per submission"),
    ({"name": "t", "resources": {"gpus_per_node": 2, "tasks_per_node": 4}},
     "resources.tasks_per_node: 4 tasks per node but gpus_per_node is 2; run one task per GPU"),
    ({"name": "t", "resources": {"partition": "gpu debug"}}, "resources.partition: 'gpu debug' is not allowed"),
    ({"name": "t", "resources": {"account": "a;rm -rf /"}}, "resources.account: 'a;rm -rf /' is not allowed"),
    ({"name": "t", "resources": {"qos": "$(id)"}}, "resources.qos: '$(id)' is not allowed"),
    ({"name": "t", "resources": {"constraint": "a100 `x`"}}, "resources.constraint: 'a100 `x`' is not allowed"),
    ({"name": "t", "dist": {"backend": "nccl"}}, "dist.backend: nccl needs GPUs but resources.gpus_per_node is 0"),
    ({"name": "t", "train": {"param_groups": [{"match": "fc.", "lr_multt": 2}]}},
     "train.param_groups[0].lr_multt: unknown key (did you mean 'lr_mult'?)"),
    ({"name": "t", "train": {"param_groups": [{"match": "fc.", "schedule": "linear"}]}},
     "train.param_groups[0].schedule: 'linear' is not allowed"),
    ({"name": "t", "train": {"warmup_epochs": 5, "epochs": 2}}, "train.warmup_epochs: 5.0 is longer than epochs"),
    ({"name": "t", "data": {"pin_memory": "yes"}}, "data.pin_memory: 'yes' is not allowed; choose one of auto, true, false"),
])
def test_bad_input_names_key_value_and_fix(raw, expected):
    assert expected in error_of(raw)


def test_sweep_point_values_are_validated():
    spec = build(sweep={"train.lr": [0.1, -1]})
    with pytest.raises(SpecError, match=r"sweep.train.lr: -1.0 is out of range; it must be > 0 \(sweep point 1: "):
        expand_sweep(spec)


def test_a_cross_field_error_of_a_point_names_its_sweep_values():
    spec = build(train={"epochs": 4, "warmup_epochs": 3}, sweep={"train.seed": [0, 1], "train.epochs": [5, 2]})
    with pytest.raises(SpecError) as info:
        expand_sweep(spec)
    assert str(info.value) == ("train.warmup_epochs: 3.0 is longer than epochs (2); set warmup_epochs <= epochs "
                               "(sweep point 1: {'train.seed': 0, 'train.epochs': 2})")


def test_sweep_points_equal_specs_built_from_scratch():
    sweep = {"train.lr": [0.05, 0.2], "data.limit_train": [None, 64], "model.arch": ["mlp"],
             "train.param_groups": [[], [{"match": "fc.", "lr_mult": 10}]]}
    spec = build(train={"epochs": 3}, sweep=sweep)
    points = expand_sweep(spec)
    assert len(points) == 8
    for point in points:
        raw = spec_to_dict(spec)
        raw["sweep"] = {}
        for key, value in point.params.items():
            section, name = key.split(".")
            raw[section][name] = value
        assert point.spec == spec_from_dict(raw), point.params
    assert points[7].spec.train.param_groups[0].lr_mult == 10.0 and points[7].spec.data.limit_train == 64


def test_yaml_aliases_and_merge_keys_work_in_a_normal_spec(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\ntrain:\n  <<: {lr: 0.2, epochs: 3}\n  epochs: 4\n"
                    "sweep:\n  train.seed: &seeds [1, 2]\n  data.num_workers: *seeds\n")
    spec = load_spec(path)
    assert (spec.train.lr, spec.train.epochs) == (0.2, 4)
    assert spec.sweep == {"train.seed": [1, 2], "data.num_workers": [1, 2]}
    assert len(expand_sweep(spec)) == 4


def test_home_is_expanded_in_roots(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = build(output={"root": "~/results"}, data={"root": "~"})
    assert (spec.output.root, spec.data.root) == (f"{tmp_path}/results", str(tmp_path))
    assert load_spec_text(tmp_path, dump_spec(spec)) == spec  # the run's spec.yaml holds the expanded path
    with pytest.raises(SpecError, match=r"output.root: '~nosuchuser1/x' starts with ~nosuchuser1, but there is no"):
        build(output={"root": "~nosuchuser1/x"})


def load_spec_text(folder, text):
    path = folder / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


@pytest.mark.parametrize("dataset, data, train, resources, key", [
    ("synthetic", {"limit_train": 255}, {"batch_size": 128}, {"tasks_per_node": 2}, "data.limit_train"),
    ("synthetic", {}, {"batch_size": 5001}, {"tasks_per_node": 2}, "train.batch_size"),
    ("cifar10", {"limit_train": 40000}, {"batch_size": 10001}, {"nodes": 2, "tasks_per_node": 2}, "data.limit_train"),
    ("cifar10", {"limit_train": 90000}, {"batch_size": 12501}, {"nodes": 2, "tasks_per_node": 2}, "train.batch_size"),
    ("mnist", {}, {"batch_size": 30001}, {"tasks_per_node": 2}, "train.batch_size"),
])
def test_drop_last_needs_a_batch_on_every_rank(dataset, data, train, resources, key):
    raw = {"name": "t", "data": {"dataset": dataset, "drop_last": True, **data}, "train": train,
           "resources": resources}
    assert error_of(raw).startswith(f"{key}: with drop_last,")
    raw["data"]["drop_last"] = False
    assert spec_from_dict(raw).data.drop_last is False


def test_drop_last_at_the_boundary_is_fine():
    spec = build(data={"dataset": "synthetic", "limit_train": 256, "drop_last": True}, train={"batch_size": 128},
                 resources={"tasks_per_node": 2})
    assert spec.world_size * spec.train.batch_size == spec.data.limit_train
    cifar = build(data={"limit_train": 10**6, "drop_last": True}, train={"batch_size": 25000},
                  resources={"tasks_per_node": 2})
    assert cifar.data.limit_train == 10**6  # cut to the 50,000 of the split: exactly one batch per rank


@pytest.mark.parametrize("item", [".train=1", "train..lr=1", "train.=1", "sweep.=1", "sweep.train..lr=[1]", "..=2"])
def test_override_with_an_empty_part_names_the_key_as_written(item):
    with pytest.raises(SpecError) as info:
        apply_overrides({"name": "t"}, [item])
    key = item.partition("=")[0]
    assert str(info.value).startswith(f"{key}: --set {item!r}: the dotted path has an empty part")


@pytest.mark.parametrize("key, value, shown", [
    ("resources.setup", ["module load x", "echo a\nrm -rf ~"], "resources.setup[1]: 'echo a\\nrm -rf ~'"),
    ("output.root", "a\rb", "output.root: 'a\\rb'"),
    ("data.root", "/data\x00", "data.root: '/data\\x00'"),
    ("dist.init_method", "file:///tmp/a\x07b", "dist.init_method: 'file:///tmp/a\\x07b'"),
    ("train.param_groups", [{"match": "fc\u2028"}], "train.param_groups[0].match: 'fc\\u2028'"),
    ("name", "a\tb", "name: 'a\\tb'"),
])
def test_control_characters_are_refused_in_every_string(key, value, shown):
    section, _, name = key.rpartition(".")
    raw = {"name": "t", section: {name: value}} if section else {"name": value}
    message = error_of(raw)
    assert message.startswith(shown) and "contains the control character" in message


def test_yaml_syntax_error_names_the_line():
    with pytest.raises(SpecError, match="f.yaml line 2, column 3: YAML syntax error"):
        parse_yaml("a: 1\n b: 2\n", "f.yaml")


def test_duplicate_yaml_keys_are_rejected():
    with pytest.raises(SpecError, match="line 3.*'lr' is written twice"):
        parse_yaml("train:\n  lr: 1\n  lr: 2\n", "f.yaml")


def test_missing_and_non_mapping_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_spec(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpecError, match="a spec is a YAML mapping"):
        load_spec(tmp_path / "list.yaml")


def test_sections_built_in_code_are_validated_too():
    with pytest.raises(SpecError, match="lr: -1 is out of range"):
        TrainSpec(lr=-1)
    assert Spec(name="x").world_size == 1
    assert spec_to_dict(build())["train"]["param_groups"] == []


def test_errors_are_one_line_whatever_they_quote():
    assert str(SpecError("k", "a\nb\x00c\u2028")) == "k: a\\nb\\x00c\\u2028"
    assert str(EnvError("X='1'\r\n")) == "X='1'\\r\\n"


def test_shipped_job_specs_are_valid():
    from pathlib import Path

    jobs = sorted(Path(__file__).resolve().parents[2].joinpath("jobs").glob("*.yaml"))
    assert jobs, "jobs/*.yaml missing"
    for job in jobs:
        assert expand_sweep(load_spec(job)), job


def test_the_dataset_catalog_is_the_spec_s_choice_of_datasets():
    from typing import get_args

    from clusterjob.spec.catalog import DATASETS, DatasetName
    from clusterjob.spec.fields import choices_of

    assert tuple(DATASETS) == get_args(DatasetName) == choices_of(DatasetName)
    assert all(name == d.name and len(d.mean) == len(d.std) == d.shape[0] for name, d in DATASETS.items())


def test_choices_come_from_the_field_types():
    from typing import Literal, Optional, Union

    from clusterjob.spec.fields import choices_of

    assert choices_of(Literal["a", "b"]) == ("a", "b")
    assert choices_of(Optional[Literal["a"]]) == ("a",)
    assert choices_of(Union[Literal["auto"], bool]) == ("auto", True, False)
    assert choices_of(Union[int, str]) is None and choices_of(str) is None
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "t", "train": {"optimizer": "adam"}})
    assert str(err.value) == "train.optimizer: 'adam' is not allowed; choose one of sgd, adamw (did you mean 'adamw'?)"
