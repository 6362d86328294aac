"""Any-time analysis (issue 29): a record's curve to a Curve, the ANYTIME metric table, the frame's
any-time columns, the metric table's CIs, and the tables of harness/analysis/anytime.py, each checked
against numbers worked by hand on small constructed records (and one real engine run)."""
import math

import numpy as np
import pandas as pd
import pytest
from conftest import make_spec, record_from

from harness.analysis import anytime as at, stats
from harness.analysis.frame import records_to_frame
from harness.analysis.tables import analyse
from harness.config import anytime
from harness.config.metrics import ANYTIME, ANYTIME_NAMES, METRICS, all_anytime, anytime_of_record

# Two tasks, every 2 steps. Task 0 has 4 steps (a mid point at its 4th step, then its end point at step 4),
# task 1 has 3 (a mid point at step 6, its end point at step 7). Bounds: (0, 4), (4, 7).
CURVE = {"every": 2, "subsample": 100, "n_rows": [100, 100],
         "steps": [0, 2, 4, 4, 6, 7], "task": [0, 0, 0, 0, 1, 1],
         "end": [False, False, False, True, False, True],
         "acc": [[0.5, None], [0.7, None], [0.9, None], [0.9, None], [0.6, 0.5], [0.8, 0.9]]}


def test_curve_from_record_bounds_and_values():
    c = anytime.curve_from_record(CURVE)
    assert c.bounds == ((0, 4), (4, 7))
    # the mid point at task 0's last step (4) is shadowed by the end point at that step: dropped
    assert c.training == (0, 0, 0, 1, 1) and c.steps == (0, 2, 4, 6, 7)
    assert c.value(3, 0) == 0.6 and c.value(2, 1) is None
    kept = anytime.curve_from_record(CURVE, keep_shadowed=True)
    assert kept.training == (0, 0, 0, 0, 1, 1) and kept.steps == (0, 2, 4, 4, 6, 7)


def test_a_shadowed_point_is_not_read_as_forgetting():
    # a method whose output differs from the trained network (BECAME, iCaRL...): the trained network's
    # point at task 0's last step (0.5) and the output's end point (0.9) share step 4. Kept, WF reads the
    # 0.7 (step 2) -> 0.5 (step 4) drop of task 0: 0.2 / 2 tasks = 0.1; dropped, task 0 goes 0.5, 0.7, 0.9,
    # 0.9, 0.9 and task 1 0.5, 0.9: no drop anywhere.
    jumpy = {**CURVE, "acc": [[0.5, None], [0.7, None], [0.5, None], [0.9, None], [0.9, 0.5], [0.9, 0.9]]}
    assert anytime_of_record(jumpy)["wf"] == pytest.approx(0.0)
    c = anytime.curve_from_record(jumpy, keep_shadowed=True)
    assert all_anytime(c, 3)["wf"] == pytest.approx(0.1)  # (0.7 -> 0.5 on task 0) / 2 tasks


def test_recovery_tolerance_is_one_test_example():
    # tolerance_of: 1 / the smallest subset, at least RECOVERY_TOL
    assert anytime.tolerance_of({"n_rows": [90, 100]}) == pytest.approx(1 / 90)
    assert anytime.tolerance_of({"n_rows": [1000]}) == anytime.RECOVERY_TOL
    assert anytime.tolerance_of({}) == anytime.RECOVERY_TOL
    # with 10 rows per task one example is 0.1: task 0 back at 0.8 >= 0.9 - 0.1 at step 7, 3 steps into task 1
    got = anytime_of_record({**CURVE, "n_rows": [10, 10], "subsample": 10})
    assert got["gap_recovery"] == 3 and got["gap_unrecovered"] == 0 and got["gap_depth"] == pytest.approx(0.3)


