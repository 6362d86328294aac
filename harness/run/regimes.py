"""Regimes on a CLNet: which parameters train, freezing the rest, and checking they stayed frozen.

A regime (config.vocabulary.parse_regime) picks the shared blocks that train (its depth) and,
within them, what trains (its family): every parameter (depth), the biases (bitfit), the
normalisation layers' affine parameters (norm), LoRA adapters on every Linear/Conv (lora;
peft, base weights frozen), prompt tokens at the transformer blocks (prompt: the first one,
prompt-deep: each; harness/api/prompts.py), or what a plug-in family selects (harness/api/plugins.py: the
built-in families are declared the same way, below). Heads always train. Whatever does not train is frozen: no
requires_grad, no optimizer entry, and a module left with frozen parameters and buffers (a
BatchNorm whose affine parameters do not train, a whole frozen block) stays in eval mode, so
its running statistics cannot drift. The engine checks frozen parameters and buffers bitwise
after every task.
"""
from __future__ import annotations

import torch
from torch import nn

from ..api.plugins import RegimeFamily, lookup, register_builtins
from ..api.prompts import add_prompts, is_prompt_parameter, prompt_parameters
from ..api.subspace import lora_layers, plain_name
from ..config.vocabulary import (
    FAMILY_ARGUMENTS,
    FAMILY_DESCRIPTIONS,
    REGIME_FAMILIES,
    Family,
    parse_regime,
    regime_depth,
)
from .models import CLNet, trainable_block_names

LORA_TARGETS = (nn.Linear, nn.Conv1d, nn.Conv2d)
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
LORA_DROPOUT = 0.0  # deterministic adapters: the regime changes what trains, nothing else


class RegimeError(ValueError):
    """A regime cannot be applied to this model (it selects nothing, or its adapters are missing)."""


def trainable_blocks(model: CLNet, regime: str) -> list[str]:
    """Names of the shared blocks the regime acts on (the last k parametrised blocks)."""
    names = trainable_block_names(model)
    k = regime_depth(regime, len(names))
    return names[len(names) - k:] if k else []


def inject_adapters(model: CLNet, regime: str) -> CLNet:
    """Give the regime's blocks the adapters of its family, if the family has any (lora); others: unchanged.

    Call once, after any pretrained weights are loaded and before the regime is applied.
    """
    parsed = parse_regime(regime)
    family = lookup("regime", parsed.family).plugin
    if family.inject is not None:
        family.inject(model, trainable_blocks(model, regime), parsed.rank)
    return model


def _inject_lora(model: CLNet, blocks: list[str], rank: int) -> None:
    """Rank-R adapters (peft, lora_alpha = R: scale 1) on every Linear/Conv of `blocks`.

    Adapters start at B = 0, so the model computes exactly what it did before.
    """
    if lora_layers(model):
        return
    from peft import LoraConfig, inject_adapter_in_model

    targets = [f"blocks.{name}" for name, m in model.blocks.named_modules()
               if isinstance(m, LORA_TARGETS) and name.split(".")[0] in set(blocks) and _lora_target(model, name)]
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=LORA_DROPOUT, bias="none", target_modules=targets)
    inject_adapter_in_model(config, model)
    # peft freezes every non-adapter parameter; the regime decides what trains, not peft.
    for p in model.parameters():
        p.requires_grad_(True)


def _lora_target(model: CLNet, name: str) -> bool:
    """Whether the Linear/Conv `name` (inside `model.blocks`) takes an adapter: a block declaring
    `lora_targets` (a ViT's: attention qkv/proj and MLP fc1/fc2; none in its patch embedding) adapts those
    modules only, any other block every Linear/Conv."""
    block, _, inner = name.partition(".")
    declared = getattr(model.blocks[block], "lora_targets", None)
    return declared is None or inner in declared


def _inject_prompt(model: CLNet, blocks: list[str], n_tokens: int) -> None:
    """VPT-shallow: `n_tokens` prompts prepended at the first token block (the model's first: the regime acts on
    every block)."""
    add_prompts(model, blocks, n_tokens, deep=False)


