"""Any-time metrics (harness.config.anytime) on constructed curves: hand-computed numbers, edge
cases, properties, and a re-statement of the official code's incremental bookkeeping
(Mattdl/ContinualEvaluation, src/eval/continual_eval_metrics.py) as an independent route."""
import math
import random
import subprocess
import sys
from collections import deque

import pytest

from harness.config.anytime import (
    Curve,
    Gap,
    a_auc,
    anytime_accuracy,
    min_acc,
    min_acc_mean,
    stability_gaps,
    summary,
    wc_acc,
    wc_acc_at_task_ends,
    wc_acc_curve,
    windowed_forgetting,
    windowed_forgetting_mean,
)

N = None
# Three tasks of 4 updates each: task k's updates are steps 4k+1 .. 4k+4. Evaluated every 2 steps;
# the boundary points (steps 4 and 8) belong to the task that just ended.
HAND = Curve(
    steps=(0, 2, 4, 6, 8, 10, 12),
    training=(0, 0, 0, 1, 1, 2, 2),
    bounds=((0, 4), (4, 8), (8, 12)),
    acc=((0.1, N, N),
         (0.6, N, N),
         (0.9, N, N),
         (0.5, 0.6, N),
         (0.8, 0.9, N),
         (0.4, 0.3, 0.7),
         (0.8, 0.89, 0.9)),
)


def test_min_acc_by_hand():
    # task 0, points after step 4: 0.5, 0.8, 0.4, 0.8 -> 0.4; task 1, after step 8: 0.3, 0.89 -> 0.3
    assert min_acc(HAND) == pytest.approx({0: 0.4, 1: 0.3})
    assert min_acc_mean(HAND) == pytest.approx((0.4 + 0.3) / 2)
    # at step 6 (point 3) only task 0 is old and only step 6 is after its end: 0.5
    assert min_acc(HAND, 3) == pytest.approx({0: 0.5})
    assert min_acc(HAND, 2) == {}  # still on task 0: no old task


def test_wc_acc_by_hand():
    # k = 1 at steps 0..4: the current task's accuracy, 0.1, 0.6, 0.9.
    # step 6: 1/2 * 0.6 + 1/2 * min(0.5) = 0.55;  step 8: 1/2 * 0.9 + 1/2 * min(0.5, 0.8) = 0.70
    # step 10: 1/3 * 0.7 + 2/3 * mean(0.4, 0.3) = 0.23333 + 0.23333 = 0.46667
    # step 12: 1/3 * 0.9 + 2/3 * mean(0.4, 0.3) = 0.3 + 0.23333 = 0.53333
    expected = [0.1, 0.6, 0.9, 0.55, 0.70, 0.7 / 3 + 2 / 3 * 0.35, 0.9 / 3 + 2 / 3 * 0.35]
    assert wc_acc_curve(HAND) == pytest.approx(expected)
    assert wc_acc(HAND) == pytest.approx(0.533333, abs=1e-6)
    assert wc_acc_at_task_ends(HAND) == pytest.approx([0.9, 0.70, 0.533333], abs=1e-6)


def test_stability_gaps_by_hand():
    # tol 0.02: regained means >= pre - 0.02.
    # task 1 starts at step 4, pre = step 4. Task 0: 0.9 -> min 0.5 at step 6 -> depth 0.4; then 0.8 < 0.88: never.
    # task 2 starts at step 8, pre = step 8. Task 0: 0.8 -> min 0.4 at step 10 -> depth 0.4; 0.8 >= 0.78 at
    # step 12: recovery 12 - 8 = 4. Task 1: 0.9 -> min 0.3 at step 10 -> depth 0.6; 0.89 >= 0.88 at step 12: 4.
    gaps = stability_gaps(HAND, tol=0.02)
    assert [(g.task, g.old) for g in gaps] == [(1, 0), (2, 0), (2, 1)]
    for g, (pre, mn, ms, depth, rec) in zip(gaps, [(0.9, 0.5, 6, 0.4, None), (0.8, 0.4, 10, 0.4, 4),
                                                   (0.9, 0.3, 10, 0.6, 4)]):
        assert (g.pre, g.minimum, g.depth) == pytest.approx((pre, mn, depth))
        assert (g.min_step, g.recovery) == (ms, rec)
    # the default tolerance (0.01) regains task 1 exactly at 0.89 (0.9 - 0.01, compared with 1e-9 of float
    # slack); a tolerance of 0.005 asks for 0.895 and task 1 never gets there
    assert [g.recovery for g in stability_gaps(HAND)] == [None, 4, 4]
    assert [g.recovery for g in stability_gaps(HAND, tol=0.005)] == [None, 4, None]
    # a tolerance of 0.1 regains task 0 after task 1's start at step 8 (0.8 >= 0.8): 8 - 4 = 4
    assert stability_gaps(HAND, tol=0.1)[0].recovery == 4


