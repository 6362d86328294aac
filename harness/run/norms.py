"""Update norms between successive evaluated models, over shared (non-head) parameters and method-owned state.

A snapshot maps names to tensors: the shared effective weights (`blocks.<block>.…`) and, for a method with
a `harness_state()` hook (api/contract.py `StateHook`), its prompts and prototypes (`prompts.<name>`,
`prototypes.<name>`). Definitions (docs/update-norms.md):

- u_t = ‖θ_t − θ_{t−1}‖₂ over the coordinates both snapshots have: the names in both, and of a tensor whose
  first dimension changed (class prototypes grow as classes arrive) the first min(n_{t−1}, n_t) rows. A
  tensor or row new at t contributes nothing to u_t.
- relative u_t = u_t / ‖θ_{t−1}‖₂ over the same coordinates (None where that norm is 0).
- per block: u_t over the names of one block (`block_of`); None at a step where the block has no name in
  both snapshots.
- drift D = ‖θ_T − θ_1‖₂ over the coordinates snapshot 1 and snapshot T both have (rows present at task 1
  and at task T; a class first seen after task 1 contributes nothing).

Without method-owned state every snapshot has the same names and shapes, and every number is what it was
before the hook existed (same tensors, same order of summation).
"""
from __future__ import annotations

import math

import torch


def snapshot(named_params: dict) -> dict:
    """Detached CPU copies of the given parameters."""
    return {n: p.detach().to("cpu", copy=True) for n, p in named_params.items()}


def block_of(param_name: str) -> str:
    """Block a shared parameter belongs to (`blocks.<block>.…`), or a state tensor's (`prompts.…` → prompts)."""
    parts = param_name.split(".")
    return parts[1] if parts[0] == "blocks" and len(parts) > 1 else parts[0]


def _sq(tensors) -> float:
    return float(sum(float(t.double().pow(2).sum()) for t in tensors))


def common_rows(a: torch.Tensor, b: torch.Tensor, name: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """`a` and `b` on the rows both have (the first min(len) rows) where their first dimension differs.

    ValueError when anything else about their shapes differs (only the first dimension may grow).
    """
    if a.shape == b.shape:
        return a, b
    if a.dim() == 0 or a.dim() != b.dim() or a.shape[1:] != b.shape[1:]:
        raise ValueError(f"{name or 'a tensor'} changed shape from {tuple(a.shape)} to {tuple(b.shape)} between "
                         "snapshots: only the first dimension may change")
    n = min(a.shape[0], b.shape[0])
    return a[:n], b[:n]


def _pairs(prev: dict, cur: dict) -> dict:
    """{name: (prev, cur)} on the coordinates both snapshots have, in `cur`'s order."""
    return {n: common_rows(prev[n], t, n) for n, t in cur.items() if n in prev}


def check_shapes(prev: dict, cur: dict) -> None:
    """ValueError (one line) when a tensor of both snapshots changed in another than its first dimension."""
    _pairs(prev, cur)


def update_norms(snapshots: list) -> dict:
    """u_t, per-block u_t and relative u_t for t >= 2 (None at t = 1), and drift ‖θ_T − θ_1‖ (module docstring)."""
    shared, relative = [None], [None]
    blocks = list(dict.fromkeys(block_of(n) for s in snapshots for n in s))
    per_block = {b: [None] for b in blocks}
    for prev, cur in zip(snapshots, snapshots[1:]):
        pairs = _pairs(prev, cur)
        diffs = {n: c - p for n, (p, c) in pairs.items()}
        u = math.sqrt(_sq(diffs.values()))
        shared.append(u)
        base = math.sqrt(_sq(pairs[n][0] for n in prev if n in pairs))  # prev's order, as before the hook
        relative.append(u / base if base > 0 else None)
        for b in blocks:
            names = [n for n in diffs if block_of(n) == b]
            per_block[b].append(math.sqrt(_sq(diffs[n] for n in names)) if names else None)
    drift = None
    if len(snapshots) >= 2:
        ends = _pairs(snapshots[-1], snapshots[0])
        drift = math.sqrt(_sq(last - first for last, first in ends.values()))  # snapshot 1's order
    return {"shared": shared, "relative": relative, "per_block": per_block, "drift": drift}
