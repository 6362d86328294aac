"""Model merging on top of fine-tuning: MagMax (Marczak et al., ECCV 2024) and baselines.

Training is Avalanche's Naive (sequential fine-tuning; or, with `finetune: independent`,
every task restarts the shared trainable parameters from θ0). After task t the plugin
hands the harness a *separate* merged model, θ0 + λ·merge(τ_1..τ_t), which the harness
evaluates and measures; training continues from the unmerged θ_t.

- θ0 follows the protocol's `pretrain`: `first-task` → the model after task 1 (so task 1
  contributes no task vector, the first τ appears at task 2, and the evaluated model after
  task 1 is θ_1 = θ0 itself); `none` → the initial model, captured before task 1; a pretrained
  backbone (`{checkpoint|dataset|torchvision: ...}`) → the pretrained model, captured before
  task 1, so task 1 contributes its task vector, as in MagMax.
- τ_i = θ_i − θ0 over the *effective* weights the regime changes (ctx.regime_params; W + BA
  for a LoRA layer, the biases under bitfit, every parameter of the trainable blocks under a
  depth regime; under `head` there are none and the evaluated model is the trained one). The
  merged model is a copy whose LoRA weights hold θ0 + λ·merge in the base with the adapters
  zeroed (harness.api.subspace). Frozen blocks, BatchNorm buffers and
  the heads of the evaluated model are the current model's. Heads are never merged: in
  task-IL, training task t gives gradients to head t only and the optimizer state is reset
  per task, so every earlier head is still exactly its own checkpoint (a test checks it);
  in class-IL the single head is shared and taken as trained last.
- Memory: θ0, the running merge and two per-element sign counters — constant in T for
  magmax, avg, task-arithmetic and randmix (per-element reservoir); ties keeps every τ_i.
- BatchNorm (`batchnorm`): a merged model is never evaluated with the running statistics of
  other weights unless asked. `recompute` (default) re-estimates the merged blocks' statistics
  on the current task's training data only (exemplar-free; one forward pass in train mode);
  `merge` merges the statistics' deltas by the same rule and λ as the weights (variances kept
  ≥ 0); `latest` keeps the unmerged model's statistics (the old behaviour, for ablations). The
  default was chosen by measurement: benchmarks/batchnorm.py. Without BatchNorm in the merged
  blocks the three are the same.
- Continual evaluation (`harness_eval_model_now`, the curve's mid-task points): the model the method
  would output if training stopped now, θ0 + λ·merge(τ_1..τ_{t-1}, θ_now − θ0) — the rule applied to the
  stored task vectors and the current one (MagMax: max-|τ| over the running best and τ_now; TIES: the
  batch rule over every stored τ_i and τ_now; sums: the running sum plus τ_now; RandMix: the reservoir's
  next draw from a copy of its generator), computed on copies: the running merger, its generator and the
  trained model are untouched, and nothing new is kept between tasks. BatchNorm as above: `recompute`
  on the current task's training data (the data the task's end model is recomputed on), `merge` merges
  the current statistics' delta with the stored ones, `latest` keeps the trained model's. Before θ0
  exists (task 1 under `pretrain: first-task`, where θ_1 = θ0) and under `head` (nothing merged) it is
  the trained model. At a task's last step it equals the task's evaluated model (tests/test_continual_merge.py).
"""
from __future__ import annotations

import copy
import math

import harness.compat  # noqa: F401  (quirks first)

import torch
from avalanche.core import SupervisedPlugin

from ..api.contract import MethodAdapter, Range
from ..api.subspace import effective_weights, write_effective
from . import _merge_rules as rules
from ._batchnorm import batchnorm_layers, recompute_statistics
from .gpm import dataset_batches, without_lone_batches

FINETUNE_MODES = ("sequential", "independent")
BATCHNORM_MODES = ("recompute", "merge", "latest")
RECOMPUTE_SAMPLES = 4096  # at most this many current-task samples re-estimate the statistics
REFERENCE = "Marczak et al., MagMax: Leveraging Model Merging for Seamless Continual Learning, ECCV 2024"


