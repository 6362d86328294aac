"""Analysis layer against hand-made fixture records (tests/fixtures/analysis/make_fixtures.py).

Expected numbers are worked out by hand in the comments, or come from an independent route
(scipy, or a plain loop) where the hand computation would be long.
"""
import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import fixture_records, record_from
from scipy import stats as sps

from harness.analysis import correlations, ranks, stats
from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.frame import format_summary, records_to_frame, regime_order, summary_table
from harness.analysis.result import AnalysisResult, AnalysisSettings
from harness.analysis.tables import analyse, headline, metric_table

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"


@pytest.fixture(scope="module")
def records():
    return fixture_records(FIXTURE)


@pytest.fixture(scope="module")
def frame(records):
    return records_to_frame(records)


@pytest.fixture(scope="module")
def cells(frame):
    return Cells(frame)


def tau_of(table, a, b):
    row = table[(table["regime_a"] == a) & (table["regime_b"] == b)].iloc[0]
    return row


# ------------------------------------------------------------------ frame

def test_frame_one_row_per_record_failed_kept(records, frame):
    assert len(frame) == len(records) == 48
    failed = frame[frame["status"] == "failed"]
    assert list(failed["method"]) == ["D"] and failed["acc"].isna().all()
    assert set(frame["method"]) == {"A", "B", "C", "D"}  # labels, not registry names
    assert set(frame["method_name"]) == {"a", "b", "c", "d"}


def test_frame_mean_update_norm_skips_nulls():
    rec = record_from({"run_id": "x", "status": "ok", "spec": {"method": "m", "label": ""},
                       "update_norms": {"shared": [None, 1.0, 3.0]}, "metrics": {"acc": 0.5},
                       "provenance": {"submission": {"file": "s.py", "sha256": "0"}}})
    row = records_to_frame([rec]).iloc[0]
    assert row["mean_update_norm"] == 2.0 and row["method"] == "m" and row["is_submission"]
    assert math.isnan(row["forgetting"])


def test_regimes_ordered_by_depth(frame):
    assert regime_order(frame) == ["head", "last-1", "full"]


def test_summary_table_and_text(frame):
    t = summary_table(frame)
    d_full = t[(t["method"] == "D") & (t["regime"] == "full")].iloc[0]
    assert (d_full["n"], d_full["n_failed"]) == (3, 1) and d_full["acc"] == pytest.approx(0.5)
    a_head = t[(t["method"] == "A") & (t["regime"] == "head")].iloc[0]
    assert a_head["acc"] == pytest.approx(0.915)  # (0.90+0.92+0.91+0.93)/4
    text = format_summary(frame)
    assert "91.5/" in text and "(3, !1)" in text
    header = [ln for ln in text.splitlines() if ln.startswith("method")][0]
    assert header.index("head") < header.index("last-1") < header.index("full")


# ------------------------------------------------------------------ coverage

def test_coverage_marks_failed_cell(frame):
    cov = coverage_table(frame)
    d_full = cov[(cov["method"] == "D") & (cov["regime"] == "full")].iloc[0]
    assert (d_full["expected"], d_full["ok"], d_full["not_ok"], bool(d_full["complete"])) == (4, 3, 1, False)
    assert d_full["statuses"] == "failed: 1"
    assert cov[cov["method"] != "D"]["complete"].all()


def test_incomplete_method_excluded_and_reported(frame, cells):
    w = ranks.w_across_regimes(frame, cells).iloc[0]
    assert w["excluded"] == "D" and w["n_methods"] == 3
    fr = ranks.friedman_table(frame, cells).set_index("regime")
    assert fr.at["full", "excluded"] == "D" and fr.at["full", "k"] == 3
    assert fr.at["head", "excluded"] == "" and fr.at["head", "k"] == 4
    mr = ranks.mean_ranks(frame, cells)
    assert not ((mr["method"] == "D") & (mr["regime"] == "full")).any()