def test_a_auc_by_hand():
    # seen-task means: 0.1, 0.6, 0.9, (0.5+0.6)/2 = 0.55, (0.8+0.9)/2 = 0.85, 1.4/3, 2.59/3.
    means = [0.1, 0.6, 0.9, 0.55, 0.85, 1.4 / 3, 2.59 / 3]
    assert [a for _, a in anytime_accuracy(HAND)] == pytest.approx(means)
    # trapezoids of width 2: 2 * (a + b) / 2 = a + b; pair sums 0.7 + 1.5 + 1.45 + 1.4 + (0.85 + 1.4/3)
    # + (1.4/3 + 2.59/3) = 7.696667; over the span 12: 0.641389
    assert a_auc(HAND) == pytest.approx(7.696667 / 12, abs=1e-6)


def test_windowed_forgetting_by_hand():
    # w = 3: pairs at most 2 steps apart (neighbours). Task 0 drops 0.9 -> 0.5 and 0.8 -> 0.4: 0.4.
    # Task 1: 0.9 -> 0.3: 0.6. Task 2 only rises: 0.
    assert windowed_forgetting(HAND, 3) == pytest.approx({0: 0.4, 1: 0.6, 2: 0.0})
    assert windowed_forgetting_mean(HAND, 3) == pytest.approx(1.0 / 3)
    # w = 7: pairs at most 6 steps apart: task 0 also sees step 4 -> step 10, 0.9 - 0.4 = 0.5
    assert windowed_forgetting(HAND, 7) == pytest.approx({0: 0.5, 1: 0.6, 2: 0.0})
    assert windowed_forgetting_mean(HAND, 7) == pytest.approx(1.1 / 3)
    assert windowed_forgetting_mean(HAND, 1) == 0.0  # no two points within one step


def test_summary_by_hand():
    s = summary(HAND, window=3, tol=0.02)
    assert s == pytest.approx({"min_acc": 0.35, "wc_acc": 0.9 / 3 + 2 / 3 * 0.35, "gap_depth": (0.4 + 0.4 + 0.6) / 3,
                               "gap_recovery": 4.0, "gap_unrecovered": 1, "a_auc": 7.696667 / 12,
                               "wf": 1.0 / 3}, abs=1e-6)


# --- edge cases ------------------------------------------------------------------------------------------

def test_one_task_has_no_old_tasks():
    c = Curve(steps=(0, 1, 2), training=(0, 0, 0), bounds=((0, 2),), acc=((0.2,), (0.5,), (0.7,)))
    assert min_acc(c) == {} and min_acc_mean(c) is None
    assert wc_acc(c) == pytest.approx(0.7)  # k = 1: the task's own accuracy
    assert stability_gaps(c) == []
    assert a_auc(c) == pytest.approx(((0.2 + 0.5) / 2 + (0.5 + 0.7) / 2) / 2)
    assert windowed_forgetting(c, 10) == {0: 0.0}
    s = summary(c, window=10)
    assert s["gap_depth"] is None and s["gap_recovery"] is None and s["gap_unrecovered"] == 0


def test_a_task_without_points_during_its_training():
    # task 1 (steps 3..4) has no evaluation point: its boundary has no gap, min-ACC of task 0 uses task 2's points
    c = Curve(steps=(0, 2, 6), training=(0, 0, 2), bounds=((0, 2), (2, 4), (4, 6)),
              acc=((0.1, N, N), (0.9, N, N), (0.6, 0.5, 0.8)))
    assert [(g.task, g.old) for g in stability_gaps(c)] == [(2, 0), (2, 1)]
    g0, g1 = stability_gaps(c)
    # task 2 starts at step 4: the last point at or before it is step 2, where task 1 was unseen
    assert (g0.pre, g0.minimum, g0.depth, g0.recovery) == pytest.approx((0.9, 0.6, 0.3, None))
    assert g1 == Gap(task=2, old=1, pre=None, minimum=0.5, min_step=6, depth=None, recovery=None)
    assert min_acc(c) == pytest.approx({0: 0.6, 1: 0.5})


