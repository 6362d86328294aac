"""Leaderboard pages in detail: the method x regime grid, p-values, sweeps, curves, class-IL matrices,
and the statistics sections the analysis adds (power, Bayesian comparisons, credible reversals,
degenerate regimes), each rendered when its table is there and skipped when it is not."""
import copy
import json
import re
from dataclasses import replace
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import diagnostics
from harness.analysis.diagnostics import Sweep, TaskSweep
from harness.analysis.tables import analyse
from harness.config.specs import RunRecord
from harness.outputs import charts, site
from harness.outputs.site import build_site, slug

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
LONG = "D with a long user label, to stress the layout"


def _sweep(alpha: float) -> dict:
    """One task's alpha_sweep entry as BecameStrategy._sweep records it (peak at alpha = 0.6)."""
    grid = [{"acc_seen": 0.9 - (a / 10 - 0.6) ** 2 / 4, "alpha": a / 10} for a in range(11)]
    return {"alpha": alpha, "closed_form": alpha, "grid": grid}


def rich_records() -> list[RunRecord]:
    """The fixture records, with BECAME / MagMax names, BECAME alpha sweeps, one class-IL run and a
    long method label (the shapes real sweeps give the site)."""
    raw = json.loads(FIXTURE.read_text())
    for r in raw:
        r["spec"]["method"] = {"b": "became", "c": "magmax"}.get(r["spec"]["method"], r["spec"]["method"])
        if r["spec"]["method"] == "d":
            r["spec"]["label"] = LONG
        if r["spec"]["method"] == "became" and r["status"] == "ok":
            alpha = r["diagnostics"]["alpha"][1]
            r["diagnostics"].update(alpha_sweep=[None, _sweep(alpha)], alpha_closed_form_all=[None, alpha])
    cil = copy.deepcopy(next(r for r in raw if r["status"] == "ok" and r["spec"]["method"] == "a"))
    cil["run_id"] = "classil00000"
    cil["spec"]["scenario"] = "class-il"
    cil["acc_matrix_task_aware"] = [[0.97, 0.5], [0.96, 0.93]]
    cil["metrics_task_aware"] = {"acc": 0.945, "la": 0.95, "bwt": -0.01, "forgetting": 0.01, "fwt": 0.0, "aia": 0.953}
    return [RunRecord.from_dict(r) for r in raw + [cil]]


class _Text(HTMLParser):
    """Visible text (scripts and styles left out) and every title attribute."""

    def __init__(self):
        super().__init__()
        self.parts, self.titles, self._skip = [], [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")
        self.titles += [v for k, v in attrs if k == "title" and v]

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())


def _page(path: Path) -> _Text:
    p = _Text()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


@pytest.fixture(scope="module")
def records():
    return rich_records()


@pytest.fixture(scope="module")
def built(tmp_path_factory, records):
    out = tmp_path_factory.mktemp("pages")
    build_site(records, out, results_dir="results")
    return out


def _ds(out: Path) -> Path:
    return out / f"dataset-{slug('toy')}.html"


# ------------------------------------------------------------------ p-values

def test_pages_with_p_values_never_print_a_four_decimal_zero(built):
    for page in (built / "index.html", _ds(built)):
        html = page.read_text(encoding="utf-8")
        assert "0.0000" not in html and "p = —" not in html and "p —" not in html, page.name
        assert not re.search(r"p = 0\.\d{4}", html), page.name


# ------------------------------------------------------------------ data-set page

def test_grid_has_methods_as_rows_and_regimes_as_columns_in_depth_order(built):
    html = _ds(built).read_text(encoding="utf-8")
    grid = html[html.index('<table class="gridt">'):]
    grid = grid[:grid.index("</table>")]
    heads = re.findall(r'<span class="tag [^"]*"[^>]*>([^<]+)</span>', grid[:grid.index("</thead>")])
    assert heads == ["head", "last-1", "full"]
    rows = re.findall(r'<tr><td class="l"><a href="method-[^"]+">([^<]+)</a>', grid)
    assert rows == ["A", "B", "C", LONG]


