"""The spec's ``container:`` section: bad values are one line and exit 2."""

from __future__ import annotations

import pytest
from clirun import cli

from clusterjob.core.errors import SpecError
from clusterjob.spec.container import ContainerSpec
from clusterjob.spec.schema import spec_from_dict


def test_a_container_spec_keeps_its_values_and_makes_a_file_image_absolute(tmp_path, monkeypatch):
    (tmp_path / "img.sif").write_text("x")
    monkeypatch.chdir(tmp_path)
    box = ContainerSpec(image="img.sif", runtime="apptainer", mounts=("/data:/data:ro",), python="python3")
    assert box.image == str(tmp_path / "img.sif")
    assert box.mounts == ("/data:/data:ro",) and box.workdir is None and box.python == "python3"
    assert ContainerSpec(image="nvcr.io#nvidia/pytorch:25.01-py3").image == "nvcr.io#nvidia/pytorch:25.01-py3"


@pytest.mark.parametrize("container, key, words", [
    ({"image": "x", "runtime": "docker"}, "container.runtime", "'docker' is not allowed; choose one of auto, pyxis"),
    ({"image": "/no/such.sif"}, "container.image", "'/no/such.sif': no such file or folder"),
    ({"image": "./missing-folder"}, "container.image", "no such file or folder"),
    ({"image": ""}, "container.image", "is empty"),
    ({"image": "x", "mounts": ["/data"]}, "container.mounts[0]", "is not SRC:DST or SRC:DST:ro"),
    ({"image": "x", "mounts": ["data:/data"]}, "container.mounts[0]", "both paths must be absolute"),
    ({"image": "x", "mounts": ["/a:/b:rx"]}, "container.mounts[0]", "the option 'rx' is not allowed"),
    ({"image": "x", "mounts": ["/data,x:/data"]}, "container.mounts[0]", "a path with ',' cannot be mounted"),
    ({"image": "x", "mounts": ["/data:/in,side"]}, "container.mounts[0]", "a path with ',' cannot be mounted"),
    ({"image": "x", "workdir": "rel"}, "container.workdir", "is not an absolute path"),
    ({"image": "x", "python": "python 3"}, "container.python", "is not allowed"),
])
def test_bad_container_values_name_the_key_the_value_and_the_fix(container, key, words):
    with pytest.raises(SpecError) as error:
        spec_from_dict({"name": "t", "container": container})
    assert str(error.value).startswith(f"{key}: ") and words in str(error.value)


@pytest.mark.parametrize("key, values", [("container.image", ["a", "b"]), ("container", [{"image": "a"}])])
def test_the_container_cannot_be_swept(key, values):
    with pytest.raises(SpecError) as error:
        spec_from_dict({"name": "t", "container": {"image": "x"}, "sweep": {key: values}})
    assert str(error.value) == (f"sweep.{key}: the container is per submission, not per sweep point; submit a spec "
                                "per image instead")


@pytest.mark.parametrize("setting, words", [
    ("container={image: x, runtime: docker}", "container.runtime: 'docker' is not allowed"),
    ("container={image: /no/such.sqsh}", "container.image: '/no/such.sqsh': no such file or folder"),
    ("container={image: x, mounts: [/data]}", "container.mounts[0]: '/data' is not SRC:DST"),
])
def test_submit_refuses_a_bad_container_with_one_line_and_writes_nothing(tmp_path, setting, words):
    (tmp_path / "t.yaml").write_text("name: t\n")
    done = cli(tmp_path, "submit", "t.yaml", "--executor", "local", "--dry-run", "--set", setting)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and words in done.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("executor", ["local", "slurm"])
@pytest.mark.parametrize("folder", ["res,ults", "res:ults"])
def test_a_results_folder_no_runtime_can_mount_is_refused_in_one_line(tmp_path, executor, folder):
    """The runtimes split their mount options on ',' (pyxis, apptainer) and ':' (all):
    the folders every container mounts may hold neither; refused before anything is written,
    the dry run too."""
    (tmp_path / "img.sqsh").write_text("x")
    (tmp_path / "t.yaml").write_text("name: t\n")
    for dry in (["--dry-run"], []) if executor == "local" else (["--dry-run"],):  # no Slurm needed here
        done = cli(tmp_path, "submit", "t.yaml", "--executor", executor, *dry, "--set", "container.image=img.sqsh",
                   "--set", "container.runtime=pyxis" if executor == "slurm" else "container.runtime=charliecloud",
                   "--set", f"output.root={tmp_path / folder}")
        errors = [line for line in done.stderr.splitlines() if not line.startswith("note: ")]  # Slurm unreachable
        assert done.returncode == 2 and len(errors) == 1, done.stderr
        assert f"container: the results folder (output.root) '{tmp_path / folder}' holds ',' or ':'" in errors[0]
        assert not (tmp_path / folder).exists()