def test_curve_from_record_partial_run_and_missing_tasks():
    # a run that failed in task 1 (no end point there) of 3: task 1 ends at its last point, task 2 is empty
    partial = {**CURVE, "steps": [0, 2, 4, 4, 6], "task": [0, 0, 0, 0, 1], "end": [False, False, False, True, False],
               "acc": [[0.5, None, None], [0.7, None, None], [0.9, None, None], [0.9, None, None],
                       [0.6, 0.5, None]]}
    assert anytime.curve_from_record(partial).bounds == ((0, 4), (4, 6), (6, 6))
    with pytest.raises(ValueError, match="one entry per point"):
        anytime.curve_from_record({**CURVE, "end": [True]})
    with pytest.raises(ValueError, match="steps, task, end and acc"):
        anytime.curve_from_record({"steps": []})


def test_window_is_every_plus_one():
    assert anytime.window_of(10) == 11 and anytime.window_of(1) == 2
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="every"):
            anytime.window_of(bad)


def test_metric_table_hand_values():
    # min-ACC: task 0 after its end (step > 4): 0.6, 0.8 -> 0.6
    # WC-ACC: k = 2 tasks seen: 0.9 / 2 + (1 - 1/2) * 0.6 = 0.75
    # gap at task 1, old task 0: pre = 0.9 (end of task 0), min 0.6 at step 6 -> depth 0.3; never back to
    #   >= 0.89 within task 1 (0.8) -> unrecovered, no recovery to average
    # A_AUC: seen means (0, .5) (2, .7) (4, .9) (4, .9) (6, .55) (7, .85); trapezoids 1.2 + 1.6 + 0 + 1.45 + 0.7
    #   = 4.95 over 7 steps
    # WF, window every + 1 = 3 (pairs <= 2 steps apart): task 0: 0.9 at 4 -> 0.6 at 6 = 0.3; task 1 (0.5 -> 0.9)
    #   never drops: 0 -> mean 0.15
    got = anytime_of_record(CURVE)
    assert list(got) == list(ANYTIME_NAMES)
    assert got["min_acc"] == pytest.approx(0.6) and got["wc_acc"] == pytest.approx(0.75)
    assert got["gap_depth"] == pytest.approx(0.3) and got["gap_recovery"] is None and got["gap_unrecovered"] == 1
    assert got["a_auc"] == pytest.approx(4.95 / 7) and got["wf"] == pytest.approx(0.15)
    # each table entry's function gives what all_anytime gives
    c, w = anytime.curve_from_record(CURVE), 3
    for name, m in ANYTIME.items():
        want = all_anytime(c, w)[name]
        assert (m.function(c, w) is None) if want is None else m.function(c, w) == pytest.approx(want)


def test_anytime_table_is_a_second_table_of_the_same_type():
    assert set(ANYTIME) == {"min_acc", "wc_acc", "a_auc", "gap_depth", "gap_recovery", "wf", "gap_unrecovered"}
    assert not set(ANYTIME) & set(METRICS) and type(ANYTIME["wf"]) is type(METRICS["acc"])
    assert [ANYTIME[m].higher_is_better for m in ANYTIME_NAMES] == [True, True, True, False, False, False, False]
    assert ANYTIME["gap_depth"].label == "gap depth" and ANYTIME["min_acc"].label == "min-ACC"
    assert ANYTIME["gap_recovery"].unit == "steps" and ANYTIME["gap_unrecovered"].unit == "count"
    assert "ICLR 2023" in ANYTIME["min_acc"].description and "Koh" in ANYTIME["a_auc"].description


# ------------------------------------------------------------------------------------ records


def _curve(pre: float, dip: float, end_old: float, cur: float, long: bool = False) -> dict:
    """Two tasks, every 2: task 0 = 2 steps (3 in a `long` run: its end point then sits at step 3),
    task 1 = 4 steps with mid points at offsets 2 and 4. Old task 0: `pre` at task 0's end, `dip` at
    task 1's offset 2, `end_old` after; task 1's own accuracy `cur` throughout."""
    e0 = 3 if long else 2
    return {"every": 2, "subsample": 100, "n_rows": [100, 100],
            "steps": [0, 2, e0, e0 + 2, e0 + 4, e0 + 4], "task": [0, 0, 0, 1, 1, 1],
            "end": [False, False, True, False, False, True],
            "acc": [[0.5, None], [pre, None], [pre, None], [dip, cur], [end_old, cur], [end_old, cur]]}


