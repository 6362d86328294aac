"""Regimes beyond depth on the leaderboard: family and trainable-fraction columns, regime order by
fraction, rank agreement within and across families (τ, W, reversals), a method absent by design
from some families, ρ per family, the log-fraction charts, slugs of ':' names, pretrain labels.

The numbers are checked by hand on a small grid (see GRID) and against scipy directly.
"""
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import record_from
from scipy import stats as sps
from test_figures import drawn_regime_names

from harness.analysis import correlations, families
from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.frame import records_to_frame, regime_order
from harness.analysis.tables import analyse, headline
from harness.config.pretrain import Pretrain
from harness.config.vocabulary import FAMILY_DESCRIPTIONS
from harness.outputs.formatting import MISSING, fraction_text

# Mean ACC per regime and method (G is "gpm": depth regimes only). Depth regimes agree with each
# other but for `full`, which swaps A/B and C/G; bitfit and both lora regimes reverse A > B > C.
GRID = {
    "head": {"A": .90, "B": .80, "C": .70, "gpm": .60},
    "last-1": {"A": .91, "B": .81, "C": .72, "gpm": .65},
    "full": {"A": .85, "B": .88, "C": .70, "gpm": .75},
    "bitfit": {"A": .70, "B": .75, "C": .80},
    "lora-r4": {"A": .72, "B": .74, "C": .78},
    "last-2:lora-r4": {"A": .71, "B": .76, "C": .79},
}
# Trainable fraction of each regime: the order they take is head, bitfit, last-2:lora-r4, lora-r4, last-1, full.
FRACTION = {"head": 0.01, "bitfit": 0.02, "last-2:lora-r4": 0.03, "lora-r4": 0.05, "last-1": 0.2, "full": 1.0}
TOTAL = 100_000
ORDERS = 4
PRETRAIN = {"dataset": "digits", "holdout": 0.25, "epochs": 5, "lr": 0.05, "batch_size": 64, "seed": 0}
PRETRAIN_LABEL = "dataset digits (batch_size 64, epochs 5, holdout 0.25, lr 0.05, seed 0)"


def _record(ds: str, regime: str, method: str, order: int, acc: float, **extra):
    # A small per-order wobble that never changes a ranking; norms and forgetting grow with the fraction.
    acc = acc + 0.002 * ((order * 7 + len(method)) % 3 - 1)
    frac = FRACTION[regime]
    forgetting = 0.02 + 0.1 * frac + 0.001 * order
    params = {"trainable": round(frac * TOTAL), "total": TOTAL, "trainable_shared": round(frac * TOTAL) - 100,
              "per_head": 50, "fraction": frac}
    return record_from({
        "run_id": f"{ds}-{regime}-{method}-{order}".replace(":", "_"),
        "spec": {"dataset": {"name": ds, "n_tasks": 2, "classes_per_task": 2, "model": "mlp"}, "regime": regime,
                 "method": method, "order": order, "pretrain": PRETRAIN},
        "acc_matrix": [[acc + forgetting, 0.5], [acc, acc]],
        "metrics": {"acc": acc, "la": acc + forgetting / 2, "bwt": -forgetting, "forgetting": forgetting,
                    "fwt": 0.0, "aia": acc},
        "update_norms": {"shared": [None, 1.0 + 5 * frac + 0.01 * order], "step_forgetting": [None, forgetting]},
        "params": params, "n_blocks": 4, "timings": {"total_s": 1.0}, **extra})


def mixed_records(datasets=("toy",), grid=GRID) -> list:
    """Every (dataset, regime, method, order) of grid as an ok record: a protocol mixing four families."""
    return [_record(ds, rg, m, o, acc) for ds in datasets for rg, row in grid.items()
            for m, acc in row.items() for o in range(ORDERS)]


@pytest.fixture(scope="module")
def records():
    return mixed_records()


@pytest.fixture(scope="module")
def tables(records):
    return analyse(records)


def _tau(a: str, b: str) -> float:
    """Kendall tau_b of GRID's mean ACC between two regimes over their common methods (scipy)."""
    common = sorted(set(GRID[a]) & set(GRID[b]))
    return sps.kendalltau([GRID[a][m] for m in common], [GRID[b][m] for m in common]).statistic


