"""Memory Aware Synapses by wrapping Avalanche's own `MASPlugin`.

The smallest useful adapter: an existing Avalanche plugin, its hyperparameters exposed
as DEFAULTS, added to plain sequential fine-tuning next to the harness's plugins.
"""
from __future__ import annotations

from harness.api.contract import Range

NAME = "mas"
DEFAULTS = {"lambda_reg": 1.0, "alpha": 0.5}
# The penalty weight is >= 0; the importance is updated as alpha * old + (1 - alpha) * new: a weight in [0, 1].
HPARAM_RANGES = {"lambda_reg": Range(low=0), "alpha": Range(0, 1)}
DESCRIPTION = "Memory Aware Synapses (wrapped avalanche MASPlugin example)"
REFERENCE = "Aljundi et al., Memory Aware Synapses, ECCV 2018"


def build(ctx, lambda_reg: float, alpha: float):
    """Naive + MASPlugin; `ctx.strategy_kwargs(extra)` keeps the harness plugins in."""
    from avalanche.training.plugins import MASPlugin
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs(MASPlugin(lambda_reg=float(lambda_reg), alpha=float(alpha))))
