"""The paper-scale unit: one depth-sweep MNIST run through cl-bench vs a plain PyTorch loop.

python benchmarks/depth_unit.py [--train 60000] [--test 10000] [--epochs 5] [--regimes full,head]
                                [--repeats 1] [--warmup 0] [--threads 1] [--jobs 2]

Writes synthetic MNIST in the real torchvision on-disk format (IDX files
`MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte` in a temporary folder; 28x28 uint8
images, each a noisy blend of its class's template and another class's, so accuracies are
class-dependent but not all 1.0), full MNIST size by default (60000 train / 10000 test).
The unit is the depth-sweep protocol's own RunSpec (expanded from protocols/depth-sweep.yaml,
order 0): mnist, 5 tasks x 2 classes, task-IL, small-cnn, SGD lr 0.01 momentum 0.9,
5 epochs of batch 64, evaluation batch 1024, first-task pre-training, method naive; one
spec per regime (`full` and `head` by default). `--epochs` shortens training for a quick try.

Per regime, one complete run through the harness (`harness.run.engine.run_one`, device cpu)
and the same run written as a plain PyTorch loop (`_common.plain_run`: same data, model,
regime, optimizer, batch order and evaluations) alternate in this process (`--repeats`
timed pairs, medians). It prints the wall and CPU ratio, whether the harness record's
accuracy matrix (and initial row) equals the plain loop's (max abs difference), runs/hour
for one worker (3600 / harness wall s), and a projection for the paper grid's MNIST-family
part (4 data sets x 15 method entries x 5 regimes x 11 orders = 3,300 runs) at `--jobs`
workers, using naive's measured mean time per run over the regimes timed as a proxy for
every method and regime (other methods cost more: LwF, GEM, GPM, BECAME do extra work).
Before timing, each side does one tiny untimed run (600/100 images, 1 epoch: imports and
first-call costs) and the data are loaded once (both sides keep them cached in memory, as a
sweep worker does). Also printed: the last runs' split of time, train vs evaluation (the
harness's includes its learning checks' linear probe per task, which the plain loop does not
do). Under `head` (and other partial regimes) the harness caches the frozen prefix's
features (harness/run/prefix_cache.py), which the plain loop does not: there cl-bench can be
faster than the plain loop with the same records.
Full size is slow on a small CPU machine: on 2 shared cores one run took 3 (head) to 9 (full)
minutes, so the defaults (2 regimes x 1 repeat x 2 sides = 4 runs) take about 25 minutes
(`--repeats 3`: over an hour); quick try: --train 6000 --test 1000 --epochs 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import numpy as np  # noqa: E402

from harness.api.registry import get_registry  # noqa: E402
from harness.config.paths import DATA_ENV  # noqa: E402
from harness.config.protocol import load_protocol, select  # noqa: E402
from harness.execution.plan import expand  # noqa: E402
from harness.run.datasets import load_dataset  # noqa: E402
from harness.run.engine import run_one  # noqa: E402

# The paper grid's MNIST-family part (protocols/depth-sweep.yaml without cifar100).
PAPER_DATASETS, PAPER_METHODS, PAPER_REGIMES, PAPER_ORDERS = 4, 15, 5, 11
PAPER_RUNS = PAPER_DATASETS * PAPER_METHODS * PAPER_REGIMES * PAPER_ORDERS


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (big-endian header, unsigned bytes), as torchvision's MNIST reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def synthetic_split(n: int, templates: np.ndarray, rng: np.random.Generator, chunk: int = 10000):
    """n images of 28x28 uint8 and balanced labels: a*template[y] + (1-a)*template[z] + noise."""
    y = rng.permutation(np.arange(n) % 10).astype(np.uint8)
    x = np.empty((n, 28, 28), dtype=np.uint8)
    for s in range(0, n, chunk):
        yy = y[s:s + chunk].astype(np.int64)
        other = (yy + rng.integers(1, 10, size=len(yy))) % 10  # a different class
        a = rng.uniform(0.45, 1.0, size=(len(yy), 1, 1)).astype(np.float32)
        img = a * templates[yy] + (1 - a) * templates[other]
        img += rng.normal(0.0, 0.35, size=img.shape).astype(np.float32)
        x[s:s + chunk] = (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)
    return x, y


def write_synthetic_mnist(root: Path, n_train: int, n_test: int, seed: int = 0) -> None:
    """Class-dependent synthetic MNIST as torchvision's raw IDX files under root/MNIST/raw."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((10, 7, 7)).astype(np.float32)
    templates = np.kron(coarse, np.ones((4, 4), dtype=np.float32))  # 10 blocky 28x28 templates
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = synthetic_split(n, templates, rng)
        write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte", x)
        write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", y)


