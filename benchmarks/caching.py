"""Frozen-prefix caching: speed-up of a complete run with the cache vs without it.

python benchmarks/caching.py [--size 32] [--epochs 3] [--repeats 3] [--threads 1]

Model: small-cnn (conv1..conv3 with BatchNorm, fc) on scikit-learn digits upsampled
bilinearly from 8x8 to SIZE x SIZE (default 32x32, CIFAR-sized inputs), so that the frozen
convolutional prefix costs what it would on real images; written to a temporary .npz and
loaded as `npz:PATH`. 5 tasks x 2 classes, naive, depth-sweep's training (5 epochs, batch 64). Both paths run
interleaved in this process; the records are checked equal. Under `pretrain: first-task`
task 1 trains the full network (nothing to cache), which bounds the whole run's speed-up
(Amdahl); "tasks 2-5 training" is the speed-up where the cache applies (record
timings.per_task_s, training only). `pretrain: none` caches every task.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.config.pretrain import Pretrain  # noqa: E402
from harness.config.specs import DatasetSpec  # noqa: E402
from harness.run import speedups  # noqa: E402
from harness.run.datasets import load_dataset  # noqa: E402
from harness.run.engine import run_one  # noqa: E402


def upsampled_digits(size: int, folder: Path) -> str:
    """Write digits upsampled to size x size as an .npz; returns the dataset name."""
    d = load_dataset("digits")

    def up(x):
        x = x.reshape(len(x), 1, 8, 8).float()
        return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                               align_corners=False).numpy()
    path = folder / f"digits{size}.npz"
    np.savez(path, x_train=up(d.x_train), y_train=d.y_train.numpy(), x_test=up(d.x_test),
             y_test=d.y_test.numpy())
    return f"npz:{path}"


def compare(spec, repeats: int) -> tuple:
    """(timings, median training seconds of tasks 2..T per path, records equal?)."""
    records = {True: [], False: []}

    def with_cache(flag):
        def fn():
            speedups.PREFIX_CACHE = flag
            try:
                records[flag].append(run_one(spec, device="cpu"))
            finally:
                speedups.PREFIX_CACHE = True
        return fn

    result = C.side_by_side({"cached": with_cache(True), "uncached": with_cache(False)}, repeats)
    later = {flag: statistics.median(sum(r.timings["per_task_s"][1:]) for r in recs)
             for flag, recs in records.items()}
    a, b = records[True][-1], records[False][-1]
    equal = a.acc_matrix == b.acc_matrix and a.update_norms == b.update_norms and a.metrics == b.metrics
    return result, later, equal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=32, help="upsampled image side (multiple of 8)")
    ap.add_argument("--epochs", type=int, default=5, help="default: depth-sweep's 5")
    ap.add_argument("--batch-size", type=int, default=64, help="default: depth-sweep's 64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    C.set_threads(args.threads)
    print(f"small-cnn on digits upsampled to {args.size}x{args.size}, naive, 5 tasks x "
          f"{args.epochs} epochs, batch {args.batch_size}, {args.threads} thread(s); {C.load_avg()}")
    with tempfile.TemporaryDirectory() as tmp:
        name = upsampled_digits(args.size, Path(tmp))
        base = C.make_spec("naive", dataset="digits", model="small-cnn", epochs=args.epochs,
                           batch_size=args.batch_size)
        base = replace(base, dataset=DatasetSpec(name, 5, 2, "small-cnn"))
        for pretrain in ("first-task", "none"):
            for regime in ("head", "last-1"):
                result, later, equal = compare(replace(base, regime=regime, pretrain=Pretrain(pretrain)), args.repeats)
                (cw, cc, _), (uw, uc, _) = result["cached"], result["uncached"]
                print(f"{regime:<7} pretrain {pretrain:<10}  whole run: uncached {uw:6.2f} s  cached {cw:6.2f} s  "
                      f"speed-up wall {uw / cw:5.2f}x cpu {uc / cc:5.2f}x | tasks 2-5 training: "
                      f"{later[False] / later[True]:5.2f}x | records equal: {equal}")
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():  # Ctrl-C stops the script, not only the run in progress (a failed record)
        main()
