"""BatchNorm helpers shared by the method families: find the layers, re-estimate their statistics."""
from __future__ import annotations

import torch
from torch import nn


def batchnorm_layers(model, blocks) -> list[nn.Module]:
    """The BatchNorm layers inside the named blocks of a CLNet, except those the regime froze
    (CLNet.frozen_modules: e.g. every BatchNorm under LoRA keeps its pretrained statistics)."""
    frozen = getattr(model, "frozen_modules", frozenset())
    return [m for b in blocks for name, m in model.blocks[b].named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and ".".join(x for x in (b, name) if x) not in frozen]


@torch.no_grad()
def recompute_statistics(model, blocks, batches) -> bool:
    """Re-estimate the running statistics of the blocks' BatchNorm layers from `batches` of inputs.

    The statistics are reset and averaged over the batches (momentum None: a cumulative
    average), in train mode (frozen blocks stay in eval mode, see CLNet.train); nothing else
    changes. Returns False when the blocks hold no BatchNorm layer (nothing to do).
    """
    layers = [bn for bn in batchnorm_layers(model, blocks) if bn.track_running_stats]
    if not layers:
        return False
    momenta = [bn.momentum for bn in layers]
    was_training = model.training
    for bn in layers:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    try:
        for x in batches:
            model.features(x)
    finally:
        for bn, momentum in zip(layers, momenta):
            bn.momentum = momentum
        model.train(was_training)
    return True