def merged_weights(model, names) -> dict:
    """The effective shared weights that carry task vectors (detached), by plain name."""
    return effective_weights(model, names) if names else {}


def trained_parameters(model) -> dict:
    """Copies of the shared parameters that train now (adapters under LoRA): `independent` restarts them."""
    return {n: p.detach().clone() for n, p in model.blocks.named_parameters(prefix="blocks") if p.requires_grad}


def merged_statistics(model, blocks) -> dict:
    """The running means/variances of the BatchNorm layers in the regime's trainable `blocks`."""
    names = {id(bn) for bn in batchnorm_layers(model, blocks)}
    out = {}
    for b in blocks:
        for module_name, module in model.blocks[b].named_modules():
            if id(module) in names and module.track_running_stats:
                prefix = f"blocks.{b}.{module_name}."
                out[prefix + "running_mean"] = module.running_mean
                out[prefix + "running_var"] = module.running_var
    return out


def merged_with(merger: rules.RunningMerger, tau: dict) -> dict:
    """merge(τ_1..τ_n, τ): what `merger.add(tau); merger.merged()` would give, leaving `merger` as it is.

    The rule runs on a shallow copy whose containers (dicts, lists) and generator (RandMix) are its own;
    the stored tensors are shared, and no rule's `add` writes into a stored tensor in place.
    """
    trial = copy.copy(merger)
    for name, value in vars(merger).items():
        if isinstance(value, torch.Generator):
            own = torch.Generator(device=value.device)
            own.set_state(value.get_state())
            setattr(trial, name, own)
        elif isinstance(value, (dict, list)):
            setattr(trial, name, copy.copy(value))
    trial.add(tau)
    return trial.merged()


def _elements(tau: dict) -> int:
    return sum(v.numel() for v in tau.values())


def _vector_norm(tau: dict) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for v in tau.values()))


