"""The board with the scenario in every key: class-IL and task-IL cells never mix, the scenario-vs-regime
tau table against hand-computed taus, the memory columns, and the site's new sections (escaped)."""
import math
import re
from pathlib import Path

import pytest
from conftest import make_spec, record_from

from harness.analysis.frame import format_summary, records_to_frame
from harness.analysis.scenarios import ALL
from harness.analysis.tables import analyse, scenario_summary
from harness.outputs.formatting import bytes_text
from harness.outputs.site import build_site, slug

XSS = "<script>alert(1)</script>"
ORDERS = range(3)


def _rec(method, regime, order, acc, scenario="class-il", ta=None, budget=None, label=""):
    """One ok record of `method` on digits; class-IL ones carry the task-aware ACC `ta`."""
    spec = make_spec(method=method, label=label, regime=regime, order=order, scenario=scenario)
    rec = {"spec": spec.to_dict(), "run_id": f"{scenario[0]}{method}{regime}{order}"[:12],
           "metrics": {"acc": acc, "forgetting": 0.1, "la": acc, "bwt": -0.1},
           "params": {"trainable": 10 if regime == "head" else 100, "total": 100}}
    if scenario == "class-il":
        rec["metrics_task_aware"] = {"acc": ta, "forgetting": 0.02}
    if budget is not None:
        rec["budget"] = budget
    return record_from(rec)


def _class_il(acc: dict, ta: dict, **kw) -> list:
    """Records over ORDERS: acc/ta {(regime, method): value}; a small order effect shared by every method."""
    return [_rec(m, rg, o, acc[(rg, m)] + 0.01 * o, ta=ta[(rg, m)] + 0.01 * o, **kw)
            for (rg, m) in acc for o in ORDERS]


# head: both views rank a > b > c; full: class-IL a > b > c, task-aware c > b > a
ACC = {("head", "a"): 0.6, ("head", "b"): 0.5, ("head", "c"): 0.4,
       ("full", "a"): 0.5, ("full", "b"): 0.4, ("full", "c"): 0.3}
TA = {("head", "a"): 0.9, ("head", "b"): 0.8, ("head", "c"): 0.7,
      ("full", "a"): 0.7, ("full", "b"): 0.8, ("full", "c"): 0.9}


@pytest.fixture(scope="module")
def tables():
    return analyse(_class_il(ACC, TA))


def test_scenario_tau_is_one_for_the_same_ranking_and_minus_one_for_the_reversed(tables):
    st = tables.scenario_tau.set_index("regime")
    assert list(st.index) == ["head", "full", ALL] and set(st["scenario"]) == {"class-il"}
    assert st.loc["head", "tau"] == pytest.approx(1.0) and st.loc["full", "tau"] == pytest.approx(-1.0)
    # 3 methods: 3! pairings, one as extreme each way -> two-sided p = 2/6
    assert st.loc["head", "p"] == pytest.approx(1 / 3) and st.loc["full", "p"] == pytest.approx(1 / 3)
    assert (st.loc[["head", "full"], "n_methods"] == 3).all()
    # the regime reorders nothing here: class-IL head and full both rank a > b > c
    assert st.loc["head", "regime_tau"] == pytest.approx(1.0) and st.loc["head", "n_regime_pairs"] == 1
    pooled = st.loc[ALL]
    assert pooled["tau"] == pytest.approx(0.0) and pooled["regime_tau"] == pytest.approx(1.0)
    assert pooled["tau_lo"] == pytest.approx(-1.0) and pooled["tau_hi"] == pytest.approx(1.0)


def test_scenario_tau_follows_the_task_aware_view_not_the_class_il_one():
    swapped = analyse(_class_il(TA, ACC)).scenario_tau.set_index("regime")
    # class-IL full now ranks c > b > a: the regime reverses head's ranking, the scenario still does in full
    assert swapped.loc["full", "tau"] == pytest.approx(-1.0)
    assert swapped.loc["head", "regime_tau"] == pytest.approx(-1.0)