# ------------------------------------------------------------------ frame and order

def test_frame_has_family_and_trainable_fraction(records):
    frame = records_to_frame(records)
    row = frame[frame["regime"] == "last-2:lora-r4"].iloc[0]
    assert row["family"] == "lora" and row["trainable_fraction"] == pytest.approx(0.03)
    assert set(frame.loc[frame["regime"] == "head", "family"]) == {"depth"}
    # without a recorded fraction: trainable / total; without counts: NaN
    old = records_to_frame([record_from({"params": {"trainable": 10, "total": 40}}), record_from({"params": {}})])
    assert old["trainable_fraction"].iloc[0] == pytest.approx(0.25) and math.isnan(old["trainable_fraction"].iloc[1])


def test_regime_order_by_fraction(records):
    assert regime_order(records_to_frame(records)) == ["head", "bitfit", "last-2:lora-r4", "lora-r4", "last-1", "full"]


def test_regime_order_ties_and_unknown_fractions_fall_back_to_the_name():
    def rec(regime, params):
        return record_from({"spec": {"regime": regime}, "params": params})
    # a depth protocol whose records carry no counts: head < last-1 < last-2 < full, as before
    bare = [rec(r, {}) for r in ("full", "last-2", "head", "last-1")]
    assert regime_order(records_to_frame(bare)) == ["head", "last-1", "last-2", "full"]
    same = [rec(r, {"fraction": 0.1}) for r in ("norm", "bitfit", "lora-r2")]
    assert regime_order(records_to_frame(same)) == ["bitfit", "norm", "lora-r2"]  # regime_sort_key
    assert regime_order(records_to_frame([rec("full", {"fraction": 1.0}), rec("last-1", {})])) == ["full", "last-1"]


# ------------------------------------------------------------------ within / across

def test_pair_kind_labels_within_and_across():
    assert families.pair_kind("head", "full") == "within"  # head is a depth regime
    assert families.pair_kind("lora-r4", "last-2:lora-r4") == "within"
    assert families.pair_kind("head", "bitfit") == "across"
    assert families.pair_kind("last-2:norm", "norm") == "within" and families.pair_kind("last-2", "last-2:norm") == "across"


def test_family_tau_lists_each_pair_once_labelled(tables):
    ft = tables.family_tau
    assert len(ft) == 15  # 6 regimes: 15 unordered pairs
    kinds = {(r.regime_a, r.regime_b): r.kind for r in ft.itertuples()}
    assert kinds[("head", "last-1")] == "within" and kinds[("last-2:lora-r4", "lora-r4")] == "within"
    assert kinds[("head", "bitfit")] == "across" and kinds[("bitfit", "lora-r4")] == "across"
    assert sorted(ft["kind"].value_counts().items()) == [("across", 11), ("within", 4)]
    for r in ft.itertuples():
        assert r.tau == pytest.approx(_tau(r.regime_a, r.regime_b)), (r.regime_a, r.regime_b)


def test_tau_uses_the_methods_both_regimes_have(tables):
    tau = tables.tau.set_index(["regime_a", "regime_b"])
    within = tau.loc[("head", "full")]
    assert within["n_methods"] == 4 and within["tau"] == pytest.approx(1 / 3)  # by hand: 4 of 6 pairs agree
    across = tau.loc[("head", "bitfit")]
    assert across["n_methods"] == 3 and across["tau"] == pytest.approx(-1.0)
    assert across["absent"] == "gpm" and across["excluded"] == ""  # absent by design, not a coverage gap


def test_mean_tau_within_and_across_by_hand(tables):
    s = tables.families.set_index(["dataset", "kind"])
    # within: head/last-1 1, head/full 1/3, last-1/full 1/3, lora-r4/last-2:lora-r4 1
    assert s.loc[("toy", "within"), "mean_tau"] == pytest.approx((1 + 1 / 3 + 1 / 3 + 1) / 4)
    # across: 3 depth regimes x 3 others (-1, -1, -1/3 each) and bitfit vs the 2 lora regimes (+1)
    assert s.loc[("toy", "across"), "mean_tau"] == pytest.approx((3 * (-1 - 1 - 1 / 3) + 2) / 11)
    assert s.loc[("toy", "across"), "n_pairs"] == 11 and s.loc[("toy", "within"), "n_pairs"] == 4
    assert s.loc[("toy", "across"), "min_tau"] == pytest.approx(-1)
    lo, hi = s.loc[("toy", "across"), ["tau_lo", "tau_hi"]]
    assert lo <= s.loc[("toy", "across"), "mean_tau"] <= hi and lo < hi
    assert s.loc[("(all)", "across"), "mean_tau"] == pytest.approx(s.loc[("toy", "across"), "mean_tau"])


