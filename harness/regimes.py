"""Depth regimes: which blocks train, freezing, and the regime's depth index."""
from __future__ import annotations

import re

import torch

from .models import CLNet, trainable_block_names

BASE_REGIMES = ("head", "last-1", "last-2", "last-3", "full")
_LAST_K = re.compile(r"^last-([1-9][0-9]*)$")


def is_regime_name(name: str) -> bool:
    """True for `head`, `full` and `last-k` with k >= 1."""
    return name in ("head", "full") or bool(_LAST_K.match(str(name)))


def regime_k(name: str, n_blocks: int) -> int:
    """Number of trainable blocks under the regime (head=0, full=n_blocks)."""
    if name == "head":
        return 0
    if name == "full":
        return n_blocks
    match = _LAST_K.match(name)
    if not match:
        raise ValueError(f"unknown regime {name!r}")
    k = int(match.group(1))
    if k > n_blocks:
        raise ValueError(f"regime {name!r} needs {k} blocks; the model has {n_blocks}")
    return k


def trainable_blocks(model: CLNet, regime: str) -> list[str]:
    """Names of the blocks the regime trains (the last k parametrised blocks)."""
    names = trainable_block_names(model)
    k = regime_k(regime, len(names))
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


def count_parameters(model: CLNet) -> dict:
    """Trainable and total parameter counts of the model as currently frozen."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable": trainable, "total": total}


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
