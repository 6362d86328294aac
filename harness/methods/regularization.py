"""Regularisation methods: online EWC, LwF, Synaptic Intelligence."""
from __future__ import annotations

from ..api.contract import MethodAdapter, Range


def fix_synaptic_intelligence_on_cpu() -> None:
    """Avalanche 0.6's SI snapshots weights with `param.detach().cpu().flatten()`, which on
    the CPU is a view of the live parameter, not a copy: the "old" and "new" weights are
    the same tensor, every importance is 0 and SI silently equals naive fine-tuning. Copy."""
    import torch
    from avalanche.training.plugins.synaptic_intelligence import SynapticIntelligencePlugin as SI

    if getattr(SI, "_cl_bench_fixed", False):
        return

    @torch.no_grad()
    def extract_weights(model, target, excluded_parameters):
        for name, param in SI.allowed_parameters(model, excluded_parameters):
            target[name].data = param.detach().flatten().to("cpu", copy=True)

    @torch.no_grad()
    def extract_grad(model, target, excluded_parameters):
        for name, param in SI.allowed_parameters(model, excluded_parameters):
            target[name].data = param.grad.detach().flatten().to("cpu", copy=True)

    SI.extract_weights = staticmethod(extract_weights)
    SI.extract_grad = staticmethod(extract_grad)
    SI._cl_bench_fixed = True


# Process-wide, as soon as the built-in methods are discovered: a submission that wraps
# Avalanche's SynapticIntelligencePlugin gets the fixed plugin too.
fix_synaptic_intelligence_on_cpu()


def build_ewc_online(ctx, ewc_lambda: float, decay_factor: float):
    """Online EWC (Schwarz et al. 2018) through Avalanche's EWC(mode='online')."""
    from avalanche.training.supervised import EWC

    return EWC(ewc_lambda=float(ewc_lambda), mode="online", decay_factor=float(decay_factor),
               keep_importance_data=False, **ctx.strategy_kwargs())


def build_lwf(ctx, alpha: float, temperature: float):
    """Learning without Forgetting (Li & Hoiem 2016)."""
    from avalanche.training.supervised import LwF

    return LwF(alpha=float(alpha), temperature=float(temperature), **ctx.strategy_kwargs())


def build_si(ctx, si_lambda: float, eps: float):
    """Synaptic Intelligence (Zenke et al. 2017); eval_mb_size is passed explicitly (default 1)."""
    from avalanche.training.supervised import SynapticIntelligence

    return SynapticIntelligence(si_lambda=float(si_lambda), eps=float(eps), **ctx.strategy_kwargs())


ADAPTERS = (
    # A penalty weight < 0 rewards forgetting; online EWC's γ decays the old importance (γ > 1 would grow it).
    MethodAdapter("ewc-online", {"ewc_lambda": 100.0, "decay_factor": 0.9}, build_ewc_online,
                  "Online Elastic Weight Consolidation", "Schwarz et al., ICML 2018",
                  family="regularization", prefix_cache=True,
                  hparam_ranges={"ewc_lambda": Range(low=0), "decay_factor": Range(0, 1)}),
    # The distillation weight is >= 0; the softmax temperature divides the logits: > 0.
    MethodAdapter("lwf", {"alpha": 1.0, "temperature": 2.0}, build_lwf,
                  "Learning without Forgetting", "Li & Hoiem, ECCV 2016", family="regularization",
                  hparam_ranges={"alpha": Range(low=0), "temperature": Range(low=0, low_open=True)}),
    # Avalanche clips SI's per-parameter importance at 0.001 (and scales it by c = 0.0015),
    # so its lambda lives on a ~1000x larger scale than the paper's c.
    # ξ (eps) damps the importance's denominator Δθ² + ξ: > 0 keeps it finite.
    MethodAdapter("si", {"si_lambda": 1000.0, "eps": 1e-7}, build_si, "Synaptic Intelligence",
                  "Zenke et al., ICML 2017", family="regularization", prefix_cache=True,
                  hparam_ranges={"si_lambda": Range(low=0), "eps": Range(low=0, low_open=True)}),
)