def unit_specs(regimes, epochs: int | None) -> dict:
    """regime -> the depth-sweep protocol's RunSpec of mnist x naive x order 0 (epochs optionally cut)."""
    protocol = select(load_protocol("depth-sweep", get_registry()), datasets=("mnist",),
                      methods=("naive",), regimes=tuple(regimes), orders=1)
    specs = {}
    for spec in expand(protocol, fingerprints={}):  # no fingerprint: the engine checks no data identity
        if epochs is not None:
            spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, epochs=epochs))
        specs[spec.regime] = spec
    return {r: specs[r] for r in regimes}  # in the order asked for


def max_abs_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def compare(spec, data_dir: str, repeats: int, warmup: int) -> tuple[dict, dict]:
    """Median timings of the harness and the plain loop, and the outputs (and plain eval seconds) of each."""
    out: dict = {"harness": [], "plain": [], "plain_eval_s": []}
    evaluate = C.evaluate_tasks

    def harness():
        record = run_one(spec, data_dir=data_dir, device="cpu")
        assert record.status == "ok", record.error
        out["harness"].append(record)

    def plain():
        spent = [0.0]

        def timed_evaluate(*a, **k):  # the plain loop's evaluation seconds, for the breakdown
            t0 = time.perf_counter()
            try:
                return evaluate(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        C.evaluate_tasks = timed_evaluate
        try:
            out["plain"].append(C.plain_run(spec))  # reads the data from $CL_BENCH_DATA
        finally:
            C.evaluate_tasks = evaluate
        out["plain_eval_s"].append(spent[0])

    timings = C.side_by_side({"cl-bench": harness, "plain": plain}, repeats=repeats, warmup=warmup)
    return timings, out


def warm_up(specs: dict, root: Path) -> None:
    """One tiny run of each side (600/100 images, 1 epoch): imports and first-call costs, untimed."""
    write_synthetic_mnist(root, 600, 100, seed=1)
    os.environ[DATA_ENV] = str(root)
    for spec in specs.values():
        tiny = dataclasses.replace(spec, training=dataclasses.replace(spec.training, epochs=1))
        assert run_one(tiny, data_dir=str(root), device="cpu").status == "ok"
        C.plain_run(tiny)
    load_dataset.cache_clear()  # the plain loop's cache entry ("mnist", no data_dir) held the tiny set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=60000, help="training images (default 60000, MNIST's)")
    ap.add_argument("--test", type=int, default=10000, help="test images (default 10000, MNIST's)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per task (default: the protocol's, 5)")
    ap.add_argument("--regimes", default="full,head", help="comma-separated depth-sweep regimes")
    ap.add_argument("--repeats", type=int, default=1, help="timed pairs per regime (default 1)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed full-size pairs before timing (default 0: a tiny untimed run of each "
                         "side and loading the data beforehand take the first-call costs)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    ap.add_argument("--jobs", type=int, default=2, help="parallel workers for the projection (default 2)")
    args = ap.parse_args()
    C.set_threads(args.threads)
    specs = unit_specs(args.regimes.split(","), args.epochs)
    first = next(iter(specs.values()))
    tr = first.training
    tmp = Path(tempfile.mkdtemp(prefix="cl-bench-depth-unit-"))
    try:
        warm_up(specs, tmp / "warm-up")
        write_synthetic_mnist(tmp, args.train, args.test)
        os.environ[DATA_ENV] = str(tmp)  # plain_run's load_dataset(name) reads $CL_BENCH_DATA
        # Exactly the calls each side makes (lru_cache keys differ with the argument count).
        data = load_dataset("mnist", str(tmp), False)  # the engine's (run_one)
        load_dataset("mnist")  # plain_run's
        print(f"depth-sweep unit: synthetic mnist {len(data.y_train)} train / {len(data.y_test)} test "
              f"(IDX files, torchvision MNIST), {first.dataset.n_tasks} tasks x {first.dataset.classes_per_task} "
              f"classes, {first.dataset.model}, naive, {tr.optimizer} lr {tr.lr} momentum {tr.momentum}, "
              f"{tr.epochs} epochs x batch {tr.batch_size}, eval batch {first.eval_batch_size}, "
              f"pretrain {first.pretrain.label}")
        print(f"{args.repeats} timed pair(s) per regime, {args.warmup} warm-up, {args.threads} torch thread(s); "
              f"{C.load_avg()}")
        walls = {}
        for regime, spec in specs.items():
            timings, out = compare(spec, str(tmp), args.repeats, args.warmup)
            record, rows = out["harness"][-1], out["plain"][-1]
            walls[regime] = timings["cl-bench"][0]
            diff = max_abs_diff(record.acc_matrix, rows[1:])
            diff0 = max_abs_diff(record.init_acc, rows[0])
            repeat_diff = max(max_abs_diff(r.acc_matrix, record.acc_matrix) for r in out["harness"])
            print(C.ratio_line(f"{regime}: cl-bench / plain", timings, "cl-bench", "plain"))
            same = "yes" if diff == 0 and diff0 == 0 else "NO"
            print(f"  acc_matrix equal to the plain loop's: {same} (max abs diff {diff:.3g}; "
                  f"initial row {diff0:.3g}; harness repeats differ by {repeat_diff:.3g}); "
                  f"final ACC {np.mean(record.acc_matrix[-1]):.4f}")
            print(f"  last harness run: train {record.timings['train_s']:.1f} s, eval+probes "
                  f"{record.timings['eval_s']:.1f} s, total {record.timings['total_s']:.1f} s; last plain run: "
                  f"eval {out['plain_eval_s'][-1]:.1f} s")
            print(f"  {3600 / walls[regime]:.1f} runs/hour for one worker on this machine "
                  f"(3600 / {walls[regime]:.1f} s)")
        mean = statistics.mean(walls.values())
        hours = PAPER_RUNS * mean / args.jobs / 3600
        size = ("full MNIST size" if (args.train, args.test) == (60000, 10000) and args.epochs in (None, 5)
                else f"at THESE sizes ({args.train}/{args.test} images, {tr.epochs} epochs), not the paper's")
        print(f"measured mean time per run over regimes {', '.join(walls)}: {mean:.1f} s (naive, harness)")
        print(f"projection ({size}): the paper grid's MNIST-family part, {PAPER_DATASETS} data sets x "
              f"{PAPER_METHODS} method entries x {PAPER_REGIMES} regimes x {PAPER_ORDERS} orders = "
              f"{PAPER_RUNS:,} runs at --jobs {args.jobs}: {hours:.1f} h on this machine "
              f"({PAPER_RUNS:,} x {mean:.1f} s / {args.jobs} / 3600; naive's time as a proxy for every method "
              f"and regime, {args.jobs} workers assumed to run at one worker's speed each)")
        print(f"done; {C.load_avg()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():  # Ctrl-C stops the script, not only the run in progress (a failed record)
        main()
