"""Learning checks: did a run learn each task it trained? Pure rules over what the engine measured.

A record with a failed check carries a warning (`config.vocabulary.WARNINGS` names them) and is
*flagged*: shown everywhere, left out of rankings unless the user asks (`--include-flagged`).

Each task is judged against its own chance, on what training reached on it right after training
it (the *learned* accuracy): in task-IL R[t][t] (its head answers among the task's classes); in
class-IL the task-aware accuracy A[t][t] (argmax over the task's own classes, the run's
acc_matrix_task_aware), so collapsed features are flagged even where the class-IL accuracy of the
newest task says little (its classes win the single head's argmax either way). The class-IL
accuracy below the task-aware one is forgetting's and recency's measure, not a learning failure.

- `chance`: learned ≤ chance + max(5 points, 3 binomial standard errors of chance on the task's
  test set), chance = 1 / classes per task (task-IL: `checks["chance"]`, the head's; class-IL:
  `checks["task_chance"]`, within the task).
- `below-probe`: learned is more than 10 points below a linear probe fitted on the trained model's
  own features of task t's training data (harness/run/probe.py; within the task's classes in both
  scenarios): the features can separate the task, the trained head does not.
- `loss-flat`: the mean training loss of the task's last 10 % of iterations is ≥ 95 % of its
  first 10 % and still above half the loss of a uniform guess over the classes the loss covers:
  ln(1 / checks["chance"]) in task-IL (the head's); in class-IL ln of the classes seen once task t
  trains, (t + 1) · classes per task (the growing head's columns: harness/api/heads.py).

The checks ask whether the run learned each task. For a method that evaluates another model than
the one it trains (a merge: θ0 + λ·merge; a classifier of its own, iCaRL's nearest mean of
exemplars), the trained model's accuracy on task t is measured too (`trained_acc`: task-IL accuracy,
class-IL task-aware accuracy, on the same test set) and the better of the two is judged: a merge's
answer below its trained model is the method's answer, not a short budget, and a head that only
trains features for a classifier of the method's own is not its answer either. Elsewhere
`trained_acc` is None and the evaluated learned accuracy is used.
"""
from __future__ import annotations

import math

from ..config.vocabulary import WARNINGS, Scenario

# The implementation of the checks' measurements, recorded as `checks["version"]` (a record without it is
# version 1). Not part of the run id: the checks measure a run, they do not change what it trains (as
# continual evaluation, config/specs.py NOT_IN_RUN_ID); a record keeps the numbers of the version that
# measured it, and its warnings are those numbers' (the store re-derives them from the record).
# 1: the probe is a logistic regression (scikit-learn LogisticRegression, lbfgs, C = 1) on standardised features.
# 2: the probe is a closed-form ridge classifier (alpha 1) on the same standardised features (probe.py):
#    a fit of ~0.5 ms a task instead of ~2-5 ms; its accuracy against version 1's: docs/small-grids.md.
CHECKS_VERSION = 2

CHANCE_MARGIN = 0.05
CHANCE_SIGMAS = 3.0
PROBE_GAP = 0.10
WINDOW = 0.10
LOSS_FELL = 0.95
LOSS_LEARNED = 0.5


def head_outputs(scenario: Scenario, n_tasks: int, classes_per_task: int) -> int:
    """How many classes the answering head chooses among."""
    return classes_per_task if scenario == Scenario.TASK_IL else n_tasks * classes_per_task


def chance_threshold(chance: float, n_test: int) -> float:
    """The accuracy at or below which a trained task counts as at chance."""
    se = math.sqrt(chance * (1 - chance) / max(int(n_test), 1))
    return chance + max(CHANCE_MARGIN, CHANCE_SIGMAS * se)


