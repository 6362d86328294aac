"""BECAME (Li et al., ICML 2025): GPM stage, free stage, closed-form Bayesian merge.

Per task t ≥ 2, inside one `strategy.train(experience)`: stage 1 trains with GPM
projection → θ_gp; stage 2 trains from θ_gp with a fresh optimizer, unprojected, over the
same trainable parameters → θ_free; α = Σ F_t δ² / Σ (F_t + F_old) δ² with δ = θ_free − θ_gp
and F_t the diagonal Fisher at θ_free; θ_t = (1−α)θ_gp + αθ_free; F_old += F_t(θ_t); the
GPM memory is updated from θ_t. Task 1 trains normally, then F_old = F_1 and memory.

- α sums over every trainable parameter, the current head included, as the official code
  does (`alpha_include_heads: false` is the heads-excluded ablation); both closed forms are
  recorded (`alpha_closed_form_all`, `alpha_closed_form_shared`).
- Budget (`stages`): `split` (default) gives the two stages ⌈E/2⌉ and ⌊E/2⌋ of the protocol's
  E epochs, so BECAME takes the optimizer steps of every other method; `full` is the
  official schedule, E epochs per stage (2× the steps): label it as such in a protocol.
  `stage1_epochs`/`stage2_epochs` override either.
- BatchNorm in the projected blocks follows GPM's `batchnorm` policy (methods/gpm.py).
- Continual evaluation: no `harness_eval_model_now`, so mid-task points evaluate the trained model. In
  stage 1 (and task 1) that is what BECAME would output if stopped there (θ_gp; δ = 0). In stage 2 the
  answer would be (1−α)θ_gp + α·θ_now, but the default α (`auto`) needs the Fisher at θ_now: a
  forward/backward pass over `fisher_samples` rows at every point (on digits ~5 training steps' work, up
  to 32 on larger tasks), not cheap; fixed α would be cheap, but then `became` and its α ablations would
  plot different things (and α = 1 is the trained model anyway). The end points show the merge.
"""
from __future__ import annotations

from dataclasses import dataclass

import harness.compat  # noqa: F401

import torch
from avalanche.training.templates import SupervisedTemplate

from ..api.contract import BATCH_GENERATOR_ATTRIBUTE, MethodAdapter, Range
from ..config.vocabulary import Family
from ._gpm_math import closed_form_alpha, diag_fisher, merge_tensors
from .gpm import (
    GPM_DEFAULTS,
    GPM_RANGES,
    GPM_REGIME_NOTE,
    GPMMemory,
    apply_batchnorm_policy,
    check_batchnorm_policy,
    check_gpm_hparams,
    dataset_batches,
    sample_indices,
    without_lone_batches,
)

STAGE_BUDGETS = ("split", "full")
BECAME_DEFAULTS = {"stages": "split", "stage1_epochs": None, "stage2_epochs": None, "stage2_lr": None,
                   **GPM_DEFAULTS, "fisher_samples": 2048, "alpha": "auto",
                   "alpha_include_heads": True, "alpha_sweep": False}
# Null defaults mean "the protocol's": the types a protocol may give instead.
BECAME_TYPES = {"stage1_epochs": (int, None), "stage2_epochs": (int, None), "stage2_lr": (float, None),
                "fisher_samples": (int, None), "alpha": (str, float)}
# What the code can mean (the checks of _config, at load): the merge coefficient α is a convex weight
# (θ = (1−α)θ_gp + αθ_free), each stage trains at least one epoch on at least one Fisher sample, at a positive lr.
BECAME_RANGES = {**GPM_RANGES, "stages": Range(choices=STAGE_BUDGETS), "stage1_epochs": Range(low=1),
                 "stage2_epochs": Range(low=1), "stage2_lr": Range(low=0, low_open=True),
                 "fisher_samples": Range(low=1), "alpha": Range(0, 1, choices=("auto",))}
SWEEP_GRID = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class BecameConfig:
    """Validated BECAME hyperparameters (None epochs/lr: the protocol's)."""

    first_epochs: int  # task 1 trains normally: the protocol's epochs
    stage1_epochs: int
    stage2_epochs: int
    stage2_lr: float | None
    fisher_samples: int | None
    alpha: str | float
    include_heads: bool
    sweep: bool


def _config(ctx, hp: dict) -> BecameConfig:
    check_gpm_hparams("became", hp["eps_base"], hp["eps_step"], hp["n_samples"])
    check_batchnorm_policy("became", hp["batchnorm"])
    first, second = _stage_epochs(hp["stages"], ctx.train_epochs, hp)
    return BecameConfig(
        first_epochs=ctx.train_epochs,
        stage1_epochs=_positive_int(hp["stage1_epochs"], "stage1_epochs", first),
        stage2_epochs=_positive_int(hp["stage2_epochs"], "stage2_epochs", second),
        stage2_lr=_optional_lr(hp["stage2_lr"]),
        fisher_samples=_positive_int(hp["fisher_samples"], "fisher_samples", None),
        alpha=_alpha(hp["alpha"]), include_heads=_flag(hp["alpha_include_heads"], "alpha_include_heads"),
        sweep=_flag(hp["alpha_sweep"], "alpha_sweep"))


