"""The harness's own evaluator: accuracy on every task's test set, by tensor slicing; continual evaluation."""
from __future__ import annotations

import time

import torch


def _batch_logits(model, x: torch.Tensor, y: torch.Tensor, task: int, batch_size: int, device):
    """(logits, labels) per evaluation batch: the one forward pass every accuracy is counted from."""
    for start in range(0, len(y), batch_size):
        xb = x[start:start + batch_size].to(device, non_blocking=True)
        yb = y[start:start + batch_size].to(device, non_blocking=True)
        yield model(xb, task), yb


def masked_correct(logits: torch.Tensor, y: torch.Tensor, columns: tuple[int, int]) -> torch.Tensor:
    """Correct predictions (a 0-d tensor on the logits' device: no sync per batch) when the argmax runs over
    logit columns [lo, hi) only (labels stay global)."""
    lo, hi = columns
    return (logits[:, lo:hi].argmax(dim=1) + lo == y).sum()


def task_columns(task_index: int, classes_per_task: int) -> tuple[int, int]:
    """The single head's logit columns of a class-IL task (streams.split_tasks offsets labels by t * cpt)."""
    return task_index * classes_per_task, (task_index + 1) * classes_per_task


@torch.no_grad()
def task_accuracy(model, x: torch.Tensor, y: torch.Tensor, task: int, batch_size: int,
                  device: torch.device) -> float:
    """Accuracy of `model` on (x, y) using the head of `task` (task-IL) or the single head."""
    if len(y) == 0:
        return float("nan")
    correct = 0
    for logits, yb in _batch_logits(model, x, y, task, batch_size, device):
        correct += (logits.argmax(dim=1) == yb).sum()  # summed on the device: one sync per task, not per batch
    return int(correct) / len(y)


@torch.no_grad()
def class_il_accuracies(model, x: torch.Tensor, y: torch.Tensor, task: int, columns: tuple[int, int],
                        batch_size: int, device: torch.device, seen: int | None = None) -> tuple[float, float]:
    """(class-IL, task-aware) accuracy on (x, y): argmax over the first `seen` columns (None: all) and
    argmax over `columns`, same logits."""
    if len(y) == 0:
        return float("nan"), float("nan")
    correct = masked = 0
    for logits, yb in _batch_logits(model, x, y, task, batch_size, device):
        correct += masked_correct(logits, yb, (0, seen if seen is not None else logits.shape[1]))
        masked += masked_correct(logits, yb, columns)
    return int(correct) / len(y), int(masked) / len(y)


def evaluate_tasks(model, tasks, batch_size: int, device: torch.device) -> list:
    """Accuracy on the test set of every task, in eval mode; restores the previous mode."""
    was_training = model.training
    model.eval()
    try:
        return [task_accuracy(model, t.x_test, t.y_test, t.index, batch_size, device) for t in tasks]
    finally:
        model.train(was_training)


def evaluate_class_il(model, tasks, batch_size: int, device: torch.device,
                      classes_per_task: int, seen: int | None = None) -> tuple[list, list]:
    """(class-IL row, task-aware row) over every task's test set, one forward pass per batch, in eval mode;
    the class-IL argmax runs over the first `seen` classes' columns (those seen so far; None: all)."""
    was_training = model.training
    model.eval()
    try:
        pairs = [class_il_accuracies(model, t.x_test, t.y_test, t.index, task_columns(t.index, classes_per_task),
                                     batch_size, device, seen) for t in tasks]
    finally:
        model.train(was_training)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def subsample_indices(n: int, k: int, seed: int, task: int) -> torch.Tensor:
    """A fixed, seeded subset of min(k, n) of a test set's n row indices, in order. Drawn from a generator of
    its own (the global RNGs that shuffle training are never touched), from the run's seed and the task."""
    generator = torch.Generator().manual_seed((int(seed) * 1_000_003 + 7_919 * (int(task) + 1)) % 2**63)
    return torch.randperm(n, generator=generator)[:min(int(k), n)].sort().values


