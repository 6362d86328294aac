"""Training budget and learning-check warnings on the tables, the site and the terminal summary.

Flagged runs (records with warnings) are left out of every rank statistic unless flagged runs
are included (their task order for every method, or the method if it is flagged in most
orders); the metric tables keep them and count them.
"""
import math
from html.parser import HTMLParser

import pytest
from conftest import record_from

from harness.analysis.coverage import Cells, coverage_table
from harness.analysis.frame import FLAG, format_summary, records_to_frame
from harness.analysis.tables import analyse, budget_table, flagged_table, metric_table
from harness.cli import build_parser
from harness.cli.requests import request_from_args
from harness.config.vocabulary import WARNINGS
from harness.outputs.site import build_site, slug

METHODS = ("A", "B", "C")
# ACC per (regime, method), by task order: A > B > C everywhere, with some spread.
ACC = {"head": {"A": (0.9, 0.85, 0.88), "B": (0.7, 0.75, 0.72), "C": (0.5, 0.55, 0.52)},
       "full": {"A": (0.8, 0.82, 0.81), "B": (0.6, 0.65, 0.62), "C": (0.4, 0.45, 0.42)}}
STEPS = {"A": (100, 110, 130), "B": (200, 200, 200), "C": (1000, 1200, 1400)}
FLAG_AT = ("full", "B", 1)  # the one flagged run: regime, method, task order
WARN = [{"code": "loss-flat", "task": 1, "message": "task 2: <b>loss</b> never fell"},
        {"code": "chance", "task": 2, "message": "task 3: at chance"},
        {"code": "loss-flat", "task": 2, "message": "task 3: loss never fell"}]


