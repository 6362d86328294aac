"""Time the leaderboard build from N seeded synthetic records (default 10,000), and the
hand-written statistics against the libraries they replace, side by side in one process.

python benchmarks/leaderboard_build.py [--n 10000] [--out DIR] [--skip-site]
Prints the time for the analysis alone and for the whole site (analysis + every page), then
ratios: baycomp's SignedRankTest vs harness.analysis.bayes (same probabilities), and
scipy.stats.bootstrap vs harness.analysis.stats.bootstrap_means (the metric table's CIs).
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _synthetic import synthetic_records

from harness.analysis import bayes, stats
from harness.analysis.tables import analyse
from harness.outputs.site import build_site


def _cpu(fn, *args, **kw):
    c0 = time.process_time()
    out = fn(*args, **kw)
    return time.process_time() - c0, out


def compare_signed_rank(n_pairs: int = 6) -> None:
    """baycomp's loop over 50,000 draws vs the vectorised version, on the same inputs and seed."""
    import baycomp

    rng = np.random.default_rng(0)
    for n in (5, 11, 44):  # demo orders, paper orders, paper orders pooled over 4 data sets
        ref_s = own_s = 0.0
        for _ in range(n_pairs):
            x = np.round(rng.normal(0.9, 0.02, n), 3)
            y = np.round(x + rng.normal(0.003, 0.01, n), 3)
            t, ref = _cpu(baycomp.SignedRankTest.probs, x, y, 0.01, random_state=0)
            ref_s += t
            t, own = _cpu(bayes.signed_rank_probs, x, y, 0.01, seed=0)
            own_s += t
            assert np.allclose(ref, own, atol=1e-12), (ref, own)
        print(f"signed-rank, {n} blocks: baycomp {ref_s / n_pairs * 1e3:.0f} ms/pair, "
              f"vectorised {own_s / n_pairs * 1e3:.1f} ms/pair, ratio {ref_s / own_s:.0f}x (same probabilities)")


def compare_bootstrap(n_groups: int = 40, n: int = 11, metrics: int = 8) -> None:
    """scipy.stats.bootstrap (percentile, 2000 resamples) vs the weight-matrix bootstrap, per group."""
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    X = [rng.normal(0.9, 0.02, (n, metrics)) for _ in range(n_groups)]
    t_ref, _ = _cpu(lambda: [sps.bootstrap((x,), np.mean, n_resamples=stats.N_BOOT, method="percentile",
                                           axis=0, rng=0) for x in X])
    t_own, _ = _cpu(lambda: [stats.bootstrap_means(x) for x in X])
    print(f"bootstrap CIs, {n_groups} groups x {metrics} metrics: scipy {t_ref:.2f} s, "
          f"weight matrix {t_own:.3f} s, ratio {t_ref / t_own:.0f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000, help="number of synthetic records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="site folder (default: a temporary folder)")
    ap.add_argument("--skip-site", action="store_true", help="time the analysis only")
    args = ap.parse_args()
    records = synthetic_records(args.n, seed=args.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    analyse(records)
    t1, c1 = time.perf_counter(), time.process_time()
    line = f"records: {args.n}  analysis: {t1 - t0:.1f} s wall / {c1 - c0:.1f} s CPU"
    if not args.skip_site:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.out or tmp)
            t2, c2 = time.perf_counter(), time.process_time()
            index = build_site(records, out)
            t3, c3 = time.perf_counter(), time.process_time()
            pages = sum(1 for _ in out.rglob("*.html"))
        line += f"  full site build: {t3 - t2:.1f} s wall / {c3 - c2:.1f} s CPU  pages: {pages}  ({index.name})"
    # CPU seconds too: on a shared machine wall time says more about the neighbours than the code
    print(line)
    compare_signed_rank()
    compare_bootstrap()


if __name__ == "__main__":
    main()
