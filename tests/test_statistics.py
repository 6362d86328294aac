"""Statistics that decide: Bayesian signed-rank (vs baycomp), design power (vs exact tests),
degenerate regimes, credible reversals, library-backed tests (vs hand computations)."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest
from conftest import make_spec, record_from
from scipy import stats as sps

from harness.analysis import bayes, power, stats
from harness.analysis.coverage import Cells
from harness.analysis.curves import seen_task_accuracy, task_curves
from harness.analysis.decisions import bayes_table, credible_reversals
from harness.analysis.degenerate import degenerate_table, tie_groups
from harness.analysis.frame import records_to_frame
from harness.analysis.tables import analyse, headline

baycomp = pytest.importorskip("baycomp")


# ------------------------------------------------------------- Bayesian signed-rank

@pytest.mark.parametrize("case", range(6))
def test_signed_rank_equals_baycomp(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(2, 13))
    x = np.round(rng.normal(0.9, 0.02, n), 2)  # accuracies on a grid: exact ties with 2*rope happen
    y = np.round(x + rng.normal(0.004, 0.01, n), 2)
    rope = (0.0, 0.01, 0.005)[case % 3]
    ref = baycomp.SignedRankTest.probs(x, y, rope, random_state=3, nsamples=20000)
    ref = ref if len(ref) == 3 else (ref[0], 0.0, ref[1])
    got = bayes.signed_rank_probs(x, y, rope, seed=3, nsamples=20000)
    assert got == pytest.approx(ref, abs=1e-12)


def test_signed_rank_direction_and_decision():
    better = np.array([0.95, 0.96, 0.94, 0.97, 0.95])
    worse = better - 0.05
    p1, pr, p2 = bayes.signed_rank_probs(better, worse, 0.01)
    assert p1 > 0.95 and p2 == 0.0
    assert bayes.decision(p1, pr, p2) == "method_1"
    assert bayes.decision(*bayes.signed_rank_probs(worse, better, 0.01)) == "method_2"
    same = better + np.array([0.001, -0.001, 0.0, 0.002, -0.002])
    assert bayes.decision(*bayes.signed_rank_probs(better, same, 0.01)) == "equal"
    assert bayes.decision(0.6, 0.3, 0.1) == "undecided"


def test_max_attainable_grows_and_matches_a_direct_computation():
    vals = [bayes.max_attainable(n) for n in range(1, 8)]
    assert vals == sorted(vals) and vals[0] < 0.95 <= vals[1]
    ref = baycomp.SignedRankTest.probs(np.full(3, 1.1) + [0, 1e-6, 2e-6], np.zeros(3), 0.01, random_state=0)
    assert bayes.max_attainable(3) == pytest.approx(ref[0], abs=1e-12)


# ------------------------------------------------------------- design power

def _exact_wilcoxon_floor(n):
    return sps.wilcoxon(np.arange(1, n + 1), method="exact").pvalue


@pytest.mark.parametrize("n", [3, 5, 6, 11])
def test_wilcoxon_floor_is_the_exact_test_at_its_most_extreme(n):
    assert power.wilcoxon_floor(n) == pytest.approx(_exact_wilcoxon_floor(n))
    assert power.wilcoxon_floor(n, 10) == pytest.approx(min(1.0, 10 * _exact_wilcoxon_floor(n)))


def test_friedman_and_nemenyi_floors_equal_the_tests_on_perfectly_concordant_blocks():
    n, k = 4, 5
    blocks = np.tile(np.arange(k, dtype=float), (n, 1))  # every block ranks the methods alike
    assert power.friedman_floor(n, k) == pytest.approx(sps.friedmanchisquare(*blocks.T).pvalue)
    p = stats.nemenyi_pvalues(blocks)
    assert power.nemenyi_floor(n, k) == pytest.approx(p[0, k - 1])


def test_tau_floor_is_the_permutation_test_at_perfect_agreement():
    x = np.arange(5.0)
    assert stats.tau_permutation_test(x, x)[1] == pytest.approx(power.tau_floor(5))


def test_the_tests_are_one_enum_and_no_wing_spells_their_names():
    import re
    from pathlib import Path

    assert set(power.WHAT) == set(power.StatTest) == set(power.FLOORS) | {power.StatTest.BAYES_SIGNED_RANK}
    assert {d.test for d in power.design_tests(5, 3, 4)} == set(power.StatTest)
    with pytest.raises(ValueError):
        power.TestDesign("wilcoxon", 5, 2)
    names = "|".join(re.escape(t) for t in power.StatTest)
    spelt = re.compile(f"(==|!=|TestDesign\\()\\s*[\"']({names})[\"']")  # code deciding by a test's name
    harness = Path(power.__file__).resolve().parent.parent
    found = [f"{p.relative_to(harness)}:{i}" for p in sorted(harness.rglob("*.py")) if p.name != "power.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if spelt.search(line)]
    assert not found, f"use analysis.power.StatTest: {found}"
    rows = pd.DataFrame({"test": [power.StatTest.WILCOXON_HOLM, "wilcoxon-holm", "friedman"],
                         "reachable": [True, True, False]})
    assert power.wilcoxon_decides(rows) and not power.wilcoxon_decides(rows.assign(reachable=[True, False, True]))


def test_power_rows_say_what_cannot_reach_alpha_and_what_is_needed():
    rows = {r["test"]: r for r in power.design_power(5, 10, 5, rope=0.01)}
    w = rows["wilcoxon-holm"]
    assert not w["reachable"] and w["blocks_needed"] == 11  # 45 pairs: 45 * 2 / 2^11 < 0.05
    assert "5 task orders" in w["message"] and "needs >= 11" in w["message"]
    assert rows["friedman"]["reachable"] and rows["bayes-signed-rank"]["reachable"]
    assert rows["bayes-signed-rank"]["max_prob"] >= 0.95
    assert not power.power_row(power.TestDesign("wilcoxon-holm", 5, 2, 1), 0.01)["reachable"]  # 0.0625
    assert power.power_row(power.TestDesign("wilcoxon-holm", 6, 2, 1), 0.01)["reachable"]      # 0.03125


# ------------------------------------------------------------- library-backed tests

def test_tau_and_holm_against_hand_computations():
    x, y = np.array([1.0, 2, 3, 4, 4]), np.array([1.0, 3, 2, 4, 5])
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(5), 2):
        s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
        conc += s > 0
        disc += s < 0
        tx += x[i] == x[j]
        ty += y[i] == y[j]
    n0 = 10
    assert stats.kendall_tau_b(x, y) == pytest.approx((conc - disc) / math.sqrt((n0 - tx) * (n0 - ty)))
    p = [0.01, 0.04, math.nan, 0.03]
    assert stats.holm(p)[[0, 1, 3]] == pytest.approx([0.03, 0.06, 0.06])  # 3*0.01, max(2*0.03, ..)
    assert math.isnan(stats.holm(p)[2])


def test_tau_permutation_p_by_enumeration():
    x, y = np.array([0.9, 0.8, 0.7, 0.6]), np.array([0.85, 0.9, 0.6, 0.7])
    tau = stats.kendall_tau_b(x, y)
    taus = [stats.kendall_tau_b(x, y[list(p)]) for p in itertools.permutations(range(4))]
    expected = np.mean(np.abs(taus) >= abs(tau) - 1e-12)
    assert stats.tau_permutation_test(x, y)[1] == pytest.approx(expected)


# ------------------------------------------------------------- degenerate regimes, reversals

def _rec(spec, acc=None, matrix=None):
    """A hand-made ok record: its spec, a final ACC and/or an accuracy matrix."""
    acc = acc if acc is not None else float(np.mean(matrix[-1]))
    return record_from({"spec": spec.to_dict(), "run_id": f"{spec.dataset.name}-{spec.regime}-{spec.method}-{spec.order}",
                        "metrics": {"acc": acc, "forgetting": 0.0}, "acc_matrix": matrix or []})


def _spec(dataset="digits", **kw):
    from harness.config.specs import DatasetSpec

    return make_spec(dataset=DatasetSpec(dataset, 5, 2, "mlp"), **kw)


def _records(scores: dict) -> list:
    """scores: {(regime, method): [acc per order]} -> records on one dataset."""
    return [_rec(_spec(regime=rg, method=m, order=order), acc=a)
            for (rg, m), accs in scores.items() for order, a in enumerate(accs)]


def test_degenerate_regime_is_left_out_of_tau_w_and_the_headline():
    base = [0.90, 0.91, 0.92, 0.93, 0.94]
    scores = {("head", m): base for m in ("naive", "lwf", "gpm", "ewc")}
    for i, m in enumerate(("naive", "lwf", "gpm", "ewc")):
        scores[("last-1", m)] = [a - 0.03 * i for a in base]
        scores[("full", m)] = [a - 0.03 * (3 - i) for a in base]
    t = analyse(_records(scores))
    deg = t.degenerate.set_index("regime")
    assert deg.at["head", "degenerate"] and not deg.at["full", "degenerate"]
    assert "all 4 methods" in deg.at["head", "reason"]
    tau = t.tau.set_index(["regime_a", "regime_b"])
    assert math.isnan(tau.at[("head", "full"), "tau"]) and "head left out" in tau.at[("head", "full"), "note"]
    assert tau.at[("last-1", "full"), "tau"] == pytest.approx(-1.0)
    assert t.w_regimes.iloc[0]["n_regimes"] == 2 and t.w_regimes.iloc[0]["regimes_left_out"] == "head"
    h = headline(t)
    assert [d["regime"] for d in h["degenerate"]] == ["head"]
    assert h["shallow_deep"][0]["a"] == "last-1"
    # every pair is credibly ordered one way in last-1 and the other in full: 6 credible reversals
    assert h["credible"] == 6 and len(t.credible_reversals) == 6
    assert set(t.credible_reversals["regime_a"]) == {"last-1"}
    assert t.reversals["credible"].sum() == 6


def test_tie_groups_and_near_ties():
    om = pd.DataFrame({"a": [0.5, 0.6], "b": [0.5, 0.6 + 1e-9], "c": [0.4, 0.6]})
    assert tie_groups(om, 1e-6) == [["a", "b"], ["c"]]
    frame = records_to_frame(_records({("head", m): [0.5, 0.6] for m in "ab"} | {("head", "c"): [0.5, 0.61]}))
    row = degenerate_table(frame, Cells(frame)).iloc[0]
    assert not row["degenerate"] and row["largest_tie"] == 2 and row["tied"] == "a, b"


def test_a_practically_equal_regime_names_the_rope_and_the_credible_level(monkeypatch):
    from harness.analysis import degenerate

    frame = records_to_frame(_records({("head", "a"): [0.5, 0.6], ("head", "b"): [0.51, 0.6]}))
    equal = pd.DataFrame([{"dataset": frame["dataset"].iloc[0], "regime": "head", "method_1": "a",
                           "method_2": "b", "decision": "equal"}])
    monkeypatch.setattr(degenerate, "CREDIBLE", 0.9)  # the reason states the level, not a copy of it
    row = degenerate_table(frame, Cells(frame), bayes=equal, rope_points=0.5).iloc[0]
    assert row["degenerate"] and row["reason"].endswith("(Bayesian signed-rank, ROPE 0.5 ACC points, P >= 0.9)")


def test_credible_reversals_need_credibility_in_both_regimes():
    table = pd.DataFrame([
        {"dataset": "d", "regime": "head", "method_1": "a", "method_2": "b", "diff": 0.02, "p_1": 0.97,
         "p_rope": 0.03, "p_2": 0.0, "decision": "method_1"},
        {"dataset": "d", "regime": "full", "method_1": "a", "method_2": "b", "diff": -0.02, "p_1": 0.0,
         "p_rope": 0.1, "p_2": 0.9, "decision": "undecided"},
        {"dataset": "d", "regime": "last-1", "method_1": "a", "method_2": "b", "diff": -0.03, "p_1": 0.0,
         "p_rope": 0.02, "p_2": 0.98, "decision": "method_2"}])
    out = credible_reversals(table, ["head", "last-1", "full"])
    assert len(out) == 1 and out.iloc[0][["regime_a", "regime_b"]].tolist() == ["head", "last-1"]
    assert out.iloc[0]["strength"] == pytest.approx(0.97)
    assert credible_reversals(table, ["head", "last-1", "full"], {"d": {"last-1": "degenerate"}}).empty


def test_bayes_table_pools_datasets_and_uses_the_rope():
    recs = []
    for ds in ("digits", "mnist1d"):
        for m, off in (("a", 0.0), ("b", 0.004)):  # 0.4 points apart: inside a 1-point ROPE
            for order in range(4):
                recs.append(_rec(_spec(ds, method=m, order=order), acc=0.9 + 0.01 * order + off))
    frame = records_to_frame(recs)
    table = bayes_table(Cells(frame), rope=0.01)
    pooled = table[table["dataset"] == "(all)"].iloc[0]
    assert pooled["n_blocks"] == 8 and pooled["decision"] == "equal"
    narrow = bayes_table(Cells(frame), rope=0.001)
    assert narrow[narrow["dataset"] == "(all)"].iloc[0]["decision"] == "method_2"


# ------------------------------------------------------------- curves

def test_seen_task_accuracy_by_hand():
    R = [[0.9, 0.1, 0.2], [0.7, 0.8, 0.3], [0.6, 0.5, 0.4]]
    assert seen_task_accuracy(R) == pytest.approx([0.9, 0.75, 0.5])


def test_task_curves_mean_over_runs():
    recs = [_rec(_spec(order=o), matrix=[[0.9, 0.5], [0.6 + 0.1 * o, 0.8]]) for o in range(3)]
    c = task_curves(recs)
    assert c["task"].tolist() == [1, 2]
    assert c.iloc[1]["acc"] == pytest.approx(np.mean([(0.6 + 0.1 * o + 0.8) / 2 for o in range(3)]))
    assert c.iloc[1]["acc_lo"] <= c.iloc[1]["acc"] <= c.iloc[1]["acc_hi"]


# ------------------------------------------------------------- where the power warnings appear

def test_dry_run_warns_about_tests_the_design_cannot_decide(cli, tmp_path):
    code, out, _ = cli("run", "--protocol", "depth-sweep-mini", "--dry-run", "--results", tmp_path)
    assert code == 0
    assert "power warning: paired Wilcoxon" in out and "needs >= 11 task orders" in out


def test_summary_power_lines_name_the_cells():
    from harness.analysis.tables import power_summary

    scores = {("head", m): [0.9, 0.91, 0.92] for m in "ab"} | {("full", m): [0.8, 0.85, 0.83] for m in "ab"}
    lines = power_summary(records_to_frame(_records(scores)))
    assert any(ln.startswith("power warning (digits/head, digits/full): paired Wilcoxon") for ln in lines)
    assert all("Bayesian" not in ln for ln in lines)  # 3 blocks are enough for P >= 0.95


def test_one_block_decides_nothing_even_when_every_method_ties():
    frame = records_to_frame(_records({("head", m): [0.9] for m in "abc"}))
    table = bayes_table(Cells(frame), rope=0.01)
    assert (table["p_rope"] == 1.0).all()  # what the test says of one tied block ...
    assert (table["decision"] == "undecided").all()  # ... is no evidence: 1 block cannot reach 0.95


def test_headline_reports_the_strongest_flips_and_whether_wilcoxon_can_decide():
    base = [0.90, 0.91, 0.92, 0.93, 0.94]
    scores = {}
    for i, m in enumerate(("naive", "lwf", "gpm", "ewc")):
        scores[("last-1", m)] = [a - 0.03 * i for a in base]
        scores[("full", m)] = [a - 0.03 * (3 - i) for a in base]
    h = headline(analyse(_records(scores)))
    assert not h["wilcoxon_decides"]  # 5 orders: p >= 0.0625 for any pair
    strengths = [r["strength"] for r in h["top_reversals"]]
    assert len(strengths) == 3 and strengths == sorted(strengths, reverse=True) and strengths[0] >= 0.95


def test_class_il_cells_show_the_task_aware_view_too(tmp_path):
    from harness.outputs.site import build_site

    recs = [record_from({"spec": _spec(method=m, order=o, scenario="class-il").to_dict(), "run_id": f"{m}{o}",
                         "metrics": {"acc": 0.5 + 0.01 * o, "forgetting": 0.4},
                         "metrics_task_aware": {"acc": 0.9 + 0.01 * o, "forgetting": 0.05}})
            for m in "ab" for o in range(3)]
    t = analyse(recs)
    row = t.methods.iloc[0]
    assert row["acc_task_aware"] == pytest.approx(0.91) and row["acc"] == pytest.approx(0.51)
    index = build_site(recs, tmp_path / "site")
    page = next(index.parent.glob("dataset-*.html")).read_text()
    assert "TA 91.0/5.0" in page and "evaluated task-aware" in page


def test_near_ties_of_a_degenerate_regime_are_not_counted_as_reversals():
    base = [0.90, 0.91, 0.92, 0.93, 0.94]
    scores = {("head", "a"): [v + 1e-7 for v in base], ("head", "b"): base, ("head", "c"): base}
    for i, m in enumerate("abc"):
        scores[("last-1", m)] = [v - 0.03 * i for v in base]
        scores[("full", m)] = [v - 0.03 * (2 - i) for v in base]
    t = analyse(_records(scores))
    assert t.degenerate.set_index("regime").at["head", "degenerate"]
    assert "head" not in set(t.reversals["regime_a"]) | set(t.reversals["regime_b"])
    h = headline(t)
    assert h["reversals"] == 3 and h["pairs_compared"] == 3  # last-1 vs full only


def test_signed_rank_refuses_what_baycomp_would_not_compute():
    with pytest.raises(ValueError):
        bayes.signed_rank_probs([0.9, math.nan], [0.8, 0.8], 0.01)
    with pytest.raises(ValueError):
        bayes.signed_rank_probs([0.9], [0.8], -0.01)


def test_power_of_tests_that_do_not_exist():
    assert power.friedman_floor(10, 2) == 1.0  # Friedman needs 3 methods
    assert power.wilcoxon_floor(10, 0) == 1.0  # no pair, nothing to call significant


def test_a_regime_where_every_pair_is_practically_equal_is_degenerate():
    base = [0.90, 0.91, 0.92, 0.93, 0.94]
    wiggle = [0.001, -0.001, 0.002, 0.0, -0.002]
    scores = {("head", m): [b + k * w for b, w in zip(base, wiggle)] for k, m in enumerate("abc")}
    for i, m in enumerate("abc"):
        scores[("full", m)] = [v - 0.03 * i for v in base]
    t = analyse(_records(scores))
    deg = t.degenerate.set_index("regime")
    assert deg.at["head", "degenerate"] and "practically equal" in deg.at["head", "reason"]
    assert deg.at["head", "largest_tie"] == 1  # not identical: the ROPE decided it
    assert not deg.at["full", "degenerate"]
    narrow = analyse(_records(scores), rope=0.01).degenerate.set_index("regime")
    assert not narrow.at["head", "degenerate"]  # a 0.01-point ROPE: the wiggles are real differences
