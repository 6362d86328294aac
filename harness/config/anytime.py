"""Any-time metrics over a continual-evaluation curve: min-ACC, WC-ACC, the stability gap, A_AUC, WF.

The accuracy matrix looks at the model only between tasks. A *continual-evaluation curve*
looks at it during training too (De Lange, van de Ven & Tuytelaars, "Continual evaluation for
lifelong learning: identifying the stability gap", ICLR 2023, arXiv:2205.13452; official code
Mattdl/ContinualEvaluation, src/eval/continual_eval_metrics.py). This module is the pure part:
a `Curve` and the metrics that follow from it. Plain Python, no numpy and no torch, so the
record store, the analysis and the CLI can use it without loading either.

Step convention: `steps[p]` is the number of optimizer updates made before evaluation point p
(global over the run), so the model at step s is the one after s updates. Task k's updates are
steps start_k + 1 .. end_k (`bounds[k] = (start_k, end_k)`); a point at step start_k sees the
model before task k's first update. `training[p]` is the task that was training at point p; a
point of task k has start_k <= steps[p] <= end_k (it resolves a step shared by two tasks).
Tasks are 0-based here; the spec (docs/metrics-anytime.md) writes them 1-based like the paper.

Missing values: `acc[p][j]` is None or NaN where task j was not evaluated at point p (unseen
tasks, a skipped evaluation). Values of tasks not yet seen at a point (j > training[p]) are
ignored. Each metric below says what a missing value does to it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

RECOVERY_TOL = 0.01
"""Default tolerance of the stability gap's recovery: one accuracy point (the accuracy counts as
regained at >= pre - 0.01). Records use tolerance_of(curve): at least this, and one test example of
the curve's smallest evaluation subset."""


_SLACK = 1e-9  # float noise: pre - tol is compared with this much slack (0.9 - 0.01 < 0.89 in floats)


