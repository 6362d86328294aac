"""The store's check of a curve's points (issue 29): a finished run's points are exactly those the engine gives
for its budget's steps per task (none deleted, duplicated or moved), a failed run's a prefix of them, and where a
task's subsample is its whole test set the initial and end points are init_acc and the accuracy matrix's rows."""
from __future__ import annotations

import copy
import json

import pytest
from avalanche.core import SupervisedPlugin
from conftest import make_spec

from harness.config.specs import ContinualSpec, DatasetSpec, TrainingSpec
from harness.execution.store import curve_points, parse_record
from harness.run.engine import run_one

# digits, 5 tasks: 9 optimizer steps per task (batch 32, 1 epoch). Classes 8, 9 first: task 0 has 88 test rows,
# the others 91, 90, 91, 90; a subsample of 90 is the whole test set of tasks 0, 2 and 4 only.
ORDER = (8, 9, 0, 1, 2, 3, 4, 5, 6, 7)
EVERY, SUBSAMPLE = 3, 90
SERIES = ("steps", "task", "end", "acc", "acc_task_aware")


def _spec(scenario="task-il", subsample=SUBSAMPLE):
    return make_spec(scenario=scenario, dataset=DatasetSpec("digits", 5, 2, "mlp"), regime="full",
                     class_order=ORDER, training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32),
                     continual=ContinualSpec(EVERY, subsample))


def _json(record) -> dict:
    return json.loads(json.dumps(record.to_dict()))


@pytest.fixture(scope="module")
def task_il():
    record = run_one(_spec(), device="cpu")
    assert record.ok, record.error
    return _json(record)


@pytest.fixture(scope="module")
def class_il():
    record = run_one(_spec("class-il", subsample=10_000), device="cpu")
    assert record.ok, record.error
    return _json(record)


def _points(d) -> list:
    c = d["curve"]
    return list(zip(c["steps"], c["task"], c["end"]))


def _edited(d, edit) -> dict:
    d = copy.deepcopy(d)
    edit(d["curve"])
    return d


def _delete(*indices):
    """Remove points, from every per-point list alike."""
    def edit(c):
        for k in SERIES:
            if k in c:
                c[k] = [v for i, v in enumerate(c[k]) if i not in indices]
    return edit


def _duplicate(i):
    def edit(c):
        for k in SERIES:
            if k in c:
                c[k].insert(i, copy.deepcopy(c[k][i]))
    return edit


def _rejected(d) -> str:
    record, problem = parse_record(d)
    assert record is None and problem.kind == "corrupt"
    assert "\n" not in problem.reason
    return problem.reason


def test_the_engines_points_are_the_rule_and_accepted(task_il):
    """Hand-written: 9 steps per task, a point every 3 — the 3rd mid point and the end point share step 9."""
    assert task_il["budget"]["steps_per_task"] == [9] * 5
    assert task_il["curve"]["n_rows"] == [88, 90, 90, 90, 90]
    task0 = [(0, 0, False), (3, 0, False), (6, 0, False), (9, 0, False), (9, 0, True)]
    task1 = [(12, 1, False), (15, 1, False), (18, 1, False), (18, 1, True)]
    assert _points(task_il)[:9] == task0 + task1 and len(_points(task_il)) == 1 + 5 * 4
    assert _points(task_il) == curve_points(EVERY, [9] * 5)
    assert curve_points(4, [9, 8, 0]) == [(0, 0, False), (4, 0, False), (8, 0, False), (9, 0, True),
                                          (13, 1, False), (17, 1, False), (17, 1, True), (17, 2, True)]
    assert parse_record(task_il)[1] is None


def _task_points(d, task, end=False):
    return [i for i, (_, t, e) in enumerate(_points(d)) if t == task and e == end]


def test_deleted_points_are_rejected(task_il):
    # The reviewer's case: task 3's mid-task points gone (the curve's metrics would change).
    assert "point" in _rejected(_edited(task_il, _delete(*_task_points(task_il, 3))))
    assert "point" in _rejected(_edited(task_il, _delete(_task_points(task_il, 1)[0])))
    # The mid point at a task's last step, beside its end point, is one of the engine's too.
    assert "point" in _rejected(_edited(task_il, _delete(_task_points(task_il, 2)[-1])))
    assert "12 points, not the 21" in _rejected(_edited(task_il, _delete(*range(12, 21))))  # a finished run


def test_duplicated_points_are_rejected(task_il):
    assert "point" in _rejected(_edited(task_il, _duplicate(_task_points(task_il, 1)[1])))
    assert "point" in _rejected(_edited(task_il, _duplicate(_task_points(task_il, 2, end=True)[0])))
    assert "point" in _rejected(_edited(task_il, _duplicate(0)))
    last = len(_points(task_il)) - 1
    assert "22 points, not the 21" in _rejected(_edited(task_il, _duplicate(last)))


def test_moved_points_are_rejected(task_il):
    i = _task_points(task_il, 1)[0]  # (12, 1): to 15, a multiple of every into task 1 too
    assert f"point {i} (step, task, end) is (15, 1, false), not (12, 1, false)" in _rejected(
        _edited(task_il, lambda c: c["steps"].__setitem__(i, 15)))

    def swap(c):  # task 0's end point before its last mid point (both at step 9)
        for k in SERIES:
            if k in c:
                c[k][3], c[k][4] = c[k][4], c[k][3]
    assert "point 3 (step, task, end) is (9, 0, true), not (9, 0, false)" in _rejected(_edited(task_il, swap))


