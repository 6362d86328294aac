"""Wall cost of continual evaluation (issue 29): the demo's runs with and without the curve.

python benchmarks/continual_cost.py [--every 10 [20 ...]] [--subsample 100] [--repeats 2] [--all]
                                    [--protocol depth-sweep-mini] [--datasets digits,...] [--threads 1]

The runs are the demo protocol's own (load_protocol + expand, as `cl-bench run` builds them); each is
run without continual evaluation (the protocol's own setting is cleared) and as a copy with
`continual=ContinualSpec(every, subsample)` for each `--every`, through `run_one` on the CPU with 1
torch thread (the demo's per-worker setting,
`--jobs 2`). The sample is every method x every regime x every data set at task order 0 (`--all`: every
task order, the whole sweep). After a warm-up (each (data set, method)'s first run, off and on), each
run's variants are timed back to back in one process, their order rotated from run to run, so a busy
shared machine slows both sides alike; a *pair* is one run on and the same run off, next to each other.

Printed per (data set, method) and overall, per interval: the median ratio on/off over the pairs and
its range, the total seconds off and on, the total ratio (sum on / sum off: what a sweep of these runs
pays) and the curve's share of the on-side time (`timings.curve_s`; "alone" = the ratio those seconds
alone imply, 1 / (1 - share), steadier on a busy machine); overall also the CPU-time ratios (median over
pairs and total), which depend less on the neighbours. The accuracy matrices with and without must be equal (continual
evaluation does not change training); a difference is printed and the script exits 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL = 1.10  # the goal: continual evaluation costs at most 10 % of the demo's wall time


@dataclasses.dataclass(frozen=True)
class Pair:
    """One run timed off and on, next to each other (seconds)."""

    off_s: float
    on_s: float
    curve_s: float = 0.0  # the on side's timings.curve_s
    off_cpu: float = 0.0
    on_cpu: float = 0.0

    @property
    def ratio(self) -> float:
        return self.on_s / self.off_s


def summarize(pairs) -> dict:
    """Median ratio on/off and its range over the pairs; totals; the curve's share of the on side."""
    pairs = list(pairs)
    ratios = [p.ratio for p in pairs]
    off, on = sum(p.off_s for p in pairs), sum(p.on_s for p in pairs)
    off_cpu, on_cpu = sum(p.off_cpu for p in pairs), sum(p.on_cpu for p in pairs)
    return {"n": len(pairs), "median": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "off_s": off, "on_s": on, "total_ratio": on / off, "curve_share": sum(p.curve_s for p in pairs) / on,
            "cpu_ratio": on_cpu / off_cpu if off_cpu else None,
            "cpu_median": statistics.median(p.on_cpu / p.off_cpu for p in pairs) if off_cpu else None}


def worst(groups: dict, by: str = "median") -> tuple:
    """The group key whose pairs have the highest `by` (a summarize() figure: median ratio, curve_share)."""
    return max(groups, key=lambda key: summarize(groups[key])[by])


def rotated(items: list, k: int) -> list:
    """`items` rotated left by k: run i times its variants in this order, so none always goes first."""
    k %= len(items)
    return items[k:] + items[:k]


def sample(specs, all_orders: bool = False) -> list:
    """The runs timed: every spec of task order 0 (each method x regime x data set), or all of them."""
    return [s for s in specs if all_orders or s.order == 0]


