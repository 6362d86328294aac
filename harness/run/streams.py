"""Task splits of a class order; conversion into an Avalanche benchmark."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..api.contract import tag_tensors
from ..config.vocabulary import Scenario
from .datasets import TensorData


@dataclass(frozen=True)
class Task:
    """One task: its classes (in the order's sequence) and its relabelled tensors."""

    index: int
    classes: tuple[int, ...]
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def split_tasks(data: TensorData, order: tuple[int, ...], n_tasks: int, classes_per_task: int,
                scenario: Scenario = Scenario.TASK_IL) -> list[Task]:
    """Cut the class order into tasks; labels become task-local (task-IL) or order positions (class-IL)."""
    tasks = []
    for t in range(n_tasks):
        classes = order[t * classes_per_task:(t + 1) * classes_per_task]
        offset = 0 if scenario == Scenario.TASK_IL else t * classes_per_task
        tasks.append(Task(t, tuple(classes),
                          *_select(data.x_train, data.y_train, classes, offset),
                          *_select(data.x_test, data.y_test, classes, offset)))
    return tasks


def on_device(tasks: list[Task], device) -> list[Task]:
    """The tasks with their tensors on a CUDA `device` (unchanged on the CPU).

    Resident data keeps an accelerator fed: training batches, evaluation batches, memory rows
    and Fisher samples are then sliced on the device, with no host-to-device copy per batch
    (several runs share one GPU, so each must not wait on its own copies).
    """
    if torch.device(device).type != "cuda":
        return tasks
    return [Task(t.index, t.classes, *(v.to(device) for v in (t.x_train, t.y_train, t.x_test, t.y_test)))
            for t in tasks]


def _select(x: torch.Tensor, y: torch.Tensor, classes, offset: int):
    lookup = torch.full((int(y.max()) + 1,), -1, dtype=torch.long)
    for local, cls in enumerate(classes):
        if cls < len(lookup):
            lookup[cls] = local + offset
    new_y = lookup[y]
    keep = new_y >= 0
    return x[keep].contiguous(), new_y[keep].contiguous()


def to_avalanche(tasks: list[Task], resident: list[Task] | None = None):
    """An Avalanche benchmark (train/test streams, one experience per task, task labels set).

    Each training dataset is tagged with its rows as tensors (`api.contract.tag_tensors`):
    those of `resident` (the same tasks on the run's device, see `on_device`) where given.
    Avalanche's own datasets stay on the host, where its per-sample code expects them.
    """
    resident = resident or tasks
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.task_aware import with_task_labels
    from avalanche.benchmarks.utils.classification_dataset import (
        _make_taskaware_tensor_classification_dataset as tensor_dataset,
    )

    train = [tag_tensors(tensor_dataset(t.x_train, t.y_train, task_labels=t.index), r.x_train, r.y_train,
                         torch.full((len(r.y_train),), r.index, dtype=torch.long, device=r.y_train.device))
             for t, r in zip(tasks, resident)]
    test = [tensor_dataset(t.x_test, t.y_test, task_labels=t.index) for t in tasks]
    return with_task_labels(benchmark_from_datasets(train=train, test=test))