def test_no_scenario_table_for_task_il_records():
    recs = [_rec(m, rg, o, ACC[(rg, m)], scenario="task-il") for (rg, m) in ACC for o in ORDERS]
    t = analyse(recs)
    assert t.scenario_tau.empty and "scenario" in t.scenario_tau.columns
    assert scenario_summary(records_to_frame(recs)) == []


def test_terminal_summary_has_the_scenario_line_and_task_aware_cells(tables):
    lines = scenario_summary(tables.runs)
    assert len(lines) == 2 and "scenario reorder methods" in lines[0]
    assert "digits: task-aware vs class-IL ranking, same runs: 0.00 (head 1.00, full -1.00)" in lines[1]
    assert "between regimes: 1.00 over 1 regime pair" in lines[1]
    text = format_summary(tables.runs)
    assert "class-IL ACC % / task-aware ACC %" in text
    assert "61.0/91.0/10.0 (3)" in text  # a in head: class-IL / task-aware / forgetting


# ------------------------------------------------------------------ scenario in the key

def _mixed() -> list:
    """digits, head, methods a and b: task-IL ranks a first in every order, class-IL b first."""
    til = [_rec(m, "head", o, acc, scenario="task-il") for m, acc in (("a", 0.9), ("b", 0.8)) for o in ORDERS]
    cil = [_rec(m, "head", o, acc, ta=0.9) for m, acc in (("a", 0.3), ("b", 0.5)) for o in ORDERS]
    return til + cil


def test_task_il_and_class_il_cells_are_ranked_apart():
    t = analyse(_mixed())
    ranks = t.methods.set_index(["scenario", "method"])["mean_rank"]
    assert ranks[("task-il", "a")] == 1 and ranks[("task-il", "b")] == 2
    assert ranks[("class-il", "a")] == 2 and ranks[("class-il", "b")] == 1
    assert len(t.methods) == 4 and (t.methods["n_runs"] == 3).all()
    assert set(map(tuple, t.order_ranks[["scenario", "method"]].drop_duplicates().to_numpy())) == \
        {("task-il", "a"), ("task-il", "b"), ("class-il", "a"), ("class-il", "b")}
    g = t.global_ranks.set_index(["scenario", "method"])["mean_rank"]
    assert g[("task-il", "a")] == 1 and g[("class-il", "b")] == 1
    acc = t.methods.set_index(["scenario", "method"])["acc"]
    assert acc[("class-il", "a")] == pytest.approx(0.3) and acc[("task-il", "a")] == pytest.approx(0.9)
    for name, df in t.tables().items():
        assert "scenario" in df.columns, name


def test_the_terminal_summary_keeps_the_scenarios_apart():
    text = format_summary(records_to_frame(_mixed()))
    assert "dataset: digits (class-il)" in text and "dataset: digits (task-il)" in text
    assert "30.0/90.0/10.0 (3)" in text and "90.0/10.0 (3)" in text


# ------------------------------------------------------------------ memory

def test_memory_columns_are_the_last_task_values_and_nan_when_undeclared():
    budget = {"optimizer_steps": 10, "samples_seen": 320, "memory_samples": [0, 100, 200],
              "memory_bytes": [0, 1024, 3 * 1024 ** 2]}
    recs = [_rec("replay", "head", 0, 0.5, ta=0.8, budget=budget),
            _rec("naive", "head", 0, 0.4, ta=0.8, budget={"optimizer_steps": 10, "samples_seen": 320,
                                                          "memory_samples": None, "memory_bytes": None}),
            _rec("lwf", "head", 0, 0.4, ta=0.8, budget={"optimizer_steps": 10, "samples_seen": 320})]
    frame = records_to_frame(recs).set_index("method")
    assert frame.loc["replay", "memory_samples"] == 200 and frame.loc["replay", "memory_bytes"] == 3 * 1024 ** 2
    assert math.isnan(frame.loc["naive", "memory_samples"]) and math.isnan(frame.loc["lwf", "memory_bytes"])
    b = analyse(recs).budget.set_index("method")
    assert b.loc["replay", "memory_bytes"] == 3 * 1024 ** 2 and math.isnan(b.loc["naive", "memory_samples"])


