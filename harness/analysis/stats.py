"""Statistical primitives: weighted bootstrap, Kendall tau_b / W, Friedman, Nemenyi, Holm.

Bootstraps are expressed as multinomial weight matrices (B x n): resampling with replacement
is the same as weighting each observation by how often it was drawn. That makes every
statistic a few matrix operations (no Python loop over resamples), and the same machinery
serves a cluster bootstrap (weights drawn per run, shared by that run's observations).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as sps

N_BOOT = 2000
SEED = 0
LEVEL = 0.95


def boot_weights(n: int, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """Multinomial resampling counts, shape (n_boot, n); row b = draw counts of resample b."""
    return _boot_weights(int(n), int(n_boot), int(seed))


@functools.lru_cache(maxsize=64)
def _boot_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    # Cached: many groups share a size, and the same seed gives the same draws anyway.
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    flat = idx + (np.arange(n_boot) * n)[:, None]
    w = np.bincount(flat.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float)
    w.flags.writeable = False
    return w


def percentile_ci(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN replicates ignored)."""
    s = np.asarray(samples, float)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return (math.nan, math.nan)
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(s, [a, 100 - a])
    return (float(lo), float(hi))


def bootstrap_means(X: np.ndarray, n_boot: int = N_BOOT, seed: int = SEED,
                    level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column means of X (n x m, NaN = missing) with percentile CIs: (mean, lo, hi), each (m,)."""
    X = np.atleast_2d(np.asarray(X, float))
    n, m = X.shape
    mask = np.isfinite(X)
    Xz = np.where(mask, X, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = Xz.sum(0) / mask.sum(0)
    if n == 0:
        return mean, mean.copy(), mean.copy()
    W = boot_weights(n, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (W @ Xz) / (W @ mask)
    ci = np.array([percentile_ci(reps[:, j], level) for j in range(m)]).reshape(m, 2)
    return mean, ci[:, 0], ci[:, 1]


def bootstrap_mean(values, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float]:
    """Mean of a 1-D sample with its percentile bootstrap CI: (mean, lo, hi)."""
    mean, lo, hi = bootstrap_means(np.asarray(values, float).reshape(-1, 1), n_boot, seed)
    return float(mean[0]), float(lo[0]), float(hi[0])


class Resampler:
    """Bootstrap weight rows drawn chunk by chunk (never the whole B x n matrix at once).

    clusters: label per observation; whole clusters (runs) are drawn, so steps of one run
    move together. strata: label per observation (constant within a cluster); clusters are
    drawn within their stratum, keeping each stratum's size as the design fixed it.
    """

    def __init__(self, n_obs: int, clusters=None, strata=None, n_boot: int = N_BOOT,
                 seed: int = SEED, chunk: int = 64):
        cl = np.arange(n_obs) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
        self.inv = cl.reshape(-1)
        n_cl = int(self.inv.max()) + 1 if n_obs else 0
        st = np.zeros(n_obs, int) if strata is None else np.unique(np.asarray(strata), return_inverse=True)[1]
        cl_stratum = np.zeros(n_cl, int)
        cl_stratum[self.inv] = st.reshape(-1)
        self.members = [np.flatnonzero(cl_stratum == s) for s in np.unique(cl_stratum)]
        self.n_cl, self.n_boot, self.seed, self.chunk = n_cl, n_boot, seed, chunk

    def chunks(self):
        """Yield weight arrays (rows x n_obs); rows sum over chunks to n_boot."""
        rng = np.random.default_rng(self.seed)
        for b0 in range(0, self.n_boot, self.chunk):
            rows = min(self.chunk, self.n_boot - b0)
            counts = np.zeros((rows, self.n_cl))
            for mem in self.members:
                idx = rng.integers(0, mem.size, size=(rows, mem.size))
                flat = (idx + (np.arange(rows) * mem.size)[:, None]).ravel()
                counts[:, mem] = np.bincount(flat, minlength=rows * mem.size).reshape(rows, mem.size)
            yield counts[:, self.inv]


class _Sorted:
    """One variable prepared for weighted ranking: sort order and tie groups, computed once."""

    def __init__(self, v: np.ndarray):
        self.order = np.argsort(v, kind="stable")
        sv = v[self.order]
        new = np.r_[True, sv[1:] != sv[:-1]]
        self.ties = not new.all()
        self.starts = np.flatnonzero(new)
        self.group = np.cumsum(new) - 1

    def ranks(self, Ws: np.ndarray) -> np.ndarray:
        """Average ranks in sorted order under weights Ws (already in sorted order).

        An observation drawn w times fills w consecutive places, so its average rank is
        (weight of smaller values) + (weight of equal values + 1) / 2.
        """
        if not self.ties:
            return np.cumsum(Ws, axis=1) - (Ws - 1) / 2
        gw = np.add.reduceat(Ws, self.starts, axis=1)
        return (np.cumsum(gw, axis=1) - (gw - 1) / 2)[:, self.group]


def _pearson_from_moments(n, sx, sy, sxx, syy, sxy) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (n * sxy - sx * sy) / np.sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))


def _weighted_pearson(x: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Pearson r per row of W for 1-D x, y: all weighted moments in one matrix product."""
    xc, yc = x - x.mean(), y - y.mean()  # centring keeps the moment formula stable
    M = W @ np.column_stack([np.ones_like(xc), xc, yc, xc * xc, yc * yc, xc * yc])
    return _pearson_from_moments(*M.T)


def _weighted_rank_pearson(rx: np.ndarray, ry: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Pearson r per row between rank rows rx, ry (rows x n) under weights W."""
    n = W.sum(1)
    m = (n + 1) / 2  # weighted average rank is always (N + 1) / 2
    dx, dy = rx - m[:, None], ry - m[:, None]
    sxy = np.einsum("ij,ij,ij->i", W, dx, dy)
    sxx = np.einsum("ij,ij,ij->i", W, dx, dx)
    syy = np.einsum("ij,ij,ij->i", W, dy, dy)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sxy / np.sqrt(sxx * syy)


def boot_corr(x, y, resampler: Resampler) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of (Spearman rho, Pearson r), each of length n_boot.

    Ranks are recomputed inside every resample (ties averaged), exactly as spearmanr on
    the resampled data would; everything is done in x-sorted order to avoid un-sorting.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    sx, sy = _Sorted(x), _Sorted(y)
    y_pos = np.empty(x.size, int)
    y_pos[sy.order] = np.arange(x.size)
    to_x = y_pos[sx.order]  # where each x-sorted observation sits in y-sorted order
    rho, r = [], []
    for W in resampler.chunks():
        Wx = W[:, sx.order]
        rx = sx.ranks(Wx)
        ry = sy.ranks(W[:, sy.order])[:, to_x]
        rho.append(_weighted_rank_pearson(rx, ry, Wx))
        r.append(_weighted_pearson(x, y, W))
    return np.concatenate(rho), np.concatenate(r)


def corr_with_ci(x, y, clusters=None, strata=None, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Spearman rho and Pearson r with p-values and percentile bootstrap CIs (see Resampler)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    res = {"n": int(x.size)}
    res.update(dict.fromkeys(("rho", "rho_lo", "rho_hi", "rho_p", "r", "r_lo", "r_hi", "r_p"), math.nan))
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return res
    rho, rho_p = sps.spearmanr(x, y)
    r, r_p = sps.pearsonr(x, y)
    res.update(rho=float(rho), rho_p=float(rho_p), r=float(r), r_p=float(r_p))
    if n_boot > 0:
        sub = lambda a: None if a is None else np.asarray(a)[keep]  # noqa: E731
        reps = boot_corr(x, y, Resampler(x.size, sub(clusters), sub(strata), n_boot, seed))
        res["rho_lo"], res["rho_hi"] = percentile_ci(reps[0])
        res["r_lo"], res["r_hi"] = percentile_ci(reps[1])
    return res


def _pair_signs(v: np.ndarray) -> np.ndarray:
    """sign(v_i - v_j) for all i < j; v is (n,) or (m, n)."""
    i, j = np.triu_indices(v.shape[-1], 1)
    return np.sign(v[..., i] - v[..., j])


def kendall_tau_b(x, y) -> float:
    """Kendall tau_b (tie-corrected) between two score vectors (scipy)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(sps.kendalltau(x, y, variant="b").statistic)


def _tau_statistic(x, y, axis=-1):
    """tau_b of x against each row of y (the vectorised statistic permutation_test calls)."""
    sx, sy = _pair_signs(np.asarray(x, float)), _pair_signs(np.asarray(y, float))
    denom = np.sqrt(np.count_nonzero(sx, axis=-1) * np.count_nonzero(sy, axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(-1) / denom


def tau_permutation_test(x, y, n_perm: int = 10000, seed: int = SEED) -> tuple[float, float]:
    """tau_b and its two-sided permutation p-value: scipy.stats.permutation_test permuting y
    against a fixed x (exact enumeration of the n! pairings up to 8 items, else n_perm seeded ones).

    Two-sided is scipy's: twice the smaller one-sided p (capped at 1). With tied scores the null
    distribution is not symmetric, and this is the more conservative of the usual conventions.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    tau = kendall_tau_b(x, y)
    if math.isnan(tau):
        return tau, math.nan
    exact = math.factorial(x.size) <= 40320
    # One sample: "pairings" then permutes y alone (n! orders). Passing (x, y) would permute
    # both samples, (n!)^2 arrangements, for the same distribution.
    res = sps.permutation_test((y,), lambda yy, axis=-1: _tau_statistic(x, yy), permutation_type="pairings",
                               vectorized=True, n_resamples=np.inf if exact else n_perm,
                               alternative="two-sided", rng=np.random.default_rng(seed))
    return tau, float(res.pvalue)


def rank_rows(scores: np.ndarray, higher_is_better: bool = True) -> np.ndarray:
    """Rank items within each row (1 = best, ties averaged)."""
    s = np.asarray(scores, float)
    return sps.rankdata(-s if higher_is_better else s, axis=-1)


def kendall_w(ranks: np.ndarray) -> dict:
    """Kendall's W for an (m raters x n items) rank matrix, tie-corrected, with chi2 p-value."""
    R = np.asarray(ranks, float)
    m, n = R.shape
    out = {"w": math.nan, "chi2": math.nan, "p": math.nan, "m": m, "n": n}
    if m < 2 or n < 2:
        return out
    S = ((R.sum(0) - m * (n + 1) / 2) ** 2).sum()
    ties = sum(((c ** 3) - c).sum() for c in (np.unique(row, return_counts=True)[1] for row in R))
    denom = m ** 2 * (n ** 3 - n) - m * ties
    if denom <= 0:
        return out
    w = 12 * S / denom
    chi2 = m * (n - 1) * w
    out.update(w=float(w), chi2=float(chi2), p=float(sps.chi2.sf(chi2, n - 1)))
    return out


def friedman(ranks: np.ndarray) -> dict:
    """Friedman chi2 (scipy, tie-corrected) and Iman-Davenport F on an (N blocks x k methods) matrix."""
    R = np.asarray(ranks, float)
    N, k = R.shape
    out = {"chi2": math.nan, "p": math.nan, "N": N, "k": k, "ff": math.nan, "ff_p": math.nan}
    if N < 2 or k < 3 or np.all(R == R[:, :1]):  # scipy needs 3 groups; all-tied blocks have no test
        return out
    chi2, p = sps.friedmanchisquare(*R.T)
    out.update(chi2=float(chi2), p=float(p))
    if N * (k - 1) - chi2 > 0:
        ff = (N - 1) * chi2 / (N * (k - 1) - chi2)
        out.update(ff=float(ff), ff_p=float(sps.f.sf(ff, k - 1, (k - 1) * (N - 1))))
    return out


def nemenyi_cd(k: int, n_blocks: int, alpha: float = 0.05) -> float:
    """Nemenyi critical difference of mean ranks (Demsar 2006): q_alpha sqrt(k(k+1)/(6N))."""
    if k < 2 or n_blocks < 1:
        return math.nan
    q = sps.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return float(q * math.sqrt(k * (k + 1) / (6 * n_blocks)))


def holm(pvalues) -> np.ndarray:
    """Holm step-down adjusted p-values (statsmodels; NaN stays NaN and is not counted)."""
    from statsmodels.stats.multitest import multipletests  # slow import: only when needed

    p = np.asarray(pvalues, float)
    out = np.full_like(p, math.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def nemenyi_pvalues(blocks: np.ndarray) -> np.ndarray:
    """Pairwise Nemenyi p-values after Friedman (scikit-posthocs) for an (N blocks x k) score matrix."""
    import scikit_posthocs as sp

    return sp.posthoc_nemenyi_friedman(np.asarray(blocks, float)).to_numpy()


def wilcoxon_p(a, b) -> float:
    """Two-sided paired Wilcoxon signed-rank p-value; 1.0 when every difference is zero."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if d.size == 0:
        return math.nan
    if np.all(d == 0):
        return 1.0
    return float(sps.wilcoxon(d).pvalue)
