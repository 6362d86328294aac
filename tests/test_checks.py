"""Learning checks and the training budget: rules by hand, budgets by hand, warnings end to end."""
from __future__ import annotations

import math

import pytest
from conftest import make_spec

from harness.config.specs import TrainingSpec
from harness.run import checks
from harness.run.engine import run_one


def test_chance_threshold_is_five_points_or_three_standard_errors():
    assert checks.chance_threshold(0.5, 10_000) == pytest.approx(0.55)  # 3·0.005 < 5 points
    assert checks.chance_threshold(0.5, 25) == pytest.approx(0.5 + 3 * 0.1)  # 3·sqrt(.25/25) = 0.3
    assert checks.chance_threshold(0.1, 100) == pytest.approx(0.1 + 0.09)


def _checks(**over):
    base = {"chance": 0.5, "n_test": [100, 100], "probe_acc": [0.9, 0.9], "loss_first": [0.7, 0.7],
            "loss_last": [0.1, 0.1]}
    return {**base, **over}


def test_each_rule_fires_alone_and_names_its_task():
    good = [[0.9, 0.5], [0.9, 0.9]]
    assert checks.run_warnings(good, _checks(), "task-il") == []
    chance = checks.run_warnings([[0.9, 0.5], [0.9, 0.62]], _checks(probe_acc=[0.9, 0.7]), "task-il")
    assert [(w["code"], w["task"]) for w in chance] == [("chance", 1)]
    assert chance[0]["message"].startswith("task 2: ") and "chance 0.500" in chance[0]["message"]
    probe = checks.run_warnings([[0.9, 0.5], [0.9, 0.79]], _checks(), "task-il")
    assert [(w["code"], w["task"]) for w in probe] == [("below-probe", 1)]  # 0.9 − 0.79 > 10 points
    assert checks.run_warnings([[0.9, 0.5], [0.9, 0.81]], _checks(), "task-il") == []
    # class-IL: the same probe rule, on the task-aware matrix (tests/test_class_il_checks.py)
    probe_cil = checks.run_warnings([[0.9, 0.5], [0.5, 0.79]], _checks(chance=0.25, task_chance=0.5), "class-il",
                                    [[0.9, 0.5], [0.9, 0.79]])
    assert [(w["code"], w["task"]) for w in probe_cil] == [("below-probe", 1)]
    flat = checks.run_warnings(good, _checks(loss_last=[0.1, 0.68]), "task-il")
    assert [(w["code"], w["task"]) for w in flat] == [("loss-flat", 1)]
    # a loss that was already small (below half of ln 2) is not "never fell"
    assert checks.run_warnings(good, _checks(loss_first=[0.7, 0.2], loss_last=[0.1, 0.2]), "task-il") == []


def test_loss_windows_are_the_first_and_last_tenth():
    losses = [10.0] * 5 + [1.0] * 40 + [2.0] * 5  # 50 iterations: windows of 5
    assert checks.loss_windows(losses) == (10.0, 2.0)
    assert checks.loss_windows([3.0]) == (3.0, 3.0)
    assert checks.loss_windows([]) is None


def test_partial_matrix_of_a_failed_run_is_checked_as_far_as_it_goes():
    warned = checks.run_warnings([[0.5, 0.5]], _checks(), "task-il")
    assert [(w["code"], w["task"]) for w in warned] == [("chance", 0), ("below-probe", 0)]


def _task_sizes(spec):
    from harness.run.datasets import load_dataset
    from harness.run.streams import split_tasks

    tasks = split_tasks(load_dataset(spec.dataset.name), spec.class_order, spec.dataset.n_tasks,
                        spec.dataset.classes_per_task)
    return [len(t.y_train) for t in tasks]


@pytest.mark.slow
def test_budget_counts_steps_samples_and_epochs_by_hand():
    spec = make_spec(dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"),
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=2, batch_size=32))
    rec = run_one(spec, device="cpu")
    assert rec.ok, rec.error
    sizes = _task_sizes(spec)
    assert rec.budget["steps_per_task"] == [2 * math.ceil(n / 32) for n in sizes]
    assert rec.budget["samples_per_task"] == [2 * n for n in sizes]
    assert rec.budget["optimizer_steps"] == sum(rec.budget["steps_per_task"])
    assert rec.budget["samples_seen"] == 2 * sum(sizes)
    assert rec.budget["epochs_per_stage"] == [[2], [2], [2]]


