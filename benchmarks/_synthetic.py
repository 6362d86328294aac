"""Seeded generator of realistic-looking run records (for benchmarks and smoke tests only)."""
from __future__ import annotations

import hashlib

import numpy as np

from harness.config.metrics import all_metrics

BLOCKS = ("conv1", "conv2", "conv3", "fc")
REGIMES = {"head": 0, "last-1": 1, "last-2": 2, "last-3": 3, "full": 4}


def _matrix(rng, T: int, skill: float, depth: int) -> np.ndarray:
    """Accuracy matrix: learned tasks decay with depth, unseen tasks stay near chance."""
    R = np.full((T, T), 0.5) + rng.normal(0, 0.02, (T, T))
    learn = np.clip(skill + rng.normal(0, 0.01, T) + 0.01 * depth, 0.5, 0.999)
    for i in range(T):
        for j in range(i + 1):
            R[i, j] = learn[j] - (i - j) * (0.004 + 0.006 * depth) * rng.uniform(0.5, 1.5)
    return np.clip(R, 0.0, 1.0)


def synthetic_records(n: int, seed: int = 0, n_tasks: int = 5, fail_rate: float = 0.02) -> list:
    """n RunRecords over datasets x regimes x methods x orders; deterministic for a seed."""
    from harness.config.specs import RunRecord

    return [RunRecord.from_dict(d) for d in synthetic_dicts(n, seed, n_tasks, fail_rate)]


def synthetic_dicts(n: int, seed: int = 0, n_tasks: int = 5, fail_rate: float = 0.02) -> list[dict]:
    """The JSON form of `synthetic_records`."""
    rng = np.random.default_rng(seed)
    datasets = ["mnist", "fmnist", "kmnist", "qmnist", "cifar100"]
    methods = ["ewc", "lwf", "si", "gem", "became", "magmax", "naive", "replay"]
    skill = {m: 0.93 + 0.01 * i for i, m in enumerate(methods)}
    out = []
    for k in range(n):
        ds = datasets[k % len(datasets)]
        regime = list(REGIMES)[(k // len(datasets)) % len(REGIMES)]
        method = methods[(k // 25) % len(methods)]
        order = k // 200
        out.append(_record(rng, k, ds, regime, method, order, n_tasks,
                           skill[method], rng.random() < fail_rate))
    return out


def _record(rng, k, ds, regime, method, order, T, skill, failed) -> dict:
    depth = REGIMES[regime]
    spec = {"protocol": "depth-sweep", "protocol_version": "1",
            "dataset": {"name": ds, "n_tasks": T, "classes_per_task": 2, "model": "cnn4"},
            "regime": regime, "method": method, "label": "", "hparams": {"lambda": 1.0},
            "order": order, "class_order": [int(c) for c in rng.permutation(2 * T)], "seed": 0,
            "scenario": "task-il", "pretrain": "first-task",
            "training": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0,
                         "epochs": 1, "batch_size": 32}, "eval_batch_size": 256}
    R = _matrix(rng, T, skill, depth)
    b = rng.normal(0.5, 0.02, T)
    u = (0.5 + depth) * rng.uniform(0.7, 1.3, T - 1)
    f = [None] + [float(np.mean(R[t - 1, :t] - R[t, :t])) for t in range(1, T)]
    diag = {}
    if method == "became":
        diag = {"alpha": [None] + [float(a) for a in rng.uniform(0.2, 0.9, T - 1)]}
    elif method == "magmax":
        diag = {"sign_conflicts": [float(x) for x in rng.uniform(0, 0.3, T)],
                "task_vector_norms": [[float(x) for x in rng.uniform(1, 3, T)]]}
    rec = {
        "schema_version": 1, "run_id": hashlib.sha256(f"{k}".encode()).hexdigest()[:12],
        "status": "ok", "error": None, "spec": spec,
        "acc_matrix": R.tolist(), "init_acc": b.tolist(), "metrics": all_metrics(R, b),
        "update_norms": {"shared": [None, *map(float, u)],
                         "relative": [None, *map(float, u / 50)],
                         "per_block": {bl: [None, *map(float, u / 4)] for bl in BLOCKS},
                         "drift": float(np.linalg.norm(u)), "step_forgetting": f},
        "diagnostics": diag, "params": {"trainable": 1000 * (depth + 1), "total": 5000},
        "regime_depth": depth, "n_blocks": len(BLOCKS), "timings": {"total_s": float(rng.uniform(5, 50))},
        "provenance": {"versions": {"torch": "2.5"}, "git_sha": "0" * 40, "device": "cpu",
                       "hostname": "synthetic"}}
    if failed:
        rec.update(status="failed", error="RuntimeError: synthetic failure", metrics={},
                   acc_matrix=R[:2].tolist())
    return rec