def _stage_epochs(stages, epochs: int, hp: dict) -> tuple[int, int]:
    """The default epochs of the two stages: the protocol's split between them, or each all of them."""
    if stages not in STAGE_BUDGETS:
        raise ValueError(f"became: hparams.stages={stages!r}; allowed: {', '.join(STAGE_BUDGETS)}")
    if stages == "full":
        return epochs, epochs
    if epochs < 2 and (hp["stage1_epochs"] is None or hp["stage2_epochs"] is None):
        raise ValueError(f"became: hparams.stages='split' needs training.epochs >= 2 to give each stage an "
                         f"epoch (the protocol has {epochs}); allowed: stages 'full' or explicit stage epochs")
    return epochs - epochs // 2, epochs // 2


def _positive_int(value, key, default):
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"became: hparams.{key}={value!r}; allowed: an integer >= 1 or null")
    return value


def _optional_lr(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"became: hparams.stage2_lr={value!r}; allowed: a number > 0 or null (protocol lr)")
    return float(value)


def _alpha(value):
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"became: hparams.alpha={value!r}; allowed: 'auto' or a number in [0, 1]")
    return float(value)


def _flag(value, key):
    if not isinstance(value, bool):
        raise ValueError(f"became: hparams.{key}={value!r}; allowed: true or false")
    return value


class BecameStrategy(SupervisedTemplate):
    """A SupervisedTemplate whose per-experience training runs BECAME's two stages and merge."""

    def __init__(self, *, ctx, cfg: BecameConfig, memory: GPMMemory):
        super().__init__(**ctx.strategy_kwargs())
        self.ctx, self.cfg, self.memory = ctx, cfg, memory
        self.f_old: dict[str, torch.Tensor] = {}
        self.task, self.stage = 0, 0
        self.alphas, self.closed_forms, self.sweeps = [], [], []
        self.harness_merge_ops = 0  # element operations of every merge (harness/run/compute.py reads it)
        self.closed_all, self.closed_shared = [], []
        self.theta_gp: dict[str, torch.Tensor] = {}
        self.theta_free: dict[str, torch.Tensor] = {}

    def _after_backward(self, **kwargs):
        if self.stage == 1:  # GPM projection only in the stability stage
            self.memory.project(self.model)
        super()._after_backward(**kwargs)

    def _train_exp(self, experience, eval_streams=None, **kwargs):
        dataset = experience.dataset
        if self.task == 0:
            self._run_stage(0, self.cfg.first_epochs, None, experience, eval_streams, **kwargs)
            self.f_old = self._fisher(dataset, "first")
            for series in (self.alphas, self.closed_forms, self.sweeps, self.closed_all, self.closed_shared):
                series.append(None)
        else:
            self._two_stages(experience, eval_streams, **kwargs)
        self.memory.update(self.model, dataset, self.ctx.eval_mb_size)
        self.task += 1

    def _run_stage(self, stage, epochs, optimizer, experience, eval_streams, **kwargs):
        saved_epochs, saved_opt = self.train_epochs, self.optimizer
        self.stage, self.train_epochs = stage, epochs
        self.optimizer = optimizer or saved_opt
        try:
            super()._train_exp(experience, eval_streams, **kwargs)
        finally:  # the harness resets the base optimizer at the next task boundary
            self.stage, self.train_epochs, self.optimizer = 0, saved_epochs, saved_opt

    def _two_stages(self, experience, eval_streams, **kwargs):
        self._run_stage(1, self.cfg.stage1_epochs, None, experience, eval_streams, **kwargs)
        self.theta_gp = self._snapshot()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        fresh = self.ctx.new_optimizer(trainable, lr=self.cfg.stage2_lr)
        # Stage 2 must not shift later tasks' minibatch order: with it restored, BECAME at
        # alpha = 0 is the same run as GPM, not GPM with other batches.
        generator = getattr(self, BATCH_GENERATOR_ATTRIBUTE, None)
        state = generator.get_state() if generator is not None else None
        self._run_stage(2, self.cfg.stage2_epochs, fresh, experience, eval_streams, **kwargs)
        if state is not None:
            generator.set_state(state)
        self.theta_free = self._snapshot()
        f_free = self._fisher(experience.dataset, "free")
        closed_all, closed_shared = (self._closed_form(f_free, heads) for heads in (True, False))
        self.closed_all.append(closed_all)
        self.closed_shared.append(closed_shared)
        closed = closed_all if self.cfg.include_heads else closed_shared
        alpha = closed if self.cfg.alpha == "auto" else self.cfg.alpha
        self.sweeps.append(self._sweep(closed, alpha) if self.cfg.sweep else None)
        self.merge(alpha)
        for name, f in self._fisher(experience.dataset, "merged").items():
            self.f_old[name] = self.f_old[name] + f if name in self.f_old else f.clone()
        self.alphas.append(alpha)
        self.closed_forms.append(closed)

    @property
    def harness_stage(self) -> int:
        """The stage being trained (0: task 1, 1: GPM stage, 2: free stage), for the record's budget."""
        return self.stage

    def _closed_form(self, f_free: dict, include_heads: bool) -> float:
        names = self._alpha_names(include_heads)
        delta = {n: self.theta_free[n] - self.theta_gp[n] for n in names}
        return closed_form_alpha(f_free, self.f_old, delta)

    def _alpha_names(self, include_heads: bool) -> list[str]:
        """Shared trainable parameters, plus every head when `include_heads`."""
        return [n for n, p in self.model.named_parameters() if p.requires_grad
                and (n.startswith("blocks.") or (include_heads and n.startswith("heads.")))]

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """Trainable parameters and the buffers of non-frozen blocks (BatchNorm statistics)."""
        out = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        frozen = {f"blocks.{b}." for b in self.model.frozen_blocks}
        for n, b in self.model.named_buffers():
            if not any(n.startswith(f) for f in frozen):
                out[n] = b.detach().clone()
        return out

    @torch.no_grad()
    def merge(self, alpha: float) -> None:
        """Set the model to (1−α)·θ_gp + α·θ_free (parameters and non-frozen buffers)."""
        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        for name, gp in self.theta_gp.items():
            tensors[name].copy_(merge_tensors(gp, self.theta_free[name], alpha))
            self.harness_merge_ops += 3 * gp.numel()  # (1−α)·gp + α·free: three operations per element

    def _fisher(self, dataset, purpose: str) -> dict[str, torch.Tensor]:
        """Diagonal Fisher of the trainable parameters on (a seeded subset of) the task's data."""
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        limit = self.cfg.fisher_samples or len(dataset)
        idx = sample_indices(len(dataset), limit, self.ctx.seed + 7919, self.task)
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        was_training = self.model.training
        self.model.train()  # the spec: train mode; BatchNorm statistics restored below
        try:
            batches = without_lone_batches(self.model, dataset_batches(dataset, idx, self.ctx.train_mb_size,
                                                                       self.device))
            return diag_fisher(self.model, batches, params)
        finally:
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    b.copy_(buffers[n])
            self.model.train(was_training)

    def _sweep(self, closed: float, alpha: float) -> dict:
        """Mean test accuracy on tasks 1..t at α ∈ {0, 0.1, …, 1} (diagnostic only)."""
        seen = self.ctx.tasks[:self.task + 1]
        grid = []
        was_training = self.model.training
        self.model.eval()
        try:
            for a in SWEEP_GRID:
                self.merge(a)
                accs = [self.ctx.accuracy(self.model, t) for t in seen]
                grid.append({"alpha": a, "acc_seen": sum(accs) / len(accs)})
        finally:
            self.model.train(was_training)
        return {"closed_form": closed, "alpha": alpha, "grid": grid}

    def harness_diagnostics(self) -> dict:
        """α per task (None for task 1), the closed form, the optional sweep, GPM memory dims."""
        out = {"alpha": list(self.alphas), "alpha_closed_form": list(self.closed_forms),
               "alpha_closed_form_all": list(self.closed_all), "alpha_closed_form_shared": list(self.closed_shared),
               "stage_epochs": [self.cfg.stage1_epochs, self.cfg.stage2_epochs], **self.memory.diagnostics()}
        if self.cfg.sweep:
            out["alpha_sweep"] = list(self.sweeps)
        return out


