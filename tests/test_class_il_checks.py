"""Class-IL learning checks judge each task against its own chance: the task-aware accuracy right after
training it against 1/classes_per_task, and against a linear probe on the trained model's features."""
from __future__ import annotations

import textwrap

import pytest
import torch
from conftest import make_spec

from harness.config.metrics import all_metrics
from harness.config.specs import SCHEMA_VERSION, DatasetSpec, TrainingSpec
from harness.execution.store import parse_record
from harness.run import checks
from harness.run.engine import run_one

# 2 tasks x 2 classes on 400 test samples each: the head's chance 1/4, each task's 1/2.
# chance threshold within the task: 0.5 + max(0.05, 3 * sqrt(0.25 / 400) = 0.075) = 0.575
CHECKS = {"chance": 0.25, "task_chance": 0.5, "n_test": [400, 400], "probe_acc": [0.97, 0.97],
          "trained_acc": [None, None], "loss_first": [1.4, 1.4], "loss_last": [0.1, 0.1]}


def _codes(warnings):
    return [(w["code"], w["task"]) for w in warnings]


def test_a_newest_task_at_within_task_chance_is_flagged_chance():
    # collapsed features: task 2 answers at 0.5 within its own two classes; class-IL its classes win the
    # single head's argmax either way (R[1][1] = 0.5, twice the head's chance of 0.25, unflagged before)
    R = [[0.96, 0.0], [0.30, 0.50]]
    A = [[0.96, 0.50], [0.62, 0.50]]
    warned = checks.run_warnings(R, {**CHECKS, "probe_acc": [0.97, 0.51]}, "class-il", A)
    assert _codes(warned) == [("chance", 1)]
    assert warned[0]["message"] == ("task 2: a task's accuracy right after training it is at chance level "
                                    "(task-aware 0.500 with chance 0.500 within the task on 400 test samples)")
    # just above the threshold: learned
    assert checks.run_warnings(R, {**CHECKS, "probe_acc": [0.97, 0.6]}, "class-il", [[0.96, 0.5], [0.62, 0.58]]) == []


def test_a_task_learned_within_its_classes_is_not_flagged_by_a_low_class_il_accuracy():
    R = [[0.95, 0.0], [0.60, 0.95]]  # task 1 forgotten class-IL (recency): not a learning failure
    A = [[0.95, 0.50], [0.95, 0.95]]
    assert checks.run_warnings(R, CHECKS, "class-il", A) == []
    R = [[0.60, 0.0], [0.30, 0.60]]  # 60 % class-IL right after training, 95 % task-aware
    A = [[0.95, 0.50], [0.90, 0.95]]
    assert checks.run_warnings(R, CHECKS, "class-il", A) == []


def test_the_probe_rule_judges_the_task_aware_accuracy_in_class_il():
    R = [[0.80, 0.0], [0.40, 0.85]]
    below = checks.run_warnings(R, CHECKS, "class-il", [[0.86, 0.5], [0.90, 0.86]])  # 0.97 - 0.86 > 10 points
    assert _codes(below) == [("below-probe", 0), ("below-probe", 1)]
    assert below[1]["message"].endswith("(task-aware 0.860 against a probe's 0.970)")
    assert checks.run_warnings(R, CHECKS, "class-il", [[0.88, 0.5], [0.90, 0.88]]) == []  # 9 points
    # class-IL R[t][t] far below the probe is not the rule: the probe separates the task's classes only
    assert checks.run_warnings([[0.5, 0.0], [0.1, 0.5]], CHECKS, "class-il", [[0.9, 0.5], [0.9, 0.9]]) == []


def test_the_trained_model_is_judged_where_another_is_evaluated_in_class_il():
    A = [[0.55, 0.5], [0.60, 0.52]]  # the evaluated model (a method's own classifier) at chance
    assert _codes(checks.run_warnings(A, CHECKS, "class-il", A)) == [
        ("chance", 0), ("below-probe", 0), ("chance", 1), ("below-probe", 1)]
    trained = {**CHECKS, "trained_acc": [0.95, 0.50]}  # what training reached: task 2 not learned
    assert _codes(checks.run_warnings(A, trained, "class-il", A)) == [("chance", 1), ("below-probe", 1)]
    # the other way round (iCaRL: a head trained only to shape features, a nearest-mean classifier that
    # answers): the evaluated model learned task 1, so only task 2, which neither learned, is flagged
    A = [[0.95, 0.5], [0.90, 0.52]]
    weak_head = {**CHECKS, "trained_acc": [0.55, 0.50]}
    assert _codes(checks.run_warnings(A, weak_head, "class-il", A)) == [("chance", 1), ("below-probe", 1)]


