"""GPU throughput: runs/hour of the MNIST-family grid unit at 1, 4, 8 and 16 concurrent runs per GPU.

python benchmarks/gpu.py [--levels 1,4,8,16] [--runs-per-level 16] [--budget-s 420] [--out DIR] [--dry-run]

The grid unit is depth-sweep's MNIST cell: small-cnn on 28×28 images, task-IL, 5 tasks × 2 classes,
first-task pre-training, depth-sweep's training settings (read from protocols/depth-sweep.yaml),
regimes head..full and the methods naive, ewc-online, lwf, gpm, became, magmax with depth-sweep's
hyperparameters. No download: synthetic class-dependent images are written as MNIST IDX files (the
on-disk format torchvision reads; --train-size/--test-size, default 6000/1000, real MNIST is
60000/10000). Each level runs the same --runs-per-level runs (a spread over methods × regimes, picked
with --only) through the real CLI, `cl-bench run --device cuda --jobs N` into a fresh results folder:
the process executor puts N worker processes on the one GPU (--jobs 1 runs inline). While a level
runs, `nvidia-smi` is sampled every 0.5 s (torch.cuda.utilization() without it).

Columns: runs/h is runs / wall time of the whole command (worker start-up, imports and CUDA
contexts included); steady/h is N × 3600 / mean in-run seconds (what a long sweep approaches);
util is the GPU's utilisation (mean / max of the samples), peak MiB the most GPU memory in use.
Without CUDA it prints one line and exits 0 (`make bench` runs every benchmark); --dry-run writes
the data and protocol and prints the commands, on any machine.

`--unit vit` measures the ViT unit instead: ViT-B/16 (`vit-b16`, random weights: throughput does not
depend on them, and the GPU machine cannot download any) on CIFAR-100-shaped uint8 pixels (synthetic
class-dependent 32x32 images written as the `cifar-100-python` pickles the harness reads;
--train-size/--test-size default 6000/1000 over 100 classes), class-IL B0Inc10 (10 tasks x 10
classes), naive under the regimes head, lora-r4 and full, training.precision bf16, levels 1,2,4
(--levels). Besides the level table it prints the GPU memory per run (the records'
provenance.memory.cuda_peak_bytes, per regime). `--cpu-smoke` runs the same code path on the CPU
with `vit-tiny` and a tiny set (the check that it runs before it meets a GPU).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAME = "gpu-bench"
METHODS = ("naive", "ewc-online", "lwf", "gpm", "became", "magmax")
SKIP_LINE = "benchmarks/gpu.py: no CUDA device; skipped (not run)"
VIT_NAME = "gpu-bench-vit"
VIT_REGIMES = ("head", "lora-r4", "full")
VIT_DATASET = "cifar100-pixels"  # uint8 pixels in memory, resized and normalised on the device by the ViT


# ---------------------------------------------------------------- data and protocol

def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (big-endian header, unsigned bytes), as torchvision's MNIST reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def synthetic_images(n: int, prototypes: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """n 28×28 uint8 images: a class prototype, scaled, shifted by up to 2 px, plus noise."""
    y = rng.integers(0, len(prototypes), size=n).astype(np.uint8)
    x = prototypes[y] * rng.uniform(0.6, 1.0, size=(n, 1, 1))
    shifts = rng.integers(-2, 3, size=(n, 2))
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            sel = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            x[sel] = np.roll(x[sel], (dy, dx), axis=(1, 2))
    x = np.clip(x + rng.normal(0.0, 0.2, size=x.shape), 0.0, 1.0)
    return (x * 255).round().astype(np.uint8), y


def write_data(root: Path, n_train: int, n_test: int, seed: int = 0) -> None:
    """MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte with 10 learnable, overlapping classes."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(10, 7, 7))                       # smooth class blobs, upsampled ×4
    prototypes = np.clip(np.kron(coarse, np.ones((4, 4))) - 0.3, 0.0, 1.5)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = synthetic_images(n, prototypes, rng)
        write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte", x)
        write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", y)


