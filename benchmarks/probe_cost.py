"""The learning checks' probe in a small run: cl-bench with the closed-form probe (checks version 2),
with the logistic-regression probe of version 1 (the per-run state before issue 31: the probe was its
only change inside a run), and without a probe, against the plain loop.

python benchmarks/probe_cost.py [--dataset mnist1d] [--model mlp] [--regime full] [--repeats 7] [--threads 1]

One naive run (benchmarks/_common.make_spec: 5 tasks x 3 epochs, batch 32, ~0.3 s on mnist1d) per
side, the sides interleaved in this process after one warm-up each (_common.side_by_side); the
version-1 side swaps harness.run.engine's probe for the logistic one (probe.logistic_accuracy on the
same standardised features), so before and after are timed side by side on the same load. Prints
each side's wall and CPU ratio to the plain loop (benchmarks/overhead.py's reference).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

from harness.run import engine, probe  # noqa: E402


def logistic_probe(model, task, device, batch_size=1024):
    """Checks version 1's probe: a logistic regression on the same standardised features."""
    feats = probe.probe_features(model, task, device, batch_size)
    return None if feats is None else probe.logistic_accuracy(*feats)


def main() -> None:
    args = C.small_run_parser(__doc__).parse_args()
    C.set_threads(args.threads)
    spec = C.make_spec("naive", dataset=args.dataset, model=args.model, regime=args.regime)

    def harness():
        record = engine.run_one(spec, device="cpu")
        assert record.status == "ok", record.error

    def swapped(fn):
        def run():
            saved = engine.probe_accuracy
            engine.probe_accuracy = fn
            try:
                harness()
            finally:
                engine.probe_accuracy = saved
        return run

    fns = {"ridge (v2)": harness, "logistic (v1)": swapped(logistic_probe),
           "no probe": swapped(lambda *a, **k: None), "plain": lambda: C.plain_run(spec)}
    print(f"{args.dataset}, {args.model}, naive, regime {args.regime}, 5 tasks x 3 epochs, batch 32, {args.threads} "
          f"thread(s), {args.repeats} repeat(s); {C.load_avg()}")
    result = C.side_by_side(fns, repeats=args.repeats)
    for name in ("ridge (v2)", "logistic (v1)", "no probe"):
        print(C.ratio_line(f"probe {name} / plain", result, name, "plain"))
    print(C.ratio_line("now / before issue 31 (v1)", result, "ridge (v2)", "logistic (v1)"))
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    main()