def test_the_loss_rules_uniform_guess_covers_the_classes_seen_in_class_il():
    A = [[0.95, 0.5], [0.9, 0.95]]
    # task 2 (4 classes seen): ln 4 / 2 = 0.693; a last loss of 0.68 that never fell is not flat ...
    assert checks.run_warnings(A, {**CHECKS, "loss_first": [0.7, 0.7], "loss_last": [0.1, 0.68]}, "class-il", A) == []
    # ... 0.75 is
    flat = checks.run_warnings(A, {**CHECKS, "loss_first": [0.7, 0.76], "loss_last": [0.1, 0.75]}, "class-il", A)
    assert _codes(flat) == [("loss-flat", 1)]
    # task 1 (2 classes seen, the loss's columns): ln 2 / 2 = 0.347, so a loss stuck at the uniform guess
    # ln 2 = 0.69 is flat; against all 4 outputs (ln 4 / 2 = 0.693) it would never be
    flat = checks.run_warnings(A, {**CHECKS, "loss_first": [0.70, 0.7], "loss_last": [0.69, 0.1]}, "class-il", A)
    assert _codes(flat) == [("loss-flat", 0)]


def test_the_store_refuses_chance_levels_that_are_not_the_specs():
    R, A = [[0.96, 0.0], [0.30, 0.50]], [[0.96, 0.50], [0.62, 0.50]]
    data = class_il_record(R, A, {**CHECKS, "probe_acc": [0.97, 0.51]})
    # an edited within-task chance below the learned accuracy would drop the chance warning
    edited = {**data["checks"], "task_chance": 0.01}
    _, problem = parse_record({**data, "checks": edited, "warnings": checks.run_warnings(R, edited, "class-il", A)})
    assert problem.kind == "corrupt" and "checks.task_chance is 0.01, not the spec's 0.5" in problem.reason
    edited = {**data["checks"], "chance": 0.5}
    _, problem = parse_record({**data, "checks": edited, "warnings": checks.run_warnings(R, edited, "class-il", A)})
    assert problem.kind == "corrupt" and "checks.chance is 0.5, not the spec's 0.25" in problem.reason


def test_task_il_warnings_keep_their_rule_and_text():
    c = {"chance": 0.5, "n_test": [100, 100], "probe_acc": [0.9, 0.95], "loss_first": [0.7, 0.7],
         "loss_last": [0.1, 0.68]}
    warned = checks.run_warnings([[0.9, 0.5], [0.9, 0.52]], c, "task-il")
    assert [w["message"] for w in warned] == [
        "task 2: a task's accuracy right after training it is at chance level (0.520 with chance 0.500 on 100 "
        "test samples)",
        "task 2: learning accuracy far below a linear probe on the same features (0.520 against a probe's 0.950)",
        "task 2: the training loss of a task never fell (loss 0.700 at the start, 0.680 at the end)"]
    # a task-aware matrix passed in task-IL changes nothing (its acc_matrix is the task-aware one)
    assert checks.run_warnings([[0.9, 0.5], [0.9, 0.52]], c, "task-il", [[1.0, 1.0], [1.0, 1.0]]) == warned


def test_class_il_checks_without_what_they_judge_are_malformed():
    R = [[0.9, 0.0], [0.5, 0.9]]
    with pytest.raises(ValueError, match="task-aware matrix"):
        checks.run_warnings(R, CHECKS, "class-il")
    with pytest.raises(ValueError, match="task_chance"):
        checks.run_warnings(R, {k: v for k, v in CHECKS.items() if k != "task_chance"}, "class-il", R)
    assert checks.run_warnings(R, {}, "class-il") == []  # a run that measured nothing has no warnings


# ------------------------------------------------------------------ the store


