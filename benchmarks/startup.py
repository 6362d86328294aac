"""Start-up: `cl-bench --help`/`list` (target <= 1 s), `cl-bench check`, and time to first record.

python benchmarks/startup.py [--repeats 5] [--skip-cli] [--skip-check] [--skip-sweep]

1. Each command runs as a fresh process, interleaved with a bare `python -c pass` (the
   floor) and with the old way of listing methods (importing every adapter through the
   registry, i.e. torch and Avalanche), so a busy machine slows all of them alike. Also says
   whether the shipped built-in method index (harness/api/_index.json) is fresh.
2. `cl-bench check submissions/l2_anchor.py` next to the import floor it cannot go below
   (`import harness.run.engine`: torch + Avalanche + the harness) and to bare python; and that
   floor with harness.compat's deferred imports next to the same import with them switched off
   (CL_BENCH_FULL_IMPORTS=1).
3. Time to first record of a 10-run grid (digits, mlp, head/full x naive x 5 orders, 1 epoch)
   through the real CLI (`--no-mlflow --no-leaderboard`), at --jobs 1 (inline) and --jobs 2
   with worker processes forked from the preloaded server (the default) and with spawned
   workers (CL_BENCH_START_METHOD=spawn, the way before), interleaved. "first" is when the
   first record file appears in the results folder; "all" when the command has exited.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from _watch import first_and_total  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "harness.cli"]
COMMANDS = {
    "python -c pass": [PY, "-c", "pass"],
    "cl-bench --help": [*CLI, "--help"],
    "cl-bench list": [*CLI, "list"],
    "cl-bench list methods": [*CLI, "list", "methods"],
    "old: import every adapter": [PY, "-c", "from harness.api.registry import get_registry; get_registry()"],
}


def _runner(argv, **env):
    def run():
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, **env))
    return run


GRID = """name: startup-grid
version: "1"
description: 10 runs for time-to-first-record.
scenario: task-il
pretrain: first-task
datasets:
  - {name: digits, n_tasks: 5, classes_per_task: 2, model: mlp}
regimes: [head, full]
methods: [naive]
task_orders: {count: 5, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 32}
evaluation: {batch_size: 512}
"""
SWEEPS = {"--jobs 1 (inline)": (1, None), "--jobs 2, forked workers": (2, "forkserver"),
          "--jobs 2, spawned workers": (2, "spawn")}


def cli_startup(repeats: int) -> None:
    """`--help` / `list` against bare python and the old import-everything listing."""
    from harness.api import index as method_index

    print(f"built-in method index fresh: {_index_is_fresh(method_index)}; {C.load_avg()}")
    result = C.side_by_side({k: _runner(v) for k, v in COMMANDS.items()}, repeats=repeats)
    floor = result["python -c pass"][0]
    for name, (wall, _, spread) in result.items():
        print(f"{name:<28} {wall:6.2f} s wall (median of {repeats}, spread {spread:.0%})   "
              f"{wall / floor:6.1f}x bare python")


def check_time(repeats: int) -> None:
    """`cl-bench check` of a submission next to the stack's import time, with and without deferral."""
    stack = [PY, "-c", "import harness.compat, harness.run.engine"]
    fns = {"python -c pass": _runner(COMMANDS["python -c pass"]),
           "import stack, deferred": _runner(stack),
           "import stack, full": _runner(stack, CL_BENCH_FULL_IMPORTS="1"),
           "cl-bench check l2_anchor.py": _runner([*CLI, "check", "submissions/l2_anchor.py"])}
    result = C.side_by_side(fns, repeats=repeats, warmup=1)
    print(f"`cl-bench check` and the import floor (median of {repeats}); {C.load_avg()}")
    print(C.ratio_line("import: deferred / full", result, "import stack, deferred", "import stack, full"))
    print(C.ratio_line("check / import floor", result, "cl-bench check l2_anchor.py", "import stack, deferred"))
    print(C.ratio_line("check / python -c pass", result, "cl-bench check l2_anchor.py", "python -c pass"))


def first_record(jobs: int, start_method: str | None, folder: Path) -> tuple[float, float]:
    """(seconds to the first record file, seconds to exit) of one `cl-bench run` of the 10-run grid."""
    protocol = folder / "grid.yaml"
    protocol.write_text(GRID)
    results = folder / f"results-{time.monotonic_ns()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if start_method:
        env["CL_BENCH_START_METHOD"] = start_method
    argv = [*CLI, "run", "--protocol", str(protocol), "--results", str(results), "--jobs", str(jobs),
            "--no-mlflow", "--no-leaderboard", "--no-progress"]
    runs = results / "startup-grid" / "runs"
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, total = first_and_total(proc, runs, t0)
    if proc.returncode != 0:
        raise SystemExit(f"cl-bench run exited {proc.returncode}: {' '.join(argv)}")
    return (first if first is not None else total), total


def sweep_startup(repeats: int) -> None:
    """Time to first record and to the end, per way of running, interleaved."""
    samples = {name: [] for name in SWEEPS}
    with tempfile.TemporaryDirectory(prefix="cl-bench-startup-") as tmp:
        for _ in range(repeats):
            for name, (jobs, method) in SWEEPS.items():
                samples[name].append(first_record(jobs, method, Path(tmp)))
    print(f"10-run grid through `cl-bench run` (median of {repeats}):")
    base = statistics.median(f for f, _ in samples["--jobs 2, spawned workers"])
    for name, values in samples.items():
        first, total = (statistics.median(v[i] for v in values) for i in (0, 1))
        print(f"  {name:<28} first record {first:6.2f} s   all 10 {total:6.2f} s   "
              f"first-record ratio to spawned {first / base:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if not args.skip_cli:
        cli_startup(args.repeats)
    if not args.skip_check:
        check_time(args.repeats)
    if not args.skip_sweep:
        sweep_startup(args.repeats)
    print(f"done; {C.load_avg()}")


def _index_is_fresh(method_index) -> bool:
    import json

    try:
        return json.loads(method_index.INDEX_PATH.read_text())["fingerprint"] == method_index.builtin_fingerprint()
    except (OSError, ValueError, KeyError):
        return False


if __name__ == "__main__":
    main()
