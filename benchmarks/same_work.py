"""Harness overhead at equal work: each method through cl-bench vs a plain loop doing its work.

python benchmarks/same_work.py [--methods all | replay,joint,...] [--repeats 5]
                               [--dataset mnist1d] [--regime full] [--threads 1] [--without-probe]

benchmarks/overhead.py counts a method's own work (replay's memory batches, GEM's QP, GPM's
projections, ...) as harness overhead, because it compares every method with naive
fine-tuning. Here each of naive (the control), replay, joint, gem, agem, gpm and became is
compared with a hand-written PyTorch loop that does the *same* work
(benchmarks/_plain_methods.py: the same data, model, regime, optimizer reset per task, batch
size, epochs, evaluations, the harness's minibatch order and memory streams, the method's
extra forward/backward passes, projections, memory and Fisher passes). The ratio
cl-bench / plain then measures the harness alone (Avalanche's template and plugins, the
record's checks and probes); the target is at most 1.2.

Per method one line: both medians (wall), the wall and CPU ratios and the spread of the
repeats, then whether the plain loop's final accuracy matrix equals the harness record's
`acc_matrix` — equality proves the two did the same computation; a difference is reported
as the largest absolute difference. GEM's memory is the first samples of a shuffled torch
DataLoader in the harness (Avalanche's GEMPlugin, kept as is); the plain loop repeats that
loader's random draws, so it matches while torch's DataLoader draws as it does now (torch
2.x); a difference there says only that the memories differ, and the ratio still holds.
Both sides run interleaved in this process, after one warm-up run each. `--without-probe`
adds a third side: the harness with the learning checks' linear probe off (a logistic
regression per task on the model's features, which the plain loop does not fit), to tell the
harness's own measurements apart from its training mechanics.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _plain_methods as PM

from harness.run import probe
from harness.run.engine import run_one

METHODS = ("naive", "replay", "joint", "gem", "agem", "gpm", "became")
# Where equality rests on another library's internals, what a difference would mean.
CAVEATS = {"gem": "memory = torch DataLoader's draws, repeated by hand"}


def matrix_note(plain_rows: list, record_rows: list) -> str:
    """'equal' or the largest absolute difference between two accuracy matrices."""
    if plain_rows == record_rows:
        return "acc_matrix equal"
    if len(plain_rows) != len(record_rows) or any(len(a) != len(b) for a, b in zip(plain_rows, record_rows)):
        return f"acc_matrix shapes differ ({len(plain_rows)} vs {len(record_rows)} rows)"
    diff = max(abs(a - b) for ra, rb in zip(plain_rows, record_rows) for a, b in zip(ra, rb))
    return f"acc_matrix differs, max |diff| {diff:.4f}"


def compare(method: str, args) -> tuple[dict, str]:
    """Median timings of the harness and the plain same-work loop; the accuracy-matrix check."""
    spec = C.make_spec(method, dataset=args.dataset, regime=args.regime)
    last = {}

    def harness():
        record = run_one(spec, device="cpu")
        assert record.status == "ok", record.error
        last["record"] = record.acc_matrix

    def plain():
        last["plain"] = PM.plain_run(method, spec)[1:]  # without the row before training

    def without_probe():
        probe.ENABLED = False
        try:
            harness()
        finally:
            probe.ENABLED = True

    fns = {"cl-bench": harness, "plain": plain}
    if args.without_probe:
        fns["no probe"] = without_probe
    result = C.side_by_side(fns, repeats=args.repeats)
    note = matrix_note(last["plain"], last["record"])
    if method in CAVEATS:
        note += f" ({CAVEATS[method]})"
    return result, note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="all", help=f"comma-separated from {','.join(METHODS)}, or 'all'")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dataset", default="mnist1d")
    ap.add_argument("--regime", default="full")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    ap.add_argument("--without-probe", action="store_true",
                    help="also time the harness without its learning checks' linear probe (harness.run.probe)")
    args = ap.parse_args()
    methods = list(METHODS) if args.methods == "all" else args.methods.split(",")
    unknown = [m for m in methods if m not in PM.PLAIN]
    if unknown:
        ap.error(f"no same-work plain loop for {', '.join(unknown)}; allowed: {', '.join(METHODS)}")
    C.set_threads(args.threads)
    print(f"{args.dataset}, mlp, regime {args.regime}, 5 tasks x 3 epochs, batch 32, "
          f"{args.threads} thread(s), {args.repeats} repeat(s); {C.load_avg()}")
    for method in methods:
        result, note = compare(method, args)
        print(C.ratio_line(f"{method} / plain {method}", result, "cl-bench", "plain") + f"   {note}", flush=True)
        if args.without_probe:
            print(C.ratio_line("  without the probe", result, "no probe", "plain"), flush=True)
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():  # Ctrl-C stops the script, not only the run in progress (a failed record)
        main()