def class_il_record(R, A, record_checks=CHECKS, budget=None) -> dict:
    """A valid class-IL record's JSON form (2 tasks x 2 classes): metrics and warnings computed."""
    spec = make_spec(scenario="class-il", dataset=DatasetSpec("digits", 2, 2, "mlp"), class_order=(0, 1, 2, 3),
                     regime="full", pretrain="none")
    b = [0.5, 0.5]
    return {"schema_version": SCHEMA_VERSION, "run_id": spec.run_id, "status": "ok", "error": None, "spec": spec.to_dict(),
            "acc_matrix": R, "init_acc": [0.25, 0.25], "metrics": all_metrics(R, [0.25, 0.25]),
            "acc_matrix_task_aware": A, "init_acc_task_aware": b, "metrics_task_aware": all_metrics(A, b),
            "update_norms": {}, "diagnostics": {}, "params": {}, "regime_depth": 2, "n_blocks": 2, "timings": {},
            "provenance": {}, "budget": budget or {"optimizer_steps": 4, "steps_per_task": [2, 2]},
            "checks": record_checks, "warnings": checks.run_warnings(R, record_checks, "class-il", A)}


def test_the_store_verifies_class_il_warnings_from_the_task_aware_matrix():
    R, A = [[0.96, 0.0], [0.30, 0.50]], [[0.96, 0.50], [0.62, 0.50]]
    data = class_il_record(R, A, {**CHECKS, "probe_acc": [0.97, 0.51]})
    assert _codes(data["warnings"]) == [("chance", 1)]
    record, problem = parse_record(data, expected_run_id=data["run_id"])
    assert problem is None and record.flagged
    for tampered in ([], [*data["warnings"], {**data["warnings"][0], "code": "below-probe"}]):
        _, problem = parse_record({**data, "warnings": tampered})
        assert problem.kind == "corrupt" and "warnings" in problem.reason
    # the warnings the old rule gave (chance 1/all classes on R[t][t]: none) are not this record's
    _, problem = parse_record({**data, "warnings": checks.run_warnings(R, data["checks"], "task-il")})
    assert problem.kind == "corrupt" and "warnings (0) are not the 1" in problem.reason
    # a class-IL record's checks without the within-task chance cannot be judged
    no_task_chance = {k: v for k, v in CHECKS.items() if k != "task_chance"}
    _, problem = parse_record({**data, "checks": no_task_chance})
    assert problem.kind == "corrupt" and "learning checks are malformed" in problem.reason
    _, problem = parse_record({**data, "checks": {**data["checks"], "task_chance": 0.0}})
    assert problem.kind == "corrupt" and "checks.task_chance" in problem.reason


# ------------------------------------------------------------------ real runs


EVAL_OTHER = textwrap.dedent('''
    """Naive, evaluated through a module that negates the trained model's logits (shares its blocks)."""
    import torch
    from avalanche.core import SupervisedPlugin
    from avalanche.training.supervised import Naive

    NAME = "negated-eval"
    DEFAULTS = {}


    class Negated(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.blocks = model, model.blocks  # shares the trained blocks

        def forward(self, x, task_labels):
            return -self.model(x, task_labels)

        def features(self, x):
            return self.model.features(x)


    class Hook(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.model = None

        def before_training(self, strategy, **kwargs):
            self.model = strategy.model

        def harness_eval_model(self):
            return Negated(self.model)


    def build(ctx):
        return Naive(**ctx.strategy_kwargs(Hook()))
''')


def _task_aware_by_hand(model, task, cpt: int) -> float:
    model.eval()
    with torch.no_grad():
        logits = model(task.x_test, task.index)
    lo = task.index * cpt
    return int(((logits[:, lo:lo + cpt].argmax(1) + lo) == task.y_test).sum()) / len(task.y_test)


def test_a_method_evaluating_another_model_is_checked_on_the_trained_one_in_class_il(tmp_path):
    from harness.run.datasets import load_dataset
    from harness.run.streams import split_tasks

    path = tmp_path / "negated_eval.py"
    path.write_text(EVAL_OTHER)
    spec = make_spec(method="negated-eval", scenario="class-il", dataset=DatasetSpec("digits", 3, 2, "mlp-bn"),
                     regime="full", pretrain="none", training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1))
    tasks = split_tasks(load_dataset("digits"), spec.class_order, 3, 2, "class-il")
    by_hand = []
    rec = run_one(spec, device="cpu", method_files=(str(path),),
                  observer=lambda event, t, s: by_hand.append(_task_aware_by_hand(s.model, tasks[t], 2))
                  if event == "after_task" else None)
    assert rec.ok, rec.error
    assert rec.checks["trained_acc"] == pytest.approx(by_hand, abs=1e-12) and min(by_hand) > 0.9
    A = rec.acc_matrix_task_aware
    assert all(A[t][t] < 0.5 for t in range(3))  # negated logits: the evaluated answer is below chance
    assert rec.warnings == []  # training learned every task
    assert parse_record(rec.to_dict(), expected_run_id=rec.run_id)[1] is None


