"""The harness's own evaluator: accuracy on every task's test set, by tensor slicing."""
from __future__ import annotations

import torch


@torch.no_grad()
def task_accuracy(model, x: torch.Tensor, y: torch.Tensor, task: int, batch_size: int,
                  device: torch.device) -> float:
    """Accuracy of `model` on (x, y) using the head of `task` (task-IL) or the single head."""
    if len(y) == 0:
        return float("nan")
    correct = 0
    for start in range(0, len(y), batch_size):
        xb = x[start:start + batch_size].to(device, non_blocking=True)
        yb = y[start:start + batch_size].to(device, non_blocking=True)
        correct += int((model(xb, task).argmax(dim=1) == yb).sum())
    return correct / len(y)


def evaluate_tasks(model, tasks, batch_size: int, device: torch.device) -> list:
    """Accuracy on the test set of every task, in eval mode; restores the previous mode."""
    was_training = model.training
    model.eval()
    try:
        return [task_accuracy(model, t.x_test, t.y_test, t.index, batch_size, device) for t in tasks]
    finally:
        model.train(was_training)