def summary_line(label: str, s: dict) -> str:
    return (f"{label:<22}{s['n']:>4}  {s['median']:5.3f} ({s['low']:5.3f}-{s['high']:5.3f})"
            f"  {s['off_s']:8.1f} {s['on_s']:8.1f}  {s['total_ratio']:6.3f}  {s['curve_share']:6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", default="depth-sweep-mini")
    ap.add_argument("--every", type=int, nargs="+", default=[10],
                    help="optimizer steps between curve points (several: compare intervals)")
    ap.add_argument("--subsample", type=int, default=100, help="test rows per task at each point")
    ap.add_argument("--repeats", type=int, default=2, help="pairs per run")
    ap.add_argument("--all", action="store_true", help="every task order (the whole sweep), not only order 0")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's workers use 1)")
    ap.add_argument("--datasets", default="", help="comma-separated: only these data sets (default: all)")
    args = ap.parse_args()

    import _common as C

    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol
    from harness.config.specs import ContinualSpec
    from harness.execution.plan import expand
    from harness.run.engine import run_one

    C.set_threads(args.threads)
    protocol = load_protocol(args.protocol, get_registry())
    runs = [s for s in sample((dataclasses.replace(s, continual=None) for s in expand(protocol)), args.all)
            if not args.datasets or s.dataset.name in args.datasets.split(",")]
    variants = [None] + [ContinualSpec(k, args.subsample) for k in args.every]
    print(f"{protocol.name} v{protocol.version}, {'all task orders' if args.all else 'task order 0'}: "
          f"{len(runs)} runs x {args.repeats} repeat(s), every {' '.join(map(str, args.every))}, subsample "
          f"{args.subsample}; {args.threads} torch thread(s), OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
          f"{C.load_avg()}")

    def run(spec, continual):
        record = None

        def call():
            nonlocal record
            record = run_one(dataclasses.replace(spec, continual=continual), device="cpu")
        wall, cpu = C.timed(call)
        return wall, cpu, record

    firsts = {}
    for spec in runs:
        firsts.setdefault((spec.dataset.name, spec.display), spec)
    for spec in firsts.values():  # warm-up: each (data set, method) once off and once on
        run(spec, None), run(spec, variants[1])

    pairs = {k: defaultdict(list) for k in args.every}  # every -> (data set, method) -> [Pair]
    mismatches, failed = [], []
    for rep in range(args.repeats):
        for i, spec in enumerate(runs):
            timed = {}
            for continual in rotated(variants, rep * len(runs) + i):
                timed[continual.every if continual else None] = run(spec, continual)
            off_wall, off_cpu, off = timed[None]
            for k in args.every:
                on_wall, on_cpu, on = timed[k]
                name = f"{spec.dataset.name} {spec.regime} {spec.display} order {spec.order} every {k}"
                if on.status != off.status or on.status.value != "ok":
                    failed.append(f"{name}: {off.status.value} off, {on.status.value} on ({on.error or off.error})")
                if (on.acc_matrix, on.acc_matrix_task_aware) != (off.acc_matrix, off.acc_matrix_task_aware):
                    mismatches.append(name)
                pairs[k][(spec.dataset.name, spec.display)].append(
                    Pair(off_wall, on_wall, on.timings.get("curve_s", 0.0), off_cpu, on_cpu))

    head = f"{'':<22}{'n':>4}  {'ratio on/off (range)':<20}  {'off s':>8} {'on s':>8}  {'total':>6}  {'curve':>6}"
    for k in args.every:
        print(f"\nevery {k} (subsample {args.subsample}): median ratio on/off over pairs, totals, "
              "total ratio = sum on / sum off, curve = curve_s share of on")
        print(head)
        for (dataset, method), group in sorted(pairs[k].items()):
            print(summary_line(f"{dataset} {method}", summarize(group)))
        print(summary_line("overall", summarize(p for group in pairs[k].values() for p in group)))
    print(f"\nsummary ({len(runs)} runs x {args.repeats}; goal <= {GOAL - 1:.0%} wall cost):")
    for k in args.every:
        s = summarize(p for group in pairs[k].values() for p in group)
        w, wc = worst(pairs[k]), worst(pairs[k], "curve_share")
        print(f"  every {k:>3}: median ratio {s['median']:.3f} ({s['low']:.3f}-{s['high']:.3f}), total "
              f"{s['total_ratio']:.3f}; cpu median {s['cpu_median']:.3f}, total {s['cpu_ratio']:.3f}; curve_s "
              f"{s['curve_share']:.1%} of on (alone: x{1 / (1 - s['curve_share']):.3f}); "
              f"{'within' if s['median'] <= GOAL else 'over'} the goal (median)\n"
              f"{'':14}worst: by median {' '.join(w)} {summarize(pairs[k][w])['median']:.3f}, by curve_s "
              f"{' '.join(wc)} {summarize(pairs[k][wc])['curve_share']:.1%}")
    n_pairs = len(runs) * args.repeats * len(args.every)
    print(f"accuracy matrices equal with and without: {n_pairs - len(mismatches)}/{n_pairs} pairs"
          + (f"; failed runs: {len(failed)}" if failed else ""))
    for line in mismatches:
        print(f"  DIFFERENT: {line}")
    for line in failed:
        print(f"  FAILED: {line}")
    print(f"done; {C.load_avg()}")
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: the demo's per-worker setting
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():  # Ctrl-C stops the script, not only the run in progress (a failed record)
        main()