def test_summary_pools_datasets():
    recs = mixed_records(("one", "two"))
    s = analyse(recs).families.set_index(["dataset", "kind"])
    assert s.loc[("(all)", "across"), "n_pairs"] == 22 and s.loc[("(all)", "within"), "n_pairs"] == 8
    assert s.loc[("(all)", "across"), "credible"] == s.loc[("one", "across"), "credible"] * 2


def test_kendall_w_per_family_by_hand(tables):
    w = tables.family_w.set_index("family")
    # depth, over A, B, C, gpm: rank sums 4, 5, 10, 11 around 7.5: S = 37, W = 12 S / (m^2 (n^3 - n))
    assert w.at["depth", "w"] == pytest.approx(12 * 37 / (9 * 60))
    assert w.at["depth", "n_methods"] == 4 and w.at["depth", "n_regimes"] == 3
    assert w.at["lora", "w"] == pytest.approx(1.0) and w.at["lora", "regimes"] == "last-2:lora-r4, lora-r4"
    assert "bitfit" not in w.index  # one regime: no W
    # every regime, over the methods common to all (A, B, C): rank sums 13, 11, 12 around 12, S = 2
    assert w.at["(all)", "w"] == pytest.approx(12 * 2 / (36 * 24)) and w.at["(all)", "absent"] == "gpm"
    assert tables.w_regimes.iloc[0]["w"] == pytest.approx(w.at["(all)", "w"])


def test_kendall_w_matches_an_independent_formula():
    # W = (12 sum R_i^2 - 3 m^2 n (n+1)^2) / (m^2 n (n^2 - 1)) for untied ranks
    r = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [2, 1, 4, 3]], float)
    m, n = r.shape
    w = (12 * (r.sum(0) ** 2).sum() - 3 * m * m * n * (n + 1) ** 2) / (m * m * n * (n * n - 1))
    assert w == pytest.approx(12 * 37 / (9 * 60))


def test_credible_reversals_split_within_and_across(tables):
    cred = tables.credible_reversals
    per = cred[cred["dataset"] == "toy"]
    assert set(per["kind"]) <= {"within", "across"} and len(per)
    s = tables.families.set_index(["dataset", "kind"])
    assert s.loc[("toy", "across"), "credible"] == (per["kind"] == "across").sum() > 0
    assert s.loc[("toy", "within"), "credible"] == (per["kind"] == "within").sum()
    # the within ones are head/last-1 vs full (A/B and C/gpm swap), never inside lora (same order)
    inside = per[per["kind"] == "within"]
    assert set(inside["regime_b"]) <= {"full"} and set(inside["family_a"]) == {"depth"}
    rev = tables.reversals
    assert s.loc[("toy", "across"), "reversals"] == (rev["kind"] == "across").sum()


def test_reversals_compare_an_absent_method_where_it_runs(tables):
    rev = tables.reversals
    with_gpm = rev[(rev["method_1"] == "gpm") | (rev["method_2"] == "gpm")]
    assert len(with_gpm) and set(with_gpm["regime_a"]) | set(with_gpm["regime_b"]) <= {"head", "last-1", "full"}
    summ = tables.reversal_summary.set_index(["regime_a", "regime_b"])
    assert summ.at[("head", "full"), "n_pairs"] == 6 and summ.at[("head", "bitfit"), "n_pairs"] == 3
    assert (summ["excluded"] == "").all()