def protocol(orders: int) -> dict:
    """depth-sweep's MNIST cell: its scenario, regimes, training and the methods' hyperparameters."""
    import yaml

    source = yaml.safe_load((ROOT / "protocols" / "depth-sweep.yaml").read_text())
    entries = [m if isinstance(m, dict) else {"name": m} for m in source["methods"]]
    methods = []
    for name in METHODS:  # the unlabelled entry of each method (its main configuration)
        entry = next(m for m in entries if m["name"] == name and "label" not in m)
        methods.append({"name": name, "hparams": entry["hparams"]} if entry.get("hparams") else name)
    mnist = next(d for d in source["datasets"] if d["name"] == "mnist")
    return {"name": NAME, "version": "1", "description": "GPU throughput benchmark (depth-sweep's MNIST cell)",
            "scenario": source["scenario"], "pretrain": source["pretrain"], "datasets": [mnist],
            "regimes": list(source["regimes"]), "methods": methods,
            "task_orders": {"count": orders, "seed": 0}, "seeds": [0],
            "training": source["training"], "evaluation": source["evaluation"]}


def pick_runs(protocol_file: Path, data_dir: Path, n: int) -> list[str]:
    """Run ids of n runs spread over methods × regimes (order 0 first), as the CLI plans them."""
    from harness import compat  # noqa: F401  (quirks first)
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol
    from harness.execution.plan import data_fingerprints, expand

    proto = load_protocol(str(protocol_file), get_registry())
    specs = expand(proto, data_fingerprints(proto, str(data_dir)))
    regimes, methods = list(proto.regimes), [m.display for m in proto.methods]

    def key(s):  # diagonals of the method × regime table: any prefix covers both axes evenly
        m, r = methods.index(s.label or s.method), regimes.index(s.regime)
        return s.order, (r - m) % len(regimes), m
    return [s.run_id for s in sorted(specs, key=key)][:n]


