"""RanPAC (McDonnell et al., NeurIPS 2023): frozen pretrained features -> a fixed random projection -> ReLU ->
a ridge-regression classifier updated in closed form from accumulated second-order statistics.

Follows the official code (github.com/RanPAC/RanPAC, RanPAC.py: `setup_RP`, `replace_fc`,
`optimise_ridge_parameter`; inc_net.py `CosineLinear.forward` with `use_RP`):
- W_rand: a (d, M) standard Gaussian matrix, drawn once (here from a generator seeded with the run's seed, on the
  CPU, so every device draws the same matrix); M = 10000 by default (`M`; 0: no projection, the features
  themselves, the official's "decorrelation only" variant).
- Per task, from one pass over its training data: H = ReLU(F W_rand), Y one-hot over every class of the run;
  G += HᵀH, Q += HᵀY; λ = `optimise_ridge_parameter(H, Y)`: for λ in 10^-8 .. 10^8 the ridge solution fitted
  on the first 80 % of the task's rows (in the order the training pass saw them: the harness's seeded shuffle,
  as the official shuffling loader) is scored by the MSE of its predictions on the other 20 %, the smallest
  wins (the first on ties); W_o = ((G + λI)⁻¹ Q)ᵀ through `torch.linalg.solve`.
- Logits: ReLU(f W_rand) W_oᵀ (sigma 1), over the classes seen so far (-inf for the others: the official head
  has no row for them).
- First session: under `head` nothing of the backbone trains (the official `ncm` rows of its tables); under a
  PEFT regime (bitfit, norm, lora, prompt, prompt-deep; the official adapter/SSF/VPT rows) task 1 trains what the
  regime trains with the harness's head and optimizer, then the backbone is frozen and RanPAC runs on the adapted
  model's features (the official uses only the adapted backbone, unlike APER's concatenation).

Deviations: (1) the first session trains the harness's linear head with the protocol's optimizer and epochs (the
official trains a cosine head with SGD, a cosine schedule and its own epochs) — first-session settings are the
protocol's, for equal budgets; (2) the statistics and the solve run in float32 on the run's device (the official
moves them to the CPU, float32: the same arithmetic, other kernels); (3) W_rand comes from a seeded CPU generator
(the official draws it from the global RNG). No hyperparameter restores (1) beyond the protocol's training block.
"""
from __future__ import annotations

import harness.compat  # noqa: F401

import numpy as np
import torch
import torch.nn.functional as F

from ..api.contract import MethodAdapter, Range
from ..config.vocabulary import HEAD, Family, Scenario, parse_regime
from .prototypes import (
    PEFT_FAMILIES,
    PEFT_WORDS,
    FrozenFeatureStrategy,
    adapts_first_session,
    class_il_only,
    model_features,
)

RIDGES = 10.0 ** np.arange(-8, 9)  # the official candidate grid (numpy float64, as in RanPAC.py)
FIT_FRACTION = 0.8  # the official: the first 80 % of the rows fit, the rest validate


def ranpac_regimes(regime: str) -> str | None:
    """RanPAC keeps its backbone frozen: `head`, or a PEFT first session."""
    if regime == HEAD or parse_regime(regime).family in PEFT_FAMILIES:
        return None
    return f"RanPAC keeps the backbone frozen; allowed: head, or a first-session PEFT adaptation ({PEFT_WORDS})"