def test_headline_sentence_only_with_two_families(tables):
    h = headline(tables)["families"]
    assert h["families"] == ["depth", "bitfit", "lora"]
    assert h["sentence"].startswith(f"Across families mean τ {(3 * (-7 / 3) + 2) / 11:.2f} [")
    assert f"(within families {2 / 3:.2f}, 4 regime pairs)" in h["sentence"]
    n = int(h["across"]["credible"])
    assert f"; {n} credible reversal{'' if n == 1 else 's'} across families" in h["sentence"]
    depth_only = analyse(mixed_records(grid={k: GRID[k] for k in ("head", "last-1", "full")}))
    assert headline(depth_only)["families"] is None


def test_family_sentence_without_pairs():
    assert families.family_sentence(None, None) == ("Across families mean τ no τ over 0 regime pairs "
                                                    "(within families no τ, 0 regime pairs); 0 credible "
                                                    "reversals across families, 0 within.")


# ------------------------------------------------------------------ absent by design: coverage

def test_coverage_does_not_report_planned_absent_cells(records):
    cov = coverage_table(records_to_frame(records))
    assert set(cov.loc[cov["method"] == "gpm", "regime"]) == {"head", "last-1", "full"}
    assert (cov["missing"] == 0).all() and cov["complete"].all()
    cells = Cells(records_to_frame(records))
    assert cells.planned("toy", "lora-r4") == ["A", "B", "C"] and "gpm" in cells.planned("toy", "full")
    assert cells.absent("toy", ["head", "bitfit"]) == ["gpm"]


def test_a_method_missing_in_one_regime_of_its_family_is_missing(records):
    recs = [r for r in records if not (r.method == "gpm" and r.spec.regime == "last-1")]
    cov = coverage_table(records_to_frame(recs)).set_index(["regime", "method"])
    assert cov.at[("last-1", "gpm"), "missing"] == ORDERS and not cov.at[("last-1", "gpm"), "complete"]
    t = analyse(recs)
    w = t.family_w.set_index("family")
    assert w.at["depth", "excluded"] == "gpm" and w.at["depth", "n_methods"] == 3
    assert t.absent["method"].tolist() == ["gpm"]


def test_absent_table_names_families_and_regimes(tables):
    row = tables.absent.iloc[0]
    assert (row["method"], row["families"], row["regimes"]) == ("gpm", "bitfit, lora", "bitfit, last-2:lora-r4, lora-r4")


def test_global_ranks_do_not_call_an_absent_method_excluded(tables):
    gr = tables.global_ranks
    assert set(gr.loc[gr["regime"] == "bitfit", "method"]) == {"A", "B", "C"}
    assert (gr["excluded"] == "").all()


# ------------------------------------------------------------------ correlations per family

def test_norm_vs_forgetting_per_family_matches_scipy(records, tables):
    nf = tables.norm_forgetting_family.set_index("family")
    frame = records_to_frame(records)
    sub = frame[frame["family"] == "lora"]
    rho = sps.spearmanr(sub["mean_update_norm"], sub["forgetting"]).statistic
    assert nf.at["lora", "rho"] == pytest.approx(rho) and nf.at["lora", "n"] == len(sub) == 24
    assert list(nf.index) == ["depth", "bitfit", "lora"] and nf.at["depth", "n_regimes"] == 3
    single = correlations.norm_vs_forgetting_by_family(records_to_frame(mixed_records(grid={"head": GRID["head"]})))
    assert single.empty  # one family: the pooled row already says it


def test_regime_table_fraction_and_counts(tables):
    rt = tables.regimes.set_index("regime")
    assert list(rt.index) == ["head", "bitfit", "last-2:lora-r4", "lora-r4", "last-1", "full"]
    assert rt.at["lora-r4", "family"] == "lora" and rt.at["lora-r4", "trainable"] == 5000
    assert rt.at["lora-r4", "fraction"] == pytest.approx(0.05) and rt.at["full", "total"] == TOTAL


# ------------------------------------------------------------------ charts: the trainable-fraction axis