def test_a_task_never_evaluated():
    # task 1's column is empty: its min-ACC, WF and gaps are None, and the averages say so rather than
    # averaging over fewer tasks; A_AUC keeps only the points where every seen task has a value
    acc = tuple((r[0], N, r[2]) for r in HAND.acc)
    c = Curve(HAND.steps, HAND.training, HAND.bounds, acc)
    assert min_acc(c) == {0: pytest.approx(0.4), 1: None} and min_acc_mean(c) is None
    assert wc_acc(c) is None
    assert windowed_forgetting(c, 3)[1] is None and windowed_forgetting_mean(c, 3) is None
    assert [g.depth for g in stability_gaps(c) if g.old == 1] == [None]
    assert a_auc(c) == pytest.approx(((0.1 + 0.6) + (0.6 + 0.9)) / 4)  # steps 0..4 only


def test_nan_is_a_missing_value_and_is_skipped():
    # NaN at step 10 for task 0 (its minimum): min-ACC and the gap fall back to the other points
    acc = [list(r) for r in HAND.acc]
    acc[5][0] = float("nan")
    c = Curve(HAND.steps, HAND.training, HAND.bounds, acc)
    assert min_acc(c) == pytest.approx({0: 0.5, 1: 0.3})  # 0.5, 0.8, 0.8 after step 4
    gap = stability_gaps(c, tol=0.02)[1]
    assert (gap.minimum, gap.min_step, gap.recovery) == (pytest.approx(0.8), 12, 0)  # only step 12: no dip
    # A_AUC drops the point at step 10 and bridges steps 8 -> 12 with one trapezoid of width 4
    area = 0.7 + 1.5 + 1.45 + 1.4 + 4 * (0.85 + 2.59 / 3) / 2
    assert a_auc(c) == pytest.approx(area / 12)
    assert c.acc[5][0] is None  # stored as None


def test_no_recovery_and_no_dip():
    c = Curve(steps=(0, 2, 3, 4), training=(0, 0, 1, 1), bounds=((0, 2), (2, 4)),
              acc=((0.0, N), (0.8, N), (0.2, 0.5), (0.3, 0.9)))
    (g,) = stability_gaps(c)
    assert (g.depth, g.recovery) == (pytest.approx(0.6), None)
    rising = Curve(c.steps, c.training, c.bounds, ((0.0, N), (0.8, N), (0.85, 0.5), (0.9, 0.9)))
    (g,) = stability_gaps(rising)
    assert g.depth == pytest.approx(-0.05) and g.recovery == 0  # signed depth; nothing to recover


def test_a_boundary_point_shared_by_two_tasks():
    # a point at task 1's start step, labelled task 1, sees the model before task 1's first update: it is
    # the gap's reference (pre) but neither during task 1 nor after task 0's end (min-ACC)
    c = Curve(steps=(0, 2, 2, 3, 4), training=(0, 0, 1, 1, 1), bounds=((0, 2), (2, 4)),
              acc=((0.1, N), (0.9, N), (0.9, 0.1), (0.4, 0.6), (0.7, 0.8)))
    (g,) = stability_gaps(c)
    assert (g.pre, g.minimum, g.min_step) == (pytest.approx(0.9), pytest.approx(0.4), 3)
    assert min_acc(c) == pytest.approx({0: 0.4})
    assert wc_acc_curve(c)[2] is None  # task 0 has no point after its end yet
    assert a_auc(c) == pytest.approx(((0.1 + 0.9) + 0 + (0.5 + 0.5) / 2 + (0.5 + 0.75) / 2) / 4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=(0, 1), training=(0,), bounds=((0, 1),), acc=((0.1,), (0.2,))), "one entry per point"),
    (dict(steps=(0, 3), training=(0, 0), bounds=((0, 2),), acc=((0.1,), (0.2,))), "outside task 0"),
    (dict(steps=(2, 1), training=(0, 0), bounds=((0, 2),), acc=((0.1,), (0.2,))), "back in time"),
    (dict(steps=(0,), training=(0,), bounds=((0, 2),), acc=((1.5,),)), "fractions in [0, 1]"),
    (dict(steps=(0,), training=(0,), bounds=((0, 2), (1, 3)), acc=((0.1, N),)), "before task 0 ends"),
    (dict(steps=(0,), training=(0,), bounds=((0, 2), (2, 3)), acc=((0.1,),)), "one per task"),
    (dict(steps=(), training=(), bounds=((0, 2),), acc=()), "no evaluation points"),
])
def test_bad_curves_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Curve(**kwargs)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="window"):
        windowed_forgetting(HAND, 0)
    with pytest.raises(ValueError, match="tol"):
        stability_gaps(HAND, tol=-0.1)