def subsample_tasks(tasks, k: int, seed: int) -> list:
    """Each task with its test set cut to its fixed seeded subsample (copies; the training data stays)."""
    import dataclasses

    out = []
    for t in tasks:
        idx = subsample_indices(len(t.y_test), k, seed, t.index).to(t.y_test.device)
        out.append(dataclasses.replace(t, x_test=t.x_test[idx], y_test=t.y_test[idx]))
    return out


class ContinualEvaluator:
    """Continual evaluation during training (De Lange et al., ICLR 2023): the accuracy of each seen task on a
    fixed test subsample at the initial model, every `every` optimizer steps of each task (called from
    HarnessPlugin.after_update: the model the method would output now, `contract.evaluated_model_now` — the
    trained model unless the method provides `harness_eval_model_now`, as the merges do) and at each task's end
    (the evaluated model, as the matrix's row).

    `evaluate(model, tasks, batch_size, device, seen) -> (row, task-aware row or None)`: the run's own
    evaluator (the engine's, prefix cache included in task-IL). A point changes nothing training depends on:
    no RNG draws, no gradients, eval mode for the evaluation (BatchNorm statistics untouched) and every
    module's own train/eval flag put back afterwards (frozen blocks stay in eval mode); a mid-task point's
    model is asked for inside `torch.random.fork_rng`, so a method's hook cannot move the RNGs either.
    """

    def __init__(self, tasks, every: int, subsample: int, seed: int, evaluate, batch_size: int, device):
        self.tasks = subsample_tasks(tasks, subsample, seed)
        self.every, self.subsample = int(every), int(subsample)
        self.evaluate, self.batch_size, self.device = evaluate, batch_size, device
        self.task, self.seen = 0, None
        self.steps, self.task_of, self.end, self.acc, self.acc_task_aware = [], [], [], [], []
        self.seconds = 0.0

    def start_task(self, t: int, seen: int | None) -> None:
        """Task t (0-based) trains next; `seen`: the classes seen once it does (class-IL; None in task-IL)."""
        self.task, self.seen = t, seen

    def after_step(self, model_now, step_in_task: int, step: int) -> None:
        """After an optimizer step: a point every `every` steps of the current task, of the model that
        `model_now()` gives (asked for only then; its time counts in `seconds`)."""
        if step_in_task % self.every == 0:
            t0 = time.perf_counter()
            with torch.random.fork_rng(devices=self._rng_devices()):
                model = model_now()
                self.seconds += time.perf_counter() - t0
                self.point(model, step)

    def _rng_devices(self) -> list:
        return [self.device] if torch.device(self.device).type == "cuda" else []

    def point(self, model, step: int, end: bool = False) -> None:
        """Evaluate tasks 0..current on their subsamples; `end`: the task's end point."""
        t0 = time.perf_counter()
        modes = [(m, m.training) for m in model.modules()]
        try:  # a model that draws while it answers (MC dropout, a sampled ensemble) must not move training's RNG
            with torch.random.fork_rng(devices=self._rng_devices()):
                row, task_aware = self.evaluate(model, self.tasks[:self.task + 1], self.batch_size, self.device,
                                                self.seen)
        finally:
            for m, mode in modes:  # each module's own flag: a frozen block stays in eval mode
                m.training = mode
        unseen = [None] * (len(self.tasks) - len(row))
        self.steps.append(int(step))
        self.task_of.append(self.task)
        self.end.append(bool(end))
        self.acc.append([*map(float, row), *unseen])
        if task_aware is not None:
            self.acc_task_aware.append([*map(float, task_aware), *unseen])
        self.seconds += time.perf_counter() - t0

    def as_json(self, task_aware: bool) -> dict:
        """The record's `curve` (RunRecord's docstring); `task_aware`: class-IL's second curve too."""
        curve = {"every": self.every, "subsample": self.subsample, "n_rows": [len(t.y_test) for t in self.tasks],
                 "steps": list(self.steps), "task": list(self.task_of), "end": list(self.end),
                 "acc": [list(r) for r in self.acc]}
        if task_aware:
            curve["acc_task_aware"] = [list(r) for r in self.acc_task_aware]
        return curve