def _rec(method, regime, order, curve=None, acc=0.8, fraction=0.5, norm=1.0, status="ok"):
    spec = make_spec(method=method, regime=regime, order=order)
    rec = {"spec": spec.to_dict(), "run_id": f"{method}-{regime}-{order}", "status": status,
           "metrics": {"acc": acc, "forgetting": 0.1, "la": acc, "bwt": -0.1},
           "params": {"trainable": int(fraction * 100), "total": 100, "fraction": fraction},
           "update_norms": {"shared": [norm, norm]}}
    if curve is not None:
        rec["curve"] = curve
    return record_from(rec)


def test_frame_columns_nan_without_a_curve_and_for_failed_runs():
    recs = [_rec("a", "full", 0, _curve(0.9, 0.6, 0.8, 0.9)), _rec("a", "full", 1),
            _rec("a", "full", 2, _curve(0.9, 0.6, 0.8, 0.9), status="failed")]
    f = records_to_frame(recs)
    assert list(f["has_curve"]) == [True, False, True] and f["has_curve"].dtype == bool
    assert all(c in f.columns for c in ANYTIME_NAMES)
    # run 0: depth 0.9 - 0.6 = 0.3, min-ACC min(0.6, 0.8) = 0.6, WC-ACC 0.9/2 + 0.6/2 = 0.75
    assert f.loc[0, "gap_depth"] == pytest.approx(0.3) and f.loc[0, "min_acc"] == pytest.approx(0.6)
    assert f.loc[0, "wc_acc"] == pytest.approx(0.75) and f.loc[0, "gap_unrecovered"] == 1
    assert f.loc[[1, 2], list(ANYTIME_NAMES)].isna().all().all()


def test_methods_table_carries_anytime_means_and_bootstrap_cis():
    depths = [0.1, 0.2, 0.4]
    recs = [_rec("a", "full", o, _curve(0.9, 0.9 - d, 0.9, 0.9)) for o, d in enumerate(depths)]
    row = analyse(recs).methods.iloc[0]
    mean, lo, hi = stats.bootstrap_mean(depths)
    assert row["gap_depth"] == pytest.approx(np.mean(depths)) == pytest.approx(mean)
    assert (row["gap_depth_lo"], row["gap_depth_hi"]) == pytest.approx((lo, hi))
    assert lo < mean < hi
    assert {"min_acc", "min_acc_lo", "wc_acc_hi", "a_auc", "wf", "gap_recovery", "gap_unrecovered"} <= set(row.index)


def test_tables_present_and_empty_without_curves():
    t = analyse([_rec(m, "full", o) for m in "ab" for o in range(3)])
    for name, cols in [("anytime_curves", at.CURVE_COLUMNS), ("anytime_ranks", at.RANK_COLUMNS),
                       ("anytime_tau", at.TAU_COLUMNS), ("gap_trend", at.TREND_COLUMNS)]:
        df = getattr(t, name)
        assert df.empty and list(df.columns) == [cols[0], "scenario", *cols[1:]], name
    assert t.methods["gap_depth"].isna().all() and not t.runs["has_curve"].any()