def _record(regime, method, order, warnings=(), budget=None):
    steps = STEPS[method][order]
    budget = {"optimizer_steps": steps, "samples_seen": steps * 32, "steps_per_task": [steps // 2, steps - steps // 2],
              "samples_per_task": [steps * 16, steps * 16], "epochs_per_stage": [[2], [1, 1]]} \
        if budget is None else budget
    return record_from({"run_id": f"{regime}-{method}-{order}", "spec": {"regime": regime, "label": method, "order": order},
                        "metrics": {"acc": ACC[regime][method][order], "forgetting": 0.1},
                        "budget": budget, "warnings": list(warnings)})


def _records():
    return [_record(rg, m, o, WARN if (rg, m, o) == FLAG_AT else ())
            for rg in ACC for m in METHODS for o in range(3)]


@pytest.fixture(scope="module")
def records():
    return _records()


@pytest.fixture(scope="module")
def tables(records):
    return analyse(records)


# ------------------------------------------------------------------ frame

def test_frame_budget_and_warning_columns():
    flagged = _record("head", "A", 0, WARN)
    plain = _record("head", "A", 1)
    old = _record("head", "A", 2, budget={})  # hand-made / older records carry no budget
    f = records_to_frame([flagged, plain, old]).set_index("run_id")
    assert f.at["head-A-0", "optimizer_steps"] == 100 and f.at["head-A-0", "samples_seen"] == 3200
    assert f.at["head-A-0", "n_warnings"] == 3 and f.at["head-A-0", "warning_codes"] == "chance,loss-flat"
    assert bool(f.at["head-A-0", "flagged"]) and not bool(f.at["head-A-0", "ranked"])
    assert f.at["head-A-1", "n_warnings"] == 0 and f.at["head-A-1", "warning_codes"] == ""
    assert not bool(f.at["head-A-1", "flagged"]) and bool(f.at["head-A-1", "ranked"])
    assert math.isnan(f.at["head-A-2", "optimizer_steps"]) and math.isnan(f.at["head-A-2", "samples_seen"])
    assert bool(records_to_frame([flagged], include_flagged=True)["ranked"].iloc[0])


def test_failed_run_is_never_ranked_even_with_flagged_included():
    failed = record_from({"run_id": "f", "status": "failed", "spec": {"label": "A"}})
    assert not records_to_frame([failed], include_flagged=True)["ranked"].any()


# ------------------------------------------------------------------ rankings

def test_flagged_run_takes_its_task_order_out_of_that_regimes_comparison(tables):
    mr = tables.methods
    ranked = lambda rg: set(mr[(mr["regime"] == rg) & mr["mean_rank"].notna()]["method"])  # noqa: E731
    assert ranked("head") == ranked("full") == set(METHODS)  # comparisons stay paired, nobody dropped
    blocks = mr.groupby("regime")["n_blocks"].max().to_dict()
    assert blocks == {"head": 3, "full": 2}  # order 1 of `full` (B flagged there) is out for everyone
    gr = tables.global_ranks
    assert set(gr[gr["regime"] == "full"]["method"]) == set(METHODS)
    assert tables.w_regimes.iloc[0]["excluded"] == ""


def _mostly_flagged():
    """B flagged in 2 of the 3 task orders of `full`."""
    return [_record(rg, m, o, WARN if (rg, m) == ("full", "B") and o in (0, 1) else ())
            for rg in ACC for m in METHODS for o in range(3)]


def test_method_flagged_in_most_task_orders_is_left_out():
    t = analyse(_mostly_flagged())
    gr, mr = t.global_ranks, t.methods
    assert set(gr[gr["regime"] == "full"]["method"]) == {"A", "C"}
    assert set(gr[gr["regime"] == "full"]["excluded"]) == {"B"}
    full = mr[(mr["regime"] == "full") & mr["mean_rank"].notna()]
    assert set(full["method"]) == {"A", "C"} and set(full["n_blocks"]) == {3}  # the others keep every order
    assert t.w_regimes.iloc[0]["excluded"] == "B"


def test_include_flagged_ranks_them(records):
    t = analyse(records, include_flagged=True)
    gr, mr = t.global_ranks, t.methods
    assert set(gr[gr["regime"] == "full"]["method"]) == set(METHODS)
    full = mr[mr["regime"] == "full"].set_index("method")
    assert full["mean_rank"].to_dict() == {"A": 1.0, "B": 2.0, "C": 3.0}
    assert set(full["n_blocks"]) == {3}
    assert t.w_regimes.iloc[0]["excluded"] == ""


def test_cells_leave_the_flagged_order_out(records):
    mat = Cells(records_to_frame(records)).mat("digits", "full")
    assert list(mat.index.get_level_values("order")) == [0, 2] and mat.notna().all().all()
    assert len(Cells(records_to_frame(records, include_flagged=True)).mat("digits", "full")) == 3


def test_coverage_counts_flagged_and_marks_incomplete(records):
    cov = coverage_table(records_to_frame(records)).set_index(["regime", "method"])
    assert cov.at[("full", "B"), "flagged"] == 1 and cov.at[("full", "B"), "complete"]
    assert cov.at[("full", "B"), "ok"] == 3  # still an ok run: it is left out, not failed
    assert cov.at[("head", "B"), "flagged"] == 0 and cov.at[("head", "B"), "complete"]
    mostly = coverage_table(records_to_frame(_mostly_flagged())).set_index(["regime", "method"])
    assert mostly.at[("full", "B"), "flagged"] == 2 and not mostly.at[("full", "B"), "complete"]


def test_metric_table_keeps_flagged_runs_and_counts_them(records):
    mt = metric_table(records_to_frame(records)).set_index(["regime", "method"])
    assert mt.at[("full", "B"), "acc"] == pytest.approx(sum(ACC["full"]["B"]) / 3)  # flagged run included
    assert mt.at[("full", "B"), "n_flagged"] == 1 and mt.at[("full", "B"), "warning_codes"] == "chance,loss-flat"
    assert mt.at[("head", "B"), "n_flagged"] == 0 and mt.at[("head", "B"), "warning_codes"] == ""


# ------------------------------------------------------------------ budget

def test_budget_mean_in_metric_table_equals_hand_mean(tables):
    mt = tables.methods.set_index(["regime", "method"])
    assert mt.at[("head", "A"), "optimizer_steps"] == pytest.approx((100 + 110 + 130) / 3)
    assert mt.at[("full", "C"), "optimizer_steps"] == pytest.approx(1200.0)
    assert mt.at[("full", "C"), "samples_seen"] == pytest.approx(1200.0 * 32)


def test_budget_missing_stays_nan():
    recs = [_record("head", m, o, budget={}) for m in METHODS for o in range(3)]
    mt = metric_table(records_to_frame(recs))
    assert mt["optimizer_steps"].isna().all() and mt["samples_seen"].isna().all()
    assert budget_table(records_to_frame(recs)).empty


def test_budget_table_relative_to_median_method(records):
    b = budget_table(records_to_frame(records)).set_index("method")
    # method means: A 113.33, B 200, C 1200; the median method is B
    assert b.at["B", "relative_steps"] == pytest.approx(1.0)
    assert b.at["A", "relative_steps"] == pytest.approx((340 / 3) / 200)
    assert b.at["C", "relative_steps"] == pytest.approx(6.0)


def test_flagged_table_one_row_per_flagged_record(records):
    ft = flagged_table(records)
    assert list(ft["run_id"]) == ["full-B-1"]
    row = ft.iloc[0]
    assert row["codes"] == "chance,loss-flat" and row["n_warnings"] == 3
    assert row["first_message"] == WARN[0]["message"]


# ------------------------------------------------------------------ terminal summary

def test_summary_marks_flagged_cells_and_explains(records):
    text = format_summary(records_to_frame(records))
    line_b = next(ln for ln in text.splitlines() if ln.startswith("B "))
    assert f"{FLAG}1" in line_b
    assert sum(f"{FLAG}1" in ln for ln in text.splitlines()) == 1  # only B's full cell
    assert "left out of rankings" in text and "--include-flagged" in text
    assert WARNINGS["chance"] in text and WARNINGS["loss-flat"] in text
    assert WARNINGS["below-probe"] not in text  # only the codes seen are explained
    assert "ranked anyway" in format_summary(records_to_frame(records, include_flagged=True))


def test_summary_without_flags_has_no_mark():
    text = format_summary(records_to_frame([_record("head", m, 0) for m in METHODS]))
    assert FLAG not in text and "learning-check" not in text


# ------------------------------------------------------------------ site

class _Text(HTMLParser):
    """Visible text, and every title attribute, of a page."""

    def __init__(self):
        super().__init__()
        self.parts, self.titles = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("title"):
            self.titles.append(a["title"])

    def handle_data(self, data):
        self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())


