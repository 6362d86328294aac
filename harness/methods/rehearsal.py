"""Memory-based methods: GEM, A-GEM and experience replay."""
from __future__ import annotations

from .contract import MethodAdapter


def build_gem(ctx, patterns_per_exp: int, memory_strength: float):
    """Gradient Episodic Memory (needs a QP solver: qpsolvers[quadprog])."""
    from avalanche.training.supervised import GEM

    return GEM(patterns_per_exp=int(patterns_per_exp), memory_strength=float(memory_strength),
               **ctx.strategy_kwargs())


def build_agem(ctx, patterns_per_exp: int, sample_size: int):
    """Averaged GEM."""
    from avalanche.training.supervised import AGEM

    return AGEM(patterns_per_exp=int(patterns_per_exp), sample_size=int(sample_size),
                **ctx.strategy_kwargs())


def build_replay(ctx, mem_size: int):
    """Experience replay with Avalanche's experience-balanced buffer."""
    from avalanche.training.supervised import Replay

    return Replay(mem_size=int(mem_size), **ctx.strategy_kwargs())


ADAPTERS = (
    MethodAdapter("gem", {"patterns_per_exp": 64, "memory_strength": 0.5}, build_gem,
                  "Gradient Episodic Memory", "Lopez-Paz & Ranzato, NeurIPS 2017", family="rehearsal",
                  prefix_cache=True),
    MethodAdapter("agem", {"patterns_per_exp": 64, "sample_size": 64}, build_agem,
                  "Averaged GEM", "Chaudhry et al., ICLR 2019", family="rehearsal", prefix_cache=True),
    MethodAdapter("replay", {"mem_size": 200}, build_replay, "Experience replay",
                  "Chaudhry et al. 2019 (ER)", family="rehearsal"),
)
