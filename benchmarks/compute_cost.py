"""Compute accounting (issue 28): what it costs, and the compute of every built-in method on one demo cell.

python benchmarks/compute_cost.py [--protocol depth-sweep-mini] [--dataset digits] [--regime last-1]
                                  [--repeats 3] [--skip-cost] [--skip-figures]

1. Cost: the protocol's own runs of one cell (its methods at `--dataset`, `--regime`, task order 0, as
   `cl-bench run` builds them: load_protocol + expand), each run with accounting (harness.run.compute.ENABLED)
   and without, back to back in one process, the order alternating from pair to pair so that a busy shared
   machine slows both sides alike, after one warm-up pair per method. Printed: per method the median ratio
   on/off over `--repeats` pairs and its range, overall the median ratio, the total ratio (sum on / sum off)
   CPU-time ratios (process time: less moved by neighbours; "min": fastest run on / fastest off), and the
   accounting's own measured seconds (the FLOP measurement; the hooks' share is in the ratios only).
   The records on and off must be equal but for budget.compute and the timings; a difference exits 1.
2. Figures: every built-in method of the registry (its defaults) on the same cell, one run each with
   accounting: optimizer steps, samples seen, forward and backward sample-passes, passes per step, training
   FLOPs, FLOPs relative to naive, peak RSS, train/eval/merge seconds and merge element ops.
All runs on the CPU with 1 torch thread (the demo's per-worker setting).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time


def _without_compute(record) -> dict:
    data = record.to_dict()
    data["budget"] = {k: v for k, v in data["budget"].items() if k != "compute"}
    return {k: v for k, v in data.items() if k not in ("timings", "provenance")}


def _timed(spec, enabled: bool):
    from harness.run import compute
    from harness.run.engine import run_one

    compute.ENABLED = enabled
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        record = run_one(spec, device="cpu")
        return record, time.perf_counter() - t0, time.process_time() - c0
    finally:
        compute.ENABLED = True


def cell_specs(protocol_name: str, dataset: str, regime: str) -> list:
    """The protocol's runs of one cell at task order 0 (every method of the protocol)."""
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol
    from harness.execution.plan import expand

    protocol = load_protocol(protocol_name, get_registry())
    specs = [s for s in expand(protocol) if s.dataset.name == dataset and s.regime == regime and s.order == 0]
    if not specs:
        sys.exit(f"no runs of {protocol_name} at dataset {dataset!r}, regime {regime!r}, order 0")
    return specs


def cost(specs, repeats: int) -> bool:
    """Print the wall cost of the accounting; False when a record differs with and without it."""
    times, accounting, same = {}, 0.0, True  # label -> {enabled: [(wall, cpu)]}
    for spec in specs:  # warm-up: the first run of each method pays imports and caches
        _timed(spec, True), _timed(spec, False)
    for i in range(repeats):
        for j, spec in enumerate(specs):
            sides = (True, False) if (i + j) % 2 == 0 else (False, True)
            got = {enabled: _timed(spec, enabled) for enabled in sides}
            same &= _without_compute(got[True][0]) == _without_compute(got[False][0])
            mine = times.setdefault(spec.label or spec.method, {True: [], False: []})
            for enabled in sides:
                mine[enabled].append(got[enabled][1:])
            accounting += got[True][0].timings["accounting_s"]
    print(f"accounting cost, {len(specs)} runs x {repeats} pairs (on = with accounting, off = without; wall and "
          "process CPU seconds; 'min' = fastest on / fastest off, the figure least moved by a busy machine):")
    for label, t in times.items():
        wall = [a[0] / b[0] for a, b in zip(t[True], t[False])]
        cpu_min = min(c for _, c in t[True]) / min(c for _, c in t[False])
        print(f"  {label:<12} wall median on/off {statistics.median(wall):.3f} (range {min(wall):.3f}-{max(wall):.3f})"
              f"  cpu min {cpu_min:.3f}")
    on = [x for t in times.values() for x in t[True]]
    off = [x for t in times.values() for x in t[False]]
    on_wall, off_wall = sum(w for w, _ in on), sum(w for w, _ in off)
    on_min = sum(min(c for _, c in t[True]) for t in times.values())
    off_min = sum(min(c for _, c in t[False]) for t in times.values())
    print(f"  overall: wall total {on_wall:.2f} s / {off_wall:.2f} s = {on_wall / off_wall:.3f}; cpu total "
          f"{sum(c for _, c in on) / sum(c for _, c in off):.3f}; sum of per-method fastest cpu {on_min:.2f} s / "
          f"{off_min:.2f} s = {on_min / off_min:.3f}; FLOP measurement {accounting:.3f} s "
          f"({100 * accounting / on_wall:.2f} % of the on side)")
    print(f"  records equal with and without accounting (but budget.compute, timings, provenance): {same}")
    return same


def figures(base) -> None:
    """One run of every built-in method (defaults) on the cell of `base` (a naive spec of the protocol)."""
    from harness.api.registry import get_registry

    rows, naive_flops = [], None
    for name, adapter in get_registry().items():
        if adapter.source != "built-in":
            continue
        spec = dataclasses.replace(base, method=name, label="", hparams={}, method_version=adapter.implementation)
        record, wall, _cpu = _timed(spec, True)
        c = record.budget.get("compute")
        if name == "naive" and c:
            naive_flops = c["flops"]
        rows.append((name, record, wall, c))
    print(f"\ncompute of every built-in method (defaults), {base.dataset.name} / {base.dataset.model}, "
          f"regime {base.regime}, order 0, pretrain {base.pretrain.label}:")
    print(f"  {'method':<16}{'status':<9}{'steps':>6}{'samples':>9}{'fwd':>9}{'bwd':>9}{'fwd/step':>9}"
          f"{'GFLOPs':>9}{'x naive':>8}{'peak RSS':>10}{'train s':>8}{'eval s':>7}{'merge s':>8}{'merge ops':>11}")
    for name, record, _wall, c in rows:
        b = record.budget
        if not c or record.status != "ok":
            print(f"  {name:<16}{record.status:<9}{(record.error or 'not measured')[:100]}")
            continue
        merge, t, memory = c.get("merge", {}), record.timings, record.provenance.get("memory", {})
        steps = b.get("optimizer_steps") or 0
        rel = f"{c['flops'] / naive_flops:.2f}" if naive_flops else "n/a"
        ops = merge.get("element_ops")
        print(f"  {name:<16}{record.status:<9}{steps:>6}{b.get('samples_seen', 0):>9}{c['forward_samples']:>9}"
              f"{c['backward_samples']:>9}{c['forward_samples'] / steps if steps else float('nan'):>9.1f}"
              f"{c['flops'] / 1e9:>9.3f}{rel:>8}{memory.get('peak_rss_bytes', 0) / 2**20:>8.0f}Mi"
              f"{t['train_s']:>8.2f}{t['eval_s']:>7.2f}{t.get('merge_s', 0.0):>8.3f}"
              f"{'' if ops is None else f'{ops:,}':>11}")


def main() -> None:
    """Parse the flags, run the cost comparison and the figures, exit 1 when records differed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="depth-sweep-mini")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--regime", default="last-1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-figures", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    specs = cell_specs(args.protocol, args.dataset, args.regime)
    same = True if args.skip_cost else cost(specs, args.repeats)
    if not args.skip_figures:
        figures(next(s for s in specs if s.method == "naive"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
