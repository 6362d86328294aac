"""Class-IL runs also record the task-aware (masked) accuracy matrix; task-IL runs do not."""
import json
import math

import numpy as np
import pytest
import torch
from conftest import make_spec

from harness.analysis.frame import COLUMNS, records_to_frame
from harness.config.metrics import all_metrics
from harness.config.specs import SCHEMA_VERSION, DatasetSpec, RunRecord, TrainingSpec, failed_record, spec_hash
from harness.execution.store import parse_record, read_record, write_record
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.evaluation import evaluate_class_il, task_columns
from harness.run.streams import Task, split_tasks

CPU = torch.device("cpu")


class LogitsAreInputs(torch.nn.Module):
    """A 'model' whose logits are its inputs (so a test chooses them); counts its forward passes."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, task):
        self.calls += 1
        return x


def _task(index, rows, labels):
    x, y = torch.tensor(rows, dtype=torch.float), torch.tensor(labels)
    return Task(index, (2 * index, 2 * index + 1), x[:0], y[:0], x, y)


# 2 tasks x 2 classes, single head of 4 logits; task 1's labels are 2, 3 (class-IL offsets).
HAND_TASKS = [
    _task(0, [[0, 3, 9, 0],   # y=1: full argmax 2 (task 1's class) wrong, masked to {0, 1}: 1 right
              [4, 1, 0, 0],   # y=0: both right
              [1, 2, 0, 0]],  # y=0: both wrong
          [1, 0, 0]),
    _task(1, [[5, 0, 1, 0],   # y=2: full argmax 0 wrong, masked to {2, 3}: 2 right
              [0, 0, 1, 2],   # y=3: both right
              [9, 9, 0, 1],   # y=2: both wrong (masked argmax 3)
              [0, 7, 3, 1]],  # y=2: full 1 wrong, masked 2 right
          [2, 3, 2, 2]),
]


def test_masked_accuracy_equals_a_hand_computation_from_one_forward_pass_per_batch():
    model = LogitsAreInputs().train()
    class_il, task_aware = evaluate_class_il(model, HAND_TASKS, batch_size=2, device=CPU, classes_per_task=2)
    assert class_il == [1 / 3, 1 / 4]
    assert task_aware == [2 / 3, 3 / 4]
    assert model.calls == 2 + 2  # ceil(3/2) + ceil(4/2) batches: both rows from the same logits
    assert model.training  # the previous mode is restored


def test_task_columns_are_the_class_il_labels_of_the_stream():
    tasks = split_tasks(load_dataset("digits"), (3, 7, 1, 0, 9, 2), 3, 2, "class-il")
    for t in tasks:
        lo, hi = task_columns(t.index, 2)
        assert (lo, hi) == (2 * t.index, 2 * t.index + 2)
        assert set(t.y_test.tolist()) == set(range(lo, hi))  # every label of task t, and only those


@pytest.fixture(scope="module")
def records():
    """(class-IL record, task-IL record) of small real runs on digits (3 tasks x 2 classes)."""
    common = dict(dataset=DatasetSpec("digits", 3, 2, "mlp"), regime="full", pretrain="none",
                  training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))
    class_il = run_one(make_spec(scenario="class-il", **common), device="cpu")
    task_il = run_one(make_spec(scenario="task-il", **common), device="cpu")
    assert class_il.status == "ok" and task_il.status == "ok", (class_il.error, task_il.error)
    return class_il, task_il


@pytest.mark.slow
def test_a_class_il_run_records_both_matrices(records):
    r, _ = records
    R, A = np.asarray(r.acc_matrix), np.asarray(r.acc_matrix_task_aware)
    assert R.shape == A.shape == (3, 3) and len(r.init_acc_task_aware) == 3
    assert r.metrics_task_aware == pytest.approx(all_metrics(r.acc_matrix_task_aware, r.init_acc_task_aware))
    assert r.metrics == pytest.approx(all_metrics(r.acc_matrix, r.init_acc))  # class-IL matrix unchanged
    # Masking to a subset that holds the true class keeps every correct prediction correct ...
    assert (A >= R).all() and (np.asarray(r.init_acc_task_aware) >= np.asarray(r.init_acc)).all()
    # ... and class-IL forgets old tasks in favour of the newest classes, which masking undoes.
    assert (A > R).any() and A[-1, 0] > R[-1, 0]
    assert r.metrics_task_aware["acc"] > r.metrics["acc"]


@pytest.mark.slow
def test_a_task_il_run_has_no_task_aware_fields(records):
    _, r = records
    assert len(r.acc_matrix) == 3
    assert (r.acc_matrix_task_aware, r.init_acc_task_aware, r.metrics_task_aware) == (None, None, None)


@pytest.mark.slow
def test_the_frame_shows_task_aware_acc_and_forgetting_after_drift(records):
    class_il, task_il = records
    frame = records_to_frame([class_il, task_il])
    assert COLUMNS[COLUMNS.index("drift") + 1:][:2] == ("acc_task_aware", "forgetting_task_aware")
    assert list(frame.columns) == list(COLUMNS)
    assert frame["acc_task_aware"][0] == class_il.metrics_task_aware["acc"]
    assert frame["forgetting_task_aware"][0] == class_il.metrics_task_aware["forgetting"]
    assert math.isnan(frame["acc_task_aware"][1]) and math.isnan(frame["forgetting_task_aware"][1])


@pytest.mark.slow
def test_records_round_trip_through_json(records):
    for r in records:
        again = RunRecord.from_dict(json.loads(json.dumps(r.to_dict())))
        assert again == r
        assert again.acc_matrix_task_aware == r.acc_matrix_task_aware
        assert parse_record(r.to_dict(), expected_run_id=r.run_id) == (again, None)  # the store accepts it


def test_failed_records_carry_empty_task_aware_fields_in_class_il_only():
    spec = make_spec(scenario="class-il")
    failed = failed_record(spec, "boom")
    assert (failed.acc_matrix_task_aware, failed.init_acc_task_aware, failed.metrics_task_aware) == ([], [], {})
    assert failed_record(make_spec(), "boom").acc_matrix_task_aware is None
    for r in (failed, failed_record(make_spec(), "boom")):
        assert parse_record(r.to_dict())[1] is None


@pytest.mark.slow
def test_the_schema_version_enters_the_run_id(records):
    r, _ = records
    assert SCHEMA_VERSION >= 4 and r.schema_version == SCHEMA_VERSION
    spec = r.spec.to_dict()
    assert r.run_id == spec_hash({**spec, "schema_version": SCHEMA_VERSION}) != spec_hash({**spec, "schema_version": 3})


def _damaged(record, **changes):
    data = record.to_dict()
    for key, change in changes.items():
        data[key] = change(data[key]) if callable(change) else change
    return data


def _first(value):
    """A change of a matrix's first entry to `value`."""
    return lambda m: [[value, *m[0][1:]], *m[1:]]


