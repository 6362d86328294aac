"""torchvision's ResNet-18 as cl-bench blocks, and its state dicts mapped onto them.

The blocks (vocabulary MODELS["resnet18"]): `stem` = conv1 + bn1 + relu + maxpool, then layer1..layer4
as torchvision builds them; models.BUILDERS adds the parameter-free `pool` (average pool + flatten,
512 features), so CLNet.features computes exactly torchvision's forward up to (not including) `fc`.
The stem keeps torchvision's names, so a torchvision key maps by a prefix: `conv1.weight` ->
`blocks.stem.conv1.weight`, `layer1.0.conv1.weight` -> `blocks.layer1.0.conv1.weight`.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from ..config.pretrain import PretrainError
from ..config.vocabulary import MODELS

# torchvision's own attribute names of the stem (not cl-bench block names, which live in the vocabulary)
STEM = tuple("conv1 bn1 relu maxpool".split())
LAYERS = MODELS["resnet18"].blocks[1:]  # the four stages after the stem


def resnet18_blocks(input_shape) -> list[nn.Module]:
    """torchvision's resnet18 (random init) as the 5 parametrised blocks stem, layer1..layer4."""
    from torchvision.models import resnet18

    net = resnet18(weights=None)
    channels = int(input_shape[0])
    if channels != 3:  # the same layer as torchvision's, for c input channels
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    stem = nn.Sequential(OrderedDict((name, getattr(net, name)) for name in STEM))
    return [stem, *(getattr(net, name) for name in LAYERS)]


def torchvision_to_blocks(state_dict: dict, in_channels: int) -> dict:
    """A torchvision resnet18 state dict as `blocks.*` keys of build_model("resnet18"); fc is dropped."""
    out = {}
    for key, tensor in state_dict.items():
        head = key.split(".", 1)[0]
        if head == "fc":  # ImageNet's classifier: the protocol's heads replace it
            continue
        if head in STEM:
            out[f"blocks.stem.{key}"] = tensor
        elif head in LAYERS:
            out[f"blocks.{key}"] = tensor
        else:
            raise PretrainError(f"torchvision resnet18 weights: unexpected key {key!r}; allowed: conv1, bn1, "
                                f"{', '.join(LAYERS)} and fc keys (a torchvision resnet18 state dict)")
    if "blocks.stem.conv1.weight" in out:
        out["blocks.stem.conv1.weight"] = adapt_input_conv(in_channels, out["blocks.stem.conv1.weight"])
    return _with_batch_counts(out)


def _with_batch_counts(state: dict) -> dict:
    """Add the BatchNorm counters that files older than PyTorch 0.4.1 lack (torchvision's ImageNet
    resnet18 file is one); 0, as BatchNorm itself assumes when loading such a file."""
    counts = {k[:-len("running_mean")] + "num_batches_tracked" for k in state if k.endswith(".running_mean")}
    return {**state, **{k: torch.tensor(0, dtype=torch.long) for k in sorted(counts) if k not in state}}


def adapt_input_conv(in_channels: int, weight: torch.Tensor) -> torch.Tensor:
    """An RGB first-layer kernel for `in_channels` inputs, as timm's adapt_input_conv does.

    One channel: the sum over R, G, B (a grey image x then gives what RGB (x, x, x) gives); other
    counts: the RGB kernels repeated and scaled by 3 / in_channels (the same response to a constant image).
    """
    dtype = weight.dtype
    weight = weight.float()
    out_c, rgb, kh, kw = weight.shape
    if in_channels == rgb:
        return weight.to(dtype)
    if rgb != 3:
        raise PretrainError(f"torchvision resnet18 weights: conv1 takes {rgb} channels; allowed: 3 (RGB)")
    if in_channels == 1:
        weight = weight.sum(dim=1, keepdim=True)
    else:
        repeat = math.ceil(in_channels / 3)
        weight = weight.repeat(1, repeat, 1, 1)[:, :in_channels] * (3 / in_channels)
    return weight.to(dtype)
