"""How the embedded protocol was tuned: which model and schedule let every run learn its tasks.

python benchmarks/demo_tuning.py [--configs NAME,...] [--methods naive] [--jobs 2]

For each candidate (backbone per data set × optimizer schedule) it runs `--methods` under the
shallowest and the deepest regime (`head`, `full`; first-task pre-training, task-IL, 5 tasks × 2
classes) over 5 task orders of digits and mnist1d, and prints, per data set and regime, the mean
ACC, the number of learning-check warnings (harness/run/checks.py: a trained task at chance,
learning accuracy > 10 points below a linear probe, a loss that never fell) and the mean time
per run. `v1` is depth-sweep-mini version 1; `v2` is what version 2 ships.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MLP, MLP_BN, CNN1D = {"digits": "mlp", "mnist1d": "mlp"}, {"digits": "mlp-bn", "mnist1d": "mlp-bn"}, \
    {"digits": "mlp-bn", "mnist1d": "cnn1d"}
CONFIGS = {  # name -> (backbones, training)
    "v1": (MLP, dict(lr=0.05, momentum=0.9, epochs=3, batch_size=32)),
    "v1-lr.01-e5": (MLP, dict(lr=0.01, momentum=0.9, epochs=5, batch_size=32)),
    "mlp-bn": (MLP_BN, dict(lr=0.02, momentum=0.9, epochs=4, batch_size=32)),
    "v2": (CNN1D, dict(lr=0.05, momentum=0.9, epochs=4, batch_size=64)),
    "v2-e5": (CNN1D, dict(lr=0.05, momentum=0.9, epochs=5, batch_size=64)),
    "v2-e3": (CNN1D, dict(lr=0.05, momentum=0.9, epochs=3, batch_size=64)),
    "v2-lr.1-e3": (CNN1D, dict(lr=0.1, momentum=0.9, epochs=3, batch_size=64)),
    "b128-lr.1-e4": (CNN1D, dict(lr=0.1, momentum=0.9, epochs=4, batch_size=128)),
    "b128-lr.05-e5": (CNN1D, dict(lr=0.05, momentum=0.9, epochs=5, batch_size=128)),
}


def _one(job):
    import torch

    from harness.config.pretrain import Pretrain
    from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
    from harness.execution.plan import class_order
    from harness.run.engine import run_one

    torch.set_num_threads(1)
    config, dataset, order, regime, method = job
    models, training = CONFIGS[config]
    spec = RunSpec(protocol="tuning", protocol_version="1", dataset=DatasetSpec(dataset, 5, 2, models[dataset]),
                   regime=regime, method=method, label="", hparams={}, order=order,
                   class_order=class_order(10, order, 0), seed=0, scenario="task-il", pretrain=Pretrain("first-task"),
                   training=TrainingSpec(optimizer="sgd", **training), eval_batch_size=1024)
    t0 = time.perf_counter()
    record = run_one(spec, device="cpu")
    return job, record.status, len(record.warnings), record.metrics.get("acc"), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--methods", default="naive")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = [(c, ds, o, rg, m) for c in args.configs.split(",") for ds in ("digits", "mnist1d")
            for rg in ("head", "full") for m in args.methods.split(",") for o in range(5)]
    with Pool(args.jobs) as pool:
        results = pool.map(_one, jobs)
    cells = defaultdict(list)
    for (c, ds, _, rg, _), status, warned, acc, seconds in results:
        cells[(c, ds, rg)].append((status, warned, acc or 0.0, seconds))
    print(f"{'config':<14}{'data set':<10}{'regime':<8}{'ACC %':>7}{'warnings':>10}{'s/run':>7}"
          f"   (5 orders, {args.methods})")
    for (c, ds, rg), rows in cells.items():
        acc = 100 * sum(r[2] for r in rows) / len(rows)
        seconds = sum(r[3] for r in rows) / len(rows)
        print(f"{c:<14}{ds:<10}{rg:<8}{acc:7.1f}{sum(r[1] for r in rows):10d}{seconds:7.2f}")


if __name__ == "__main__":
    main()