def _page(path) -> _Text:
    p = _Text()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


@pytest.fixture(scope="module")
def site(tmp_path_factory, records):
    out = tmp_path_factory.mktemp("site")
    build_site(records, out)
    return out


def test_site_overview_lists_flagged_runs_and_says_they_are_left_out(site):
    page = _page(site / "index.html")
    assert "1 flagged run" in page.text
    assert "Flagged cells are left out of rankings" in page.text and "--include-flagged" in page.text
    assert "task 2: <b>loss</b> never fell" in page.text  # the message, escaped (shown as text)
    assert "<b>loss</b>" not in (site / "index.html").read_text()
    assert "Training budget" in page.text and "1,200" in page.text  # methods differ: the table


def test_site_dataset_page_marks_flagged_cell_and_shows_steps(site):
    page = _page(site / f"dataset-{slug('digits')}.html")
    assert f"{FLAG}1" in page.text
    assert any("chance" in t and WARNINGS["loss-flat"] in t for t in page.titles)
    assert " steps " in f" {page.text} " and "1,200" in page.text and "113" in page.text


def test_site_method_page_shows_steps(site):
    page = _page(site / f"method-{slug('C')}.html")
    assert "steps" in page.text and "1,400" in page.text and "1,200" in page.text


def test_site_run_page_lists_warnings_and_budget(site):
    page = _page(site / "runs" / f"{slug('full-B-1')}.html")
    assert "3 learning-check warnings" in page.text and "task 3: at chance" in page.text
    assert "200 optimizer steps" in page.text and "6,400 training samples" in page.text
    assert "1 + 1" in page.text
    plain = _page(site / "runs" / f"{slug('head-A-0')}.html")
    assert "no warnings" in plain.text


def test_site_with_flagged_included_says_so(tmp_path, records):
    build_site(records, tmp_path, include_flagged=True)
    text = _page(tmp_path / "index.html").text
    assert "Flagged runs are ranked in this build" in text and "left out of rankings" not in text


def test_site_same_budget_is_one_line(tmp_path):
    recs = [_record("head", m, o, budget={"optimizer_steps": 54, "samples_seen": 1620})
            for m in METHODS for o in range(3)]
    build_site(recs, tmp_path)
    text = _page(tmp_path / "index.html").text
    assert "Equal optimizer steps: 54 per run on average; compute not measured" in text
    assert "No run has learning-check warnings" in text and "Flagged cells" not in text


# ------------------------------------------------------------------ CLI

@pytest.mark.parametrize("argv", [["leaderboard"], ["run", "--protocol", "smoke"]])
def test_include_flagged_flag_parses(argv):
    assert request_from_args(build_parser().parse_args(argv)).include_flagged is False
    assert request_from_args(build_parser().parse_args([*argv, "--include-flagged"])).include_flagged is True


def test_build_leaderboard_passes_the_flag_to_the_site(monkeypatch, tmp_path):
    from harness import service
    from harness.execution import store, views
    from harness.outputs import site

    seen = {}
    monkeypatch.setattr(store, "load_records", lambda *a, **k: ["record"])
    monkeypatch.setattr(views, "view_records", lambda recs, *a, **k: recs)
    monkeypatch.setattr(site, "build_site", lambda recs, out, **kw: seen.update(kw) or out / "index.html")
    service.build_leaderboard(tmp_path / "results", "p", out=str(tmp_path / "site"), include_flagged=True)
    assert seen["include_flagged"] is True