# --- properties and the official code's route ----------------------------------------------------------

def random_curve(rng: random.Random, per_step: bool = False) -> Curve:
    """Random tasks of 2..6 updates; every step evaluated (per_step) or a random subset of steps."""
    T = rng.randint(1, 4)
    bounds, s = [], 0
    for _ in range(T):
        n = rng.randint(2, 6)
        bounds.append((s, s + n))
        s += n
    steps, training, acc = [], [], []
    for k, (a, b) in enumerate(bounds):
        for st in range(a if k == 0 else a + 1, b + 1):
            if per_step or st == b or rng.random() < 0.5:
                steps.append(st)
                training.append(k)
                acc.append(tuple(round(rng.random(), 2) if j <= k else None for j in range(T)))
    return Curve(steps, training, bounds, acc)


def official_route(c: Curve, window: int):
    """The official plugins' bookkeeping, re-stated: points come one at a time; each seen task's accuracy
    enters a deque of the last `window` values (WF: the largest earlier-minus-later drop in it, kept as a
    running max from 0); tasks other than the one training keep a running minimum (min-ACC); WC-ACC is the
    plain mean of the current task's accuracy and the other tasks' minima."""
    windows, wf, mins, wc = {}, {}, {}, None
    for p in range(len(c.steps)):
        cur = c.training[p]
        for j in range(cur + 1):
            a = c.acc[p][j]
            w = windows.setdefault(j, deque())
            w.append(a)
            if len(w) > window:
                w.popleft()
            drops = [w[m] - w[n] for m in range(len(w)) for n in range(m + 1, len(w))]
            wf[j] = max([wf.get(j, 0.0)] + drops)
            if j != cur:
                mins[j] = min(mins.get(j, math.inf), a)
        wc = sum([c.acc[p][cur]] + [v for j, v in mins.items() if j != cur]) / (1 + len(mins))
    return wf, mins, wc


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_the_official_bookkeeping_on_per_step_curves(seed):
    # per-step evaluation after every update (the paper's rho_eval = 1), as the official plugins track:
    # a window of w points is then a window of w steps
    c = random_curve(random.Random(seed), per_step=True)
    w = random.Random(seed + 1000).randint(1, 5)
    wf, mins, wc = official_route(c, w)
    assert windowed_forgetting(c, w) == pytest.approx(wf)
    assert min_acc(c) == pytest.approx({j: v for j, v in mins.items()})
    assert wc_acc(c) == pytest.approx(wc)


@pytest.mark.parametrize("seed", range(60))
def test_properties(seed):
    rng = random.Random(seed)
    c = random_curve(rng)
    last = len(c.steps) - 1
    final = [c.acc[last][j] for j in range(c.training[last] + 1)]
    for i, m in min_acc(c).items():  # the last point is after every old task's end
        assert m <= final[i]
    for g in stability_gaps(c):
        if g.minimum is not None and g.pre is not None and g.minimum < g.pre:
            assert g.depth > 0
        if g.depth is not None and g.depth <= 0:
            assert g.recovery == 0
        if g.recovery is not None:
            assert g.recovery >= 0 and c.bounds[g.task][0] + g.recovery <= c.bounds[g.task][1]
    # WC-ACC is a lower bound on the final average accuracy over the seen tasks
    assert wc_acc(c) <= sum(final) / len(final) + 1e-12
    means = [a for _, a in anytime_accuracy(c)]
    assert min(means) - 1e-12 <= a_auc(c) <= max(means) + 1e-12
    wfs = [windowed_forgetting_mean(c, w) for w in (1, 2, 3, 5, 100)]
    assert wfs[0] == 0.0 and all(0 <= a <= b + 1e-12 for a, b in zip(wfs, wfs[1:]))


def test_module_imports_neither_torch_nor_numpy():
    code = ("import sys, harness.config.anytime\n"
            "print(sorted(m for m in ('torch', 'numpy', 'avalanche') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