def build_became(ctx, **hparams):
    """BECAME on the regime's shared trainable layers (see module docstring)."""
    cfg = _config(ctx, hparams)
    if cfg.sweep and not ctx.tasks:
        raise ValueError("became: hparams.alpha_sweep=true needs the run's tasks (MethodContext.tasks)")
    memory = GPMMemory(ctx.regime_blocks, hparams["eps_base"], hparams["eps_step"], hparams["n_samples"], ctx.seed)
    apply_batchnorm_policy(ctx.model, ctx.regime_blocks, hparams["batchnorm"], memory)
    return BecameStrategy(ctx=ctx, cfg=cfg, memory=memory)


ADAPTERS = (
    MethodAdapter("became", dict(BECAME_DEFAULTS), build_became,
                  "BECAME: GPM stage + free stage, merged with a closed-form Bayesian coefficient",
                  "Li et al., ICML 2025", family="gpm", prefix_cache=True, hparam_types=BECAME_TYPES,
                  hparam_ranges=BECAME_RANGES,
                  # 2: BatchNorm policy; α over every trainable parameter (heads too); stages split the epochs
                  version="2", captions={
                      "alpha": "BECAME merge coefficient α per task",
                      "alpha_closed_form": "closed-form α per task (before any fixed-α override)",
                      "alpha_closed_form_all": "closed-form α over every trainable parameter (heads included)",
                      "alpha_closed_form_shared": "closed-form α over the shared blocks only (heads excluded)",
                      "stage_epochs": "epochs of the GPM stage and of the free stage",
                      "gpm_memory_dims": "GPM memory dimension per layer after each task"},
                  regime_families=(Family.DEPTH,), regime_note=GPM_REGIME_NOTE),
)