def _inject_deep_prompts(model: CLNet, blocks: list[str], n_tokens: int) -> None:
    """VPT-deep: `n_tokens` prompts at every token block of `blocks` (the first prepends, the rest replace)."""
    add_prompts(model, blocks, n_tokens, deep=True)


def _every(module, pname: str, argument) -> bool:
    return True


def _bias(module, pname: str, argument) -> bool:
    return pname == "bias"


def _norm(module, pname: str, argument) -> bool:
    return isinstance(module, NORM_LAYERS)


def _adapters_only(module, pname: str, argument) -> bool:
    return False  # the base weights stay frozen; the adapter factors train (see _selects)


def _prompts(module, pname: str, argument) -> bool:
    return is_prompt_parameter(module, pname)  # the backbone stays frozen; only the added prompts train


# The built-in regime families, declared as a plug-in file declares its own (harness/api/plugins.py);
# their grammar is the vocabulary's (FAMILY_ARGUMENTS).
PLUGINS = register_builtins(
    RegimeFamily(Family.DEPTH, _every, FAMILY_DESCRIPTIONS[Family.DEPTH]),
    RegimeFamily(Family.BITFIT, _bias, FAMILY_DESCRIPTIONS[Family.BITFIT]),
    RegimeFamily(Family.NORM, _norm, FAMILY_DESCRIPTIONS[Family.NORM]),
    RegimeFamily(Family.LORA, _adapters_only, FAMILY_DESCRIPTIONS[Family.LORA], argument=FAMILY_ARGUMENTS[Family.LORA],
                 inject=_inject_lora),
    RegimeFamily(Family.PROMPT, _prompts, FAMILY_DESCRIPTIONS[Family.PROMPT], argument=FAMILY_ARGUMENTS[Family.PROMPT],
                 inject=_inject_prompt),
    RegimeFamily(Family.PROMPT_DEEP, _prompts, FAMILY_DESCRIPTIONS[Family.PROMPT_DEEP],
                 argument=FAMILY_ARGUMENTS[Family.PROMPT_DEEP], inject=_inject_deep_prompts),
)
assert tuple(p.name for p in PLUGINS) == REGIME_FAMILIES


def selected_parameters(model: CLNet, regime: str) -> list[str]:
    """Full names of the shared parameters the regime trains (heads excluded: they always train)."""
    parsed = parse_regime(regime)
    family = lookup("regime", parsed.family).plugin
    blocks = trainable_blocks(model, regime)
    selected = []
    for block in blocks:
        for module_name, module in model.blocks[block].named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                full = ".".join(x for x in ("blocks", block, module_name, pname) if x)
                if _selects(family, parsed.rank, full, pname, module):
                    selected.append(full)
    if parsed.family != Family.DEPTH and not selected:
        raise RegimeError(f"regime {regime!r} selects no parameter of blocks {', '.join(blocks)}"
                          + (" (no adapters injected)" if family.inject is not None else ""))
    return selected


def _selects(family, argument, full: str, pname: str, module) -> bool:
    if plain_name(full) is None:  # an adapter factor trains under its own family only; under depth it stays B = 0
        return family.inject is not None
    return bool(family.selects(module, pname, argument))


def apply_regime(model: CLNet, regime: str) -> list[str]:
    """Freeze every shared parameter outside the regime; returns the names of the blocks it acts on.

    Frozen blocks (nothing trains) and, outside the depth family, frozen modules holding
    buffers are put (and kept, see CLNet.train) in eval mode. Heads always train.
    """
    selected = set(selected_parameters(model, regime))
    for name, p in model.blocks.named_parameters(prefix="blocks"):
        p.requires_grad_(name in selected)
    for p in model.heads.parameters():
        p.requires_grad_(True)
    parametrised = set(trainable_block_names(model))
    model.frozen_blocks = frozenset(n for n in model.block_names if n in parametrised
                                    and not any(p.requires_grad for p in model.blocks[n].parameters()))
    model.frozen_modules = frozenset() if parse_regime(regime).family == Family.DEPTH else _frozen_modules(model)
    model.train(model.training)
    return sorted(trainable_blocks(model, regime), key=model.block_names.index)