class MergingPlugin(SupervisedPlugin):
    """Keeps θ0 and a running merge; evaluates θ0 + λ·merge, trains on the unmerged model."""

    def __init__(self, merger: rules.RunningMerger, lam: float, names, blocks, first_task: bool,
                 finetune: str = "sequential", rule: str = "", batchnorm: str = "recompute",
                 stats_merger: rules.RunningMerger | None = None, batch_size: int = 256):
        super().__init__()
        self.merger, self.lam, self.names, self.blocks = merger, float(lam), tuple(names), tuple(blocks)
        # first_task (pretrain: first-task): θ0 is the model after task 1, not the one before it
        self.first_task, self.finetune, self.rule = first_task, finetune, rule
        self.batchnorm, self.stats_merger, self.batch_size = batchnorm, stats_merger, batch_size
        self.theta0: dict | None = None
        self.raw0: dict | None = None  # the trained parameters at θ0 (LoRA: the adapters), for `independent`
        self.stats0: dict | None = None  # θ0's BatchNorm statistics (batchnorm: merge)
        self.dataset = None  # the current task's training data (batchnorm: recompute)
        self.signs = rules.SignCounter()
        self.norms: list = []            # ‖τ_i‖ in task-vector order
        self.norms_by_task: list = []    # after each task: the norms of every τ so far
        self.conflicts_by_task: list = []
        self.model = None
        self.scratch = None  # the "now" model's copy, reused within a task (never kept between tasks)
        # The merge's arithmetic (harness/run/compute.py reads it): one operation per merged parameter element
        # for each element-wise step, τ = θ − θ0 and folding τ into the running merge after a task, λ-scaling and
        # adding θ0 when the evaluated model is built; a rule's sorting or selection (TIES's top-k) is not
        # counted, nor the harness's mid-task curve points (harness_eval_model_now).
        self.harness_merge_ops = 0

    def before_training_exp(self, strategy, **kwargs):
        self.model, self.scratch = strategy.model, None
        self.dataset = strategy.experience.dataset  # the current task's, for the "now" model's statistics
        if self.theta0 is None and not self.first_task:
            self._capture_theta0(strategy.model)
        elif self.theta0 is not None and self.finetune == "independent":
            current = dict(strategy.model.blocks.named_parameters(prefix="blocks"))
            with torch.no_grad():  # heads, frozen blocks and buffers stay as they are
                for k, value in self.raw0.items():
                    current[k].copy_(value)

    def _capture_theta0(self, model) -> None:
        self.theta0 = {k: v.clone() for k, v in merged_weights(model, self.names).items()}
        self.raw0 = trained_parameters(model)
        self.stats0 = self._statistics(model)

    def after_training_exp(self, strategy, **kwargs):
        self.model, self.scratch = strategy.model, None
        self.dataset = strategy.experience.dataset
        if self.theta0 is None:  # pretrain = first-task: task 1 *is* θ0
            self._capture_theta0(strategy.model)
        else:
            current = merged_weights(strategy.model, self.names)
            tau = {k: v - self.theta0[k] for k, v in current.items()}
            self.merger.add(tau)
            self.harness_merge_ops += 2 * _elements(tau)
            if self.stats0:
                self.stats_merger.add({k: v - self.stats0[k] for k, v in self._statistics(strategy.model).items()})
            self.signs.add(tau)
            self.norms.append(_vector_norm(tau))
        self.norms_by_task.append(list(self.norms))
        self.conflicts_by_task.append(self.signs.conflict_fraction())

    def merged_vector(self) -> dict:
        """λ·merge(τ_1..τ_t) per merged parameter (empty before the first task vector)."""
        if self.merger.n == 0:
            return {}
        return {k: self.lam * v for k, v in self.merger.merged().items()}

    def harness_eval_model(self):
        """A copy of the current model whose merged parameters are θ0 + λ·merge(τ_1..τ_t)."""
        vector = self.merged_vector()
        if not vector:  # no task vector yet (θ_1 = θ0) or nothing merged (regime `head`)
            return self.model
        stats = self.stats_merger.merged() if self._merges_statistics() and self.stats_merger.n else None
        self.harness_merge_ops += 2 * _elements(vector)
        return self._merged_model(vector, stats)

    def harness_eval_model_now(self):
        """Mid-task: θ0 + λ·merge(τ_1..τ_{t-1}, θ_now − θ0), a copy (module docstring); None (the trained
        model) before θ0 exists or when nothing is merged."""
        if self.theta0 is None or not self.names or self.model is None:
            return None
        current = merged_weights(self.model, self.names)
        merged = merged_with(self.merger, {k: v - self.theta0[k] for k, v in current.items()})
        stats = None
        if self._merges_statistics():
            delta = {k: v - self.stats0[k] for k, v in self._statistics(self.model).items()}
            stats = merged_with(self.stats_merger, delta)
        return self._merged_model({k: self.lam * v for k, v in merged.items()}, stats, self._scratch_copy())

    def _scratch_copy(self):
        """A copy of the trained model as it is now: the task's first call deep-copies it, later calls copy
        its tensors and train/eval flags into that copy (a twentieth of the time; the same values). Valid
        until the next call; dropped at the task's end, so nothing is kept between tasks."""
        if self.scratch is None:
            self.scratch = copy.deepcopy(self.model)
            return self.scratch
        with torch.no_grad():
            mine = self.scratch.state_dict(keep_vars=True)
            for k, v in self.model.state_dict(keep_vars=True).items():
                mine[k].copy_(v)
        for a, b in zip(self.scratch.modules(), self.model.modules()):
            a.training = b.training
        return self.scratch

    def _merges_statistics(self) -> bool:
        return self.batchnorm == "merge" and bool(self.stats0)

    def _merged_model(self, vector: dict, stats: dict | None, evaluated=None):
        """A copy of the trained model (`evaluated`, else a new one) with θ0 + vector in the merged weights and
        statistics of its own."""
        evaluated = copy.deepcopy(self.model) if evaluated is None else evaluated
        write_effective(evaluated, {k: self.theta0[k] + vector[k] for k in vector})
        self._set_statistics(evaluated, stats)
        return evaluated

    def _statistics(self, model) -> dict:
        """Copies of the statistics the `merge` policy merges (empty for the other policies)."""
        if self.batchnorm != "merge" or self.stats_merger is None:
            return {}
        return {k: v.detach().clone() for k, v in merged_statistics(model, self.blocks).items()}

    def _set_statistics(self, evaluated, merged: dict | None) -> None:
        """Give the merged model statistics of its own weights (see the module docstring); `merged`: the
        merge of the statistics' deltas (batchnorm: merge)."""
        if self.batchnorm == "merge" and self.stats0 and merged is not None:
            with torch.no_grad():
                for k, buf in merged_statistics(evaluated, self.blocks).items():
                    value = self.stats0[k] + self.lam * merged[k]
                    buf.copy_(value.clamp_min(0) if k.endswith("running_var") else value)
        elif self.batchnorm == "recompute" and self.dataset is not None:
            device = next(evaluated.parameters()).device
            n = min(len(self.dataset), RECOMPUTE_SAMPLES)
            idx = torch.linspace(0, len(self.dataset) - 1, n).round().long()
            lone_free = without_lone_batches(evaluated, dataset_batches(self.dataset, idx, self.batch_size, device))
            batches = (x for x, _ in lone_free)
            recompute_statistics(evaluated, self.blocks, batches)

    def harness_diagnostics(self) -> dict:
        """Per task: ‖τ_i‖ of every task vector so far, and their sign-conflict fraction."""
        return {"task_vector_norms": [list(n) for n in self.norms_by_task],
                "sign_conflicts": list(self.conflicts_by_task),
                "merge": {"rule": self.rule, "lambda": self.lam, "finetune": self.finetune,
                          "batchnorm": self.batchnorm, "n_task_vectors": self.merger.n}}

    def stored_tensors(self) -> list:
        """Every parameter-shaped tensor the plugin keeps between tasks (memory accounting)."""
        theta0 = list(self.theta0.values()) if self.theta0 else []
        stats = [*self.stats0.values(), *self.stats_merger.tensors()] if self.stats0 else []
        return [*theta0, *self.merger.tensors(), *self.signs.tensors(), *stats]


