"""Update norms between successive evaluated models, over shared (non-head) parameters."""
from __future__ import annotations

import math


def snapshot(named_params: dict) -> dict:
    """Detached CPU copies of the given parameters."""
    return {n: p.detach().to("cpu", copy=True) for n, p in named_params.items()}


def block_of(param_name: str) -> str:
    """Block a shared parameter belongs to (`blocks.<block>.…`)."""
    parts = param_name.split(".")
    return parts[1] if parts[0] == "blocks" and len(parts) > 1 else parts[0]


def _sq(tensors) -> float:
    return float(sum(float(t.double().pow(2).sum()) for t in tensors))


def update_norms(snapshots: list) -> dict:
    """u_t, per-block u_t and relative u_t for t >= 2 (None at t = 1), and drift ‖θ_T − θ_1‖."""
    shared, relative = [None], [None]
    blocks = list(dict.fromkeys(block_of(n) for n in snapshots[0])) if snapshots else []
    per_block = {b: [None] for b in blocks}
    for prev, cur in zip(snapshots, snapshots[1:]):
        diffs = {n: cur[n] - prev[n] for n in cur}
        u = math.sqrt(_sq(diffs.values()))
        shared.append(u)
        base = math.sqrt(_sq(prev.values()))
        relative.append(u / base if base > 0 else None)
        for b in blocks:
            per_block[b].append(math.sqrt(_sq(d for n, d in diffs.items() if block_of(n) == b)))
    drift = None
    if len(snapshots) >= 2:
        drift = math.sqrt(_sq(snapshots[-1][n] - snapshots[0][n] for n in snapshots[0]))
    return {"shared": shared, "relative": relative, "per_block": per_block, "drift": drift}