def test_nothing_imputed_in_metric_table(frame):
    mt = metric_table(frame)
    row = mt[(mt["method"] == "D") & (mt["regime"] == "full")].iloc[0]
    assert (row["n_runs"], row["n_ok"], row["n_failed"]) == (4, 3, 1)
    assert row["acc"] == pytest.approx(0.5) and row["acc_lo"] == row["acc_hi"] == pytest.approx(0.5)


# ------------------------------------------------------------------ ranks and agreement

def test_order_ranks_ties_averaged_one_is_best():
    assert list(stats.rank_rows([0.9, 0.8, 0.9])) == [1.5, 3.0, 1.5]


def test_mean_ranks_by_hand(frame, cells):
    mr = ranks.mean_ranks(frame, cells).set_index(["regime", "method"])
    assert mr.at[("head", "A"), "mean_rank"] == 1.0 and mr.at[("head", "A"), "rank_lo"] == 1.0
    # last-1: A ranks 2,2,1,2 over orders, B 1,1,2,1
    assert mr.at[("last-1", "A"), "mean_rank"] == pytest.approx(7 / 4)
    assert mr.at[("last-1", "B"), "mean_rank"] == pytest.approx(5 / 4)
    lo, hi = mr.at[("last-1", "A"), "rank_lo"], mr.at[("last-1", "A"), "rank_hi"]
    assert 1.0 <= lo <= 7 / 4 <= hi <= 2.0


def test_tau_between_regimes_by_hand(frame, cells):
    t = ranks.regime_agreement(frame, cells)
    # head A>B>C>D vs last-1 B>A>C>D: 1 discordant pair of 6 -> (5-1)/6; D is complete in both
    r = tau_of(t, "head", "last-1")
    assert r["tau"] == pytest.approx(2 / 3) and r["n_methods"] == 4 and r["excluded"] == ""
    # permutations of 4 with |tau| >= 2/3: inversions 0, 1, 5, 6 -> 1 + 3 + 3 + 1 = 8 of 24
    assert r["p"] == pytest.approx(8 / 24)
    # head A>B>C vs full C>B>A: fully reversed; exact p = 2/6 (identity and reversal)
    r = tau_of(t, "head", "full")
    assert r["tau"] == pytest.approx(-1.0) and r["p"] == pytest.approx(1 / 3) and r["excluded"] == "D"
    # last-1 B>A>C vs full C>B>A: AB concordant, AC and BC discordant
    assert tau_of(t, "last-1", "full")["tau"] == pytest.approx(-1 / 3)
    assert tau_of(t, "full", "last-1")["tau"] == pytest.approx(-1 / 3)  # symmetric entry


def test_tau_b_matches_scipy_with_ties():
    rng = np.random.default_rng(3)
    for _ in range(20):
        x, y = rng.integers(0, 4, 9), rng.integers(0, 4, 9)
        assert stats.kendall_tau_b(x, y) == pytest.approx(sps.kendalltau(x, y).statistic)


def test_tau_permutation_p_monte_carlo_close_to_exact():
    x, y = np.arange(9.0), np.array([0, 2, 1, 3, 5, 4, 6, 8, 7.0])
    tau, p = stats.tau_permutation_test(x, y, n_perm=4000)
    assert tau == pytest.approx(sps.kendalltau(x, y).statistic)
    assert p == pytest.approx(sps.kendalltau(x, y, method="exact").pvalue, abs=0.01)


def test_kendall_w_by_hand(frame, cells):
    # ranks (A, B, C): head 1,2,3; last-1 2,1,3; full 3,2,1 -> sums 6,5,7, S = 2,
    # W = 12 S / (m^2 (n^3 - n)) = 24 / 216
    w = ranks.w_across_regimes(frame, cells).iloc[0]
    assert w["w"] == pytest.approx(1 / 9)
    wo = ranks.w_across_orders(frame, cells).set_index("regime")
    assert wo.at["head", "w"] == pytest.approx(1.0)
    # last-1 per-order rank sums A 7, B 5, C 12, D 16 -> S = 74, W = 12*74/(16*60)
    assert wo.at["last-1", "w"] == pytest.approx(0.925)


