"""The harness's own evaluator: accuracy on every task's test set, by tensor slicing."""
from __future__ import annotations

import torch


def _batch_logits(model, x: torch.Tensor, y: torch.Tensor, task: int, batch_size: int, device):
    """(logits, labels) per evaluation batch: the one forward pass every accuracy is counted from."""
    for start in range(0, len(y), batch_size):
        xb = x[start:start + batch_size].to(device, non_blocking=True)
        yb = y[start:start + batch_size].to(device, non_blocking=True)
        yield model(xb, task), yb


def masked_correct(logits: torch.Tensor, y: torch.Tensor, columns: tuple[int, int]) -> int:
    """Correct predictions when the argmax runs over logit columns [lo, hi) only (labels stay global)."""
    lo, hi = columns
    return int((logits[:, lo:hi].argmax(dim=1) + lo == y).sum())


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
        correct += int((logits.argmax(dim=1) == yb).sum())
    return correct / len(y)


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
    return correct / len(y), masked / len(y)


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
