"""Where a training step's time goes: Avalanche's template (through cl-bench) against the plain loop.

python benchmarks/step_costs.py [--dataset mnist1d] [--model mlp] [--regime full] [--repeats 7] [--threads 1]

Times each phase of every training iteration, summed over a run (benchmarks/_common.make_spec's naive
run, ~0.3 s on mnist1d): for cl-bench, a copy of Avalanche's `SGDUpdate.training_epoch` with timers
between its calls (the same calls in the same order); for the plain loop, the same timers around its
own lines. Both run in this process, alternated. A timer costs ~0.1 µs. What the template does that
the plain loop does not (callbacks, the empty loss, unpacking) shows as its own rows.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402
from avalanche.training.templates.update_type.sgd_update import SGDUpdate  # noqa: E402

from harness.run.engine import run_one  # noqa: E402

HARNESS, PLAIN = Counter(), Counter()
clock = time.perf_counter


def timed_epoch(self, **kwargs):
    """SGDUpdate.training_epoch (avalanche 0.6) with a timer between its calls."""
    batches = iter(self.dataloader)
    while True:
        t0 = clock()
        try:
            self.mbatch = next(batches)
        except StopIteration:
            break
        if self._stop_training:
            break
        t1 = clock()
        self._unpack_minibatch()
        self._before_training_iteration(**kwargs)
        t2 = clock()
        self.optimizer.zero_grad()
        t3 = clock()
        self.loss = self._make_empty_loss()
        self._before_forward(**kwargs)
        t4 = clock()
        self.mb_output = self.forward()
        t5 = clock()
        self._after_forward(**kwargs)
        t6 = clock()
        self.loss += self.criterion()
        t7 = clock()
        self._before_backward(**kwargs)
        self.backward()
        t8 = clock()
        self._after_backward(**kwargs)
        t9 = clock()
        self._before_update(**kwargs)
        self.optimizer_step()
        t10 = clock()
        self._after_update(**kwargs)
        self._after_training_iteration(**kwargs)
        t11 = clock()
        for name, a, b in (("data", t0, t1), ("unpack + before_training_iteration", t1, t2), ("zero_grad", t2, t3),
                           ("empty loss + before_forward", t3, t4), ("forward", t4, t5), ("after_forward", t5, t6),
                           ("criterion", t6, t7), ("backward", t7, t8), ("after_backward", t8, t9),
                           ("optimizer step", t9, t10), ("after_update + after_training_iteration", t10, t11)):
            HARNESS[name] += b - a


def plain(spec) -> None:
    """benchmarks/_common.plain_run's training with the same timers (its evaluations left out)."""
    C.seed_everything(spec.seed)
    data = C.load_dataset(spec.dataset.name)
    tasks = C.split_tasks(data, spec.class_order, spec.dataset.n_tasks, spec.dataset.classes_per_task, spec.scenario)
    model = C.build_run_model(spec, data.input_shape)
    gen, loss_fn = C.batch_generator(spec.seed), torch.nn.CrossEntropyLoss()
    for t, task in enumerate(tasks):
        C.apply_regime(model, "full" if t == 0 and spec.pretrain.first_task else spec.regime)
        opt = C.make_optimizer(spec.training, [p for p in model.parameters() if p.requires_grad])
        model.train()
        x, y = task.x_train, task.y_train
        for _ in range(spec.training.epochs):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), spec.training.batch_size):
                t0 = clock()
                idx = order[start:start + spec.training.batch_size]
                xb, yb = x[idx], y[idx]
                t1 = clock()
                opt.zero_grad()
                t2 = clock()
                out = model(xb, task.index)
                t3 = clock()
                loss = loss_fn(out, yb)
                t4 = clock()
                loss.backward()
                t5 = clock()
                opt.step()
                t6 = clock()
                for name, a, b in (("data", t0, t1), ("zero_grad", t1, t2), ("forward", t2, t3),
                                   ("criterion", t3, t4), ("backward", t4, t5), ("optimizer step", t5, t6)):
                    PLAIN[name] += b - a


def main() -> None:
    args = C.small_run_parser(__doc__).parse_args()
    C.set_threads(args.threads)
    spec = C.make_spec("naive", dataset=args.dataset, model=args.model, regime=args.regime)
    SGDUpdate.training_epoch = timed_epoch
    for _ in range(2):  # warm-up
        run_one(spec, device="cpu")
        plain(spec)
    HARNESS.clear()
    PLAIN.clear()
    for _ in range(args.repeats):
        run_one(spec, device="cpu")
        plain(spec)
    print(f"{args.dataset}, {args.model}, naive, regime {args.regime}: training steps, ms per run (sum over its "
          f"steps), {args.repeats} repeat(s); {C.load_avg()}")
    for name in sorted(set(HARNESS) | set(PLAIN), key=lambda k: -HARNESS[k]):
        h, p = HARNESS[name] / args.repeats * 1e3, PLAIN[name] / args.repeats * 1e3
        print(f"  {name:42s} cl-bench {h:7.1f}   plain {p:7.1f}   difference {h - p:+6.1f}")
    h, p = sum(HARNESS.values()) / args.repeats * 1e3, sum(PLAIN.values()) / args.repeats * 1e3
    print(f"  {'all steps':42s} cl-bench {h:7.1f}   plain {p:7.1f}   difference {h - p:+6.1f} ({h / p:.2f}x)")
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    main()
