"""Prompt tokens (the `prompt` regime families, VPT) through a duck-typed transformer-block API.

A *token block* is a transformer block taking (batch, tokens, width) with its leading class token(s);
a backbone names them in `token_blocks` (harness/api/plugins.py: Backbone). The block module itself
provides:

    block.embed_dim: int        the token width D
    block.prefix_tokens: int    the leading tokens prompts go after (1: the class token)
    block.prompt                an nn.Parameter of shape (L, D), or None until one is added
    block.add_prompt(n_tokens: int, replace: bool) -> None

`add_prompt` registers `block.prompt` (VPT's init: uniform(-v, v), v = vpt_bound(patch_area, D)) and from
then on the block's forward first does `insert_prompt(x, block.prompt, block.prefix_tokens, replace)`:
replace=False prepends the prompt after the class token (VPT-shallow, and the first block of VPT-deep);
replace=True swaps the previous block's prompt outputs for its own (VPT-deep). Without a prompt the
block computes exactly what it did before.

A prompt is an *added* parameter, as a LoRA adapter is: it trains, it is not part of the backbone's
`total`, and its own value is its effective weight (api/subspace.effective_weights includes it by its
name, `blocks.<block>.prompt`), so update norms, task vectors and merges see the prompts.
Methods use these functions; they never need the backbone's class.
"""
from __future__ import annotations

import math

import torch

PROMPT = "prompt"  # the parameter's attribute name on its block
_API = ("embed_dim", "prefix_tokens", PROMPT, "add_prompt")


def is_token_block(module) -> bool:
    """True for a module providing the token-block API above (a prompt may or may not be added yet)."""
    return all(hasattr(module, a) for a in _API) and callable(module.add_prompt)


def token_blocks(model, names=None) -> dict[str, torch.nn.Module]:
    """The shared blocks (of `names`, else all) that are token blocks, by block name, input side first."""
    wanted = None if names is None else set(names)
    return {n: b for n, b in model.blocks.items() if (wanted is None or n in wanted) and is_token_block(b)}


def prompt_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The prompts added to the model's blocks, by full parameter name (`blocks.block1.prompt`)."""
    return {f"blocks.{n}.{PROMPT}": b.prompt for n, b in token_blocks(model).items() if b.prompt is not None}


def is_prompt_parameter(module, param_name: str) -> bool:
    """True for the prompt of a token block (`param_name` as the module names it, non-recursive)."""
    return param_name == PROMPT and is_token_block(module)


def add_prompts(model, names, n_tokens: int, deep: bool) -> list[str]:
    """Add `n_tokens` prompts to the token blocks among `names`: the first prepends; with `deep` every later
    one replaces its predecessor's (VPT-deep), else only the first gets one (VPT-shallow). Returns the
    prompted blocks; none when the model already has prompts (injection happens once)."""
    if prompt_parameters(model):
        return []
    blocks = list(token_blocks(model, names).items())[: None if deep else 1]
    for i, (_, block) in enumerate(blocks):
        block.add_prompt(n_tokens, replace=i > 0)
    return [n for n, _ in blocks]


def insert_prompt(x: torch.Tensor, prompt: torch.Tensor, prefix_tokens: int, replace: bool) -> torch.Tensor:
    """The token sequence a prompted block computes on: (B, P + L + rest, D), the prompt after the P prefix
    tokens; `replace` drops the L tokens that held the previous block's prompts."""
    rows = prompt.unsqueeze(0).expand(x.shape[0], -1, -1).to(x.dtype)
    start = prefix_tokens + (prompt.shape[0] if replace else 0)
    return torch.cat((x[:, :prefix_tokens], rows, x[:, start:]), dim=1)


def vpt_bound(patch_area: int, embed_dim: int) -> float:
    """VPT's prompt init bound v (uniform(-v, v)): sqrt(6 / (3 * patch_area + D)), Xavier over a patch."""
    return math.sqrt(6.0 / (3 * patch_area + embed_dim))