def test_a_naive_full_run_whose_features_collapse_is_flagged(tmp_path):
    """The issue's case: digits class-IL, MLP with BatchNorm, every block trained with lr 0.05 and
    momentum 0.9: the newest task sits at 0.5 within its two classes and the probe on its features
    too; chance 1/(all classes) never flagged it."""
    spec = make_spec(scenario="class-il", dataset=DatasetSpec("digits", 5, 2, "mlp-bn"), regime="full",
                     class_order=(7, 8, 1, 5, 3, 4, 2, 0, 9, 6),
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=4, batch_size=64))
    rec = run_one(spec, device="cpu")
    assert rec.ok, rec.error
    A = rec.acc_matrix_task_aware
    assert A[4][4] <= checks.chance_threshold(0.5, rec.checks["n_test"][4]) and rec.checks["probe_acc"][4] < 0.6
    assert ("chance", 4) in _codes(rec.warnings)
    assert rec.checks["task_chance"] == 0.5 and rec.checks["chance"] == 0.1
    assert A[0][0] > 0.95 and not [w for w in rec.warnings if w["task"] == 0]  # a task it learned is not flagged
    assert rec.acc_matrix[4][4] > checks.chance_threshold(0.1, rec.checks["n_test"][4])  # what the old rule saw
    assert parse_record(rec.to_dict(), expected_run_id=rec.run_id)[1] is None


def test_the_probe_fits_a_class_il_tasks_global_labels():
    from harness.run.probe import probe_accuracy
    from harness.run.streams import Task

    class Identity(torch.nn.Module):
        def features(self, x):
            return x

    g = torch.Generator().manual_seed(0)
    y = torch.tensor([4, 5] * 40)  # task 3 of 2 classes each: global labels 4 and 5
    x = torch.randn(80, 3, generator=g) + 3.0 * (y == 5).float()[:, None]
    task = Task(2, (4, 5), x[:60], y[:60], x[60:], y[60:])
    assert probe_accuracy(Identity(), task, torch.device("cpu")) == 1.0
    flipped = Task(2, (4, 5), x[:60], y[:60], x[60:], 9 - y[60:])  # 4 <-> 5: every answer a global label, wrong
    assert probe_accuracy(Identity(), flipped, torch.device("cpu")) == 0.0


def test_the_store_range_checks_the_checks_version():
    R, A = [[0.96, 0.0], [0.30, 0.50]], [[0.96, 0.50], [0.62, 0.50]]
    for version in (1, checks.CHECKS_VERSION):
        data = class_il_record(R, A, {**CHECKS, "version": version})
        assert parse_record(data, expected_run_id=data["run_id"])[1] is None
    for bad in (0, -1, "2", 1.5, True, None):
        _, problem = parse_record(class_il_record(R, A, {**CHECKS, "version": bad}))
        assert problem.kind == "corrupt" and "checks.version" in problem.reason
    # a newer cl-bench's checks: not this one's to judge, and not damaged either
    _, problem = parse_record(class_il_record(R, A, {**CHECKS, "version": checks.CHECKS_VERSION + 1}))
    assert problem.kind == "foreign" and f"checks.version {checks.CHECKS_VERSION + 1}: measured by a newer" in problem.reason


def test_a_view_says_when_two_checks_versions_measured_its_records():
    from dataclasses import replace

    from harness.execution.views import view_records

    R, A = [[0.96, 0.0], [0.30, 0.50]], [[0.96, 0.50], [0.62, 0.50]]
    record, _ = parse_record(class_il_record(R, A, {**CHECKS, "version": 2}))
    older = replace(record, spec=replace(record.spec, order=1), checks=dict(CHECKS))  # no version: version 1
    said = []
    assert len(view_records([record, older], log=said.append)) == 2
    assert any("2 implementations of the learning checks (version 1: 1 runs, version 2: 1 runs)" in s
               for s in said)
    said.clear()
    view_records([record], log=said.append)
    assert not any("implementations of the learning checks" in s for s in said)
    lost = replace(record, spec=replace(record.spec, order=2), checks={})  # a run whose worker died: no checks
    view_records([record, lost], log=said.append)
    assert not any("implementations of the learning checks" in s for s in said)
