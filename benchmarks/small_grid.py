"""Small grids, whole processes (issue 31): a 12-run `cl-bench run`, `cl-bench check`, time to first record.

python benchmarks/small_grid.py [--repeats 5] [--before-ref REF] [--skip-grid] [--skip-check]

Every figure is a fresh process timed from outside, the variants alternated round-robin (so a busy
machine slows them alike), medians printed with the load average next to the reference:

1. Whole process, 12 naive runs: `cl-bench run --protocol depth-sweep-mini --datasets digits
   --methods naive --orders 3 --jobs 1 --no-mlflow --no-leaderboard` (into a fresh folder) against
   benchmarks/_plain_process.py, a plain PyTorch process doing the same 12 runs (same data, split,
   model, regimes, budget, matrix and continual-evaluation points; only torch, NumPy and
   scikit-learn imported). Time to the first record (a record file appears) next to the plain
   process's end of its first run, and the plain process's own import time.
2. `cl-bench check submissions/l2_anchor.py` (a one-file method) and its import share: the
   seconds a fresh process spends importing what the command imports (the CLI, the engine, every
   built-in method), timed inside it, against the whole command's wall time.

`--before-ref REF` adds the same commands on the harness of git ref REF (a `git archive` copy,
run with PYTHONPATH there), e.g. the commit before a change; without it, "before" is this tree
with CL_BENCH_FULL_IMPORTS=1 (nothing deferred or split by harness.compat).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _watch import first_and_total  # noqa: E402

PY = sys.executable
GRID = ["--protocol", str(ROOT / "protocols" / "depth-sweep-mini.yaml"), "--datasets", "digits",
        "--methods", "naive", "--orders", "3", "--jobs", "1", "--no-mlflow", "--no-leaderboard", "--no-progress"]
# What `check` imports, timed inside the process (its exit, which `check` pays too, is not an import)
IMPORTS = ("import time\nt0 = time.perf_counter()\n"
           "import harness.cli.commands, harness.execution.check, harness.execution.sweep, harness.run.engine\n"
           "from harness.api.registry import get_registry\nget_registry()\nprint(time.perf_counter() - t0)")
CHECK = ["check", "submissions/l2_anchor.py"]  # each variant checks its own copy (run in its tree)


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


class Variant:
    """A harness to run: a source tree (PYTHONPATH and cwd) and extra environment."""

    def __init__(self, name: str, root: Path, **env):
        self.name, self.root, self.env = name, root, env

    def environ(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "CL_BENCH_FULL_IMPORTS"}
        return env | {"PYTHONPATH": str(self.root), "OMP_NUM_THREADS": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
                      "RAY_USAGE_STATS_ENABLED": "0"} | self.env

    def cli(self, *args) -> list:
        return [PY, "-m", "harness.cli", *args]


def grid_run(variant: Variant, folder: Path) -> dict:
    """One `cl-bench run` of the 12-run grid: seconds to the first record file and to the exit."""
    results = folder / f"results-{time.monotonic_ns()}"
    runs = results / "depth-sweep-mini" / "runs"
    t0 = time.perf_counter()
    proc = subprocess.Popen(variant.cli("run", *GRID, "--results", str(results)), cwd=variant.root,
                            env=variant.environ(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first, total = first_and_total(proc, runs, t0)
    if proc.returncode != 0:
        raise SystemExit(f"{variant.name}: cl-bench run exited {proc.returncode}: {proc.stderr.read()[-2000:]!r}")
    n = len(list(runs.glob("*.json")))
    if n != 12:
        raise SystemExit(f"{variant.name}: {n} records, not 12")
    return {"first": first if first is not None else total, "all": total}


def plain_config(folder: Path) -> Path:
    """The 12 runs for benchmarks/_plain_process.py, from the protocol as the harness expands it."""
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol, select
    from harness.config.vocabulary import MODELS, regime_depth
    from harness.execution.plan import expand

    protocol = select(load_protocol(GRID[1], get_registry()), datasets=["digits"], methods=["naive"], orders=3)
    specs = expand(protocol, fingerprints={"digits": "-"})
    assert len(specs) == 12, len(specs)
    s = specs[0]
    n_blocks = MODELS[s.dataset.model].n_blocks
    cfg = {"runs": [{"class_order": list(x.class_order), "seed": x.seed,
                     "trainable_blocks": regime_depth(x.regime, n_blocks)} for x in specs],
           "n_tasks": s.dataset.n_tasks, "classes_per_task": s.dataset.classes_per_task,
           "lr": s.training.lr, "momentum": s.training.momentum, "epochs": s.training.epochs,
           "batch_size": s.training.batch_size, "eval_batch_size": s.eval_batch_size,
           "every": s.continual.every, "subsample": s.continual.subsample}
    path = folder / "plain-runs.json"
    path.write_text(json.dumps(cfg))
    return path


def plain_run(config: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    t0, w0 = time.perf_counter(), time.time()
    out = subprocess.run([PY, str(ROOT / "benchmarks" / "_plain_process.py"), str(config)], env=env,
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    total = time.perf_counter() - t0
    marks = json.loads(out.stdout.splitlines()[-1])
    return {"first": marks["first"] - w0, "all": total, "imports": marks["imported"] - w0}


def timed(argv, variant: Variant) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=variant.root, env=variant.environ(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def import_seconds(variant: Variant) -> float:
    out = subprocess.run([PY, "-c", IMPORTS], cwd=variant.root, env=variant.environ(), check=True,
                         capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def medians(samples: list[dict]) -> dict:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def spread(values) -> str:
    med = statistics.median(values)
    return f"{(max(values) - min(values)) / med:.0%}" if med else "-"


def whole_grid(variants: list[Variant], repeats: int, folder: Path) -> None:
    config = plain_config(folder)
    samples = {v.name: [] for v in variants} | {"plain": []}
    print(f"1. whole process, 12 naive runs (digits, depth-sweep-mini, 3 orders x 4 regimes); {load()}")
    for r in range(repeats):
        for v in variants:
            samples[v.name].append(grid_run(v, folder))
        samples["plain"].append(plain_run(config))
        print(f"   pair {r + 1}: " + "  ".join(f"{k} {s[-1]['all']:.2f} s" for k, s in samples.items())
              + f"; {load()}", flush=True)
    plain = medians(samples["plain"])
    print(f"   plain process: {plain['all']:6.2f} s (median of {repeats}, spread "
          f"{spread([s['all'] for s in samples['plain']])}); its imports {plain['imports']:.2f} s; "
          f"first run done at {plain['first']:.2f} s")
    for v in variants:
        m = medians(samples[v.name])
        print(f"   {v.name:<24} all 12 {m['all']:6.2f} s  = {m['all'] / plain['all']:4.2f}x plain "
              f"(spread {spread([s['all'] for s in samples[v.name]])});  first record {m['first']:5.2f} s "
              f"= {m['first'] / plain['first']:4.2f}x plain's first run")
    print(f"   goal (issue 31): whole process <= 1.3x the plain loop; {load()}")


def check_time(variants: list[Variant], repeats: int) -> None:
    samples = {(v.name, what): [] for v in variants for what in ("check", "imports")}
    samples[("python", "-c pass")] = []
    print(f"2. `cl-bench check submissions/l2_anchor.py` and its imports (fresh processes); {load()}")
    for _ in range(repeats):
        for v in variants:
            samples[(v.name, "check")].append(timed(v.cli(*CHECK), v))
            samples[(v.name, "imports")].append(import_seconds(v))
        samples[("python", "-c pass")].append(timed([PY, "-c", "pass"], variants[0]))
    bare = statistics.median(samples[("python", "-c pass")])
    for v in variants:
        check, imports = (statistics.median(samples[(v.name, w)]) for w in ("check", "imports"))
        print(f"   {v.name:<24} check {check:6.2f} s (spread {spread(samples[(v.name, 'check')])})   "
              f"imports {imports:5.2f} s = {imports / check:4.0%} of it   (bare python process {bare:.2f} s)")
    if len(variants) > 1:
        a, b = variants[0].name, variants[1].name
        ca, cb = (statistics.median(samples[(n, "check")]) for n in (a, b))
        ia, ib = (statistics.median(samples[(n, "imports")]) for n in (a, b))
        print(f"   {a} / {b}: check {ca / cb:4.2f}x, imports {ia / ib:4.2f}x")
    print(f"   goal (issue 31): check <= 5 s on a quiet machine, of which imports <= 3 s; {load()}")


def before_tree(ref: str, folder: Path) -> Path:
    dest = folder / f"before-{ref.replace('/', '_')}"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--before-ref", default=None, help="git ref whose harness is 'before'")
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cl-bench-small-grid-") as tmp:
        folder = Path(tmp)
        before = (Variant(f"before ({args.before_ref})", before_tree(args.before_ref, folder)) if args.before_ref
                  else Variant("before (FULL_IMPORTS=1)", ROOT, CL_BENCH_FULL_IMPORTS="1"))
        variants = [Variant("this tree", ROOT), before]
        if not args.skip_check:
            check_time(variants, args.repeats)
        if not args.skip_grid:
            whole_grid(variants, args.repeats, folder)
    print(f"done; {load()}")


if __name__ == "__main__":
    main()
