"""Learning checks: did a run learn each task it trained? Pure rules over what the engine measured.

A record with a failed check carries a warning (`config.vocabulary.WARNINGS` names them) and is
*flagged*: shown everywhere, left out of rankings unless the user asks (`--include-flagged`).

- `chance`: R[t][t] ≤ chance + max(5 points, 3 binomial standard errors of chance on the task's
  test set), chance = 1 / (outputs of the head that answers: classes per task in task-IL, all
  classes in class-IL).
- `below-probe` (task-IL): R[t][t] is more than 10 points below a logistic-regression probe fitted
  on the trained model's own features of task t's training data (harness/run/probe.py): the
  features can separate the task, the trained head does not.

The checks ask whether *training* learned each task. For a method that evaluates another model
than the one it trains (a merge: θ0 + λ·merge), R[t][t] is the method's answer, not a sign of a
short budget: the checks then use the trained model's accuracy on task t (`trained_acc`, task-IL),
measured on the same test set. Elsewhere `trained_acc` is None and R[t][t] is used.
- `loss-flat`: the mean training loss of the task's last 10 % of iterations is ≥ 95 % of its
  first 10 % and still above half the loss of a uniform guess, ln(outputs).
"""
from __future__ import annotations

import math

from ..config.vocabulary import WARNINGS, Scenario

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
    """The warnings of task t (0-based) given its accuracy right after training it."""
    out = []
    chance, n_test = checks["chance"], checks["n_test"][t]
    if learned <= chance_threshold(chance, n_test):
        out.append(_warning("chance", t, f"{learned:.3f} with chance {chance:.3f} on {n_test} test samples"))
    probe = _at(checks.get("probe_acc"), t)
    if scenario == Scenario.TASK_IL and probe is not None and probe - learned > PROBE_GAP:
        out.append(_warning("below-probe", t, f"{learned:.3f} against a probe's {probe:.3f}"))
    first, last = _at(checks.get("loss_first"), t), _at(checks.get("loss_last"), t)
    scale = math.log(1 / chance) if chance > 0 else 0.0
    if first is not None and last is not None and last >= LOSS_FELL * first and last > LOSS_LEARNED * scale:
        out.append(_warning("loss-flat", t, f"loss {first:.3f} at the start, {last:.3f} at the end"))
    return out


def _at(values, t):
    return values[t] if values is not None and t < len(values) else None


def run_warnings(acc_matrix, checks: dict, scenario: Scenario) -> list[dict]:
    """Every warning of a run, task by task, from its accuracy matrix and its measured checks."""
    if not checks or "chance" not in checks:
        return []
    return [w for t, row in enumerate(acc_matrix) if t < len(row) and t < len(checks.get("n_test", []))
            for w in task_warnings(t, _learned(t, row, checks), checks, scenario)]


def _learned(t: int, row, checks: dict) -> float:
    """What training reached on task t: the trained model's accuracy where a merge is evaluated, else R[t][t]."""
    trained = _at(checks.get("trained_acc"), t)
    return float(trained) if trained is not None else float(row[t])