def test_grid_cell_shows_acc_ci_forgetting_and_marks_the_best(built, records):
    html = _ds(built).read_text(encoding="utf-8")
    mt = analyse(records).methods
    top = mt.loc[mt.groupby("regime")["acc"].idxmax()].set_index("regime")
    best = re.findall(r'<td class="best"[^>]*><span class="acc">([\d.]+)</span> <span class="ci">± ([\d.]+)</span>', html)
    assert len(best) == 3
    a = top.loc["head"]  # A in head (its mean over the four orders and the class-IL copy)
    assert a["method"] == "A" and best[0] == (f"{a['acc'] * 100:.1f}", f"{(a['acc_hi'] - a['acc_lo']) * 50:.1f}")
    assert html.count('class="best-mark"') == 3
    assert f'<span class="fg">F {a["forgetting"] * 100:.1f}' in html  # forgetting under the ACC
    if a["acc_task_aware"] == a["acc_task_aware"]:  # the class-IL copy: its task-aware view beside it
        assert f'TA {a["acc_task_aware"] * 100:.1f}/' in html


def test_long_list_is_collapsible_and_keeps_its_download(built):
    html = _ds(built).read_text(encoding="utf-8")
    details = html[html.index('<details class="fold"><summary>All metrics'):]
    details = details[:details.index("</details>")]
    assert "<th>BWT</th>" in details and f"data/{slug('toy')}-methods.csv" in details


def test_tau_heatmap_prints_p_in_cells(built):
    html = _ds(built).read_text(encoding="utf-8")
    svg = html[html.index('aria-label="Kendall tau heatmap'):]
    svg = svg[:svg.index("</svg>")]
    shown = re.findall(r'font-size="9"[^>]*>p ([^<]+)</text>', svg)
    assert shown and all(re.fullmatch(r"(= \d\.\d{3}|&lt; 0\.001)", s) for s in shown), shown


def test_curves_panel_per_regime_with_bands(built, records):
    html = _ds(built).read_text(encoding="utf-8")
    assert html.count('aria-label="accuracy on seen tasks,') == 3
    assert html.count("<polygon") >= 3  # CI bands
    assert "after training task t" in html


def test_reversals_credible_first_and_full_list_collapsed_at_the_end(built):
    html = _ds(built).read_text(encoding="utf-8")
    credible = html.index("credible reversal")
    full = html.index('id="all-reversals"')
    assert credible < html.index("Update norm and forgetting") < full
    assert "<details" in html[full:full + 400]
    assert "0.998" in html[credible:full]  # the fixture's P of the credible flips


def test_every_chart_has_an_svg_download_button(built):
    for page in [_ds(built), built / "index.html", built / f"method-{slug('B')}.html",
                 built / "runs" / f"{slug('classil00000')}.html"]:
        html = page.read_text(encoding="utf-8")
        figures = html.count('<figure class="chart">')
        assert figures and figures == html.count('class="svg-dl"'), page.name
        assert figures == len(re.findall(r'<figure class="chart">.*?<svg xmlns=', html, re.S)), page.name


# ------------------------------------------------------------------ method and run pages

def test_method_page_shows_description_reference_and_the_alpha_sweep(built):
    page = _page(built / f"method-{slug('B')}.html")
    assert "BECAME: GPM stage + free stage" in page.text and "Li et al., ICML 2025" in page.text
    html = (built / f"method-{slug('B')}.html").read_text(encoding="utf-8")
    assert html.count('aria-label="acc_seen against alpha"') == 3  # one per regime
    assert "chosen alpha = 0.250 (task 2)" in html  # the record's chosen alpha, head regime
    assert "best alpha on the grid" in page.text and "0.60" in page.text


