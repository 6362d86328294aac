"""Task orders and task splits."""
import torch

from harness.execution.plan import class_order
from harness.run.datasets import load_dataset
from harness.run.streams import split_tasks


def test_order_zero_is_natural():
    assert class_order(10, 0, seed=123) == tuple(range(10))


def test_orders_are_deterministic_distinct_permutations():
    orders = [class_order(10, k, seed=0) for k in range(11)]
    assert orders == [class_order(10, k, seed=0) for k in range(11)]
    assert len(set(orders)) == 11
    assert all(sorted(o) == list(range(10)) for o in orders)
    assert class_order(10, 3, seed=0) != class_order(10, 3, seed=1)


def test_split_relabels_per_task():
    data = load_dataset("digits")
    order = class_order(10, 2, seed=0)
    tasks = split_tasks(data, order, 5, 2, "task-il")
    for t in tasks:
        assert t.classes == order[2 * t.index:2 * t.index + 2]
        assert set(t.y_train.tolist()) == {0, 1}
        # every selected sample really is of the task's classes, in the right local label
        original = data.y_train[torch.isin(data.y_train, torch.tensor(t.classes))]
        assert len(original) == len(t.y_train)
    total = sum(len(t.y_test) for t in tasks)
    assert total == len(data.y_test)


def test_class_il_labels_are_global_positions():
    data = load_dataset("digits")
    tasks = split_tasks(data, tuple(range(10)), 5, 2, "class-il")
    assert set(tasks[3].y_train.tolist()) == {6, 7}