@pytest.mark.parametrize("n, text", [(None, "—"), (float("nan"), "—"), (0, "0 B"), (512, "512 B"),
                                     (2048, "2.00 KiB"), (3 * 1024 ** 2, "3.00 MiB"),
                                     (150 * 1024 ** 2, "150 MiB"), (12.5 * 1024 ** 3, "12.5 GiB")])
def test_bytes_are_printed_in_binary_units(n, text):
    assert bytes_text(n) == text


# ------------------------------------------------------------------ site

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    budget = {"optimizer_steps": 10, "samples_seen": 320, "memory_samples": [100, 200], "memory_bytes": [1, 2048]}
    recs = _class_il(ACC, TA, budget={"optimizer_steps": 10, "samples_seen": 320})  # no memory declared
    recs += [_rec("x", rg, o, 0.45, ta=0.85, budget=budget, label=XSS) for rg in ("head", "full") for o in ORDERS]
    recs += [_rec(m, "head", o, 0.9 - 0.1 * i, scenario="task-il") for i, m in enumerate("ab") for o in ORDERS]
    out = tmp_path_factory.mktemp("site")
    build_site(recs, out, results_dir="results")
    return out


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_site_shows_scenario_tau_and_memory_escaped(site):
    page = site / f"dataset-{slug('digits · class-il')}.html"
    html = _text(page)
    assert 'id="scenario"' in html and "Does the scenario reorder methods" in html
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "task-aware ACC" in html and "200 · 2.00 KiB" in html
    index = _text(site / "index.html")
    assert "Does the scenario reorder methods as much as the regime does?" in index
    assert f'href="dataset-{slug("digits · class-il")}.html#scenario"' in index
    budget = index[index.index("<h2>Training budget</h2>"):index.index("<h2>Datasets and methods</h2>")]
    assert "200 · 2.00 KiB" in budget and budget.count('<td class="nw" data-v="">—</td>') == 3  # a, b, c declare none
    assert XSS not in index
    method = _text(site / f"method-{slug(XSS)}.html")
    assert XSS not in method and "task-aware ACC" in method and "200 · 2.00 KiB" in method


def test_site_gives_each_scenario_of_a_dataset_its_own_page(site):
    for page in site.rglob("*.html"):  # every dataset link (run pages included) names an existing page
        for link in re.findall(r'href="([^"#]*dataset-[^"#]*)', _text(page)):
            assert (page.parent / link).exists(), (page, link)
    til = _text(site / f"dataset-{slug('digits')}.html")
    assert 'id="scenario"' not in til and "task-aware ACC" not in til
    grid = til[til.index('<table class="gridt">'):til.index("</table>")]
    assert re.findall(r'<a href="method-[^"]+">([^<]+)</a>', grid) == ["a", "b"]
    index = _text(site / "index.html")
    cards = re.findall(r'<span class="muted small">(task-il|class-il)</span>', index)
    assert sorted(set(cards)) == ["class-il", "task-il"]  # global rankings per scenario


def test_a_run_page_shows_the_memory_kept_after_each_task(site):
    pages = {p: _text(p) for p in (site / "runs").rglob("*.html")}
    with_memory = [html for html in pages.values() if "memory: samples" in html]
    assert with_memory and len(with_memory) < len(pages)  # only the runs of the method that declares it
    row = with_memory[0][with_memory[0].index("memory: bytes"):]
    assert row.index("1 B") < row.index("2.00 KiB") < row.index("</tr>")
