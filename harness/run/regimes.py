"""Depth regimes on a CLNet: which blocks train, freezing them, and checking they stayed frozen."""
from __future__ import annotations

import torch

from ..config.vocabulary import regime_depth
from .models import CLNet, trainable_block_names


def trainable_blocks(model: CLNet, regime: str) -> list[str]:
    """Names of the blocks the regime trains (the last k parametrised blocks)."""
    names = trainable_block_names(model)
    k = regime_depth(regime, len(names))
    return names[len(names) - k:] if k else []


def apply_regime(model: CLNet, regime: str) -> list[str]:
    """Freeze every block outside the regime; returns the trainable block names.

    Frozen blocks lose requires_grad and are put (and kept, see CLNet.train) in eval mode.
    Heads always train.
    """
    train_names = set(trainable_blocks(model, regime))
    # Parameter-free blocks after the last trainable one (e.g. pooling) follow their input.
    frozen = {n for n in model.block_names if n not in train_names and n in trainable_block_names(model)}
    for name, block in model.blocks.items():
        for p in block.parameters():
            p.requires_grad_(name not in frozen)
    for p in model.heads.parameters():
        p.requires_grad_(True)
    model.frozen_blocks = frozenset(frozen)
    model.train(model.training)
    return sorted(train_names, key=model.block_names.index)


def frozen_state(model: CLNet) -> dict:
    """Copies of every parameter and buffer of the frozen blocks."""
    state = {}
    for name in model.frozen_blocks:
        block = model.blocks[name]
        for key, tensor in [*block.named_parameters(), *block.named_buffers()]:
            state[f"blocks.{name}.{key}"] = tensor.detach().clone()
    return state


def changed_frozen(model: CLNet, before: dict) -> list[str]:
    """Names of frozen parameters/buffers that are no longer bitwise equal to `before`."""
    current = dict(model.named_parameters()) | dict(model.named_buffers())
    return [n for n, t in before.items() if n not in current or not torch.equal(current[n].detach(), t)]