def test_end_points_must_be_the_matrix_on_whole_test_sets(task_il):
    """Tasks 0, 2, 4 are evaluated on their whole test sets: the initial point and the end points are the
    matrix's; tasks 1, 3 (90 of 91 rows) may differ from it."""
    end3 = _task_points(task_il, 3, end=True)[0]
    assert [task_il["curve"]["acc"][end3][j] for j in (0, 2)] == [task_il["acc_matrix"][3][j] for j in (0, 2)]
    assert task_il["curve"]["acc"][0][0] == task_il["init_acc"][0]

    def shift(i, j, n):
        return lambda c: c["acc"][i].__setitem__(j, c["acc"][i][j] + (1 if c["acc"][i][j] < 0.5 else -1) / n)
    reason = _rejected(_edited(task_il, shift(end3, 2, 90)))
    assert reason.startswith(f"its curve's acc[{end3}][2] (task 3's end point) is not acc_matrix[3][2]")
    assert "init_acc[0]" in _rejected(_edited(task_il, shift(0, 0, 88)))
    assert parse_record(_edited(task_il, shift(end3, 1, 90)))[1] is None  # task 1: a subsample
    assert parse_record(_edited(task_il, shift(end3 - 1, 2, 90)))[1] is None  # a mid point: not the matrix's


def test_class_il_end_points_are_both_matrices(class_il):
    c = class_il["curve"]
    assert c["n_rows"] == class_il["checks"]["n_test"]
    end2 = _task_points(class_il, 2, end=True)[0]
    assert parse_record(class_il)[1] is None
    assert c["acc_task_aware"][end2][:3] == class_il["acc_matrix_task_aware"][2][:3]
    j = next(j for j in range(3) if c["acc"][end2][j] < c["acc_task_aware"][end2][j])  # room to move acc up
    up = _edited(class_il, lambda c: c["acc"][end2].__setitem__(j, c["acc"][end2][j] + 1 / c["n_rows"][j]))
    assert "is not acc_matrix[2]" in _rejected(up)
    k = next(k for k in range(3) if c["acc_task_aware"][end2][k] < 1)
    aware = _edited(class_il, lambda c: c["acc_task_aware"][end2].__setitem__(
        k, c["acc_task_aware"][end2][k] + 1 / c["n_rows"][k]))
    assert "is not acc_matrix_task_aware[2]" in _rejected(aware)


class _FailAt(SupervisedPlugin):
    """Raises after the `at`-th optimizer step of the task it is added in (after the harness's point)."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.steps = at, 0

    def after_update(self, strategy, **kwargs):
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("stop here")


def test_a_failed_runs_prefix_is_accepted_and_nothing_else(task_il):
    def observer(event, t, strategy):
        if event == "before_task" and t == 2:
            strategy.plugins.append(_FailAt(6))
    data = _json(run_one(_spec(), device="cpu", observer=observer))
    assert data["status"] == "failed" and data["budget"]["steps_per_task"] == [9, 9, 6]
    # Up to task 2's 6th step: the finished run's points, without task 2's end point and the rest.
    assert _points(data) == _points(task_il)[:11] and _points(data)[-1] == (24, 2, False)
    assert parse_record(data)[1] is None
    assert parse_record(_edited(data, _delete(10)))[1] is None  # a shorter prefix (the point itself failed)
    assert "point 9 " in _rejected(_edited(data, _delete(9)))  # a hole
    assert "point 11 (step, task, end) is (24, 2, false), not (24, 2, true)" in _rejected(
        _edited(data, _duplicate(10)))

    def append(step, end):
        return lambda c: [c[k].append(copy.deepcopy(c[k][-1])) for k in SERIES if k in c] and (
            c["steps"].__setitem__(-1, step), c["end"].__setitem__(-1, end))
    ended = _edited(data, append(24, True))  # it failed after task 2's end point
    assert parse_record(ended)[1] is None
    assert "13 points, not the 12" in _rejected(_edited(ended, append(24, True)))


def test_a_run_with_a_curve_needs_its_steps_per_task(task_il):
    short = copy.deepcopy(task_il)
    short["budget"]["steps_per_task"] = [9] * 4
    assert "budget.steps_per_task is not 5 step counts" in _rejected(short)


def test_an_accelerator_record_may_differ_from_its_matrix_by_one_example(task_il):
    """On CPU both evaluations are one computation (exact); a record made on a GPU gets one example of slack
    (kernels chosen per call may flip a tie), and no more."""
    end3 = _task_points(task_il, 3, end=True)[0]
    n = task_il["checks"]["n_test"][2]

    def shift(k):
        return lambda c: c["acc"][end3].__setitem__(2, c["acc"][end3][2] + (k if c["acc"][end3][2] < 0.5 else -k) / n)
    on_gpu = {**task_il, "provenance": {**task_il["provenance"], "device": "cuda:0"}}
    assert "not acc_matrix[3][2]" in _rejected(_edited(task_il, shift(1)))
    assert parse_record(_edited(on_gpu, shift(1)))[1] is None
    assert "not acc_matrix[3][2]" in _rejected(_edited(on_gpu, shift(2)))


def test_a_view_shows_curves_of_one_setting(task_il):
    """The curve is not in the run id: records of one version with curves of two settings (an edited protocol
    or record) keep the majority's curves; the others are shown without theirs, and the view says so."""
    from dataclasses import replace

    from harness.execution.views import view_records

    rec = parse_record(task_il)[0]
    other = replace(rec.spec.continual, every=rec.spec.continual.every + 1)
    records = [replace(rec, spec=replace(rec.spec, order=k, continual=other if k == 2 else rec.spec.continual))
               for k in range(3)]
    said = []
    shown = view_records(records, log=said.append)
    assert [r.curve is not None for r in shown] == [True, True, False]
    assert [r.acc_matrix for r in shown] == [rec.acc_matrix] * 3
    assert any("curves of 2 settings" in s and "1 curves not taken every" in s for s in said)
    assert all(r.curve is not None for r in view_records(records[:2], log=said.append))