def _value(x) -> float | None:
    """A finite float, or None for None/NaN."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Curve:
    """A continual-evaluation curve: P evaluation points over T tasks.

    steps: P non-decreasing global optimizer-step counts, one per evaluation point.
    training: P task indices, non-decreasing: the task training at each point.
    bounds: T pairs (start_k, end_k), start_k <= end_k <= start_{k+1}: task k's updates are
        steps start_k + 1 .. end_k.
    acc: P rows of T accuracies (fractions of 1); None/NaN where not evaluated.
    """

    steps: tuple
    training: tuple
    bounds: tuple
    acc: tuple

    def __post_init__(self):
        steps = tuple(int(s) for s in self.steps)
        training = tuple(int(k) for k in self.training)
        bounds = tuple((int(a), int(b)) for a, b in self.bounds)
        acc = tuple(tuple(_value(x) for x in row) for row in self.acc)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "training", training)
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "acc", acc)
        T, P = len(bounds), len(steps)
        if T == 0:
            raise ValueError("curve: bounds is empty; a curve needs at least one task")
        if P == 0:
            raise ValueError("curve: no evaluation points")
        if len(training) != P or len(acc) != P:
            raise ValueError(f"curve: steps, training and acc must have one entry per point, "
                             f"got {P}, {len(training)} and {len(acc)}")
        for k, (a, b) in enumerate(bounds):
            if a > b:
                raise ValueError(f"curve: task {k} starts at step {a} after it ends at step {b}")
            if k and a < bounds[k - 1][1]:
                raise ValueError(f"curve: task {k} starts at step {a} before task {k - 1} ends "
                                 f"at step {bounds[k - 1][1]}")
        for p in range(P):
            k, s = training[p], steps[p]
            if p and (s < steps[p - 1] or k < training[p - 1]):
                raise ValueError(f"curve: point {p} (step {s}, task {k}) goes back in time "
                                 f"after point {p - 1} (step {steps[p - 1]}, task {training[p - 1]})")
            if not 0 <= k < T:
                raise ValueError(f"curve: point {p} names task {k}; tasks are 0..{T - 1}")
            if not bounds[k][0] <= s <= bounds[k][1]:
                raise ValueError(f"curve: point {p} at step {s} is outside task {k}'s steps "
                                 f"{bounds[k][0]}..{bounds[k][1]}")
            if len(acc[p]) != T:
                raise ValueError(f"curve: point {p} has {len(acc[p])} accuracies, expected one per task ({T})")
            bad = [x for x in acc[p] if x is not None and not 0.0 <= x <= 1.0]
            if bad:
                raise ValueError(f"curve: point {p} has accuracy {bad[0]!r}; accuracies are fractions in [0, 1]")

    @property
    def n_tasks(self) -> int:
        return len(self.bounds)

    def value(self, p: int, j: int) -> float | None:
        """Accuracy on task j at point p, or None if missing or task j is not yet seen there."""
        return self.acc[p][j] if j <= self.training[p] else None


def _last(curve: Curve, upto: int | None) -> int:
    last = len(curve.steps) - 1 if upto is None else upto
    if not 0 <= last < len(curve.steps):
        raise ValueError(f"curve: no evaluation point {upto}; the curve has {len(curve.steps)}")
    return last


def _mean(values) -> float | None:
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def min_acc(curve: Curve, upto: int | None = None) -> dict:
    """min-ACC per old task at point t = `upto` (default: the last point): {i: min or None}.

    Old tasks are i < training[t]. For each, the minimum accuracy over the points n <= t with
    steps[n] > end_i, i.e. after task i's last update (De Lange et al.: min over
    |T_<=i| < n <= t). Missing values are skipped; None if task i has no value there.
    """
    t = _last(curve, upto)
    out = {}
    for i in range(curve.training[t]):
        end = curve.bounds[i][1]
        vals = [v for n in range(t + 1) if curve.steps[n] > end and (v := curve.value(n, i)) is not None]
        out[i] = min(vals) if vals else None
    return out


def min_acc_mean(curve: Curve, upto: int | None = None) -> float | None:
    """min-ACC averaged over the old tasks at point t: (1/(k-1)) sum_{i<k} min-ACC_i.

    None if there is no old task (one task) or any old task's min-ACC is None: a missing task
    would silently change the denominator.
    """
    return _mean(min_acc(curve, upto).values())


def wc_acc_at(curve: Curve, t: int) -> float | None:
    """WC-ACC at point t (De Lange et al.): (1/k) A(current task, t) + (1 - 1/k) min-ACC_t.

    k = training[t] + 1 is the number of tasks seen so far. For k = 1 it is the current
    task's accuracy. None if the current task's value or (k > 1) min-ACC_t is missing.
    """
    t = _last(curve, t)
    cur = curve.training[t]
    a = curve.value(t, cur)
    if a is None:
        return None
    k = cur + 1
    if k == 1:
        return a
    m = min_acc_mean(curve, t)
    return None if m is None else a / k + (1 - 1 / k) * m


def wc_acc_curve(curve: Curve) -> list:
    """WC-ACC at every evaluation point (None where undefined)."""
    return [wc_acc_at(curve, t) for t in range(len(curve.steps))]


def wc_acc(curve: Curve) -> float | None:
    """WC-ACC at the last evaluation point: the run's summary value (what the paper reports)."""
    return wc_acc_at(curve, len(curve.steps) - 1)


def wc_acc_at_task_ends(curve: Curve) -> list:
    """WC-ACC at the last evaluation point of each task's training (None if a task has none)."""
    last = {}
    for p, k in enumerate(curve.training):
        last[k] = p
    return [wc_acc_at(curve, last[k]) if k in last else None for k in range(curve.n_tasks)]


@dataclass(frozen=True)
class Gap:
    """The stability gap of old task `old` when task `task` starts.

    pre: accuracy on `old` at the last point with step <= start of `task`.
    minimum / min_step: the lowest accuracy on `old` at the points of `task` after its start,
        and the step of its first occurrence.
    depth: pre - minimum (signed: negative when the accuracy only rose).
    recovery: steps from the start of `task` to the first point at or after min_step whose
        accuracy is >= pre - tol (up to 1e-9 of float noise), within `task`'s training; 0 if the minimum is already
        >= pre - tol; None if never regained during `task`.
    Fields are None where the values they need are missing.
    """

    task: int
    old: int
    pre: float | None
    minimum: float | None
    min_step: int | None
    depth: float | None
    recovery: int | None