def _check_finetune(method: str, finetune: str) -> str:
    if finetune not in FINETUNE_MODES:
        raise ValueError(f"{method}: hyperparameter finetune must be one of "
                         f"{', '.join(FINETUNE_MODES)}; got {finetune!r}")
    return finetune


def _check_batchnorm(method: str, batchnorm: str) -> str:
    if batchnorm not in BATCHNORM_MODES:
        raise ValueError(f"{method}: hparams.batchnorm={batchnorm!r}; allowed: {', '.join(BATCHNORM_MODES)}")
    return batchnorm


def _merged_names(ctx) -> tuple:
    """The effective weights task vectors cover: ctx.regime_params; a context made without them
    (by hand, before regimes beyond depth) means every parameter of ctx.regime_blocks."""
    if ctx.regime_params or not ctx.regime_blocks:
        return tuple(ctx.regime_params)
    return tuple(f"blocks.{b}.{n}" for b in ctx.regime_blocks for n, _ in ctx.model.blocks[b].named_parameters())


def _strategy(ctx, method: str, make_merger, lam: float, finetune: str, batchnorm: str):
    """Naive training with the merging plugin; `make_merger()` gives the rule's running merger
    (a second one merges BatchNorm statistics under `batchnorm: merge`)."""
    from avalanche.training.supervised import Naive

    plugin = MergingPlugin(make_merger(), lam, _merged_names(ctx), ctx.regime_blocks, ctx.pretrain.first_task,
                           _check_finetune(method, finetune), rule=method,
                           batchnorm=_check_batchnorm(method, batchnorm), stats_merger=make_merger(),
                           batch_size=ctx.eval_mb_size)
    return Naive(**ctx.strategy_kwargs(plugin))