def loss_windows(losses) -> tuple[float, float] | None:
    """(mean of the first 10 %, mean of the last 10 %) of a task's iteration losses (≥ 1 each)."""
    losses = [float(x) for x in losses]
    if not losses:
        return None
    k = max(1, int(len(losses) * WINDOW))
    return sum(losses[:k]) / k, sum(losses[-k:]) / k


def _warning(code: str, task: int, detail: str) -> dict:
    return {"code": code, "task": task, "message": f"task {task + 1}: {WARNINGS[code]} ({detail})"}


def task_warnings(t: int, learned: float, checks: dict, scenario: Scenario) -> list[dict]:
    """The warnings of task t (0-based) given what training reached on it (`learned`, see run_warnings)."""
    out = []
    class_il = scenario == Scenario.CLASS_IL
    n_test = checks["n_test"][t]
    if class_il:
        chance = checks["task_chance"]
        if learned <= chance_threshold(chance, n_test):
            out.append(_warning("chance", t, f"task-aware {learned:.3f} with chance {chance:.3f} within the task "
                                             f"on {n_test} test samples"))
    else:
        chance = checks["chance"]
        if learned <= chance_threshold(chance, n_test):
            out.append(_warning("chance", t, f"{learned:.3f} with chance {chance:.3f} on {n_test} test samples"))
    probe = _at(checks.get("probe_acc"), t)
    if probe is not None and probe - learned > PROBE_GAP:
        what = "task-aware " if class_il else ""
        out.append(_warning("below-probe", t, f"{what}{learned:.3f} against a probe's {probe:.3f}"))
    first, last = _at(checks.get("loss_first"), t), _at(checks.get("loss_last"), t)
    # A uniform guess's loss over the classes the loss covers: the head's in task-IL; in class-IL the
    # classes seen once task t trains, (t + 1) / task_chance (the growing head's columns).
    outputs = (t + 1) / checks["task_chance"] if class_il else 1 / checks["chance"]
    scale = math.log(outputs) if outputs > 0 else 0.0
    if first is not None and last is not None and last >= LOSS_FELL * first and last > LOSS_LEARNED * scale:
        out.append(_warning("loss-flat", t, f"loss {first:.3f} at the start, {last:.3f} at the end"))
    return out


def _at(values, t):
    return values[t] if values is not None and t < len(values) else None


def run_warnings(acc_matrix, checks: dict, scenario: Scenario, acc_matrix_task_aware=None) -> list[dict]:
    """Every warning of a run, task by task, from its accuracy matrices and its measured checks.

    `acc_matrix_task_aware`: a class-IL run's task-aware matrix (row for row with acc_matrix), whose
    diagonal the class-IL checks judge; ignored in task-IL. ValueError when a class-IL run with
    checks comes without it, or its checks without `task_chance`.
    """
    if not checks or "chance" not in checks:
        return []
    n_tasks = len(checks.get("n_test", []))
    if scenario == Scenario.CLASS_IL:
        if acc_matrix_task_aware is None or len(acc_matrix_task_aware) != len(acc_matrix):
            raise ValueError("class-IL learning checks judge the task-aware matrix, row for row with acc_matrix")
        if "task_chance" not in checks:
            raise ValueError("class-IL learning checks need the within-task chance (checks.task_chance)")
        judged = acc_matrix_task_aware
    else:
        judged = acc_matrix
    return [w for t, row in enumerate(judged) if t < len(row) and t < n_tasks
            for w in task_warnings(t, _learned(t, row, checks), checks, scenario)]


def _learned(t: int, row, checks: dict) -> float:
    """What the run reached on task t: the judged row's accuracy (R[t][t] in task-IL, the task-aware A[t][t]
    in class-IL), or, where another model than the trained one is evaluated, the better of the two models'
    (a merge answers below the model it trained; a classifier of the method's own, iCaRL's nearest mean
    of exemplars, above a head it only trains features with): a task counts as learned when either does."""
    trained = _at(checks.get("trained_acc"), t)
    return float(row[t]) if trained is None else max(float(trained), float(row[t]))