def test_fraction_profile_places_regimes_by_log_fraction(tables):
    from harness.outputs import charts

    rows = charts.records_of(tables.depth_profile)
    c = charts.fraction_profile(rows, "forgetting", 100.0, {}, "forgetting %")
    x = {p["regime"]: p["x"] for p in c["points"]}
    assert sorted(x, key=x.get) == regime_order(tables.runs)
    # log scale: equal fraction ratios are equal distances (head -> bitfit and lora-r4 -> ... x2 / x2.5)
    per_decade = (x["full"] - x["head"]) / 2  # 1% -> 100%: two decades
    assert x["bitfit"] - x["head"] == pytest.approx(per_decade * math.log10(2), abs=0.2)
    assert x["last-1"] - x["lora-r4"] == pytest.approx(per_decade * math.log10(4), abs=0.2)
    assert [t["label"] for t in c["xticks"]] == ["1%", "10%", "100%"] and c["log"]
    assert [ln["family"] for ln in c["lines"]] == ["depth", "bitfit", "lora"]
    names = [t["regime"] for t in sorted(c["labels"], key=lambda t: t["x"])]
    assert names == regime_order(tables.runs)
    xs = sorted(t["x"] for t in c["labels"])
    assert all(b - a >= 17 - 1e-6 for a, b in zip(xs, xs[1:]))  # close fractions: names rotated, spread apart
    assert all(t["rotate"] for t in c["labels"])
    assert c["L"] >= 46 and c["width"] >= c["L"] + c["W"]


def test_rank_shift_on_the_fraction_axis_and_without_fractions(tables):
    from harness.outputs import charts

    mt = tables.methods
    regs = regime_order(tables.runs)
    rs = charts.rank_shift(mt, regs, {}, FRACTION)
    assert sorted(rs["x"], key=rs["x"].get) == regs and rs["log"]
    assert rs["x"]["full"] - rs["x"]["last-1"] == pytest.approx(rs["W"] * math.log10(5) / 2, abs=0.2)
    even = charts.rank_shift(mt, regs, {})
    steps = np.diff([even["x"][r] for r in regs])
    assert not even["log"] and np.allclose(steps, steps[0]) and not even["xticks"]


def test_decade_ticks_add_2_and_5_in_a_narrow_range():
    from harness.outputs import charts

    ticks = charts.decade_ticks((math.log10(0.25), 0.0), 100)
    assert [t["label"] for t in ticks] == ["50%", "100%"] and ticks[-1]["x"] == 100
    assert fraction_text(0.05) == "5.0%" and fraction_text(1.0) == "100%"
    assert fraction_text(0.000123) == "0.012%" and fraction_text(float("nan")) == MISSING


def test_regime_colours_stay_distinct_past_six():
    from harness.outputs import charts

    regs = [f"last-{k}" for k in range(1, 10)]
    colours = charts.regime_colours(regs)
    assert len(set(colours.values())) == 9 and colours["last-1"] == charts.REGIME_COLOURS[0]
    assert colours["last-9"] == charts.REGIME_COLOURS[-1]
    assert charts.regime_colours(["head", "full"]) == {"head": charts.REGIME_COLOURS[0], "full": charts.REGIME_COLOURS[1]}


def test_figures_plot_against_the_fraction_in_order(tables):
    from harness.outputs import figures

    fig = figures.rank_shift(tables, "toy")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and drawn_regime_names(ax) == regime_order(tables.runs)
    line = {c.get_label(): c.lines[0] for c in ax.containers}["B"]  # B: one point per regime, dodged a little
    xs = np.asarray(line.get_xdata(), float)
    assert np.all(np.diff(xs) > 0)
    assert xs / np.array([FRACTION[r] for r in regime_order(tables.runs)]) == pytest.approx(np.full(6, xs[0] / 0.01))
    fig.canvas.draw()


# ------------------------------------------------------------------ names with ':' and pretrain dicts

def test_slug_of_a_composed_regime_is_file_and_id_safe():
    from harness.outputs.site import slug

    s = slug("last-2:lora-r4")
    assert s == slug("last-2:lora-r4") and re.fullmatch(r"[a-z0-9-]+", s) and s.startswith("last-2-lora-r4-")
    assert s != slug("last-2-lora-r4")  # the hash keeps them apart
    assert not set(s) & set('<>:"/\\|?*')  # nothing Windows forbids in a file name


def test_pretrain_label_of_a_dict():
    assert Pretrain.from_json(PRETRAIN).label == PRETRAIN_LABEL
    assert Pretrain.from_json({"checkpoint": "/abs/p.pt", "sha256": "ab" * 32}).label == "checkpoint " + "ab" * 6
    assert Pretrain.from_json("first-task").label == "first-task"


