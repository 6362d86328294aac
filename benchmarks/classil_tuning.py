"""How classil-sweep-mini's training was tuned: which schedule lets class-IL runs learn their tasks.

python benchmarks/classil_tuning.py [--configs NAME,...] [--methods naive,replay,derpp,gdumb] [--orders 2] [--jobs 2]

For each candidate schedule it runs `--methods` in class-IL under head, lora-r4, last-1 and full
(digits on an MLP with BatchNorm, mnist1d on a 1-D CNN, 5 tasks x 2 classes, 200-sample memories,
the backbone pretrained on a held-out 15% of each data set as classil-sweep-mini does) and prints,
per data set and regime, the mean class-IL ACC, the mean task-aware ACC, the runs flagged by the
learning checks (harness/run/checks.py: each task judged within its own classes) and the diverged
runs. `v1` is what classil-sweep-mini version 1 ships.
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

CONFIGS = {  # name -> training (SGD)
    "task-il-demo": dict(lr=0.05, momentum=0.9, epochs=4, batch_size=64),  # depth-sweep-mini's
    "lr.05-m0": dict(lr=0.05, momentum=0.0, epochs=4, batch_size=64),
    "lr.02-b32": dict(lr=0.02, momentum=0.9, epochs=4, batch_size=32),
    "v1": dict(lr=0.01, momentum=0.9, epochs=4, batch_size=32),
}
MODELS = {"digits": "mlp-bn", "mnist1d": "cnn1d"}
PRETRAIN = {"dataset": "same", "holdout": 0.15, "epochs": 2, "lr": 0.05, "batch_size": 64, "seed": 0}
MEMORY = {"replay": "mem_size", "der": "mem_size", "derpp": "mem_size", "er-ace": "mem_size",
          "icarl": "mem_size", "bic": "mem_size", "gdumb": "mem_size"}


def _one(job):
    import torch

    from harness.api.registry import get_registry
    from harness.config.pretrain import Pretrain
    from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
    from harness.execution.plan import class_order
    from harness.run.engine import run_one

    torch.set_num_threads(1)
    config, dataset, order, regime, method = job
    hparams = {**get_registry()[method].defaults, **({MEMORY[method]: 200} if method in MEMORY else {})}
    spec = RunSpec(protocol="classil-tuning", protocol_version="1", dataset=DatasetSpec(dataset, 5, 2, MODELS[dataset]),
                   regime=regime, method=method, label="", hparams=hparams, order=order,
                   class_order=class_order(10, order, 0), seed=0, scenario="class-il",
                   pretrain=Pretrain.from_json(PRETRAIN).for_dataset(dataset),
                   training=TrainingSpec(optimizer="sgd", **CONFIGS[config]), eval_batch_size=1024)
    t0 = time.perf_counter()
    record = run_one(spec, device="cpu")
    return (job, record.status, bool(record.warnings), (record.metrics or {}).get("acc"),
            (record.metrics_task_aware or {}).get("acc"), time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--methods", default="naive,replay,derpp,gdumb")
    ap.add_argument("--orders", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = [(c, ds, o, rg, m) for c in args.configs.split(",") for ds in MODELS
            for rg in ("head", "lora-r4", "last-1", "full") for m in args.methods.split(",")
            for o in range(args.orders)]
    with Pool(args.jobs) as pool:
        results = pool.map(_one, jobs)
    cells = defaultdict(list)
    for (c, ds, _, rg, _), status, flagged, acc, acc_ta, seconds in results:
        cells[(c, ds, rg)].append((status, flagged, acc or 0.0, acc_ta or 0.0, seconds))
    print(f"{'config':<14}{'data set':<10}{'regime':<9}{'ACC %':>7}{'TA %':>7}{'flagged':>9}{'diverged':>10}"
          f"{'s/run':>7}   ({args.orders} orders x {args.methods})")
    for (c, ds, rg), rows in cells.items():
        n = len(rows)
        print(f"{c:<14}{ds:<10}{rg:<9}{100 * sum(r[2] for r in rows) / n:7.1f}{100 * sum(r[3] for r in rows) / n:7.1f}"
              f"{sum(r[1] for r in rows):9d}{sum(r[0] != 'ok' for r in rows):10d}{sum(r[4] for r in rows) / n:7.2f}")


if __name__ == "__main__":
    main()