def stability_gaps(curve: Curve, tol: float = RECOVERY_TOL) -> list:
    """One Gap per task boundary k >= 1 (with points of task k) and old task j < k, in (k, j) order."""
    if tol < 0:
        raise ValueError(f"stability gap: tol must be >= 0, got {tol}")
    gaps = []
    for k in sorted(set(curve.training)):
        if k == 0:
            continue
        start = curve.bounds[k][0]
        before = [p for p in range(len(curve.steps)) if curve.steps[p] <= start]
        during = [p for p in range(len(curve.steps)) if curve.training[p] == k and curve.steps[p] > start]
        for j in range(k):
            pre = curve.value(before[-1], j) if before else None
            vals = [(p, v) for p in during if (v := curve.value(p, j)) is not None]
            if not vals:
                gaps.append(Gap(k, j, pre, None, None, None, None))
                continue
            p_min, minimum = min(vals, key=lambda pv: pv[1])  # first occurrence on ties
            if pre is None:
                gaps.append(Gap(k, j, None, minimum, curve.steps[p_min], None, None))
                continue
            floor = pre - tol - _SLACK
            if minimum >= floor:
                recovery = 0
            else:
                back = [p for p, v in vals if p >= p_min and v >= floor]
                recovery = curve.steps[back[0]] - start if back else None
            gaps.append(Gap(k, j, pre, minimum, curve.steps[p_min], pre - minimum, recovery))
    return gaps


def anytime_accuracy(curve: Curve) -> list:
    """(step, mean accuracy over the seen tasks 0..training[p]) per point; the mean is None if
    any seen task's value is missing there."""
    return [(curve.steps[p], _mean(curve.value(p, j) for j in range(curve.training[p] + 1)))
            for p in range(len(curve.steps))]


def a_auc(curve: Curve) -> float | None:
    """A_AUC, any-time average accuracy: trapezoid area under the seen-tasks mean accuracy over
    the steps, divided by the step span (first to last kept point).

    Points whose mean is None are dropped (the curve is interpolated across them). One kept
    point, or all at one step: the mean of their values. No kept point: None.
    """
    pts = [(s, a) for s, a in anytime_accuracy(curve) if a is not None]
    if not pts:
        return None
    span = pts[-1][0] - pts[0][0]
    if span == 0:
        return sum(a for _, a in pts) / len(pts)
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))
    return area / span


def windowed_forgetting(curve: Curve, window: int) -> dict:
    """WF^(w) per task: {j: value or None}, the largest drop A(j, m) - A(j, n) over points m < n
    that both lie in one window of w consecutive steps (steps[n] - steps[m] <= w - 1), maximised
    over the whole curve while task j is seen; 0 if it never drops (De Lange et al.'s
    Delta^{w,-}, maximised over t, as their code does). None if task j has no value at all.
    """
    if int(window) != window or window < 1:
        raise ValueError(f"windowed forgetting: the window is a whole number of steps >= 1, got {window!r}")
    out = {}
    for j in range(curve.training[-1] + 1):
        series = [(curve.steps[p], v) for p in range(len(curve.steps)) if (v := curve.value(p, j)) is not None]
        if not series:
            out[j] = None
            continue
        worst = 0.0
        for n, (sn, vn) in enumerate(series):
            m = n - 1
            while m >= 0 and sn - series[m][0] <= window - 1:
                worst = max(worst, series[m][1] - vn)
                m -= 1
        out[j] = worst
    return out


def windowed_forgetting_mean(curve: Curve, window: int) -> float | None:
    """WF^(w) averaged over every task seen by the end of the curve (None if any is None)."""
    return _mean(windowed_forgetting(curve, window).values())