def test_curves_align_runs_with_unequal_task_lengths():
    # run 0: task 0 is 2 steps; run 1: 3 steps (its end point at step 3). Offsets into task 1 are the
    # same (2 and 4), so mid points align by offset and end points with end points.
    r0 = _rec("a", "full", 0, _curve(0.9, 0.6, 0.8, 0.95))
    r1 = _rec("a", "full", 1, _curve(0.7, 0.5, 0.7, 0.85, long=True))
    c = at.curves([r0, r1])
    assert list(zip(c["task"], c["point"], c["offset"], c["end"])) == [
        (1, 0, 0.0, False), (1, 1, 2.0, False), (1, 2, 2.5, True),  # end: median of 2 and 3 steps
        (2, 0, 2.0, False), (2, 1, 4.0, False), (2, 2, 4.0, True)]
    # x = (task - 1) + offset / median length: 2 / 2.5, then task 1 (4 steps in both) at 1.5 and 2.0
    assert c["x"].tolist() == pytest.approx([0.0, 0.8, 1.0, 1.5, 2.0, 2.0])
    assert (c["n"] == 2).all()
    task2 = c[c["task"] == 2].reset_index(drop=True)
    # old accuracy at offset 2 (the dip): mean of 0.6 and 0.5; seen: mean of (0.6+0.95)/2 and (0.5+0.85)/2
    assert task2.loc[0, "old_acc"] == pytest.approx(0.55)
    assert task2.loc[0, "seen_acc"] == pytest.approx((0.775 + 0.675) / 2)
    assert task2.loc[2, "first_acc"] == pytest.approx(0.75)
    assert c[c["task"] == 1]["old_acc"].isna().all()  # no old task during task 1
    mean, lo, hi = stats.bootstrap_means(np.array([[0.6], [0.5]]))
    assert (task2.loc[0, "old_acc_lo"], task2.loc[0, "old_acc_hi"]) == pytest.approx((lo[0], hi[0]))


def test_curves_slot_only_some_runs_have():
    # run 1's task 0 is 4 steps: it has a mid point at offset 4 the 2-step run lacks; median length 3,
    # so x of that slot (4 / 3) is clipped to the task's end
    r0 = _rec("a", "full", 0, _curve(0.9, 0.6, 0.8, 0.95))
    long = _curve(0.7, 0.5, 0.7, 0.85)
    long.update(steps=[0, 2, 4, 4, 6, 8, 8], task=[0, 0, 0, 0, 1, 1, 1], end=[False, False, False, True, False,
                                                                                False, True],
                acc=[[0.5, None], [0.7, None], [0.7, None], [0.7, None], [0.5, 0.85], [0.7, 0.85], [0.7, 0.85]])
    c = at.curves([r0, _rec("a", "full", 1, long)])
    first = c[c["task"] == 1]
    assert first["offset"].tolist() == [0.0, 2.0, 4.0, 3.0] and first["n"].tolist() == [2, 2, 1, 2]
    assert first["x"].tolist() == pytest.approx([0.0, 2 / 3, 1.0, 1.0])
    assert first["seen_acc"].iloc[2] == pytest.approx(0.7)


# a > b > c by ACC; by min-ACC (and so WC-ACC: same current-task accuracy) c > b > a
MIN = {"a": 0.5, "b": 0.6, "c": 0.7}
ACC = {"a": 0.9, "b": 0.8, "c": 0.7}


def _ranked_records(regime="full", flip=True):
    return [_rec(m, regime, o, _curve(0.9, MIN[m] if flip else 1.2 - MIN[m], 0.9, 0.9), acc=ACC[m] + 0.01 * o)
            for m in "abc" for o in range(3)]


def test_ranks_and_tau_against_hand_rankings():
    t = analyse(_ranked_records("full") + _ranked_records("head", flip=False))
    r = t.anytime_ranks.set_index(["regime", "method"])
    assert r.loc[("full", "a"), "acc_rank"] == 1 and r.loc[("full", "a"), "min_acc_rank"] == 3
    assert r.loc[("full", "c"), "wc_acc_rank"] == 1 and r.loc[("full", "b"), "n"] == 3
    assert r.loc[("full", "a"), "min_acc"] == pytest.approx(0.5)
    assert r.loc[("full", "a"), "acc"] == pytest.approx(0.91)  # mean of 0.90, 0.91, 0.92
    tau = t.anytime_tau.set_index("regime")
    # 3 methods: 3! pairings, one as extreme each way -> two-sided p 2/6
    assert tau.loc["full", "tau_min_acc"] == pytest.approx(-1) and tau.loc["full", "p_min_acc"] == pytest.approx(1 / 3)
    assert tau.loc["full", "tau_wc_acc"] == pytest.approx(-1)
    assert tau.loc["head", "tau_min_acc"] == pytest.approx(1) and tau.loc["head", "n_methods"] == 3


