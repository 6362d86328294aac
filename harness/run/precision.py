"""The protocol's `training.precision`: float32, or bfloat16 autocast around the model's forward passes.

The model carries the setting (`AUTOCAST_ATTRIBUTE`, set by the engine on the run's model; copies a method
makes with deepcopy carry it too) and every forward of it enters the autocast region: CLNet.forward and
CLNet.features, and the frozen-prefix cache's own block passes (training and evaluation), so the cached path
computes what the uncached one does. Only the forwards: a method's own linear algebra between them (GPM's
gradient projections, merges, the probe's ridge fit) and the backward's gradient accumulation into the
float32 parameters stay float32. Outputs leave the region as float32, so losses, argmaxes and distances are
computed as at fp32 on numbers the bf16 forward produced.

On the CPU bf16 runs as well (torch's CPU autocast): slower than fp32 on most CPUs, but the same computation
as on a GPU up to kernels, so a protocol can be tested anywhere; the record's provenance says where it ran.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

AUTOCAST_ATTRIBUTE = "harness_autocast"
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def set_precision(model: torch.nn.Module, precision: str) -> None:
    """Make every later forward of `model` (and of its deep copies) run at `precision` (a PRECISIONS value)."""
    setattr(model, AUTOCAST_ATTRIBUTE, DTYPES[precision])


def autocast(model, x: torch.Tensor):
    """The autocast region for a forward of `model` on `x` (a no-op context at fp32)."""
    dtype = getattr(model, AUTOCAST_ATTRIBUTE, None)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=x.device.type, dtype=dtype)


def as_float(out):
    """A forward's output as float32 (a dict of task logits too); float32 and integer tensors unchanged."""
    if isinstance(out, dict):
        return {k: as_float(v) for k, v in out.items()}
    if isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype != torch.float32:
        return out.float()
    return out


def provenance(model, device) -> dict:
    """What ran: {'precision': 'bf16', 'autocast': 'torch.bfloat16 on cuda'}; empty at fp32."""
    dtype = getattr(model, AUTOCAST_ATTRIBUTE, None)
    if dtype is None:
        return {}
    return {"precision": "bf16", "autocast": f"{dtype} on {torch.device(device).type}"}