def summary(curve: Curve, window: int, tol: float = RECOVERY_TOL) -> dict:
    """The scalar any-time metrics of one run, as a record would carry them.

    min_acc, wc_acc, a_auc, wf: as above, at the end of the curve. gap_depth: mean depth over
    the gaps with a depth; gap_recovery: mean recovery (steps) over the gaps that recovered;
    gap_unrecovered: how many gaps with a depth never recovered.
    """
    gaps = [g for g in stability_gaps(curve, tol) if g.depth is not None]
    recovered = [g.recovery for g in gaps if g.recovery is not None]
    return {
        "min_acc": min_acc_mean(curve),
        "wc_acc": wc_acc(curve),
        "gap_depth": sum(g.depth for g in gaps) / len(gaps) if gaps else None,
        "gap_recovery": sum(recovered) / len(recovered) if recovered else None,
        "gap_unrecovered": len(gaps) - len(recovered),
        "a_auc": a_auc(curve),
        "wf": windowed_forgetting_mean(curve, window),
    }


def window_of(every: int) -> int:
    """The WF window (in optimizer steps) cl-bench uses for a curve evaluated every `every` steps:
    every + 1, the smallest window that pairs neighbouring points (the spec asks w >= every + 1;
    with per-step evaluation it is De Lange et al.'s shortest, WF^2; at every = 10 it is the
    closest to their WF^10). WF is then the largest drop between two neighbouring points."""
    if isinstance(every, bool) or int(every) != every or every < 1:
        raise ValueError(f"curve: every is a whole number of steps >= 1, got {every!r}")
    return int(every) + 1


def curve_from_record(curve: dict, accuracy: str = "acc", keep_shadowed: bool = False) -> Curve:
    """The `Curve` of a record's `curve` field (RunRecord; format: docs/metrics-anytime.md).

    The record's points carry global cumulative optimizer steps (`steps`), the task training at
    each (`task`, 0-based) and `end` (the task's end point: the evaluated model, at its last step).
    Task k's bounds are (end step of task k-1, or 0; end step of task k). A task whose end point is
    missing (a run that failed during it) ends at its last point; a task with no point at all (never
    trained) gets the empty bounds (previous end, previous end). `accuracy`: the record key of the
    per-point accuracies, "acc" (the main accuracy; class-IL accuracy in class-IL) or, in class-IL,
    "acc_task_aware".

    A point taken during training at its task's last step is *shadowed* by the task's end point at
    the same step: both see the same training, the end point the method's output. It is dropped
    (`keep_shadowed=False`), so a step has one value per task and the metrics never read the jump
    between the trained network and the method's output (BECAME, iCaRL, NCM, BiC) as forgetting or a
    minimum; the merges' "now" model equals their end point there anyway. Charts keep it.
    """
    try:
        steps, tasks, ends, acc = curve["steps"], curve["task"], curve["end"], curve[accuracy]
    except (KeyError, TypeError):
        raise ValueError(f"curve: not a record's curve with steps, task, end and {accuracy}") from None
    if not (len(steps) == len(tasks) == len(ends) == len(acc)):
        raise ValueError("curve: steps, task, end and acc must have one entry per point")
    T = max((len(row) for row in acc), default=0)
    last, end_step = {}, {}
    for s, k, e in zip(steps, tasks, ends):
        last[int(k)] = int(s)
        if e:
            end_step[int(k)] = int(s)
    bounds, prev = [], 0
    for k in range(T):
        end = end_step.get(k, last.get(k, prev))
        bounds.append((prev, end))
        prev = end
    kept = [p for p, (s, k, e) in enumerate(zip(steps, tasks, ends))
            if keep_shadowed or e or end_step.get(int(k)) != int(s)]
    return Curve(steps=tuple(steps[p] for p in kept), training=tuple(tasks[p] for p in kept),
                 bounds=tuple(bounds), acc=tuple(tuple(acc[p]) for p in kept))


def tolerance_of(curve: dict) -> float:
    """The recovery tolerance for a record's curve: one test example of its smallest evaluation
    subset (1 / min n_rows), and at least RECOVERY_TOL. With 88-91 rows per digits task one example
    is 1.1 points, so a fixed 0.01 would call a gap that ends one example short 'never recovered' on
    digits but 'recovered' on 100-row subsets; per record, both read 'back to within one example'."""
    rows = [int(n) for n in curve.get("n_rows") or [] if isinstance(n, (int, float)) and n > 0]
    return max(RECOVERY_TOL, 1.0 / min(rows)) if rows else RECOVERY_TOL
