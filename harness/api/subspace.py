"""Effective weights of the shared blocks, whatever the regime's family trains.

A LoRA layer (peft) holds a frozen base weight W and adapter factors A, B; what the network
computes with is W + s·BA. Update norms, task vectors and merges use these *effective* weights,
named as the plain backbone names them (`blocks.fc1.1.weight`, never `...base_layer.weight` or
the factors), so every family is measured in the same coordinates. Without adapters the
effective weights are the parameters themselves, bitwise. A prompt (harness/api/prompts.py) is an
added parameter whose effective weight is itself: it is in these weights by its own name.

peft is recognised by duck typing (a module with `base_layer`, `lora_A`, `lora_B` and
`get_delta_weight`), so methods never import it.
"""
from __future__ import annotations

import torch

ADAPTER = "default"  # peft's adapter name


def is_lora_layer(module) -> bool:
    """True for a peft LoRA layer wrapping a base Linear/Conv."""
    return all(hasattr(module, a) for a in ("base_layer", "lora_A", "lora_B", "get_delta_weight"))


def lora_layers(model, prefix: str = "blocks") -> dict[str, torch.nn.Module]:
    """LoRA layers of the shared blocks by their plain module name (`blocks.fc1.1`)."""
    root = getattr(model, prefix)
    return {f"{prefix}.{name}": m for name, m in root.named_modules() if is_lora_layer(m) and ADAPTER in m.lora_A}


def plain_name(param_name: str) -> str | None:
    """The backbone's own name for a parameter (`.base_layer` dropped); None for adapter factors."""
    if ".lora_" in param_name:
        return None
    return param_name.replace(".base_layer.", ".")


def _delta(layer) -> torch.Tensor:
    return layer.get_delta_weight(ADAPTER)


@torch.no_grad()
def effective_weights(model, names=None) -> dict[str, torch.Tensor]:
    """Detached effective shared weights by plain name (W + s·BA for LoRA weights), optionally only `names`.

    A plain parameter is returned detached, not copied (it shares storage): clone what you keep.
    """
    lora = {f"{n}.weight": layer for n, layer in lora_layers(model).items()}
    wanted = None if names is None else set(names)
    out = {}
    for name, p in model.blocks.named_parameters(prefix="blocks"):
        plain = plain_name(name)
        if plain is None or (wanted is not None and plain not in wanted):
            continue
        layer = lora.get(plain)
        out[plain] = (p + _delta(layer)).detach() if layer is not None else p.detach()
    return out


@torch.no_grad()
def write_effective(model, values: dict) -> None:
    """Set effective shared weights by plain name; a LoRA weight goes into its base, its adapters zeroed.

    Used on a model *copy* that is evaluated (a merge); the trained model's frozen bases are never written.
    """
    lora = {f"{n}.weight": layer for n, layer in lora_layers(model).items()}
    params = {plain_name(n): p for n, p in model.blocks.named_parameters(prefix="blocks") if plain_name(n)}
    for name, value in values.items():
        params[name].copy_(value)
        layer = lora.get(name)
        if layer is not None:
            layer.lora_B[ADAPTER].weight.zero_()


def shared_named_parameters(model) -> dict[str, torch.Tensor]:
    """Parameters of the blocks (shared across tasks), i.e. everything but the heads."""
    return {f"blocks.{n}": p for n, p in model.blocks.named_parameters()}
