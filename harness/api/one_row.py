"""Whether a model can train on a minibatch of one row (a task of 269 rows in batches of 67 ends with one).

BatchNorm normalising with batch statistics needs more than one value per channel. One row gives a layer
as many as its input has positions per channel: a BatchNorm2d on 8x8 maps has 64 and trains on one row
like any other batch, a BatchNorm1d on flat features (mlp-bn, cnn1d's fc block) or on the 1x1 maps of
resnet18's last stage has one and cannot. `note_row_extents` measures each layer's positions per
channel once, from one row in eval mode; `one_row_fails` answers from them and the layers' modes now.
The training loops (harness.run.fastdata) and the methods' own passes over data (BECAME's Fisher, a
merged model's recomputed statistics) skip a last batch of one row exactly when it answers True: a batch
that trains is never dropped.
"""
from __future__ import annotations

import math

import torch
from torch import nn

_EXTENT = "harness_row_extent"  # on each BatchNorm layer: values per channel one row gives it


def batchnorm_layers(model: nn.Module) -> list[nn.Module]:
    """Every BatchNorm layer of `model` (any dimension, SyncBatchNorm too)."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def note_row_extents(model: nn.Module, forward_one_row) -> None:
    """Record on each BatchNorm layer of `model` how many values per channel one row gives it.

    `forward_one_row()` runs the model on one row. It runs in eval mode without gradients, under a
    forked random state (no statistics move, no random number is drawn). A model without BatchNorm,
    with parameters not yet built (lazy modules), or that the probe cannot run, records nothing: its
    layers count as taking one row, and a batch of one trains as it always did.
    """
    layers = batchnorm_layers(model)
    if not layers or any(nn.parameter.is_lazy(p) for p in model.parameters()):
        return
    seen: dict[nn.Module, int] = {}

    def note(module, args):
        extent = math.prod(args[0].shape[2:]) if args and args[0].dim() >= 2 else 0
        seen[module] = min(extent, seen.get(module, extent))

    modes = {m: m.training for m in model.modules()}
    hooks = [bn.register_forward_pre_hook(note) for bn in layers]
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(model)):
            forward_one_row()
    except Exception:  # noqa: BLE001 - a probe never fails a run; training shows any real error
        seen.clear()
    finally:
        for hook in hooks:
            hook.remove()
        for module, mode in modes.items():
            module.training = mode
    for bn, extent in seen.items():
        setattr(bn, _EXTENT, extent)


def one_row_fails(model: nn.Module) -> bool:
    """Whether a forward of one row now fails: a BatchNorm layer that normalises with batch statistics
    (train mode, or no running statistics) gets one value per channel (see `note_row_extents`)."""
    return any((bn.training or bn.running_mean is None) and getattr(bn, _EXTENT, None) == 1
               for bn in batchnorm_layers(model))


def _cuda_devices(model: nn.Module) -> list[int]:
    """The CUDA devices the model's parameters are on (whose random state the probe forks)."""
    return sorted({p.device.index if p.device.index is not None else torch.cuda.current_device()
                   for p in model.parameters() if p.is_cuda})
