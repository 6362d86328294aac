"""Where a small run's time goes: the engine's phases, timed inside one run_one call.

python benchmarks/run_costs.py [--dataset mnist1d] [--model mlp] [--regime full] [--method naive]
                               [--repeats 5] [--threads 1] [--continual EVERY]

Wraps the engine's steps (the names harness.run.engine calls: data loading, model build,
strategy build, evaluation, the learning checks' probe, update-norm snapshots, frozen-state
checks, test-data fingerprints, record building, process-state capture/restore) with timers
and prints the median seconds of each per run and its share of the run's wall time; what is
left is training (strategy.train) and the rest. `--continual EVERY` turns continual
evaluation on (every EVERY optimizer steps, 100 test rows). A timer costs ~1 µs per call.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

from harness.config.specs import ContinualSpec  # noqa: E402
from harness.run import engine  # noqa: E402

# engine-level names (module attributes of harness.run.engine) -> the phase they are counted in
PHASES = {
    "get_registry": "setup", "capture": "isolation", "restore": "isolation", "_check_plugins": "setup",
    "load_dataset": "data", "_check_data": "data", "split_tasks": "data", "on_device": "data",
    "fingerprint_test_data": "test-data checks", "_check_test_data": "test-data checks",
    "_run_model": "model", "parameter_counts": "model", "trainable_block_names": "model",
    "_build_strategy": "strategy build", "to_avalanche": "streams",
    "apply_regime": "regime", "frozen_state": "frozen checks", "_check_frozen": "frozen checks",
    "_timed_eval": "evaluation", "probe_accuracy": "probe", "_trained_accuracy": "trained acc",
    "snapshot": "norms", "shared_effective_weights": "norms", "update_norms": "norms",
    "_record": "record", "_memory_use": "record",
}


def instrument(acc: dict):
    """Wrap the engine's names; a nested timed call is not counted twice (outermost only)."""
    depth = [0]
    originals = {}
    for name, phase in PHASES.items():
        fn = getattr(engine, name)
        originals[name] = fn

        def timed(*a, __fn=fn, __phase=phase, **k):
            if depth[0]:
                return __fn(*a, **k)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return __fn(*a, **k)
            finally:
                acc[__phase] += time.perf_counter() - t0
                depth[0] -= 1
        setattr(engine, name, timed)
    return originals


def main() -> None:
    ap = C.small_run_parser(__doc__, repeats=5)
    ap.add_argument("--method", default="naive")
    ap.add_argument("--continual", type=int, default=0, help="continual evaluation every N steps (0: off)")
    args = ap.parse_args()
    C.set_threads(args.threads)
    spec = C.make_spec(args.method, dataset=args.dataset, model=args.model, regime=args.regime)
    if args.continual:
        spec = dataclasses.replace(spec, continual=ContinualSpec(args.continual, 100))
    engine.run_one(spec, device="cpu")  # warm-up
    samples = defaultdict(list)
    originals = None
    for _ in range(args.repeats):
        acc = defaultdict(float)
        originals = instrument(acc)
        try:
            t0 = time.perf_counter()
            record = engine.run_one(spec, device="cpu")
            wall = time.perf_counter() - t0
        finally:
            for name, fn in originals.items():
                setattr(engine, name, fn)
        assert record.status == "ok", record.error
        # per_task_s spans apply_regime, the frozen-state checks and strategy.train (without curve points)
        acc["training"] = float(sum(record.timings["per_task_s"])) - acc["regime"] - acc["frozen checks"]
        acc["curve"] = record.timings.get("curve_s", 0.0)  # its points run inside training and evaluation
        acc["rest"] = wall - sum(v for k, v in acc.items() if k != "curve") - acc["curve"]
        acc["run (wall)"] = wall
        for k, v in acc.items():
            samples[k].append(v)
    wall = statistics.median(samples["run (wall)"])
    print(f"{args.dataset}, {args.model}, {args.method}, regime {args.regime}, 5 tasks x 3 epochs, batch 32, "
          f"continual {args.continual or 'off'}, {args.repeats} repeat(s); {C.load_avg()}")
    order = sorted((k for k in samples if k != "run (wall)"), key=lambda k: -statistics.median(samples[k]))
    for k in order + ["run (wall)"]:
        m = statistics.median(samples[k])
        print(f"  {k:<18} {m * 1000:8.1f} ms  {m / wall:6.1%}")
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    main()