def test_sweep_curve_is_the_mean_over_runs(records):
    mine = [r for r in records if r.method == "B" and r.spec.regime == "head"]
    panel = charts.sweep_panel(diagnostics.sweeps(mine, ["head"])[0], 100.0)
    assert panel["x_key"] == "alpha" and panel["y_key"] == "acc_seen" and panel["percent"]
    row = panel["rows"][0]
    assert row["task"] == 2 and row["n"] == 4 and row["marks"]["alpha"] == pytest.approx(0.25)
    assert row["best_x"] == pytest.approx(0.6) and row["best_y"] == pytest.approx(90.0)
    assert [v["dash"] for v in panel["vlines"]] == [""]  # closed form = chosen: one solid line


def test_sweep_marks_a_closed_form_that_differs_from_the_chosen_alpha():
    sweep = Sweep("alpha_sweep", "toy", "head", "alpha", "acc_seen", True, {2: TaskSweep(
        n=1, points={0.0: [0.8], 0.5: [0.9], 1.0: [0.85]}, marks={"alpha": [0.0], "closed_form": [0.4]})})
    panel = charts.sweep_panel(sweep, 100.0)
    assert sorted(v["dash"] for v in panel["vlines"]) == ["", "4 3"]
    assert panel["others"] == ["closed_form"]


def test_flatten_keeps_per_task_dicts_and_leaves_sweeps_to_charts():
    assert diagnostics.flatten("alpha_sweep", [None, _sweep(0.3)]) == []
    assert diagnostics.flatten("stats", [None, {"a": 1.0, "b": "x"}, {"a": 2.0}]) == [("stats.a", [None, 1.0, 2.0])]


def test_diagnostic_means_are_elementwise_over_ok_runs_only(records):
    mine = [r for r in records if r.method == "C" and r.spec.regime == "head"]  # MagMax: 4 ok runs
    failed = replace(mine[0], status="failed", diagnostics={"task_vector_norms": [[9.0, 9.0]]})
    means = {d.name: d for d in diagnostics.diagnostic_means([*mine, failed], ["head"])}
    assert sorted(means) == ["sign_conflicts", "task_vector_norms[0]"]
    (row,) = means["task_vector_norms[0]"].rows
    assert (row.dataset, row.regime, row.n) == ("toy", "head", 4)
    assert row.values == pytest.approx([1.0, (1.02 + 1.12 + 1.22 + 1.32) / 4])  # the fixture's norms, by hand
    assert means["sign_conflicts"].width == 2 and means["sign_conflicts"].rows[0].values == pytest.approx([0.0, 0.1])


def test_run_page_class_il_shows_both_matrices_labelled(built):
    html = (built / "runs" / f"{slug('classil00000')}.html").read_text(encoding="utf-8")
    assert "class-IL (no task id at test time)" in html and "task-aware (predictions masked" in html
    assert html.count('aria-label="accuracy matrix"') == 2
    assert ">task-aware</td>" in html and "94.50" in html
    plain = (built / "runs" / f"{slug('heA000000000')}.html").read_text(encoding="utf-8")
    assert plain.count('aria-label="accuracy matrix"') == 1 and "task-aware" not in plain


def test_run_page_spec_and_provenance_scroll_in_their_own_boxes(built):
    html = unescape((built / "runs" / f"{slug('heA000000000')}.html").read_text(encoding="utf-8"))
    assert '<pre class="box">{\n "protocol": "toy-proto"' in html
    assert "<code>total_s</code> 1.50" in html


# ------------------------------------------------------------------ overview

def test_overview_states_setup(built):
    text = _page(built / "index.html").text
    assert "Scenario class-il · task-il" in text and "Pre-training first-task" in text  # every value
    assert "1 epoch per task · batch 32 · sgd, lr 0.05" in text


def test_overview_setup_lists_every_value(tmp_path, records):
    other = [RunRecord.from_dict({**r.to_dict(), "spec": {**r.spec.to_dict(), "training": {
        **r.spec.to_dict()["training"], "lr": 0.1}}}) for r in records[:2]]
    build_site(records + other, tmp_path)
    assert "lr 0.05 · 0.1" in _page(tmp_path / "index.html").text
    assert "precision" not in _page(tmp_path / "index.html").text.split("Training", 1)[1].split("Budget", 1)[0]