def test_kendall_w_equals_friedman_over_scipy():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 3, (7, 5)).astype(float)  # many ties
    R = stats.rank_rows(scores)
    chi2 = sps.friedmanchisquare(*R.T).statistic
    assert stats.friedman(R)["chi2"] == pytest.approx(chi2)
    assert stats.kendall_w(R)["w"] == pytest.approx(chi2 / (7 * 4))


def test_friedman_and_cd_by_hand(frame, cells):
    fr = ranks.friedman_table(frame, cells).set_index("regime")
    assert fr.at["last-1", "chi2"] == pytest.approx(4 * 3 * 0.925)  # N (k-1) W
    # Demsar 2006 table: q_0.05 = 2.569 for k = 4; CD = q sqrt(k(k+1)/(6N))
    assert fr.at["last-1", "cd"] == pytest.approx(2.569 * math.sqrt(20 / 24), abs=1e-3)


@pytest.mark.parametrize("k,q", [(2, 1.960), (3, 2.343), (5, 2.728), (8, 3.031), (10, 3.164)])
def test_nemenyi_q_matches_demsar_table(k, q):
    assert stats.nemenyi_cd(k, 6) == pytest.approx(q * math.sqrt(k * (k + 1) / 36), abs=2e-3)


def test_rank_reversals_by_hand(frame, cells):
    rev = ranks.rank_reversals(frame, cells)
    pairs = {(r.regime_a, r.regime_b, r.method_1, r.method_2) for r in rev.itertuples()}
    assert pairs == {("head", "last-1", "A", "B"), ("head", "full", "A", "B"),
                     ("head", "full", "A", "C"), ("head", "full", "B", "C"),
                     ("last-1", "full", "A", "C"), ("last-1", "full", "B", "C")}
    # 4 orders: the smallest exact two-sided Wilcoxon p is 2/16, so nothing is significant
    assert not rev["significant_both"].any()
    summ = ranks.reversal_summary(frame, rev, cells)
    assert summ["reversals"].sum() == 6 and (summ["n_pairs"] == 3).all()


def test_holm_by_hand():
    # sorted 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> monotone 0.06
    assert np.allclose(stats.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    assert np.isnan(stats.holm([0.2, np.nan])[1])


def test_wilcoxon_all_equal_is_one():
    assert stats.wilcoxon_p([1, 2, 3], [1, 2, 3]) == 1.0


# ------------------------------------------------------------------ bootstrap

def test_bootstrap_mean_matches_plain_loop():
    x = np.array([0.3, 0.9, 0.4, 0.7, 0.1, 0.8])
    mean, lo, hi = stats.bootstrap_mean(x, n_boot=1000, seed=7)
    rng = np.random.default_rng(7)
    idx = rng.integers(0, x.size, size=(1000, x.size))
    reps = [x[i].mean() for i in idx]
    assert mean == pytest.approx(x.mean())
    assert (lo, hi) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])))


