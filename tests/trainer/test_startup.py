"""What a rank does before its first step: no torchvision import for the built-in models
and synthetic data, a ResNet-18 that is torchvision's weight for weight, and synthetic
splits made on several threads that are the same pixels on any number."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from clusterjob.trainer.data import SyntheticImages, synthetic_split
from clusterjob.trainer.models import build_model

REPO = Path(__file__).resolve().parents[2]


def _torchvision_cifar_resnet18(num_classes: int, channels: int) -> torch.nn.Module:
    """What clusterjob built before it had its own: torchvision's, with the CIFAR stem."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = torch.nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    torch.nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = torch.nn.Identity()
    return model


def test_resnet18_is_torchvisions_weight_for_weight_and_output_for_output():
    for shape in ((3, 32, 32), (1, 28, 28)):
        torch.manual_seed(7)
        ours, after_ours = build_model("resnet18", 10, shape), torch.rand(4)
        torch.manual_seed(7)
        theirs, after_theirs = _torchvision_cifar_resnet18(10, shape[0]), torch.rand(4)
        a, b = ours.state_dict(), theirs.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
        assert torch.equal(after_ours, after_theirs)  # the random stream is left where torchvision's left it
        x = torch.randn(3, *shape)
        assert torch.equal(ours.train()(x), theirs.train()(x))
        assert torch.equal(ours.state_dict()["bn1.running_mean"], theirs.state_dict()["bn1.running_mean"])


def test_the_trainer_set_up_imports_no_torchvision():
    code = """
import sys
from clusterjob.trainer import pipeline, train
from clusterjob.trainer.device import plan_device
from clusterjob.trainer.models import build_model
from clusterjob.spec.schema import spec_from_dict
spec = spec_from_dict({"name": "t", "model": {"arch": "resnet18"},
                       "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 8}})
data = pipeline.load_splits(spec.data, 0)
loaders = pipeline.build_tensor_loaders(data, spec.data, 8, 0, 1, 0, "cpu")
plan = plan_device(spec, 0, 1, 1, cuda_count=0)
train.build_trainer(spec, plan, build_model("resnet18", 10, (3, 32, 32)), len(loaders.train_loader), 1)
print(sorted(m for m in sys.modules if m.split(".")[0] == "torchvision"))
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


def test_synthetic_pixels_are_the_same_on_any_thread_count_and_as_before():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = synthetic_split(600, 4, "val")
        torch.set_num_threads(3)
        three = synthetic_split(600, 4, "val")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])
    images, labels = three
    # pinned from the single-threaded generator this replaced: the same dataset for a seed
    assert int(images.long().sum()) == 237_869_531
    weights = torch.arange(600 * 3072).view(600, 3, 32, 32)
    assert int((images.long() * weights % 1_000_003).sum()) == 912_314_350_279
    assert labels[:12].tolist() == [1, 6, 7, 1, 3, 2, 1, 1, 8, 5, 1, 5]


def test_the_synthetic_dataset_makes_its_transform_on_first_use():
    ds = SyntheticImages(4, 0, "train", augment=False)
    assert "transform" not in vars(ds)
    x, label = ds[2]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and label == int(ds.targets[2])
    assert "transform" in vars(ds)