def test_overview_names_a_bf16_precision(tmp_path, records):
    bf16 = [RunRecord.from_dict({**r.to_dict(), "spec": {**r.spec.to_dict(), "training": {
        **r.spec.to_dict()["training"], "precision": "bf16"}}}) for r in records]
    build_site(bf16, tmp_path)
    assert "precision bf16 (autocast)" in _page(tmp_path / "index.html").text


def test_headline_leads_with_credible_reversals(built):
    text = _page(built / "index.html").text
    head = text[text.index("Do rankings survive a change of regime?"):]
    assert head.index("5 credible rank reversals") < head.index("Kendall τ")
    assert "beats" in head and "P = 0.998" in head


# ------------------------------------------------------------------ optional statistics tables

def _inject(monkeypatch, **frames):
    """analyse() returns the real result with these tables replaced (a function: applied to the real one)."""
    def fake(records, include_flagged=False, rope=1.0, **kw):
        t = analyse(records, include_flagged=include_flagged, rope=rope, **kw)
        return replace(t, **{k: v(getattr(t, k)) if callable(v) else v for k, v in frames.items()})
    monkeypatch.setattr(site, "analyse", fake)


def _empty(df: pd.DataFrame) -> pd.DataFrame:
    return df.iloc[:0]


POWER = pd.DataFrame([
    {"dataset": "toy", "regime": "head", "test": "wilcoxon-holm", "n_blocks": 4, "n_items": 2, "n_comparisons": 6,
     "min_p": 0.75, "max_prob": float("nan"), "alpha": 0.05, "threshold": float("nan"), "reachable": False,
     "blocks_needed": 8, "message": "paired Wilcoxon: 4 task orders give p >= 0.75; needs >= 8 task orders"},
    {"dataset": "toy", "regime": "head", "test": "friedman", "n_blocks": 4, "n_items": 4, "n_comparisons": 1,
     "min_p": 0.00001, "max_prob": float("nan"), "alpha": 0.05, "threshold": float("nan"), "reachable": True,
     "blocks_needed": 3, "message": ""}])
BAYES = pd.DataFrame([
    {"dataset": "toy", "regime": "head", "method_1": "A", "method_2": "B", "n_blocks": 4, "diff": 0.06,
     "p_1": 0.987, "p_rope": 0.013, "p_2": 0.0, "rope": 0.01, "decision": "method_1"},
    {"dataset": "toy", "regime": "head", "method_1": "A", "method_2": "C", "n_blocks": 4, "diff": 0.001,
     "p_1": 0.02, "p_rope": 0.97, "p_2": 0.01, "rope": 0.01, "decision": "equal"}])
CREDIBLE = pd.DataFrame([
    {"dataset": "toy", "method_1": "A", "method_2": "C", "regime_a": "head", "regime_b": "full",
     "diff_a": 0.11, "diff_b": -0.15, "p_a": 0.9712, "p_b": 0.9654, "strength": 0.9654}])
DEGENERATE = pd.DataFrame([
    {"dataset": "toy", "regime": "head", "n_methods": 4, "degenerate": True, "largest_tie": 4, "tied": "A, B, C, D",
     "spread": 0.0, "reason": "all 4 methods score within 1e-06 of each other"},
    {"dataset": "toy", "regime": "full", "n_methods": 3, "degenerate": False, "largest_tie": 1, "tied": "",
     "spread": 0.2, "reason": ""}])


def test_power_table_and_warnings_on_overview_and_dataset_page(tmp_path, monkeypatch, records):
    _inject(monkeypatch, power=POWER)
    build_site(records, tmp_path)
    for page in (tmp_path / "index.html", _ds(tmp_path)):
        html = page.read_text(encoding="utf-8")
        assert "Design power" in html and '<div class="warnbox">' in html
        box = html[html.index('<div class="warnbox">'):]
        assert "needs &gt;= 8 task orders" in box[:box.index("</div>")]
        assert '<tr class="warn">' in html and "&lt; 0.001" in html  # the p filter on the smallest p