def test_report_orders_regimes_by_fraction_and_keeps_colons(tables):
    from harness.outputs.report import report_latex, report_markdown

    md = report_markdown(tables)
    header = next(ln for ln in md.splitlines() if ln.startswith("| method"))
    assert header == "| method | " + " | ".join(regime_order(tables.runs)) + " |"
    tex = report_latex(tables)
    assert "Method & head & bitfit & last-2:lora-r4 & lora-r4 & last-1 & full \\\\" in tex
    row = next(ln for ln in md.splitlines() if ln.startswith("| gpm"))
    assert row.count("—") == 3  # absent from bitfit and both lora regimes, never imputed


# ------------------------------------------------------------------ the site

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from harness.outputs.site import build_site

    out = tmp_path_factory.mktemp("families-site")
    build_site(mixed_records(), out)
    return out


def _dataset_page(out: Path) -> Path:
    from harness.outputs.site import slug

    return out / f"dataset-{slug('toy')}.html"


def test_overview_shows_families_regimes_and_the_pretrain_label(site):
    from test_site_pages import _page

    text = _page(site / "index.html").text
    assert "Do rankings survive a change of subspace family?" in text
    assert "Across families mean τ -0.45 [" in text and "(within families 0.67, 4 regime pairs)" in text
    assert f"Pre-training {PRETRAIN_LABEL}" in text and "{" not in text.split("Pre-training")[1][:40]
    for fam, description in FAMILY_DESCRIPTIONS.items():
        if fam not in ("norm", "prompt", "prompt-deep"):  # no norm or prompt regime in this protocol
            assert f"{fam} : {description}" in text  # <b>family</b>: description
    assert FAMILY_DESCRIPTIONS["norm"] not in text and FAMILY_DESCRIPTIONS["prompt"] not in text
    regimes = text[text.index("Regimes A regime is"):]
    assert "last-2:lora-r4 lora 3.0% 3,000" in regimes and "full depth 100% 100,000" in regimes
    assert "gpm in bitfit, lora" in text


def test_depth_only_site_has_no_family_section(tmp_path):
    from test_site_pages import _page

    from harness.outputs.site import build_site

    build_site(mixed_records(grid={k: GRID[k] for k in ("head", "last-1")}), tmp_path)
    text = _page(tmp_path / "index.html").text
    assert "subspace family?" not in text
    assert "depth : " + FAMILY_DESCRIPTIONS["depth"] in text


def test_dataset_page_shows_family_fraction_w_and_rho_per_family(site):
    from test_site_pages import _page

    text = _page(_dataset_page(site)).text
    assert "last-2:lora-r4 lora · 3.0%" in text and "head depth · 1.0%" in text  # grid headers
    assert "Within and across subspace families" in text
    assert "within family 4 0.67" in text and "across families 11 -0.45" in text
    assert "depth family head, last-1, full 0.822" in text and "every regime" in text
    assert "run level, lora family last-2:lora-r4, lora-r4 24" in text
    assert "Against the trainable fraction" in text and "trainable fraction (log scale)" in text


def test_no_colon_from_a_regime_in_ids_names_or_links(site):
    for page in [site / "index.html", _dataset_page(site), *sorted(site.glob("method-*.html"))]:
        html = page.read_text(encoding="utf-8")
        for attr in ("id", "data-name", "href"):
            values = re.findall(rf'{attr}="([^"]*)"', html)
            assert not [v for v in values if ":" in v and not v.startswith(("#", "url("))], (page.name, attr)
    assert not [p for p in site.rglob("*") if ":" in p.name]


def test_mixed_family_pages_fit_1280px_in_chromium(site, tmp_path):
    import test_browser

    if test_browser.CHROMIUM is None:
        pytest.skip("chromium not installed")
    for page in (site / "index.html", _dataset_page(site)):
        m, errors = test_browser.measure(page)
        assert not errors and m["sw"] <= m["iw"], (page.name, m)
        assert not m["clipped"] and not m["svg_text"] and not m["overlaps"], (page.name, m)
        assert m["charts"] and m["buttons"] == m["charts"] == m["downloads"], (page.name, m)