def build_magmax(ctx, lam: float, finetune: str, batchnorm: str):
    """MagMax: per element the largest-magnitude τ_i (ties → later task), θ0 + λ·τ_max."""
    return _strategy(ctx, "magmax", rules.MagMaxMerger, lam, finetune, batchnorm)


def build_avg(ctx, finetune: str, batchnorm: str):
    """Weight averaging: θ0 + (1/n) Σ τ_i over the n task vectors so far."""
    return _strategy(ctx, "avg", lambda: rules.SumMerger(average=True), 1.0, finetune, batchnorm)


def build_task_arithmetic(ctx, lam: float, finetune: str, batchnorm: str):
    """Task arithmetic (Ilharco et al. 2023): θ0 + λ Σ τ_i."""
    return _strategy(ctx, "task-arithmetic", lambda: rules.SumMerger(average=False), lam, finetune, batchnorm)


def build_ties(ctx, top_k: float, lam: float, finetune: str, batchnorm: str):
    """TIES: trim each τ_i to its top-k %, elect signs, disjoint mean; θ0 + λ·merged."""
    return _strategy(ctx, "ties", lambda: rules.TiesMerger(top_k), lam, finetune, batchnorm)


def build_randmix(ctx, lam: float, seed: int, finetune: str, batchnorm: str):
    """RandMix: per element τ_i of a uniformly random task (seeded by run seed and `seed`)."""
    make = lambda: rules.RandMixMerger(seed=int(ctx.seed) * 100_003 + int(seed))  # noqa: E731
    return _strategy(ctx, "randmix", make, lam, finetune, batchnorm)


_SEQ = {"finetune": "sequential", "batchnorm": "recompute"}
# λ scales the merged task vectors (θ0 + λ·merge): a negative λ moves away from every task (task negation,
# not continual learning); TIES keeps the top_k % largest entries of each τ_i, a percentage in (0, 100].
_SEQ_RANGES = {"finetune": Range(choices=FINETUNE_MODES), "batchnorm": Range(choices=BATCHNORM_MODES)}
_LAM = {"lam": Range(low=0)}
# 2: merged models get BatchNorm statistics of their own weights (`batchnorm`); ties: official rounding
_MERGE = dict(family="merging", prefix_cache=True, version="2", captions={
    "sign_conflicts": "fraction of sign conflicts among the task vectors, per task",
    "task_vector_norms": "task-vector norms ‖τ_i‖ after each task"})
ADAPTERS = (
    MethodAdapter("magmax", {"lam": 0.5, **_SEQ}, build_magmax,
                  "MagMax: sequential fine-tuning + max-magnitude merging of task vectors",
                  REFERENCE, hparam_ranges={**_LAM, **_SEQ_RANGES}, **_MERGE),
    MethodAdapter("avg", dict(_SEQ), build_avg, "Weight averaging of task vectors",
                  "Wortsman et al., ICML 2022 (model soups); baseline in " + REFERENCE,
                  hparam_ranges=dict(_SEQ_RANGES), **_MERGE),
    MethodAdapter("task-arithmetic", {"lam": 0.3, **_SEQ}, build_task_arithmetic,
                  "Task arithmetic: θ0 + λ Σ τ_i", "Ilharco et al., ICLR 2023",
                  hparam_ranges={**_LAM, **_SEQ_RANGES}, **_MERGE),
    MethodAdapter("ties", {"top_k": 20.0, "lam": 0.55, **_SEQ}, build_ties,
                  "TIES-merging: trim, elect sign, disjoint mean", "Yadav et al., NeurIPS 2023",
                  hparam_ranges={"top_k": Range(0, 100, low_open=True), **_LAM, **_SEQ_RANGES}, **_MERGE),
    MethodAdapter("randmix", {"lam": 1.0, "seed": 0, **_SEQ}, build_randmix,
                  "Random per-element mixing of task vectors", "baseline in " + REFERENCE,
                  hparam_ranges={**_LAM, "seed": Range(low=0), **_SEQ_RANGES}, **_MERGE),
)