def test_bayes_matrix_per_regime_collapsible_and_downloadable(tmp_path, monkeypatch, records):
    _inject(monkeypatch, bayes=BAYES)
    build_site(records, tmp_path)
    html = _ds(tmp_path).read_text(encoding="utf-8")
    section = html[html.index("Pairwise Bayesian comparisons"):html.index("<h2>Design power")]
    assert section.count('<details class="fold">') == 1  # head only
    assert '<td class="row"' in section and '<td class="col"' in section and '<td class="equal"' in section
    assert "<span>0.99</span><span class=\"pe\">0.01</span><span>0.00</span>" in section
    assert f"data/{slug('toy')}-bayes.csv" in section
    assert len(json.loads((tmp_path / "data" / f"{slug('toy')}-bayes.json").read_text())) == 2


def test_credible_reversals_shown_first_with_probabilities(tmp_path, monkeypatch, records):
    _inject(monkeypatch, credible_reversals=CREDIBLE)
    build_site(records, tmp_path)
    html = _ds(tmp_path).read_text(encoding="utf-8")
    at = html.index("1</b> credible reversal")
    assert at < html.index('id="all-reversals"')
    assert "0.971" in html[at:] and "0.965" in html[at:]


def test_degenerate_regime_marked_in_grid_header_and_heatmap(tmp_path, monkeypatch, records):
    _inject(monkeypatch, degenerate=DEGENERATE)
    build_site(records, tmp_path)
    html = _ds(tmp_path).read_text(encoding="utf-8")
    assert '<th class="degenerate" title="degenerate: all 4 methods' in html
    assert html.count("degenerate †") >= 1 and "all 4 methods score within 1e-06 of each other" in _page(_ds(tmp_path)).text
    svg = html[html.index('aria-label="Kendall tau heatmap'):]
    assert "url(#hatch-" in svg[:svg.index("</svg>")] and "head †" in svg[:svg.index("</svg>")]
    assert html.count('<span class="best-mark"') == 2  # no best in the degenerate regime


def test_empty_statistics_tables_pages_still_build(tmp_path, monkeypatch, records):
    _inject(monkeypatch, power=_empty, bayes=_empty, credible_reversals=_empty, degenerate=_empty, curves=_empty)
    build_site(records, tmp_path)
    html = _ds(tmp_path).read_text(encoding="utf-8")
    assert "Pairwise Bayesian" not in html and "Accuracy over tasks" not in html and "degenerate †" not in html
    assert "<b>0</b> credible reversals" in html and "Design-power table (0 tests)" in html
    index = _page(tmp_path / "index.html").text
    assert "No credible rank reversal" in index and "Left out as degenerate" not in index


def test_rope_is_passed_to_the_analysis(tmp_path, monkeypatch, records):
    seen = {}

    def spy(records, include_flagged=False, rope=1.0):
        seen["rope"] = rope
        return analyse(records, include_flagged=include_flagged, rope=rope)
    monkeypatch.setattr(site, "analyse", spy)
    build_site(records, tmp_path, rope=2.5)
    assert seen["rope"] == 2.5
    assert "ROPE 2.5 ACC points" in _page(tmp_path / "index.html").text


# ------------------------------------------------------------------ chart geometry

def test_spread_keeps_labels_apart_and_inside():
    ys = charts.spread([50, 50, 51, 200, 10], 13, 0, 100)
    assert all(abs(a - b) >= 13 - 1e-9 for i, a in enumerate(ys) for b in ys[i + 1:])
    assert min(ys) >= 0 and max(ys) <= 100


def test_rank_shift_end_labels_do_not_overlap(records):
    mt = analyse(records).of_dataset("toy", "task-il").methods  # one panel, as its page draws it
    rs = charts.rank_shift(mt, ["head", "last-1", "full"], {})
    ys = sorted(ln["label"]["y"] for ln in rs["lines"] if ln["px"])
    assert all(b - a >= 13 - 1e-9 for a, b in zip(ys, ys[1:]))
    assert rs["width"] >= rs["L"] + rs["W"] + charts.text_width(LONG)
