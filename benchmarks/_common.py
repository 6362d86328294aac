"""Shared helpers of the performance benchmarks: specs, a hand-written PyTorch reference
loop, and side-by-side timing (interleaved repeats, medians, ratios).

Every benchmark compares two ways of doing the same work in one process, alternating
between them, so a busy shared machine slows both alike; CPU seconds (process time) are
printed next to wall seconds because they depend less on the neighbours.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import compat  # noqa: F401  (quirks first)
from harness.api.contract import make_optimizer
from harness.api.registry import get_registry
from harness.config.pretrain import Pretrain
from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
from harness.run.datasets import load_dataset
from harness.run.engine import build_run_model, seed_everything
from harness.run.evaluation import evaluate_tasks
from harness.run.fastdata import batch_generator
from harness.run.regimes import apply_regime
from harness.run.streams import split_tasks


def make_spec(method: str = "naive", dataset: str = "mnist1d", model: str = "mlp",
              regime: str = "full", pretrain: str = "first-task", epochs: int = 3,
              batch_size: int = 32, seed: int = 0, hparams: dict | None = None) -> RunSpec:
    """A depth-sweep-mini-like spec (5 tasks x 2 classes, SGD lr 0.05 momentum 0.9)."""
    defaults = dict(get_registry()[method].defaults)
    return RunSpec(protocol="bench", protocol_version="1", dataset=DatasetSpec(dataset, 5, 2, model),
                   regime=regime, method=method, label="", hparams={**defaults, **(hparams or {})},
                   order=0, class_order=tuple(range(10)), seed=seed, scenario="task-il",
                   pretrain=Pretrain(pretrain), training=TrainingSpec(lr=0.05, momentum=0.9, epochs=epochs,
                                                            batch_size=batch_size),
                   eval_batch_size=1024)


def plain_run(spec: RunSpec, extra=None, device: str = "cpu") -> list:
    """The same run written as a plain PyTorch loop; returns the accuracy matrix.

    Same data, model, regime per task, optimizer (reset per task), batch size, epochs and
    evaluations (every task after every task, plus before training). `extra` (optional)
    adds a method's own work: an object with `penalty(model, x, t, out)` (added to the
    loss) and `after_task(model, task)`.
    """
    seed_everything(spec.seed)
    data = load_dataset(spec.dataset.name)
    tasks = split_tasks(data, spec.class_order, spec.dataset.n_tasks,
                        spec.dataset.classes_per_task, spec.scenario)
    model = build_run_model(spec, data.input_shape).to(device)
    gen = batch_generator(spec.seed)  # the harness's batch order, so the runs can be compared
    loss_fn = torch.nn.CrossEntropyLoss()
    rows = [evaluate_tasks(model, tasks, spec.eval_batch_size, device)]
    for t, task in enumerate(tasks):
        apply_regime(model, "full" if t == 0 and spec.pretrain.first_task else spec.regime)
        opt = make_optimizer(spec.training, [p for p in model.parameters() if p.requires_grad])
        model.train()
        x, y = task.x_train.to(device), task.y_train.to(device)
        for _ in range(spec.training.epochs):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), spec.training.batch_size):
                idx = order[start:start + spec.training.batch_size]
                out = model(x[idx], task.index)
                loss = loss_fn(out, y[idx])
                if extra is not None:
                    loss = loss + extra.penalty(model, x[idx], task.index, out)
                opt.zero_grad()
                loss.backward()
                opt.step()
        if extra is not None:
            extra.after_task(model, task)
        rows.append(evaluate_tasks(model, tasks, spec.eval_batch_size, device))
    return rows


def small_run_parser(doc: str, repeats: int = 7) -> argparse.ArgumentParser:
    """The arguments of the small-run benchmarks: one make_spec run (dataset, model, regime), repeats, threads."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="mnist1d")
    ap.add_argument("--model", default="mlp", help="backbone (the demo's: cnn1d on mnist1d, mlp-bn on digits)")
    ap.add_argument("--regime", default="full")
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--threads", type=int, default=1)
    return ap


def timed(fn):
    """(wall seconds, CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def side_by_side(fns: dict, repeats: int = 5, warmup: int = 1) -> dict:
    """Median (wall, cpu) per named function, calls interleaved round-robin."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timed(fn))
    return {name: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s),
                   _spread([w for w, _ in s]))
            for name, s in samples.items()}


def _spread(values) -> float:
    """(max - min) / median: how noisy the repeats were."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def ratio_line(label: str, result: dict, name: str, reference: str) -> str:
    """One line: both medians and their wall and CPU ratios."""
    (w, c, s), (rw, rc, rs) = result[name], result[reference]
    return (f"{label:<26} {w:7.3f} s vs {rw:7.3f} s   ratio wall {w / rw:5.2f}  cpu {c / rc:5.2f}"
            f"   (spread {s:.0%} / {rs:.0%})")


def set_threads(n: int) -> None:
    """Fix torch's intra-op threads (both sides of a comparison run with the same)."""
    torch.set_num_threads(n)


def load_avg() -> str:
    """The machine's 1-minute load average and core count (how noisy the numbers are)."""
    import os

    try:
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        return f"{os.cpu_count()} cores"
