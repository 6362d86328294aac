"""The metric table: every per-run summary metric of cl-bench, defined once.

A run's metrics follow from its accuracy matrix R and initial row b:
R[i][j] = accuracy on task j's test set after training task i (i, j = 1..T), measured on
*all* tasks after every task (future tasks too); b_j = accuracy on task j before training
task 1. Task-incremental runs use each task's own head. Every definition is taken from the
literature it names; the identity ACC = LA + ((T-1)/T) * BWT holds for any square R.

`METRICS` (name -> Metric) is what the engine records, the store recomputes on read, the
analysis aggregates and the report, figures, site and export label. Order matters: it is the
order of the keys in a record's `metrics`. Values are accuracies (fractions of 1); pages show
them in percent (points, for differences).

`ANYTIME` (name -> Metric) is the second table: the any-time metrics of a run with a continual-
evaluation curve (record field `curve`), computed from it (harness.config.anytime; spec, choices
and sources: docs/metrics-anytime.md). Same `Metric` type; their `function` takes the `Curve` and
the WF window. They are not stored in a record's `metrics`: the analysis computes them on read
from the verified curve (NaN for a run without one).

numpy is imported when a metric is computed, not when this module is: the CLI's parser reads
the table's names, and `cl-bench --help` stays numpy-free.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import anytime


def acc(R, init) -> float:
    """ACC, final average accuracy: (1/T) sum_j R[T][j]."""
    import numpy as np

    return float(np.mean(R[-1]))


def la(R, init) -> float:
    """LA, learning accuracy (plasticity; Riemer et al. 2019): (1/T) sum_j R[j][j]."""
    import numpy as np

    return float(np.mean(np.diag(R)))


def bwt(R, init) -> float:
    """BWT, backward transfer (Lopez-Paz & Ranzato 2017): (1/(T-1)) sum_{j<T} (R[T][j] - R[j][j]); 0 for T = 1."""
    import numpy as np

    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[-1, j] - R[j, j] for j in range(T - 1)]))


def forgetting(R, init) -> float:
    """Forgetting (Chaudhry et al. 2018): (1/(T-1)) sum_{j<T} [max_{j<=l<T} R[l][j] - R[T][j]]; 0 for T = 1.

    Max-based, not Avalanche's last-minus-initial forgetting.
    """
    import numpy as np

    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[j:T - 1, j].max() - R[-1, j] for j in range(T - 1)]))


def fwt(R, init) -> float:
    """FWT, forward transfer (Lopez-Paz & Ranzato 2017): (1/(T-1)) sum_{j>=2} (R[j-1][j] - b_j); 0 for T = 1."""
    import numpy as np

    T = len(R)
    if T < 2:
        return 0.0
    return float(np.mean([R[j - 1, j] - init[j] for j in range(1, T)]))


def aia(R, init) -> float:
    """AIA, average incremental accuracy (Rebuffi et al. 2017): (1/T) sum_k (1/k) sum_{j<=k} R[k][j]."""
    import numpy as np

    return float(np.mean([np.mean(R[k, :k + 1]) for k in range(len(R))]))


@dataclass(frozen=True)
class Metric:
    """One summary metric: its record key, how pages label it, its display unit, which way is
    better, how it follows from (R, b) as numpy arrays, and what it measures."""

    name: str
    label: str
    unit: str
    higher_is_better: bool
    function: Callable[..., float]
    description: str


METRICS = {m.name: m for m in (
    Metric("acc", "ACC", "%", True, acc, "final average accuracy over all tasks"),
    Metric("la", "LA", "%", True, la, "learning accuracy: each task's accuracy right after training it"),
    Metric("bwt", "BWT", "%", True, bwt, "backward transfer: final minus just-learned accuracy of earlier tasks"),
    Metric("forgetting", "Forgetting", "%", False, forgetting,
           "forgetting: best earlier minus final accuracy of earlier tasks (Chaudhry et al. 2018)"),
    Metric("fwt", "FWT", "%", True, fwt, "forward transfer: accuracy on a task before training it, minus at init"),
    Metric("aia", "AIA", "%", True, aia, "average incremental accuracy over the tasks seen after each task"),
)}
METRIC_NAMES = tuple(METRICS)


def all_metrics(acc_matrix, init_acc) -> dict:
    """Every metric of the table for a complete T x T accuracy matrix and its initial row, in table order."""
    import numpy as np

    R = np.asarray(acc_matrix, dtype=float)
    b = np.asarray(init_acc, dtype=float)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise ValueError(f"accuracy matrix must be square, got shape {R.shape}")
    return {m.name: m.function(R, b) for m in METRICS.values()}


def step_forgetting(R) -> list:
    """Per-step forgetting f_t = mean_{j<t} (R[t-1][j] - R[t][j]) for t >= 2, None for t = 1.

    A series recorded with the update norms (to set against u_t), not a summary metric.
    """
    import numpy as np

    R = np.asarray(R, dtype=float)
    return [None] + [float(np.mean(R[t - 1, :t] - R[t, :t])) for t in range(1, len(R))]


# ---------------------------------------------------------------- any-time metrics (second table)
# Each takes the run's Curve and the WF window (steps); None where the curve cannot give a value.

def min_acc(curve, window: int) -> float | None:
    """min-ACC at the end of the curve, averaged over the old tasks (De Lange et al. 2023)."""
    return anytime.min_acc_mean(curve)


def wc_acc(curve, window: int) -> float | None:
    """WC-ACC at the end of the curve (De Lange et al. 2023)."""
    return anytime.wc_acc(curve)


def a_auc(curve, window: int) -> float | None:
    """A_AUC: area under the seen-tasks accuracy over steps, over the step span (Koh et al. 2022)."""
    return anytime.a_auc(curve)


def gap_depth(curve, window: int) -> float | None:
    """Mean stability-gap depth (pre-task minus in-task minimum) over the (boundary, old task) gaps."""
    return anytime.summary(curve, window)["gap_depth"]


def gap_recovery(curve, window: int) -> float | None:
    """Mean steps from a task's start until an old task regains its pre-task accuracy (recovered gaps)."""
    return anytime.summary(curve, window)["gap_recovery"]


