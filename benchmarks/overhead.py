"""Harness overhead: one complete run through cl-bench vs a hand-written PyTorch loop.

python benchmarks/overhead.py [--dataset mnist1d] [--regime full] [--methods naive,...]
                              [--repeats 5] [--threads 1] [--before]

A run = 5 tasks of training + the full accuracy matrix (every task after every task).
Both sides use the same model, optimizer, batch size, epochs and evaluations and run
interleaved in this process. `naive` is compared with the plain loop; `ewc-online` and
`lwf` with the plain loop plus their extra work (EWC penalty + Fisher pass, distillation
through the previous model); every other method with the plain loop alone (its extra work
is counted as overhead). `--before` also times the harness on Avalanche's default data
path (harness.run.speedups.ENABLED = False), i.e. before the fast path existed.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402

from harness.api.registry import get_registry  # noqa: E402
from harness.run import speedups  # noqa: E402
from harness.run.engine import run_one  # noqa: E402


class EWCWork:
    """Online EWC's extra work: λ Σ F (θ − θ*)² per step; a squared-gradient pass per task."""

    def __init__(self, lam: float = 100.0, decay: float = 0.9, batch_size: int = 32):
        self.lam, self.decay, self.bs = lam, decay, batch_size
        self.fisher, self.anchor = {}, {}

    def penalty(self, model, x, t, out):
        if not self.fisher:
            return 0.0
        return self.lam * sum((self.fisher[n] * (p - self.anchor[n]).pow(2)).sum()
                              for n, p in model.named_parameters() if n in self.fisher)

    def after_task(self, model, task):
        params = dict(model.named_parameters())
        new = {n: torch.zeros_like(p) for n, p in params.items()}
        loss_fn = torch.nn.CrossEntropyLoss()
        model.eval()
        for start in range(0, len(task.y_train), self.bs):
            model.zero_grad()
            xb, yb = task.x_train[start:start + self.bs], task.y_train[start:start + self.bs]
            loss_fn(model(xb, task.index), yb).backward()
            for n, p in params.items():
                if p.grad is not None:
                    new[n] += p.grad.detach() ** 2
        model.train()
        n_batches = -(-len(task.y_train) // self.bs)
        for n in new:
            new[n] /= n_batches
            self.fisher[n] = self.decay * self.fisher[n] + new[n] if n in self.fisher else new[n]
            self.anchor[n] = params[n].detach().clone()


class LwFWork:
    """LwF's extra work: the previous model's outputs and a distillation loss per step."""

    def __init__(self, alpha: float = 1.0, temperature: float = 2.0):
        self.alpha, self.T, self.prev, self.seen = alpha, temperature, None, []

    def penalty(self, model, x, t, out):
        if self.prev is None:
            return 0.0
        feats = model.features(x)
        loss = 0.0
        with torch.no_grad():
            prev_feats = self.prev.features(x)
        for old in self.seen:
            log_p = torch.log_softmax(model.heads[old](feats) / self.T, dim=1)
            q = torch.softmax(self.prev.heads[old](prev_feats) / self.T, dim=1)
            loss = loss + torch.nn.functional.kl_div(log_p, q, reduction="batchmean")
        return self.alpha * loss

    def after_task(self, model, task):
        self.prev = copy.deepcopy(model).eval()
        self.seen.append(task.index)


EXTRA = {"ewc-online": EWCWork, "lwf": LwFWork}


def compare(method: str, args) -> dict:
    """Median timings of the harness (and optionally its old path) and the plain loop."""
    spec = C.make_spec(method, dataset=args.dataset, regime=args.regime)
    plain_spec = C.make_spec("naive", dataset=args.dataset, regime=args.regime)
    extra = EXTRA.get(method)

    def harness():
        record = run_one(spec, device="cpu")
        assert record.status == "ok", record.error

    def before():
        speedups.ENABLED = False
        try:
            harness()
        finally:
            speedups.ENABLED = True

    fns = {"cl-bench": harness, "plain": lambda: C.plain_run(plain_spec, extra() if extra else None)}
    if args.before:
        fns["before"] = before
    return C.side_by_side(fns, repeats=args.repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="mnist1d")
    ap.add_argument("--regime", default="full")
    ap.add_argument("--methods", default="naive", help="comma-separated, or 'all'")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    ap.add_argument("--before", action="store_true", help="also time Avalanche's default data path")
    args = ap.parse_args()
    C.set_threads(args.threads)
    methods = sorted(get_registry()) if args.methods == "all" else args.methods.split(",")
    print(f"{args.dataset}, mlp, regime {args.regime}, 5 tasks x 3 epochs, batch 32, "
          f"{args.threads} thread(s); {C.load_avg()}")
    for method in methods:
        result = compare(method, args)
        ref = "plain + " + method if method in EXTRA else "plain"
        print(C.ratio_line(f"{method} / {ref}", result, "cl-bench", "plain"))
        if args.before:
            print(C.ratio_line(f"  before: {method} / {ref}", result, "before", "plain"))
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():  # Ctrl-C stops the script, not only the run in progress (a failed record)
        main()
