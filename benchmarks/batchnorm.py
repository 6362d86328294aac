"""BatchNorm policies on a small-cnn of 28×28 images: GPM, BECAME and the merges, naive for reference.

python benchmarks/batchnorm.py [--orders 3] [--jobs 2] [--epochs 3] [--out DIR]

Writes scikit-learn's digits, upsampled to 28×28, as MNIST IDX files (the real on-disk format,
every 5th image in the test split), then runs one grid through `cl-bench run` (task-IL, 5 tasks
× 2 classes, first-task pre-training, small-cnn) with every method under each of its BatchNorm
policies, and prints ACC and forgetting per method × policy × regime (mean ± sd over orders).
This is the measurement behind the defaults: GPM/BECAME `batchnorm: batch-stats` and the
merges' `batchnorm: recompute` (methods/gpm.py, methods/merging.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPM = {"eps_base": 0.97, "eps_step": 0.003, "n_samples": 200}
METHODS = [{"name": "naive"}]
METHODS += [{"name": "gpm", "label": f"gpm[{p}]", "hparams": {**GPM, "batchnorm": p}}
            for p in ("batch-stats", "frozen-stats", "running-stats")]
METHODS += [{"name": "became", "label": f"became[{p}]", "hparams": {**GPM, "batchnorm": p}}
            for p in ("batch-stats", "frozen-stats", "running-stats")]
METHODS += [{"name": m, "label": f"{m}[{p}]", "hparams": {**hp, "batchnorm": p}}
            for m, hp in (("magmax", {"lam": 0.5}), ("avg", {}), ("ties", {"top_k": 20.0, "lam": 0.55}))
            for p in ("recompute", "merge", "latest")]


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (big-endian header, unsigned bytes), as torchvision's MNIST reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_digits_as_mnist(root: Path) -> None:
    """digits (8×8, values 0..16) bilinearly upsampled to 28×28 uint8, split 4:1 into train/t10k."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    x = (x.squeeze(1).clamp(0, 1) * 255).round().numpy().astype(np.uint8)
    y = d.target.astype(np.uint8)
    test = np.arange(len(y)) % 5 == 0
    for prefix, mask in (("train", ~test), ("t10k", test)):
        write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte", x[mask])
        write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", y[mask])


def protocol(orders: int, epochs: int, regimes) -> dict:
    return {"name": "batchnorm-bench", "version": "1", "description": "BatchNorm policies (benchmark)",
            "scenario": "task-il", "pretrain": "first-task",
            "datasets": [{"name": "mnist", "n_tasks": 5, "classes_per_task": 2, "model": "small-cnn"}],
            "regimes": list(regimes), "methods": METHODS, "task_orders": {"count": orders, "seed": 0},
            "seeds": [0], "training": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "epochs": epochs,
                                       "batch_size": 32}, "evaluation": {"batch_size": 1024}}


def table(results: Path) -> list[str]:
    from harness.execution.store import load_records

    recs = [r for r in load_records(results, "batchnorm-bench") if r.ok]
    cells: dict = {}
    for r in recs:
        cells.setdefault((r.method, r.spec.regime), []).append(
            (r.metrics["acc"], r.metrics["forgetting"], len(r.warnings)))
    regimes = sorted({k[1] for k in cells}, key=lambda s: (s != "last-2", s))
    lines = ["method × policy          " + "".join(f"{rg:>30}" for rg in regimes),
             " " * 25 + "".join(f"{'ACC %':>15}{'forgetting %':>15}" for _ in regimes)]
    for m in dict.fromkeys(r.method for r in sorted(recs, key=lambda r: METHODS_ORDER.index(r.method))):
        row = f"{m:<25}"
        for rg in regimes:
            v = np.array(cells.get((m, rg), []), dtype=float)
            if not len(v):
                row += f"{'-':>30}"
                continue
            row += (f"{100 * v[:, 0].mean():9.1f} ± {100 * v[:, 0].std():3.1f}"
                    f"{100 * v[:, 1].mean():9.1f} ± {100 * v[:, 1].std():3.1f}")
        warned = sum(int(x[2]) for rg in regimes for x in cells.get((m, rg), []))
        lines.append(row + (f"   ({warned} warnings)" if warned else ""))
    return lines


METHODS_ORDER = [m.get("label", m["name"]) for m in METHODS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--regimes", default="full,last-2")
    ap.add_argument("--out", default=None, help="keep the data and results here (default: a temp folder)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="cl-bench-bn-"))
    write_digits_as_mnist(out / "data")
    (out / "protocol.yaml").write_text(json.dumps(protocol(args.orders, args.epochs, args.regimes.split(","))))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness.cli", "run", "--protocol", str(out / "protocol.yaml"),
                    "--data-dir", str(out / "data"), "--results", str(out / "results"), "--jobs", str(args.jobs),
                    "--no-mlflow", "--no-leaderboard", "--no-progress"], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    print(f"grid: {len(METHODS)} methods × {args.regimes} × {args.orders} orders, "
          f"{args.epochs} epochs, {time.perf_counter() - t0:.0f} s (--jobs {args.jobs}); results in {out}")
    print("\n".join(table(out / "results")))


if __name__ == "__main__":
    main()
