"""Bayesian signed-rank test with a ROPE (Benavoli et al., ICML 2014 / JMLR 2017), vectorised.

It is the test of the `baycomp` package (`baycomp.SignedRankTest`) computed the same way:
the same Dirichlet-process posterior, the same draws for a given seed, the same comparisons
of the pairwise sums d_i + d_j with ±2·rope, the same argmax decision per draw. baycomp
loops over its 50,000 draws in Python (about 0.7 s a pair; a leaderboard compares thousands
of pairs), so this module computes each draw's three masses with prefix sums instead:
for a draw w, w'Bw = Σ_i w_i Σ_{j: d_i + d_j < t} w_j, and because float addition is monotone
the inner set is a prefix of the sorted differences. tests/test_statistics.py checks the
probabilities against baycomp itself.
"""
from __future__ import annotations

import functools

import numpy as np

PRIOR = 0.5        # baycomp's default: weight of the pseudo-observation at difference 0
N_SAMPLES = 50_000  # baycomp's default number of posterior draws
SEED = 0
CREDIBLE = 0.95    # a probability at or above this decides


@functools.lru_cache(maxsize=32)
def _draws(n: int, nsamples: int, seed: int, prior: float) -> np.ndarray:
    """Dirichlet weights (nsamples x (n + 1)), exactly as baycomp draws them for random_state=seed."""
    weights = np.ones(n + 1)
    weights[0] = prior
    w = np.random.RandomState(seed).dirichlet(weights, nsamples)
    w.flags.writeable = False
    return w


def _masses(W: np.ndarray, sums: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Per draw, (Σ w_i w_j H(-sums_ij, t), Σ w_i w_j H(sums_ij, t)) with baycomp's heaviside
    (ties count 1/2); sums has ascending columns, so each row's set is a prefix or a suffix."""
    n1 = sums.shape[0]
    cum = np.zeros((W.shape[0], n1 + 1))
    np.cumsum(W, axis=1, out=cum[:, 1:])
    lt, le = (sums < -threshold).sum(1), (sums <= -threshold).sum(1)  # -sums > t, -sums >= t
    gt, ge = (sums > threshold).sum(1), (sums >= threshold).sum(1)
    below = 0.5 * (cum[:, lt] + cum[:, le])                      # prefix + half of the ties
    above = cum[:, -1:] - 0.5 * (cum[:, n1 - gt] + cum[:, n1 - ge])  # suffix + half of the ties
    return np.einsum("si,si->s", W, below), np.einsum("si,si->s", W, above)


def signed_rank_probs(x, y, rope: float = 0.0, *, prior: float = PRIOR,
                      nsamples: int = N_SAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """(P(x better), P(practically equal), P(y better)) over paired blocks; baycomp's p_left/p_rope/p_right."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("x and y must be 1-D arrays of the same non-zero length")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or not rope >= 0:
        raise ValueError("scores must be finite and the rope >= 0")
    diff = np.concatenate([[0.0], y - x])
    order = np.argsort(diff, kind="stable")
    d = diff[order]
    W = _draws(x.size, int(nsamples), int(seed), float(prior))[:, order]
    sums = d[:, None] + d[None, :]  # the same float sums baycomp forms, in sorted order
    left, right = _masses(W, sums, 2 * rope if rope > 0 else 0.0)
    if rope > 0:
        samples = np.column_stack([left, 1 - left - right, right])
    else:  # baycomp: without a ROPE only the mass above 0 is computed, the rest goes left
        samples = np.column_stack([1 - right, np.zeros_like(right), right])
    winners = np.argmax(samples, axis=1)
    p = np.bincount(winners, minlength=3) / len(winners)
    return float(p[0]), float(p[1]), float(p[2])


def decision(p1: float, p_rope: float, p2: float, level: float = CREDIBLE) -> str:
    """'method_1', 'method_2', 'equal' when that probability reaches level, else 'undecided'."""
    for name, p in (("method_1", p1), ("method_2", p2), ("equal", p_rope)):
        if p >= level:
            return name
    return "undecided"


EXACT_UP_TO = 20  # max_attainable grows with n and is 1.0 (to 5 decimals) by then


@functools.lru_cache(maxsize=64)
def max_attainable(n_blocks: int, rope: float = 0.01, prior: float = PRIOR) -> float:
    """The largest P(A better) n paired blocks can give: every difference far outside the ROPE.

    Beyond EXACT_UP_TO blocks the value at EXACT_UP_TO is returned (a lower bound; it is monotone).
    """
    if n_blocks < 1:
        return 0.0
    n_blocks = min(n_blocks, EXACT_UP_TO)
    big = 1.0 + 10 * rope
    # distinct differences, so no tie-breaking decides the answer
    x = big + np.arange(n_blocks) * 1e-6
    return signed_rank_probs(x, np.zeros(n_blocks), rope, prior=prior)[0]
