"""A vit-tiny run through cl-bench vs a plain timm training loop doing the same work, side by side (goal <= 1.2x).

python benchmarks/vit_cpu.py [--repeats 5] [--regime full] [--epochs 3] [--threads 1]

The harness side is one `run_one` of naive fine-tuning: digits, class-IL (5 tasks x 2 classes, one growing
head, the loss and argmax over the classes seen so far), model vit-tiny, SGD lr 0.05 momentum 0.9, batch 32.
The plain side is timm's own VisionTransformer of the same size (vit_tiny_patch16_224 with vit-tiny's width,
depth, heads and patches; timm's Block, timm's forward and classifier) started from the same weights, trained
on the same minibatches in the same order (the harness's batch generator), with an optimizer made afresh per
task, and evaluated on every task's test set after every task (and once before training), as the harness
does. The ratio cl-bench / plain measures what the harness adds (Avalanche's template and plugins, the
record's checks, compute accounting and the learning checks' linear probe); both sides' accuracy matrices are
compared (equal: the two did the same computation).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import timm
import torch
from torch.nn import functional as F

from harness.api.contract import make_optimizer
from harness.run.datasets import load_dataset
from harness.run.engine import build_run_model, run_one, seed_everything
from harness.run.fastdata import batch_generator
from harness.run.streams import split_tasks
from harness.run.vit import blocks_to_timm, timm_kwargs


def plain_timm_model(spec, input_shape):
    """timm's VisionTransformer of vit-tiny's size with timm's own Block and classifier, holding the weights the
    harness's run starts from (the same seed, the same initial model)."""
    seed_everything(spec.seed)
    start = build_run_model(spec, input_shape)
    kwargs = {k: v for k, v in timm_kwargs(spec.dataset.model, input_shape).items() if k != "block_fn"}
    vit = timm.create_model("vit_tiny_patch16_224", **{**kwargs, "num_classes": start.heads[0].out_features})
    state = blocks_to_timm(start.state_dict())
    state.update({"head.weight": start.heads[0].weight, "head.bias": start.heads[0].bias})
    vit.load_state_dict(state)
    return vit


@torch.no_grad()
def accuracies(vit, tasks, seen: int, batch_size: int) -> list:
    """Every task's test accuracy, the argmax over the classes seen so far (the harness's class-IL evaluation)."""
    vit.eval()
    out = []
    for task in tasks:
        correct = 0
        for start in range(0, len(task.y_test), batch_size):
            logits = vit(task.x_test[start:start + batch_size])[:, :seen]
            correct += int((logits.argmax(1) == task.y_test[start:start + batch_size]).sum())
        out.append(correct / len(task.y_test))
    return out


def plain_run(spec) -> list:
    """The run as a plain timm loop; returns the accuracy matrix (the row before training first)."""
    data = load_dataset(spec.dataset.name)
    tasks = split_tasks(data, spec.class_order, spec.dataset.n_tasks, spec.dataset.classes_per_task, spec.scenario)
    vit = plain_timm_model(spec, data.input_shape)
    gen = batch_generator(spec.seed)
    cpt = spec.dataset.classes_per_task
    rows = [accuracies(vit, tasks, cpt, spec.eval_batch_size)]
    for t, task in enumerate(tasks):
        seen = (t + 1) * cpt
        opt = make_optimizer(spec.training, vit.parameters())
        vit.train()
        for _ in range(spec.training.epochs):
            order = torch.randperm(len(task.y_train), generator=gen)
            for start in range(0, len(order), spec.training.batch_size):
                idx = order[start:start + spec.training.batch_size]
                opt.zero_grad()
                F.cross_entropy(vit(task.x_train[idx])[:, :seen], task.y_train[idx]).backward()
                opt.step()
        rows.append(accuracies(vit, tasks, seen, spec.eval_batch_size))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--regime", default="full", help="full: the plain loop trains every parameter too")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    C.set_threads(args.threads)
    spec = C.make_spec("naive", dataset="digits", model="vit-tiny", regime=args.regime, pretrain="none",
                       epochs=args.epochs)
    spec = spec.__class__(**{**spec.__dict__, "scenario": "class-il"})
    last = {}

    def harness():
        record = run_one(spec, device="cpu")
        assert record.status == "ok", record.error
        last["record"] = record.acc_matrix

    def plain():
        last["plain"] = plain_run(spec)[1:]  # the record's matrix has no row before training

    print(f"digits, vit-tiny, class-IL, regime {args.regime}, 5 tasks x {args.epochs} epochs, batch 32, "
          f"{args.threads} thread(s), {args.repeats} repeat(s); {C.load_avg()}")
    result = C.side_by_side({"cl-bench": harness, "plain timm": plain}, repeats=args.repeats)
    plain_rows, record_rows = last["plain"], last["record"]
    diff = max(abs(a - b) for ra, rb in zip(plain_rows, record_rows) for a, b in zip(ra, rb))
    note = "acc_matrix equal" if plain_rows == record_rows else f"acc_matrix differs, max |diff| {diff:.4f}"
    print(C.ratio_line("vit-tiny / plain timm", result, "cl-bench", "plain timm") + f"   {note}")
    print(f"done; {C.load_avg()}")


if __name__ == "__main__":
    from harness.execution.interrupts import signals_interrupt

    with signals_interrupt():
        main()
