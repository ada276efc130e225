"""The sweep point a task runs: --point, else the array task; an index that is not plain
ASCII digits in range is bad input, never a crash."""
import argparse

import pytest

from clusterjob.core.errors import BadInput
from clusterjob.spec import task


def sweep_spec(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nsweep: {train.lr: [0.1, 0.2, 0.3]}\n")
    return path


@pytest.mark.parametrize("given", ["1", 1])
def test_the_point_is_the_array_task_or_point(tmp_path, given):
    args = argparse.Namespace(spec=str(sweep_spec(tmp_path)), set=[], point=None)
    spec, params = task.point(args, str(given))
    assert params == {"train.lr": 0.2} and spec.train.lr == 0.2
    args.point = given if isinstance(given, int) else int(given)
    assert task.point(args, None)[1] == {"train.lr": 0.2}


@pytest.mark.parametrize("given", ["²", "٣", "-1", "3", "1.0", " ", "99999999999999999999999"])
def test_an_index_that_is_no_point_is_bad_input(tmp_path, given):
    args = argparse.Namespace(spec=str(sweep_spec(tmp_path)), set=[], point=None)
    with pytest.raises(BadInput, match="is a sweep of 3 runs; pass --point 0..2"):
        task.point(args, given)