DAMAGE = {
    "a missing row": (dict(acc_matrix_task_aware=lambda m: m[:-1]), "acc_matrix_task_aware is not 3x3"),
    "a short row": (dict(acc_matrix_task_aware=lambda m: [m[0][:2], *m[1:]]), "acc_matrix_task_aware is not 3x3"),
    "text in the matrix": (dict(acc_matrix_task_aware=_first("x")), "acc_matrix_task_aware is not 3x3"),
    "a boolean in the matrix": (dict(acc_matrix_task_aware=_first(True)), "acc_matrix_task_aware is not 3x3"),
    "an accuracy above 1": (dict(acc_matrix_task_aware=_first(1.5)), "accuracies in [0, 1]"),
    "not a list": (dict(acc_matrix_task_aware="0.9"), "its acc_matrix_task_aware is str"),
    "metrics not a dict": (dict(metrics_task_aware=[0.5]), "its metrics_task_aware is list"),
    "matrix missing in class-IL": (dict(acc_matrix_task_aware=None), "a class-IL record without its task-aware"),
    "metrics missing in class-IL": (dict(metrics_task_aware=None), "a class-IL record without its task-aware"),
    "a short initial row": (dict(init_acc_task_aware=lambda b: b[:2]), "initial ones (init_acc_task_aware)"),
    "edited metrics": (dict(metrics_task_aware=lambda m: {**m, "acc": 1.0}),
                       "its task-aware metrics do not follow from its task-aware accuracy matrix (acc 1.0"),
    "a metric missing": (dict(metrics_task_aware=lambda m: {k: v for k, v in m.items() if k != "fwt"}),
                         "its task-aware metrics ["),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_the_store_rejects_damaged_task_aware_fields(records, tmp_path, case):
    record, _ = records
    changes, reason = DAMAGE[case]
    path = write_record(tmp_path, record)
    assert read_record(path) == (record, None)  # intact, it is read back
    path.write_text(json.dumps(_damaged(record, **changes)))
    got, problem = read_record(path)
    assert got is None and problem.kind == "corrupt" and reason in problem.reason, problem


@pytest.mark.slow
def test_the_store_rejects_task_aware_accuracies_below_class_il_ones(records):
    record, _ = records
    data = _damaged(record, acc_matrix_task_aware=_first(0.0))
    R = data["acc_matrix_task_aware"]
    data["metrics_task_aware"] = all_metrics(R, data["init_acc_task_aware"])  # consistent metrics
    assert record.acc_matrix[0][0] > 0.0
    _, problem = parse_record(data)
    assert problem.kind == "corrupt" and "task-aware accuracies are below its class-IL ones" in problem.reason


@pytest.mark.slow
def test_the_store_rejects_a_task_il_record_with_a_task_aware_matrix(records):
    _, record = records
    data = _damaged(record, acc_matrix_task_aware=record.acc_matrix)
    _, problem = parse_record(data)
    assert problem.kind == "corrupt" and "a task-IL record with task-aware fields" in problem.reason


@pytest.mark.slow
def test_a_schema_3_record_is_foreign(records):
    data = _damaged(records[0], schema_version=3)
    _, problem = parse_record(data)
    assert problem.kind == "foreign" and "schema_version 3" in problem.reason