def test_bootstrap_is_seeded_and_constant_data_has_zero_width():
    assert stats.bootstrap_mean([1, 5, 2, 8]) == stats.bootstrap_mean([1, 5, 2, 8])
    assert stats.bootstrap_mean([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_bootstrap_means_ignore_nan_per_column():
    mean, lo, hi = stats.bootstrap_means(np.array([[1.0, np.nan], [3.0, 4.0]]))
    assert mean[0] == 2.0 and mean[1] == 4.0 and lo[1] == hi[1] == 4.0


# ------------------------------------------------------------------ correlations

def test_spearman_by_hand():
    # d = (0, 1, 1): rho = 1 - 6 * 2 / (3 * 8) = 0.5
    res = stats.corr_with_ci([1, 2, 3], [1, 3, 2])
    assert res["rho"] == pytest.approx(0.5) and res["n"] == 3


def test_weighted_bootstrap_equals_scipy_on_explicit_resamples():
    rng = np.random.default_rng(1)
    x = np.round(rng.normal(size=25), 1)
    y = np.round(x + rng.normal(size=25), 1)  # rounding makes ties
    res = stats.Resampler(25, n_boot=6, seed=2, chunk=4)
    W = np.vstack(list(res.chunks()))
    rho, r = stats.boot_corr(x, y, stats.Resampler(25, n_boot=6, seed=2, chunk=4))
    for w, a, b in zip(W, rho, r):
        idx = np.repeat(np.arange(25), w.astype(int))
        assert a == pytest.approx(sps.spearmanr(x[idx], y[idx]).statistic)
        assert b == pytest.approx(sps.pearsonr(x[idx], y[idx]).statistic)


def test_cluster_resampler_moves_runs_whole_and_keeps_strata():
    clusters = np.repeat(np.arange(6), 3)          # 6 runs x 3 steps
    strata = np.repeat([0, 0, 0, 1, 1, 1], 3)      # two regimes, 3 runs each
    W = np.vstack(list(stats.Resampler(18, clusters, strata, n_boot=50, seed=0).chunks()))
    assert np.all(W.reshape(50, 6, 3) == W.reshape(50, 6, 3)[:, :, :1])
    assert np.all(W[:, :9].sum(1) == 9) and np.all(W[:, 9:].sum(1) == 9)


def test_norm_vs_forgetting_matches_scipy(frame):
    nf = correlations.norm_vs_forgetting(frame).set_index(["dataset", "regime"])
    ok = frame[(frame["status"] == "ok") & (frame["regime"] == "last-1")]
    exp = sps.spearmanr(ok["mean_update_norm"], ok["forgetting"]).statistic
    row = nf.loc[("toy", "last-1")]
    assert row["rho"] == pytest.approx(exp) and row["n"] == 16
    assert row["rho_lo"] <= row["rho"] <= row["rho_hi"]
    pooled = nf.loc[("toy", correlations.ALL)]
    assert pooled["n"] == 47 and pooled["rho"] > 0.8  # norms and forgetting both grow with depth


def test_depth_trend_and_step_level(records, frame):
    tr = correlations.depth_trend(frame).set_index("quantity")
    assert tr.at["forgetting", "rho_means"] == pytest.approx(1.0)
    assert tr.at["mean_update_norm", "rho_means"] == pytest.approx(1.0)
    steps = correlations.step_frame(records)
    assert len(steps) == 47 and (steps["t"] == 2).all()
    sl = correlations.step_level(records, frame).set_index("regime")
    sub = steps[steps["regime"] == "full"]
    assert sl.at["full", "rho"] == pytest.approx(sps.spearmanr(sub["u"], sub["f"]).statistic)


def test_result_holds_every_table_and_the_settings_it_was_computed_with(records):
    t = analyse(records, rope=2.0, include_flagged=True)
    assert list(t.tables()) == [f.name for f in fields(AnalysisResult) if f.name != "settings"]
    assert all(isinstance(df, pd.DataFrame) for df in t.tables().values())
    # accuracies are stored as fractions: a 2-point ROPE is 0.02 of them
    assert t.settings == AnalysisSettings(rope_points=2.0, rope=pytest.approx(0.02), credible=0.95, alpha=0.05,
                                          include_flagged=True)


def test_result_cut_to_one_dataset_keeps_its_rows_and_the_pooled_tables(records):
    t = analyse(records)
    two = replace(t, methods=pd.concat([t.methods, t.methods.assign(dataset="other")], ignore_index=True),
                  tau=pd.concat([t.tau, t.tau.assign(dataset="other")], ignore_index=True))
    toy = two.of_dataset("toy")
    assert toy.methods.reset_index(drop=True).equals(t.methods) and toy.tau.reset_index(drop=True).equals(t.tau)
    assert len(two.of_dataset("other").methods) == len(t.methods)
    assert toy.global_ranks is t.global_ranks and toy.budget is t.budget  # pooled over data sets: whole


def test_analyse_bundle_and_headline(records):
    t = analyse(records)
    h = headline(t)
    assert h["reversals"] == 6 and h["significant"] == 0
    # off-diagonal taus: 2/3, -1, -1/3
    assert h["mean_tau"] == pytest.approx((2 / 3 - 1 - 1 / 3) / 3)
    assert h["shallow_deep"][0]["tau"] == pytest.approx(-1.0)
    gr = t.global_ranks
    assert set(gr[gr["regime"] == "full"]["method"]) == {"A", "B", "C"}
