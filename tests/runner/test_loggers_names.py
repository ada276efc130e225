"""How each logger takes a metric name (clusterjob.runner.loggers), checked against the
tool's own rules: every name MLflow would refuse comes out as one its own validator
takes (or as nothing); W&B's own names are never taken; what a W&B history holds is read
by the position of each row."""

from __future__ import annotations

import os

import pytest

from clusterjob.runner.loggers import history_held, mlflow_key

HOSTILE = ["x//y", "a/../b", "/x", "x/", "./x", "x/.", "..", ".", "", "..x", "...", "a/./b", "../../etc/passwd",
           "loss@val", "ü/ß", "tab\there", "new\nline", "a" * 300, "a/" * 200, ("." * 249) + "/x", "x" * 249 + "/..",
           "val:acc", "  ", "a b", "-", "//", "😀", "a\x00b"]


def mlflow_refuses(name: str) -> bool:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric_name

    try:
        _validate_metric_name(name)
    except MlflowException:
        return True
    return len(name) > 250  # what MLflow's stores take as a key


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_mlflow_refuses_comes_out_as_one_it_takes_or_as_nothing(name):
    key = mlflow_key(name)
    assert key == "" or not mlflow_refuses(key), key
    assert mlflow_key(key) == key  # cleaning a clean name changes nothing
    if not mlflow_refuses(name):
        assert key == name  # a name MLflow takes is sent as it is


def test_mlflow_names_are_cleaned_as_paths():
    assert [mlflow_key(n) for n in ("x//y", "a/../b", "/x/", "..x", "loss@val", "..", "val:acc")] == \
        ["x/y", "a/b", "x", "_..x", "loss_val", "", "val:acc"]


def test_what_a_wandb_history_holds_is_each_metrics_highest_position_without_wandbs_own_keys():
    rows = [{"_step": 0, "_runtime": 1.0, "step": 1, "acc": 0.1}, {"_step": 1, "step": 3, "acc": 0.3, "loss": 2.0},
            {"_step": 2, "step": 2, "loss": 1.0}, {"_step": 3, "loss": 5.0}, {"_step": 4, "step": "x", "acc": 1}]
    assert history_held(rows, "step") == {"acc": 3, "loss": 3}
