"""What a method keeps between tasks is in the record: budget.memory_samples / memory_bytes per task
(api.contract.MemoryHook), range-checked when a record is read."""
from __future__ import annotations

import textwrap

import pytest
from conftest import make_spec

from harness.config.specs import DatasetSpec, TrainingSpec
from harness.execution.store import parse_record
from harness.run.engine import run_one

# A rehearsal-like plugin: after each task it keeps the first ROWS training rows of the task (inputs as
# float32, labels as int64) and one float64 tensor of 5 numbers (e.g. class statistics).
KEEPER = textwrap.dedent('''
    """Naive that keeps ROWS rows of every task it trained (a test of the memory accounting)."""
    import torch
    from avalanche.core import SupervisedPlugin
    from avalanche.training.supervised import Naive

    from harness.api.contract import MemoryUse

    NAME = "keeper"
    DEFAULTS = {"rows": 3, "report": 0}


    class Keep(SupervisedPlugin):
        def __init__(self, tasks, rows, report):
            super().__init__()
            self.tasks, self.rows, self.report, self.kept = tasks, rows, report, []
            self.stats = torch.zeros(5, dtype=torch.float64)

        def after_training_exp(self, strategy, **kwargs):
            task = self.tasks[len(self.kept) // 2]
            self.kept += [task.x_train[:self.rows].float().clone(), task.y_train[:self.rows].long().clone()]

        def harness_memory(self):
            samples = sum(len(y) for y in self.kept[1::2]) if self.report == 0 else self.report
            return MemoryUse(samples=samples, tensors=(*self.kept, self.stats))


    def build(ctx, rows, report):
        return Naive(**ctx.strategy_kwargs(Keep(ctx.tasks, rows, report)))
''')

SPEC = dict(method="keeper", dataset=DatasetSpec("digits", 3, 2, "mlp"), regime="full", pretrain="none",
            training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))


@pytest.fixture(scope="module")
def keeper(tmp_path_factory):
    path = tmp_path_factory.mktemp("methods") / "keeper.py"
    path.write_text(KEEPER)
    return str(path)


@pytest.fixture(scope="module")
def records(keeper):
    """(class-IL, task-IL) records of the keeper with 7 rows per task."""
    return tuple(run_one(make_spec(scenario=s, hparams={"rows": 7, "report": 0}, **SPEC), device="cpu",
                         method_files=(keeper,)) for s in ("class-il", "task-il"))


def test_the_engine_records_samples_and_bytes_after_every_task(records):
    row_bytes = 64 * 4 + 8  # digits: 64 float32 inputs and an int64 label per stored row
    for rec in records:
        assert rec.ok, rec.error
        assert rec.budget["memory_samples"] == [7, 14, 21]
        assert rec.budget["memory_bytes"] == [7 * t * row_bytes + 5 * 8 for t in (1, 2, 3)]
        record, problem = parse_record(rec.to_dict(), expected_run_id=rec.run_id)
        assert problem is None and record.budget == rec.budget


def test_a_method_that_declares_nothing_has_no_memory_entries():
    rec = run_one(make_spec(**{**SPEC, "method": "naive"}), device="cpu")
    assert rec.ok and "memory_samples" not in rec.budget and "memory_bytes" not in rec.budget


def test_a_negative_count_of_samples_fails_the_run(keeper):
    rec = run_one(make_spec(hparams={"rows": 2, "report": -3}, **SPEC), device="cpu", method_files=(keeper,))
    assert rec.status == "failed" and "harness_memory() reported -3 stored samples" in rec.error
    assert "memory_samples" not in rec.budget  # nothing recorded for the task it failed after
    assert parse_record(rec.to_dict(), expected_run_id=rec.run_id)[1] is None


@pytest.mark.parametrize("change, named", [
    ({"memory_samples": [7, -1, 21]}, "budget.memory_samples[1] is -1"),
    ({"memory_samples": [7, 14.5, 21]}, "budget.memory_samples[1] is 14.5"),
    ({"memory_bytes": [1, 2, "3"]}, "budget.memory_bytes[2] is '3'"),
    ({"memory_bytes": [1, 2, True]}, "budget.memory_bytes[2] is True"),
    ({"memory_bytes": [1, 2]}, "one entry per trained task (of 3)"),
    ({"memory_samples": [1, 2, 3, 4], "memory_bytes": [1, 2, 3, 4]}, "one entry per trained task (of 3)"),
    ({"memory_samples": [[7], 14, 21]}, "are not lists of one entry per task"),
    ({"memory_samples": 21}, "are not lists of one entry per task"),
    ({"memory_samples": None}, "are not lists of one entry per task"),
])
def test_the_store_range_checks_the_memory_entries(records, change, named):
    data = records[0].to_dict()
    data["budget"] = {**data["budget"], **change}
    _, problem = parse_record(data)
    assert problem.kind == "corrupt" and named in problem.reason, problem


def test_the_memory_entries_come_together_and_may_be_null_after_an_undeclared_task(records):
    data = records[1].to_dict()
    alone = {k: v for k, v in data["budget"].items() if k != "memory_bytes"}
    _, problem = parse_record({**data, "budget": alone})
    assert problem.kind == "corrupt" and "memory_samples without memory_bytes" in problem.reason
    nulls = {**data["budget"], "memory_samples": [None, 14, 21], "memory_bytes": [None, 5, 6]}
    assert parse_record({**data, "budget": nulls})[1] is None