def wf(curve, window: int) -> float | None:
    """WF^(window): windowed forgetting, averaged over the seen tasks (De Lange et al. 2023)."""
    return anytime.windowed_forgetting_mean(curve, window)


def gap_unrecovered(curve, window: int) -> float | None:
    """How many (boundary, old task) gaps never regained the pre-task accuracy during the new task."""
    return float(anytime.summary(curve, window)["gap_unrecovered"])


_DL23 = "De Lange, van de Ven & Tuytelaars, ICLR 2023"
ANYTIME = {m.name: m for m in (
    Metric("min_acc", "min-ACC", "%", True, min_acc,
           f"lowest accuracy of each old task after it was learned, averaged over old tasks ({_DL23})"),
    Metric("wc_acc", "WC-ACC", "%", True, wc_acc,
           f"worst-case accuracy: current task's accuracy and old tasks' min-ACC, weighted 1/k ({_DL23})"),
    Metric("a_auc", "A_AUC", "%", True, a_auc,
           "any-time average accuracy: area under the seen-tasks accuracy curve over training steps, "
           "normalised by the step span (Koh et al., ICLR 2022)"),
    Metric("gap_depth", "gap depth", "%", False, gap_depth,
           f"stability gap: drop of an old task's accuracy from before a new task to its minimum during it, "
           f"mean over task boundaries and old tasks (cl-bench's measure of the gap of {_DL23})"),
    Metric("gap_recovery", "gap recovery", "steps", False, gap_recovery,
           "optimizer steps from a task's start until an old task is back within tolerance of its pre-task "
           "accuracy, mean over the gaps that recovered (cl-bench)"),
    Metric("wf", "WF", "%", False, wf,
           f"windowed forgetting: largest accuracy drop within a window of steps, mean over tasks ({_DL23})"),
    Metric("gap_unrecovered", "unrecovered gaps", "count", False, gap_unrecovered,
           "how many (task boundary, old task) gaps never regained the pre-task accuracy during the new task"),
)}
ANYTIME_NAMES = tuple(ANYTIME)
ALL_METRICS = {**METRICS, **ANYTIME}
"""Both tables by name: what the report and figures can show."""


def all_anytime(curve, window: int, tol: float = anytime.RECOVERY_TOL) -> dict:
    """Every any-time metric of a Curve, in ANYTIME order (None where undefined); one pass over the gaps."""
    s = anytime.summary(curve, window, tol)
    return {name: s[name] for name in ANYTIME_NAMES}


def anytime_of_record(curve: dict, accuracy: str = "acc") -> dict:
    """Every any-time metric of a record's `curve` field (`accuracy`: "acc", the main accuracy, or in
    class-IL "acc_task_aware"), with cl-bench's choices: WF window = every + 1 (anytime.window_of), gap
    tolerance one test example of the smallest subset, at least anytime.RECOVERY_TOL (anytime.tolerance_of)."""
    return all_anytime(anytime.curve_from_record(curve, accuracy), anytime.window_of(curve["every"]),
                       anytime.tolerance_of(curve))