@pytest.mark.slow
def test_a_run_that_cannot_learn_is_flagged_and_a_trained_one_is_not():
    data = make_spec().dataset.__class__("digits", 3, 2, "mlp")
    frozen = run_one(make_spec(dataset=data, training=TrainingSpec(lr=1e-7, epochs=1, batch_size=32)), device="cpu")
    codes = {(w["code"], w["task"]) for w in frozen.warnings}
    assert frozen.ok and frozen.flagged
    assert {("loss-flat", 0), ("loss-flat", 1), ("loss-flat", 2)} <= codes
    assert any(code == "chance" for code, _ in codes)
    probe = frozen.checks["probe_acc"]
    assert len(probe) == 3 and all(0.0 <= p <= 1.0 for p in probe)
    trained = run_one(make_spec(dataset=data, regime="full",
                                training=TrainingSpec(lr=0.05, momentum=0.9, epochs=3, batch_size=32)), device="cpu")
    assert trained.ok and trained.warnings == [], trained.warnings
    assert min(trained.acc_matrix[t][t] for t in range(3)) > 0.9


@pytest.mark.slow
def test_below_probe_fires_when_the_head_lags_separable_features():
    # task 1 trains the whole network; from task 2 only the head trains, far too slowly to learn
    # what its (task-1) features already separate
    rec = run_one(make_spec(dataset=make_spec().dataset.__class__("digits", 3, 2, "mlp"), regime="head",
                            training=TrainingSpec(lr=0.002, epochs=1, batch_size=32)), device="cpu")
    below = [w for w in rec.warnings if w["code"] == "below-probe"]
    assert below, rec.warnings
    for w in below:
        t = w["task"]
        assert rec.checks["probe_acc"][t] - rec.acc_matrix[t][t] > checks.PROBE_GAP


@pytest.mark.slow
def test_records_whose_warnings_were_edited_are_corrupt(tmp_path):
    from harness.config.specs import RunRecord
    from harness.execution.store import content_problem

    data = make_spec().dataset.__class__("digits", 3, 2, "mlp")
    rec = run_one(make_spec(dataset=data, training=TrainingSpec(lr=1e-7, epochs=1, batch_size=32)), device="cpu")
    assert rec.flagged and content_problem(rec) is None
    unflagged = RunRecord.from_dict({**rec.to_dict(), "warnings": []})
    problem = content_problem(unflagged)
    assert problem is not None and problem.kind == "corrupt" and "warnings" in problem.reason


def test_probe_of_non_finite_features_is_none_not_a_failure():
    import torch

    from harness.run.probe import probe_accuracy
    from harness.run.streams import Task

    class NaNFeatures(torch.nn.Module):
        def features(self, x):
            return torch.full((len(x), 3), float("nan"))

    task = Task(0, (0, 1), torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]), torch.zeros(2, 2), torch.tensor([0, 1]))
    assert probe_accuracy(NaNFeatures(), task, torch.device("cpu")) is None


def test_a_merge_is_checked_on_the_model_it_trained():
    """A merged model below its probe is the method's answer, not a short budget: the checks use
    the trained model's accuracy (trained_acc) where one is recorded, R[t][t] elsewhere."""
    from harness.run.checks import run_warnings

    checks = {"chance": 0.5, "n_test": [100, 100], "probe_acc": [0.95, 0.95], "trained_acc": [None, 0.94]}
    matrix = [[0.80, 0.50], [0.79, 0.70]]  # task 1 evaluated at 0.80, task 2 at 0.70 (a merge)
    codes = [(w["code"], w["task"]) for w in run_warnings(matrix, checks, "task-il")]
    assert codes == [("below-probe", 0)]  # task 2's trained model reached 0.94: no warning
    assert [(w["code"], w["task"]) for w in run_warnings(matrix, {**checks, "trained_acc": []}, "task-il")] == \
        [("below-probe", 0), ("below-probe", 1)]


@pytest.mark.slow
def test_merging_records_carry_the_trained_accuracy_and_others_do_not():
    from conftest import make_spec

    from harness.run.engine import run_one

    merged = run_one(make_spec(regime="last-2", method="magmax", pretrain="none"), device="cpu")
    plain = run_one(make_spec(regime="last-2", method="naive", pretrain="none"), device="cpu")
    assert merged.ok and plain.ok
    assert all(a is not None for a in merged.checks["trained_acc"])  # θ0 = init: every task is merged
    assert merged.checks["trained_acc"] != [row[t] for t, row in enumerate(merged.acc_matrix)]
    assert plain.checks["trained_acc"] == [None] * 5