def test_ranks_leave_out_flagged_runs_like_acc_ranks():
    recs = _ranked_records()
    flagged = [record_from({**r.to_dict(), "warnings": [{"code": "at-chance", "task": 1, "message": "x"}]})
               if r.method == "b" and r.spec.order == 0 else r for r in recs]
    r = analyse(flagged).anytime_ranks
    assert set(r["n"]) == {2}  # the flagged run's task order leaves every method's comparison


def test_spearman_exact_p():
    assert at.spearman_exact([1, 2, 3, 4], [1, 2, 3, 5]) == pytest.approx((1.0, 2 / 24))
    # 3 points, rho over the 6 pairings: 1, .5, .5, -.5, -.5, -1; P(rho <= -.5) = 3/6, P(rho >= -.5) = 5/6;
    # two-sided = twice the smaller one-sided p (scipy's, as stats.tau_permutation_test) = 1
    rho, p = at.spearman_exact([1, 2, 3], [3, 1, 2])
    assert rho == pytest.approx(-0.5) and p == pytest.approx(1.0)
    assert at.spearman_exact([1, 2, 3], [1, 2, 3]) == pytest.approx((1.0, 2 / 6))
    assert math.isnan(at.spearman_exact([1, 1, 1], [1, 2, 3])[0])


def test_gap_trend_grows_with_the_fraction_and_the_norm():
    fractions = {"head": 0.1, "last-1": 0.4, "full": 1.0}
    recs = []
    for i, (rg, fr) in enumerate(fractions.items()):
        for o in range(4):
            depth = 0.1 * (i + 1) + 0.01 * o
            recs.append(_rec("a", rg, o, _curve(0.9, 0.9 - depth, 0.9, 0.9), fraction=fr, norm=10 * depth))
            recs.append(_rec("b", rg, o, _curve(0.9, 0.8 - 0.01 * ((o + i) % 2), 0.9, 0.9), fraction=fr,
                             norm=1 + o))
    g = analyse(recs).gap_trend.set_index("method")
    a, b = g.loc["a"], g.loc["b"]
    assert a["n_regimes"] == 3 and a["n_runs"] == 12
    assert a["rho_fraction"] == pytest.approx(1) and a["p_fraction"] == pytest.approx(2 / 6)
    assert a["rho_norm"] == pytest.approx(1) and a["trend"] == "grows"
    # runs: depth rank rises with fraction rank, 3 tied groups of 4 -> scipy's Spearman of the same vectors
    frac = np.repeat([0.1, 0.4, 1.0], 4)
    from scipy.stats import spearmanr
    want = spearmanr(frac, [0.1 * (i + 1) + 0.01 * o for i in range(3) for o in range(4)])
    assert a["rho_runs"] == pytest.approx(want[0]) and a["p_runs"] == pytest.approx(want[1])
    assert b["trend"] == "no trend"


def test_real_engine_run_gives_a_curve_the_analysis_reads():
    from harness.config.specs import ContinualSpec, DatasetSpec
    from harness.run.engine import run_one

    spec = make_spec(dataset=DatasetSpec("digits", 3, 2, "mlp"), regime="full", continual=ContinualSpec(5, 30),
                     training=make_spec().training)
    rec = run_one(spec, device="cpu")
    assert rec.ok, rec.error
    f = records_to_frame([rec])
    assert bool(f.loc[0, "has_curve"]) and f.loc[0, list(ANYTIME_NAMES)].notna().all()
    c = anytime.curve_from_record(rec.curve)
    ends = [s for s, e in zip(rec.curve["steps"], rec.curve["end"]) if e]
    assert [b for _, b in c.bounds] == ends == list(np.cumsum(rec.budget["steps_per_task"]))
    # min-ACC by hand from the record: each old task's lowest accuracy after its end point
    mins = [min(row[j] for s, row in zip(rec.curve["steps"], rec.curve["acc"]) if s > ends[j]) for j in range(2)]
    assert f.loc[0, "min_acc"] == pytest.approx(sum(mins) / 2)
    curves = at.curves([rec])
    assert curves["end"].sum() == 3 and curves.groupby("task")["end"].last().all()
    assert isinstance(curves, pd.DataFrame) and curves["x"].max() == pytest.approx(3.0)
