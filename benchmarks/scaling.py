"""Scaling: the same grid with --jobs 1 and --jobs 2, process pool and Ray, side by side.

Grids (both from depth-sweep-mini; `--orders` of its 5 task orders, default 5):
  --grid small (default): digits x {head, full} x {naive, lwf}: 4 runs per order, 20 runs,
      each a fraction of a second, so fixed costs (spawning workers that import torch and
      Avalanche, starting Ray) weigh a lot; a full depth-sweep amortises them.
  --grid wide: {digits, mnist1d} x {head, full} x 7 methods (every depth-sweep-mini entry but
      the became-a1 ablation: naive, lwf, gpm, became, became-a0, magmax, ties): 28 runs per
      order, 140 runs, the "--jobs 2 vs --jobs 1 on a 140-run grid" figure. (The protocol has
      5 task orders, so a bigger grid takes more of its other axes rather than more orders.)
Each configuration (executor x --jobs 1..J) runs the grid in a fresh results folder. Printed:
wall seconds per configuration, runs/s, the ratio to the first configuration (process --jobs 1,
which runs inline), Ray's start-up, the runs' own seconds summed (so that worker start-up and
contention can be told apart), the load average at the start, and whether every configuration
produced the same records (status, metrics and accuracy matrix of every run id) as the first.
Run: .venv/bin/python benchmarks/scaling.py [--grid small|wide] [--orders N] [--jobs-max J]
                                            [--executors process,ray]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from harness import compat  # noqa: F401,E402  (telemetry and usage stats off)
from harness.api.registry import get_registry  # noqa: E402
from harness.config.protocol import load_protocol, select  # noqa: E402
from harness.execution.executors import RunOptions, make_executor  # noqa: E402
from harness.execution.plan import make_plan  # noqa: E402
from harness.execution.store import load_records  # noqa: E402
from harness.execution.sweep import run_sweep  # noqa: E402

# --grid name -> (datasets, regimes, method entries) of depth-sweep-mini
GRIDS = {
    "small": (("digits",), ("head", "full"), ("naive", "lwf")),
    "wide": (("digits", "mnist1d"), ("head", "full"),
             ("naive", "lwf", "gpm", "became", "became-a0", "magmax", "ties")),
}


def grid(orders: int, name: str = "small"):
    """depth-sweep-mini restricted to one of GRIDS x the first `orders` task orders."""
    datasets, regimes, methods = GRIDS[name]
    protocol = load_protocol("depth-sweep-mini", get_registry())
    return select(protocol, datasets=datasets, regimes=regimes, methods=methods, orders=orders)


def describe(name: str, orders: int) -> str:
    datasets, regimes, methods = GRIDS[name]
    return f"{','.join(datasets)} x {','.join(regimes)} x {','.join(methods)} x {orders} orders"


def timed_sweep(protocol, executor: str, jobs: int) -> tuple[float, float, dict, float]:
    """(wall seconds of the sweep, seconds to start Ray, {run_id: (status, metrics, acc_matrix)},
    the runs' own seconds summed) in a fresh folder."""
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
        records = load_records(results, protocol.name)
        metrics = {r.run_id: (r.status, r.metrics, r.acc_matrix) for r in records}
        run_s = sum((r.timings or {}).get("total_s") or 0.0 for r in records)
    if executor == "ray":
        import ray

        ray.shutdown()
    return wall, start_s, metrics, run_s


def worker_cold_start() -> float:
    """Seconds a fresh Python process needs to import what a worker imports."""
    import subprocess
    import sys

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import harness.compat, harness.run.engine"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    """Print wall times and ratios for each executor at --jobs 1..J."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small",
                        help="small: 4 runs per order (20 at 5 orders, the default); wide: 28 per order (140)")
    parser.add_argument("--orders", type=int, default=5, help="task orders, 1..5 (default 5)")
    parser.add_argument("--jobs-max", type=int, default=2, help="largest --jobs (default 2)")
    parser.add_argument("--executors", default="process,ray",
                        help="comma-separated, of process and ray (default both)")
    args = parser.parse_args()
    executors = args.executors.split(",")
    unknown = set(executors) - {"process", "ray"}
    if unknown:
        parser.error(f"--executors: unknown {', '.join(sorted(unknown))}; allowed: process, ray")
    protocol = grid(args.orders, args.grid)
    n = len(make_plan(protocol, tempfile.gettempdir() + "/cl-bench-scaling-none").todo)
    print(f"grid: {n} runs (depth-sweep-mini: {describe(args.grid, args.orders)}), "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; {load_avg()}")
    rows, reference = [], None
    for executor in executors:
        for jobs in range(1, args.jobs_max + 1):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            wall, start_s, metrics, run_s = timed_sweep(protocol, executor, jobs)
            reference = reference or (wall, metrics)
            rows.append((executor, jobs, wall, start_s, metrics == reference[1], run_s, load))
    base = reference[0]
    cold = worker_cold_start()
    first = f"vs {rows[0][0]} 1"
    print(f"{'executor':<9} {'jobs':>4} {'wall s':>8} {'runs/s':>7} {first:>13} "
          f"{'ray start s':>11} {'sum run s':>9} {'load':>5}  same records")
    for executor, jobs, wall, start_s, same, run_s, load in rows:
        note = " (inline)" if executor == "process" and jobs == 1 else ""
        print(f"{executor:<9} {jobs:>4} {wall:>8.1f} {n / wall:>7.2f} {base / wall:>12.2f}x "
              f"{start_s:>11.1f} {run_s:>9.1f} {load:>5.2f}  {'yes' if same else 'NO'}{note}")
    print("sum run s: the runs' own seconds (record timings) added up; wall - sum/jobs is what "
          "workers, scheduling and waiting added. load: 1-minute load average when it started")
    print(f"one fresh worker process importing the harness (torch, Avalanche): {cold:.1f} s; "
          "each pool worker and each Ray worker pays it once")
    for executor in executors:
        walls = {j: w for e, j, w, *_ in rows if e == executor}
        if 1 in walls and 2 in walls:
            print(f"{executor}: --jobs 2 vs --jobs 1 on a {n}-run grid: {walls[1] / walls[2]:.2f}x the speed "
                  f"({walls[2]:.1f} s vs {walls[1]:.1f} s)")
    print(f"done; {load_avg()}")


def load_avg() -> str:
    """The 1-minute load average (how busy the machine's other users kept it)."""
    try:
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        return "load average unknown"


if __name__ == "__main__":
    main()
