"""Built-in architectures: output shapes, the CIFAR stem, parameter counts, names."""

import pytest
import torch
from torch import nn

from clusterjob.trainer.models import build_model

SHAPES = [(1, 28, 28), (3, 32, 32)]


@pytest.mark.parametrize("arch", ["resnet18", "convnet", "mlp"])
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape_per_arch_and_input(arch, shape):
    torch.manual_seed(0)
    model = build_model(arch, 7, shape).eval()
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_resnet18_has_cifar_stem(shape):
    model = build_model("resnet18", 10, shape)
    conv = model.conv1
    assert (conv.in_channels, conv.out_channels) == (shape[0], 64)
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
    assert conv.bias is None
    assert isinstance(model.maxpool, nn.Identity)
    # 32x32 in: the last stage still sees 4x4 (the ImageNet stem would leave 1x1)
    seen = []
    model.layer4.register_forward_hook(lambda module, inputs, out: seen.append(out.shape) and None)
    with torch.no_grad():
        model.eval()(torch.randn(1, *shape))
    assert seen[0][-2:] == ((shape[1] + 7) // 8, (shape[2] + 7) // 8)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts():
    # torchvision resnet18 (11,689,512) with a 3x3 stem (-7,680) and a 10-way head (-507,870)
    assert _count(build_model("resnet18", 10, (3, 32, 32))) == 11_173_962
    # PyTorch's MNIST example network has 1,199,882 parameters on 1x28x28
    assert _count(build_model("convnet", 10, (1, 28, 28))) == 1_199_882
    # 3x32x32: the flatten size is 64 * 14 * 14
    assert build_model("convnet", 10, (3, 32, 32)).fc1.in_features == 64 * 14 * 14
    assert _count(build_model("mlp", 10, (3, 32, 32))) == 3072 * 256 + 256 + 256 * 10 + 10


@pytest.mark.parametrize("arch", ["resnet18", "convnet", "mlp"])
def test_parameters_are_materialized_for_ddp(arch):
    model = build_model(arch, 10, (3, 32, 32))
    assert not any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters())


def test_head_names_for_param_group_prefixes():
    assert "fc.weight" in dict(build_model("resnet18", 10, (3, 32, 32)).named_parameters())
    for arch in ("convnet", "mlp"):
        names = dict(build_model(arch, 10, (3, 32, 32)).named_parameters())
        assert {"fc1.weight", "fc2.weight", "fc2.bias"} <= set(names)


def test_mlp_is_deterministic_no_bn_no_dropout():
    model = build_model("mlp", 10, (3, 32, 32))
    assert not any(isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.Dropout)) for m in model.modules())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model.train()(x), model.eval()(x))


def test_unknown_arch_lists_allowed():
    with pytest.raises(ValueError, match="resnet18, convnet, mlp"):
        build_model("vgg16", 10, (3, 32, 32))


# ----------------------------------------------------------------------------- channels_last


def _plan(spec, cuda: bool):
    from clusterjob.trainer.device import plan_device

    return plan_device(spec, 0, 1, 1, cuda_count=1 if cuda else 0, capability=90 if cuda else None)


@pytest.mark.parametrize("arch, setting, cuda, expected", [
    ("resnet18", "auto", True, True), ("convnet", "auto", True, True), ("mlp", "auto", True, False),
    ("resnet18", "auto", False, False), ("convnet", True, False, True), ("resnet18", False, True, False)])
def test_channels_last_auto_is_for_conv_nets_on_cuda(arch, setting, cuda, expected):
    from clusterjob.spec.schema import spec_from_dict
    from clusterjob.trainer.train import memory_format_for

    gpus = {"gpus_per_node": 1} if cuda else {}
    spec = spec_from_dict({"name": "t", "model": {"arch": arch, "channels_last": setting}, "resources": gpus})
    fmt = memory_format_for(spec, _plan(spec, cuda))
    assert fmt == (torch.channels_last if expected else torch.contiguous_format)


def test_channels_last_with_the_mlp_is_bad_input():
    from clusterjob.core.errors import SpecError
    from clusterjob.spec.schema import spec_from_dict

    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "t", "model": {"arch": "mlp", "channels_last": True}})
    assert str(err.value) == ("model.channels_last: true does nothing for the mlp (it has no convolutions); "
                              "set channels_last: auto or false, or use arch: convnet or resnet18")
    assert spec_from_dict({"name": "t", "model": {"arch": "mlp", "channels_last": False}}).model.channels_last is False


def test_channels_last_converts_weights_and_inputs_and_trains_the_same():
    from clusterjob.spec.schema import spec_from_dict
    from clusterjob.trainer import train

    results = {}
    for setting in (True, False):
        spec = spec_from_dict({"name": "t", "model": {"arch": "convnet", "channels_last": setting},
                               "train": {"amp": "off", "batch_size": 4, "log_every": 1}})
        torch.manual_seed(0)
        trainer = train.build_trainer(spec, _plan(spec, cuda=False), build_model("convnet", 10, (3, 32, 32)),
                                      num_batches=2, world_size=1)
        trainer.raw_model.dropout1.p = trainer.raw_model.dropout2.p = 0.0  # masks follow the memory layout
        weight = trainer.raw_model.conv2.weight
        assert weight.is_contiguous(memory_format=torch.channels_last) == setting
        seen = []
        trainer.raw_model.conv1.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0]) and None)
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(2)]
        train.train_epoch(trainer, batches, 1, lambda *a: None, lambda: False)
        assert all(x.is_contiguous(memory_format=torch.channels_last) == setting for x in seen) and len(seen) == 2
        results[setting] = trainer.raw_model.state_dict()
    for key in results[True]:
        assert torch.allclose(results[True][key], results[False][key], atol=1e-5), key