def random_projection(width: int, m: int, seed: int) -> torch.Tensor:
    """The fixed (width, M) standard Gaussian matrix W_rand, from a CPU generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randn(int(width), int(m), generator=generator)


def one_hot(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """The official `target2onehot`: float rows with a 1 at each label."""
    out = torch.zeros(labels.shape[0], n_classes, device=labels.device)
    out.scatter_(dim=1, index=labels.long().view(-1, 1), value=1.0)
    return out


def choose_ridge(features: torch.Tensor, targets: torch.Tensor) -> float:
    """The official `optimise_ridge_parameter`: the λ of RIDGES whose ridge fit on the first 80 % of the rows
    has the smallest MSE on the rest."""
    n_fit = int(features.shape[0] * FIT_FRACTION)
    fit, val = features[:n_fit], features[n_fit:]
    q, g = fit.T @ targets[:n_fit], fit.T @ fit
    eye = torch.eye(g.shape[0], device=g.device)
    losses = []
    for ridge in RIDGES:
        w = torch.linalg.solve(g + ridge * eye, q).T
        losses.append(float(F.mse_loss(val @ w.T, targets[n_fit:])))
    return float(RIDGES[int(np.argmin(np.array(losses)))])


class RidgeClassifier:
    """RanPAC's head: W_rand, the accumulated G and Q, the chosen λ per task and W_o."""

    def __init__(self, n_classes: int, m: int, seed: int):
        self.n_classes, self.m, self.seed = int(n_classes), int(m), int(seed)
        self.w_rand = self.gram = self.q = self.w_out = None
        self.known = torch.zeros(self.n_classes, dtype=torch.bool)
        self.lambdas: list[float] = []

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """H = ReLU(F W_rand) (M = 0: F itself)."""
        features = features.float()
        return features if self.w_rand is None else F.relu(features @ self.w_rand)

    def learn(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the task's statistics, choose λ on its rows, solve for W_o."""
        if self.gram is None:
            if self.m > 0:
                self.w_rand = random_projection(features.shape[1], self.m, self.seed).to(features.device)
            width = self.m if self.m > 0 else features.shape[1]
            self.gram = torch.zeros(width, width, device=features.device)
            self.q = torch.zeros(width, self.n_classes, device=features.device)
            self.known = self.known.to(features.device)
        h, y = self.project(features), one_hot(labels, self.n_classes).to(features.device)
        self.q += h.T @ y
        self.gram += h.T @ h
        ridge = choose_ridge(h, y)
        self.lambdas.append(ridge)
        eye = torch.eye(self.gram.shape[0], device=self.gram.device)
        self.w_out = torch.linalg.solve(self.gram + ridge * eye, self.q).T
        self.known[torch.unique(labels)] = True

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        out = F.linear(self.project(features), self.w_out)
        return out.masked_fill(~self.known, float("-inf"))

    def state(self) -> dict:
        """`prototypes.ridge`: W_o's rows of the classes seen so far, (classes, M)."""
        return {} if self.w_out is None else {"prototypes.ridge": self.w_out[self.known].detach()}

    def tensors(self) -> tuple:
        kept = (self.w_rand, self.gram, self.q, self.w_out, self.known)
        return tuple(t for t in kept if t is not None)

    def diagnostics(self) -> dict:
        return {"ranpac_lambda": list(self.lambdas)}


def build_ranpac(ctx, M: int = 10000):
    """Random projection + ReLU of the frozen features, ridge classifier from accumulated statistics."""
    class_il_only(ctx, "ranpac")
    classifier = RidgeClassifier(ctx.model.head_classes, M, ctx.seed)
    return FrozenFeatureStrategy(classifier=classifier, features=model_features,
                                 adapt_first=adapts_first_session(ctx), **ctx.strategy_kwargs())


ADAPTERS = (
    MethodAdapter(
        "ranpac", {"M": 10000}, build_ranpac,
        "RanPAC: frozen features, fixed random projection + ReLU, ridge classifier in closed form from accumulated "
        "Gram statistics (λ chosen per task on a held-out 20 %); optional PEFT first session",
        "McDonnell et al., NeurIPS 2023 (RanPAC: random projections and pre-trained models for continual "
        "learning); github.com/RanPAC/RanPAC RanPAC.py",
        family="prototype", hparam_ranges={"M": Range(low=0)},
        regime_families=(Family.DEPTH, *PEFT_FAMILIES),
        regime_note="a prototype method on a frozen backbone (optionally a first-session PEFT adaptation)",
        scenarios=(Scenario.CLASS_IL,), regimes_allowed=ranpac_regimes,
        check_hparams={"M": 64},  # the wiring is the same; M = 10000 is 72 CPU solves of a 10000 x 10000 system
        captions={"ranpac_lambda": "the ridge parameter λ chosen after each task (official grid 10^-8..10^8)"}),
)
