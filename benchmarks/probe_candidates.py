"""Cheaper probes against checks version 1's logistic regression, on the features of real runs.

python benchmarks/probe_candidates.py RESULTS [--orders 0,1] [--datasets digits,mnist1d]

Re-runs the records under RESULTS (e.g. the demo's depth-sweep-mini, made under checks version 1) in
this process with continual evaluation off (it changes no training), keeps each task's standardised probe
features (probe.probe_features), checks the accuracy matrix equals the record's, and scores each
candidate probe against the logistic one: mean and mean/max absolute difference of the accuracy, the
below-probe warnings it would lose or gain (the learned accuracy as harness/run/checks.py judges it), and
the fit's milliseconds a task. How the ridge probe of version 2 was chosen: docs/small-grids.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from probe_agreement import learned  # noqa: E402

from harness.config.specs import RunSpec  # noqa: E402
from harness.run import checks, engine, probe  # noqa: E402


def logistic(x, y, xt, yt, n=None, max_iter=1000):
    from sklearn.linear_model import LogisticRegression

    if n and len(y) > n:  # refit on a strided subsample, standardised by the full sample's statistics
        idx = np.linspace(0, len(y) - 1, n).round().astype(int)
        x, y = x[idx], y[idx]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter below convergence warns
        clf = LogisticRegression(max_iter=max_iter).fit(x, y)
    return float((clf.predict(xt) == yt).mean())


def ridge(x, y, xt, yt, alpha=1.0):
    return float((probe.ridge_predict(probe.ridge_fit(x, y, alpha), xt) == yt).mean())


def lda(x, y, xt, yt, shrink=1e-3):
    classes = np.unique(y)
    means = np.stack([x[y == c].mean(0) for c in classes])
    r = x - means[np.searchsorted(classes, y)]
    cov = r.T @ r / len(y)
    cov = (1 - shrink) * cov + shrink * np.trace(cov) / len(cov) * np.eye(len(cov))
    w = np.linalg.solve(cov, means.T)
    prior = np.log([(y == c).mean() for c in classes])
    scores = xt @ w - 0.5 * (means * w.T).sum(1) + prior
    return float((classes[scores.argmax(1)] == yt).mean())


CANDIDATES = {
    "logistic max_iter 20": lambda *a: logistic(*a, max_iter=20),
    "logistic max_iter 10": lambda *a: logistic(*a, max_iter=10),
    "logistic n<=512": lambda *a: logistic(*a, n=512),
    "logistic n<=256": lambda *a: logistic(*a, n=256),
    "ridge alpha 1 (v2)": ridge,
    "ridge alpha 10": lambda *a: ridge(*a, alpha=10.0),
    "lda shrinkage 1e-3": lda,
    "lda shrinkage 0.1": lambda *a: lda(*a, shrink=0.1),
}


def collect(results: Path, orders: set, datasets: set | None) -> list:
    """(record, [features per task]) for the selected records, re-run here."""
    out = []
    for path in sorted(results.glob("**/runs/*.json")):
        r = json.loads(path.read_text())
        if r["status"] != "ok" or r["spec"]["order"] not in orders or (
                datasets and r["spec"]["dataset"]["name"] not in datasets):
            continue
        feats = []

        def grab(model, task, device, batch_size=1024, feats=feats):
            f = probe.probe_features(model, task, device, batch_size)
            feats.append(f)
            return None if f is None else probe.logistic_accuracy(*f)

        saved, engine.probe_accuracy = engine.probe_accuracy, grab
        try:
            rec = engine.run_one(dataclasses.replace(RunSpec.from_dict(r["spec"]), continual=None), device="cpu")
        finally:
            engine.probe_accuracy = saved
        if rec.acc_matrix != r["acc_matrix"]:
            print(f"skipped {path.name}: its accuracy matrix differs when re-run here")
            continue
        out.append((r, rec.checks["probe_acc"], feats))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--orders", default="0,1")
    ap.add_argument("--datasets", default="")
    args = ap.parse_args()
    C.set_threads(1)
    runs = collect(args.results, {int(o) for o in args.orders.split(",")},
                   set(args.datasets.split(",")) if args.datasets else None)
    n_flags = sum(p is not None and p - learned(r, t) > checks.PROBE_GAP
                  for r, probes, _ in runs for t, p in enumerate(probes))
    print(f"{len(runs)} runs re-run; {n_flags} below-probe warnings under the logistic probe; {C.load_avg()}")
    for name, fn in {"logistic (v1)": probe.logistic_accuracy, **CANDIDATES}.items():
        diffs, lost, gained, seconds = [], 0, 0, 0.0
        for r, probes, feats in runs:
            for t, (old, f) in enumerate(zip(probes, feats)):
                if f is None:
                    continue
                t0 = time.perf_counter()
                new = fn(*f)
                seconds += time.perf_counter() - t0
                diffs.append(new - old)
                was, now = old - learned(r, t) > checks.PROBE_GAP, new - learned(r, t) > checks.PROBE_GAP
                lost, gained = lost + (was and not now), gained + (now and not was)
        d = np.array(diffs)
        print(f"  {name:<22} mean {d.mean():+.4f}  mean |d| {np.abs(d).mean():.4f}  max |d| {np.abs(d).max():.4f}  "
              f"warnings lost {lost} gained {gained}  fit {seconds / len(d) * 1000:.2f} ms/task")


if __name__ == "__main__":
    main()
