"""Scaling: the same grid with --jobs 1 and --jobs 2, process pool and Ray, side by side.

Grid: depth-sweep-mini restricted to digits x {head, full} x {naive, lwf} x 5 task orders
(20 runs, each a fraction of a second), so fixed costs (spawning workers that import
torch and Avalanche, starting Ray) weigh a lot; a full depth-sweep amortises them.
Wall seconds per configuration, the ratio to the process --jobs 1 baseline (which runs
inline), and whether every configuration produced the same metrics.
Run: .venv/bin/python benchmarks/scaling.py [--orders N] [--jobs-max J]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from harness import compat  # noqa: F401,E402  (telemetry and usage stats off)
from harness.execution.executors import RunOptions, make_executor  # noqa: E402
from harness.config.protocol import load_protocol, select  # noqa: E402
from harness.execution.store import load_records  # noqa: E402
from harness.methods.registry import get_registry  # noqa: E402
from harness.execution.plan import make_plan  # noqa: E402
from harness.execution.sweep import run_sweep  # noqa: E402


def grid(orders: int):
    """depth-sweep-mini, one dataset x 2 regimes x 2 methods x `orders` task orders."""
    protocol = load_protocol("depth-sweep-mini", get_registry())
    return select(protocol, datasets=("digits",), regimes=("head", "full"), methods=("naive", "lwf"),
                  orders=orders)


def timed_sweep(protocol, executor: str, jobs: int) -> tuple[float, float, dict]:
    """(wall seconds of the sweep, seconds to start Ray, {run_id: metrics}) in a fresh folder."""
    start_s = 0.0
    options = RunOptions(device="cpu", threads=1)
    if executor == "ray":
        import ray

        from harness.execution.executors.ray import start_ray

        t0 = time.perf_counter()
        start_ray(ray, None, jobs)
        start_s = time.perf_counter() - t0
    runner = make_executor(executor, options, jobs)
    with tempfile.TemporaryDirectory(prefix="cl-bench-scaling-") as results:
        plan = make_plan(protocol, results)
        t0 = time.perf_counter()
        result = run_sweep(plan, protocol, results, options, executor=runner, progress=False,
                           log=lambda *_: None)
        wall = time.perf_counter() - t0
        assert not result.interrupted and len(result.written) == len(plan.todo)
        metrics = {r.run_id: r.metrics for r in load_records(results, protocol.name)}
    if executor == "ray":
        import ray

        ray.shutdown()
    return wall, start_s, metrics


def worker_cold_start() -> float:
    """Seconds a fresh Python process needs to import what a worker imports."""
    import subprocess
    import sys

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import harness.compat, harness.run.engine"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    """Print wall times and ratios for process and Ray at --jobs 1..J."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=5, help="task orders (4 runs each; default 5)")
    parser.add_argument("--jobs-max", type=int, default=2, help="largest --jobs (default 2)")
    args = parser.parse_args()
    protocol = grid(args.orders)
    n = len(make_plan(protocol, tempfile.gettempdir() + "/cl-bench-scaling-none").todo)
    print(f"grid: {n} runs (digits x head,full x naive,lwf x {args.orders} orders), "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    rows, reference = [], None
    for executor in ("process", "ray"):
        for jobs in range(1, args.jobs_max + 1):
            wall, start_s, metrics = timed_sweep(protocol, executor, jobs)
            reference = reference or (wall, metrics)
            rows.append((executor, jobs, wall, start_s, metrics == reference[1]))
    base = reference[0]
    cold = worker_cold_start()
    print(f"{'executor':<9} {'jobs':>4} {'wall s':>8} {'runs/s':>7} {'vs process 1':>13} "
          f"{'ray start s':>11}  same metrics")
    for executor, jobs, wall, start_s, same in rows:
        note = " (inline)" if executor == "process" and jobs == 1 else ""
        print(f"{executor:<9} {jobs:>4} {wall:>8.1f} {n / wall:>7.2f} {base / wall:>12.2f}x "
              f"{start_s:>11.1f}  {'yes' if same else 'NO'}{note}")
    print(f"one fresh worker process importing the harness (torch, Avalanche): {cold:.1f} s; "
          "each pool worker and each Ray worker pays it once")
    for executor in ("process", "ray"):
        walls = {j: w for e, j, w, _, _ in rows if e == executor}
        if 1 in walls and 2 in walls:
            print(f"{executor}: --jobs 2 is {walls[1] / walls[2]:.2f}x the speed of --jobs 1")


if __name__ == "__main__":
    main()