def write_cifar_pickles(root: Path, n_train: int, n_test: int, size: int = 32, seed: int = 0) -> None:
    """cifar-100-python/{train,test}: dicts of uint8 'data' (n, 3*size*size) and 'fine_labels' (100 classes,
    balanced), each class a smooth colour blob plus noise: learnable, and read as the real files are."""
    import pickle

    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0.0, 1.0, size=(100, 3, 4, 4))
    prototypes = np.kron(coarse, np.ones((size // 4, size // 4)))  # (100, 3, size, size)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        y = np.arange(n) % 100
        rng.shuffle(y)
        x = np.clip(prototypes[y] + rng.normal(0.0, 0.15, size=(n, 3, size, size)), 0.0, 1.0)
        entry = {"data": (x * 255).round().astype(np.uint8).reshape(n, -1), "fine_labels": y.tolist()}
        (folder / split).write_bytes(pickle.dumps(entry, protocol=2))


def vit_protocol(orders: int, model: str = "vit-b16", dataset: str = VIT_DATASET, epochs: int = 1) -> dict:
    """The ViT unit: class-IL B0Inc10 on CIFAR-100-shaped pixels, naive under head, lora-r4 and full, bf16."""
    return {"name": VIT_NAME, "version": "1",
            "description": f"GPU throughput benchmark (ViT unit: {model}, class-IL B0Inc10, bf16)",
            "scenario": "class-il", "pretrain": "none",
            "datasets": [{"name": dataset, "n_tasks": 10, "classes_per_task": 10, "model": model}],
            "regimes": list(VIT_REGIMES), "methods": ["naive"],
            "task_orders": {"count": orders, "seed": 0}, "seeds": [0],
            "training": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "epochs": epochs, "batch_size": 64,
                         "precision": "bf16"},
            "evaluation": {"batch_size": 256}}


def default_vit_dataset() -> str:
    """cifar100-pixels (uint8 in memory) where this checkout has it, else cifar100 (the same files, float32)."""
    from harness.config.vocabulary import DATASETS

    return VIT_DATASET if VIT_DATASET in DATASETS else "cifar100"


def memory_per_regime(results: Path, name: str) -> dict:
    """regime -> (runs, mean MiB, max MiB) of the records' CUDA peak allocated memory (provenance.memory)."""
    from harness.execution.store import load_records

    found: dict = {}
    for r in load_records(results, name) if (results / name).exists() else []:
        peak = (r.provenance.get("memory") or {}).get("cuda_peak_bytes")
        if peak:
            found.setdefault(r.spec.regime, []).append(peak / 2**20)
    return {k: (len(v), statistics.fmean(v), max(v)) for k, v in sorted(found.items())}


def level_command(protocol_file: Path, data_dir: Path, results: Path, jobs: int, run_ids, device="cuda") -> list:
    return [sys.executable, "-m", "harness.cli", "run", "--protocol", str(protocol_file), "--data-dir", str(data_dir),
            "--device", device, "--jobs", str(jobs), "--no-mlflow", "--no-leaderboard", "--no-progress",
            "--results", str(results), "--only", ",".join(run_ids)]


# ---------------------------------------------------------------- GPU sampling

def gpu_index() -> str:
    """The GPU the runs use (cuda:0), as nvidia-smi names it (index or UUID)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def gpu_name() -> str:
    """The GPU's name, without creating a CUDA context in this process when nvidia-smi answers."""
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "-i", gpu_index(), "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    import torch

    return torch.cuda.get_device_name(0)


class GpuSampler(threading.Thread):
    """Samples utilisation % and memory MiB of one GPU every `period` s until stopped."""

    def __init__(self, period: float = 0.5):
        super().__init__(daemon=True)
        self.period, self.samples, self.done = period, [], threading.Event()
        self.smi = shutil.which("nvidia-smi")
        self.source = "nvidia-smi" if self.smi else "torch.cuda.utilization"

    def sample(self):
        if self.smi:
            out = subprocess.run([self.smi, "-i", gpu_index(), "--query-gpu=utilization.gpu,memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            util, mem = out.stdout.strip().splitlines()[0].split(",")
            return float(util), float(mem)
        import torch

        mem = torch.cuda.device_memory_used(0) / 2**20 if hasattr(torch.cuda, "device_memory_used") else math.nan
        return float(torch.cuda.utilization(0)), mem

    def run(self):
        while not self.done.is_set():
            try:
                self.samples.append(self.sample())
            except Exception:  # noqa: BLE001  (a missed sample is not a failed benchmark)
                pass
            self.done.wait(self.period)

    def stop(self) -> dict:
        self.done.set()
        if self.ident is not None:  # started (a CPU smoke run samples nothing)
            self.join(timeout=15)
        util = [u for u, _ in self.samples]
        mem = [m for _, m in self.samples if not math.isnan(m)]
        return {"util_mean": statistics.fmean(util) if util else math.nan, "util_max": max(util, default=math.nan),
                "mem_peak": max(mem, default=math.nan), "samples": len(self.samples)}


# ---------------------------------------------------------------- one level

def run_level(cmd: list, timeout: float, log: Path, sample: bool = True) -> tuple[float, int, dict]:
    """(wall s, exit code, GPU stats) of one CLI sweep; its output goes to `log` (`sample`: watch the GPU)."""
    sampler = GpuSampler()
    if sample:
        sampler.start()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: a timeout ends its workers too
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 124
    wall = time.perf_counter() - t0
    return wall, code, sampler.stop()


def level_records(results: Path, name: str = NAME) -> tuple[int, bool, float, set]:
    """(records, all ok, mean in-run seconds, devices recorded) of a level's results folder."""
    from harness.execution.store import load_records

    recs = load_records(results, name) if (results / name).exists() else []
    total = [r.timings.get("total_s") for r in recs if r.timings.get("total_s")]
    return (len(recs), bool(recs) and all(r.status == "ok" for r in recs),
            statistics.fmean(total) if total else math.nan, {r.provenance.get("device") for r in recs})


def fmt(x: float, spec: str) -> str:
    """format(x, spec), a '%' at the end of spec appended literally; '-' for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec[:-1]) + "%" if spec.endswith("%") else format(x, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", choices=("mnist", "vit"), default="mnist",
                    help="mnist: depth-sweep's MNIST cell (default); vit: ViT-B/16 on CIFAR-100-shaped pixels, bf16")
    ap.add_argument("--levels", help="concurrent runs per GPU (--jobs), comma-separated (default 1,4,8,16; vit 1,2,4)")
    ap.add_argument("--runs-per-level", type=int,
                    help="runs at every level (default 16: one per worker at 16; vit 6: 3 regimes x 2 orders)")
    ap.add_argument("--model", help="vit unit: the backbone (default vit-b16; vit-tiny with --cpu-smoke)")
    ap.add_argument("--dataset", help=f"vit unit: the data set (default {VIT_DATASET}, or cifar100 where this "
                                      "checkout has no pixel data set: the same files, held as float32)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no further level after this many seconds (default 420)")
    ap.add_argument("--train-size", type=int, default=6000, help="synthetic training images (default 6000)")
    ap.add_argument("--test-size", type=int, default=1000, help="synthetic test images (default 1000)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="vit unit on the CPU with vit-tiny and a tiny set (200/100 images, levels 1,2, 3 runs): "
                         "checks the code path, measures nothing")
    ap.add_argument("--out", help="keep data, protocol, results and logs here (default: a temp folder, removed)")
    ap.add_argument("--dry-run", action="store_true", help="write data and protocol, print the commands, run nothing")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.unit, args.train_size, args.test_size = "vit", 200, 100
        args.levels, args.runs_per_level = args.levels or "1,2", args.runs_per_level or 3
    vit = args.unit == "vit"
    levels = [int(v) for v in (args.levels or ("1,2,4" if vit else "1,4,8,16")).split(",") if v.strip()]
    args.runs_per_level = args.runs_per_level or (6 if vit else 16)

    import torch

    if not args.dry_run and not args.cpu_smoke and not torch.cuda.is_available():
        print(SKIP_LINE)
        return 0
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cl-bench-gpu-"))
    try:
        return _bench(args, levels, out)
    finally:
        if not args.out and not args.dry_run:  # a dry run keeps what its printed commands need
            shutil.rmtree(out, ignore_errors=True)


def _prepare(args, data_dir: Path, proto_file: Path) -> tuple[str, str]:
    """Write the unit's data and protocol; (protocol name, one line saying what was written)."""
    import yaml

    if args.unit == "vit":
        write_cifar_pickles(data_dir, args.train_size, args.test_size)
        orders = max(1, math.ceil(args.runs_per_level / len(VIT_REGIMES)))
        model = args.model or ("vit-tiny" if args.cpu_smoke else "vit-b16")
        dataset = args.dataset or default_vit_dataset()
        proto_file.write_text(yaml.safe_dump(vit_protocol(orders, model, dataset), sort_keys=False))
        return VIT_NAME, (f"{args.train_size}/{args.test_size} synthetic CIFAR-100 32x32 uint8 images as {dataset}, "
                          f"{model}, "
                          "class-IL 10x10, naive under head/lora-r4/full, bf16")
    write_data(data_dir, args.train_size, args.test_size)
    per_order = len(METHODS) * len(protocol(1)["regimes"])
    proto_file.write_text(yaml.safe_dump(protocol(max(1, math.ceil(args.runs_per_level / per_order))),
                                         sort_keys=False))
    return NAME, f"{args.train_size}/{args.test_size} synthetic MNIST images"


def _bench(args, levels: list[int], out: Path) -> int:
    t_start = time.perf_counter()
    data_dir, proto_file = out / "data", out / "protocol.yaml"
    name, what = _prepare(args, data_dir, proto_file)
    run_ids = pick_runs(proto_file, data_dir, args.runs_per_level)
    print(f"data: {what} in {data_dir}; protocol {proto_file}; "
          f"{len(run_ids)} runs per level ({time.perf_counter() - t_start:.0f} s to prepare)")
    device = "cpu" if args.cpu_smoke else "cuda"
    commands = {n: level_command(proto_file, data_dir, out / f"results-c{n}", n, run_ids, device) for n in levels}
    if args.dry_run:
        for n, cmd in commands.items():
            print(f"level {n:>2}: {shlex.join(cmd)}")
        print(f"dry run: nothing run; data and protocol kept in {out}")
        return 0
    if not args.cpu_smoke:
        print(f"device: {gpu_name()} (nvidia-smi -i {gpu_index()}); sampling with {GpuSampler().source}")
    rows, failed = _levels(args, levels, commands, out, name, run_ids, t_start)
    _print_levels(rows)
    if args.unit == "vit":
        _print_memory(out, name, levels)
    print(f"total {time.perf_counter() - t_start:.0f} s; logs and results "
          f"{'in ' + str(out) if args.out else 'removed (keep them with --out DIR)'}")
    return 1 if failed else 0


def _levels(args, levels, commands, out: Path, name: str, run_ids, t_start: float) -> tuple[list, bool]:
    """Run every level within the budget; (table rows, whether any level failed)."""
    rows, failed = [], False
    for n in levels:
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            print(f"budget: {elapsed:.0f} s > --budget-s {args.budget_s:.0f}; levels not run: "
                  f"{', '.join(str(m) for m in levels[levels.index(n):])}")
            break
        timeout = max(60.0, args.budget_s - elapsed) + 120.0
        wall, code, gpu = run_level(commands[n], timeout, out / f"level-c{n}.log", sample=not args.cpu_smoke)
        count, ok, run_s, devices = level_records(out / f"results-c{n}", name)
        ok = ok and code == 0 and count == len(run_ids)
        failed |= not ok
        rows.append((n, count, wall, count * 3600 / wall, math.nan if math.isnan(run_s) else n * 3600 / run_s,
                     run_s, gpu, ok, code, devices))
        print(f"  level {n:>2}: {count} runs in {wall:.0f} s (exit {code}, devices {sorted(map(str, devices))})",
              flush=True)
        if code != 0 or not ok:
            print("    " + "\n    ".join((out / f"level-c{n}.log").read_text().splitlines()[-15:]))
    return rows, failed


def _print_levels(rows: list) -> None:
    print(f"\n{'conc':>4} {'runs':>5} {'wall s':>7} {'runs/h':>8} {'steady/h':>9} {'s/run':>6} "
          f"{'util mean':>9} {'util max':>8} {'peak MiB':>9}  all ok")
    for n, count, wall, per_h, steady, run_s, gpu, ok, code, _ in rows:
        print(f"{n:>4} {count:>5} {wall:>7.0f} {per_h:>8.0f} {fmt(steady, '.0f'):>9} {fmt(run_s, '.1f'):>6} "
              f"{fmt(gpu['util_mean'], '.0f%'):>9} {fmt(gpu['util_max'], '.0f%'):>8} {fmt(gpu['mem_peak'], '.0f'):>9}  "
              f"{'yes' if ok else f'NO (exit {code})'}")


def _print_memory(out: Path, name: str, levels: list[int]) -> None:
    """GPU memory per run, per regime (the first level's records: one run alone on the GPU)."""
    memory = memory_per_regime(out / f"results-c{levels[0]}", name)
    print(f"\nGPU memory per run (CUDA peak allocated, records of level {levels[0]}):")
    if not memory:
        print("  - (no record carries provenance.memory.cuda_peak_bytes: CPU runs, or compute accounting off)")
    for regime, (count, mean, peak) in memory.items():
        print(f"  {regime:>8}: {mean:8.0f} MiB mean, {peak:8.0f} MiB max over {count} run(s)")


if __name__ == "__main__":
    sys.exit(main())