def _frozen_modules(model: CLNet) -> frozenset[str]:
    """Modules with buffers (e.g. BatchNorm) none of whose own parameters train, in trainable blocks."""
    out = set()
    for name, module in model.blocks.named_modules():
        if not name or name.split(".")[0] in model.frozen_blocks:
            continue
        own = list(module.parameters(recurse=False))
        if any(True for _ in module.buffers(recurse=False)) and not any(p.requires_grad for p in own):
            out.add(name)
    return frozenset(out)


def frozen_state(model: CLNet) -> dict:
    """Copies of every frozen shared parameter and of the buffers of frozen blocks and modules."""
    state = {name: p.detach().clone() for name, p in model.blocks.named_parameters(prefix="blocks")
             if not p.requires_grad}
    frozen = set(model.frozen_blocks)
    modules = set(getattr(model, "frozen_modules", ()))
    for name, buf in model.blocks.named_buffers(prefix="blocks"):
        path = name.split(".")[1:-1]
        if path[0] in frozen or ".".join(path) in modules:
            state[name] = buf.detach().clone()
    return state


def changed_frozen(model: CLNet, before: dict) -> list[str]:
    """Names of frozen parameters/buffers that are no longer bitwise equal to `before`."""
    current = dict(model.named_parameters()) | dict(model.named_buffers())
    return [n for n, t in before.items() if n not in current or not torch.equal(current[n].detach(), t)]


def parameter_counts(model: CLNet, regime: str) -> dict:
    """Trainable/total parameter counts under the regime (heads always train; added parameters are not in `total`).

    `fraction` = trainable / total: added parameters (LoRA adapters, prompts) count as trainable, the base
    model as the total, so families are placed on one axis; `adapters` counts the added parameters.
    """
    selected = set(selected_parameters(model, regime))
    shared = dict(model.blocks.named_parameters(prefix="blocks"))
    heads = sum(p.numel() for p in model.heads.parameters())
    added = {n for n in shared if plain_name(n) is None} | set(prompt_parameters(model))
    base_shared = sum(p.numel() for n, p in shared.items() if n not in added)
    trainable_shared = sum(shared[n].numel() for n in selected)
    adapters = sum(shared[n].numel() for n in added)
    total = base_shared + heads
    return {"trainable": trainable_shared + heads, "total": total, "trainable_shared": trainable_shared,
            "total_shared": base_shared, "per_head": heads // max(len(model.heads), 1),
            "adapters": adapters, "fraction": (trainable_shared + heads) / total if total else 0.0}


def method_parameter_counts(before: dict, model: CLNet, trained, regime: str) -> dict:
    """The record's `params` once the method is built: `before` (parameter_counts before build) where the method
    trains the run's model; where it trains its own model around it (`trained`, a prompt pool's wrapper), the
    run's model recounted as build() left it (L2P's regime prompt resized to zero tokens) plus the wrapper's
    own parameters (not the run's model's) as added ones: in `adapters` and, those that train, in `trainable`;
    `method_owned` says how many they are."""
    if trained is model or not isinstance(trained, torch.nn.Module):
        return before
    ours = {id(p) for p in model.parameters()}
    owned = [p for p in trained.parameters() if id(p) not in ours]
    counts = parameter_counts(model, regime)
    added, trains = sum(p.numel() for p in owned), sum(p.numel() for p in owned if p.requires_grad)
    counts["adapters"] += added
    counts["trainable"] += trains
    counts["method_owned"] = added
    counts["fraction"] = counts["trainable"] / counts["total"] if counts["total"] else 0.0
    return counts


def trained_effective(model: CLNet, regime: str) -> list[str]:
    """Plain names of the effective weights the regime changes (a LoRA layer's weight for its adapters, a
    prompt itself)."""
    out = []
    for name in selected_parameters(model, regime):
        plain = plain_name(name)
        if plain is None:  # blocks.fc1.1.lora_A.default.weight -> blocks.fc1.1.weight
            plain = name.split(".lora_")[0] + ".weight"
        if plain not in out:
            out.append(plain)
    return out
