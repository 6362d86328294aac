"""The any-time evaluation on the leaderboard (issue 29): chart geometry and view-models from hand-made
tables (numbers worked by hand), escaping of a hostile method label in the new section, and no section,
column or download where no run has a continual-evaluation curve."""
import copy
import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from harness.config.metrics import ANYTIME_NAMES
from harness.config.specs import RunRecord
from harness.outputs import charts
from harness.outputs.site import anytime, build_site, slug
from harness.outputs.site.templates import environment

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
XSS = "<script>alert(1)</script>"
NAN = float("nan")


def _row(method, task, point, offset, end, x, old, seen, n=3, regime="full", spread=0.02):
    """A row of the anytime_curves table (contract of analysis/anytime.py), CI = mean ± spread."""
    lo_hi = (lambda v: (v - spread, v + spread)) if spread else (lambda v: (v, v))
    o_lo, o_hi = lo_hi(old) if old == old else (NAN, NAN)
    s_lo, s_hi = lo_hi(seen)
    return {"dataset": "toy", "scenario": "task-il", "regime": regime, "method": method, "task": task, "point": point,
            "offset": offset, "end": end, "x": x, "n": n, "old_acc": old, "old_acc_lo": o_lo, "old_acc_hi": o_hi,
            "seen_acc": seen, "seen_acc_lo": s_lo, "seen_acc_hi": s_hi,
            "first_acc": seen, "first_acc_lo": s_lo, "first_acc_hi": s_hi}


def curves_table(method="m"):
    """Two tasks of 20 steps, points every 10: task 1 (x 0, 0.5, 1 end), task 2 (x 1.5, 2 mid, 2 end)."""
    return pd.DataFrame([
        _row(method, 1, 0, 0.0, False, 0.0, NAN, 0.50),
        _row(method, 1, 1, 10.0, False, 0.5, NAN, 0.90),
        _row(method, 1, 2, 20.0, True, 1.0, NAN, 0.96),
        _row(method, 2, 0, 10.0, False, 1.5, 0.60, 0.75),  # the stability gap: 0.96 -> 0.60
        _row(method, 2, 1, 20.0, False, 2.0, 0.80, 0.85),
        _row(method, 2, 2, 20.0, True, 2.0, 0.90, 0.92),
    ])


# ---------------------------------------------------------------- charts

def test_anytime_panel_segment_starts_at_the_pre_task_accuracy():
    (panel,) = charts.anytime_panels(curves_table(), ["full"], {"m": "#123456"}, 100.0)
    (s,) = panel["series"]
    # task 1 has no old task: no segment; task 2's starts at task 1's end point on the tasks seen (0.96)
    assert [d["v"] for d in s["dots"]] == pytest.approx([96.0, 60.0, 80.0, 90.0])
    assert [d["end"] for d in s["dots"]] == [True, False, False, True]
    assert len(s["lines"]) == 1 and len(s["bands"]) == 1
    # x axis: task 1 has no old tasks, so it runs from 1 to 2 over W = 700 px from L = 46
    assert [d["x"] for d in s["dots"]] == [46.0, 396.0, 746.0, 746.0]
    # y limits: values 58..98 (CIs, and the end points' seen accuracy) padded by 8% of 40 to 54.8..101.2,
    # on ticks of 20: 40..120, clipped to 100
    ylo, yhi = 40.0, 100.0
    H, T = panel["H"], panel["T"]
    assert s["dots"][1]["y"] == pytest.approx(round(T + H - (60 - ylo) / (yhi - ylo) * H, 1))
    assert [t["label"] for t in panel["xticks"]] == ["t2"]
    assert [v["x"] for v in panel["vlines"]] == [46.0]  # the boundary between tasks 1 and 2
    assert {e["kind"] for e in panel["legend"]} == {"line", "end", "boundary"}


def test_anytime_panel_keeps_a_start_point_of_its_own():
    df = curves_table()
    start = _row("m", 2, 0, 0.0, False, 1.0, 0.97, 0.97)
    df = pd.concat([df, pd.DataFrame([start])], ignore_index=True)
    (panel,) = charts.anytime_panels(df, ["full"], {}, 100.0)
    vals = [d["v"] for d in panel["series"][0]["dots"]]
    assert vals[0] == pytest.approx(97.0) and 96.0 not in vals  # the table's own start, no borrowed one


def test_anytime_panels_empty_without_curves():
    assert charts.anytime_panels(curves_table().iloc[:0], ["full"], {}, 100.0) == []


def test_run_curve_one_line_per_task_with_ends_and_boundaries():
    curve = {"every": 10, "subsample": 100, "n_rows": [100, 100], "steps": [0, 10, 20, 20, 30, 40, 40],
             "task": [0, 0, 0, 0, 1, 1, 1], "end": [False, False, False, True, False, False, True],
             "acc": [[0.5, None], [0.8, None], [0.9, None], [1.0, None], [0.6, 0.7], [0.8, 0.9], [0.85, 0.95]]}
    c = charts.run_curve(curve, 100.0)
    t1, t2 = c["series"]
    assert (t1["name"], t2["name"]) == ("task 1", "task 2")
    assert [d["v"] for d in t1["dots"]] == pytest.approx([50, 80, 90, 100, 60, 80, 85])
    assert [d["v"] for d in t2["dots"]] == pytest.approx([70, 90, 95])
    assert [d["end"] for d in t1["dots"]] == [False, False, False, True, False, False, True]
    L, W = c["L"], c["W"]
    assert [d["x"] for d in t2["dots"]] == [L + W * 30 / 40, L + W * 40 / 40, L + W]
    assert [v["x"] for v in c["vlines"]] == [L + W / 2]  # task 1 ends at step 20 of 40
    assert charts.run_curve({"steps": [], "task": [], "end": [], "acc": []}, 100.0) is None


# ---------------------------------------------------------------- view-models

def _methods_rows():
    base = {"dataset": "toy", "scenario": "task-il"}
    rows = []
    for m, rg, d in [("a", "head", 0.001), ("b", "head", 0.004), ("a", "full", 0.05), ("b", "full", 0.02)]:
        rows.append({**base, "method": m, "regime": rg, "acc": 0.9, "gap_depth": d, "gap_depth_lo": d - 0.01,
                     "gap_depth_hi": d + 0.01, "gap_recovery": 5.0, "gap_unrecovered": 0.0, "min_acc": 0.8,
                     "wc_acc": 0.85, "a_auc": 0.88})
    rows.append({**base, "method": "c", "regime": "full", "acc": 0.9, "gap_depth": NAN})  # no curve
    return pd.DataFrame(rows)


def test_gap_grid_cells_and_the_shallowest_gap_as_printed():
    g = anytime.gap_grid(_methods_rows(), ["head", "last-1", "full"])
    assert g["regs"] == ["head", "full"]  # last-1 has no runs with a curve
    assert [r["method"] for r in g["rows"]] == ["a", "b"]  # c has no curve
    a, b = g["rows"]
    # head: 0.1 and 0.4 points print as 0.1 and 0.4: a is the shallowest; full: b (2.0 < 5.0)
    assert [c["best"] for c in a["cells"]] == [True, False] and [c["best"] for c in b["cells"]] == [False, True]
    assert a["cells"][1]["gap_depth"] == pytest.approx(0.05)
    tie = _methods_rows().assign(gap_depth=[0.0001, 0.0002, 0.05, 0.02, NAN])  # both print as 0.0: a tie
    assert [r["cells"][0]["best"] for r in anytime.gap_grid(tie, ["head", "full"])["rows"]] == [True, True]


def test_rank_tables_order_and_shifts():
    ranks = pd.DataFrame([
        {"dataset": "toy", "scenario": "task-il", "regime": "full", "method": m, "n": 5, "acc": acc,
         "acc_rank": ar, "min_acc": mn, "min_acc_rank": mr, "wc_acc": mn, "wc_acc_rank": mr, "a_auc": acc,
         "a_auc_rank": ar}
        for m, acc, ar, mn, mr in [("x", 0.90, 2.0, 0.70, 3.0), ("y", 0.95, 1.0, 0.80, 1.6), ("z", 0.80, 3.0, 0.75, 1.4)]])
    (t,) = anytime.rank_tables(ranks, ["head", "full"])
    assert t["regime"] == "full" and t["n"] == 5
    assert [r["method"] for r in t["rows"]] == ["y", "x", "z"]  # by ACC rank
    # shift = ACC rank - min-ACC rank: + moves up; z 3 -> 1.4 = +1.6, x 2 -> 3 = -1, y 1 -> 1.6 = -0.6
    assert [r["shift"]["min_acc"] for r in t["rows"]] == pytest.approx([-0.6, -1.0, 1.6])
    assert [r["shift"]["a_auc"] for r in t["rows"]] == pytest.approx([0.0, 0.0, 0.0])


def test_method_columns_only_where_runs_have_curves():
    mt = _methods_rows()
    assert anytime.method_columns(mt) == ("gap_depth", "min_acc", "wc_acc", "a_auc")
    assert anytime.method_columns(mt[mt["method"] == "c"]) == ()


# ---------------------------------------------------------------- escaping (the section's template)

def test_hostile_method_label_is_escaped_in_the_section():
    env = environment()
    cv = curves_table(method=XSS)
    section = {"panels": charts.anytime_panels(cv, ["full"], {XSS: "#123456"}, 100.0),
               "gap": anytime.gap_grid(_methods_rows().replace({"method": {"a": XSS}}), ["head", "full"]),
               "ranks": [{"regime": "full", "n": 3, "rows": [
                   {"method": XSS, "acc": 0.9, "acc_rank": 1.0, "min_acc": 0.8, "min_acc_rank": 2.0, "wc_acc": 0.8,
                    "wc_acc_rank": 2.0, "a_auc": 0.8, "a_auc_rank": 1.0,
                    "shift": {"min_acc": -1.0, "wc_acc": -1.0, "a_auc": 0.0}}]}],
               "tau": [{"regime": "full", "n_methods": 2, "tau_min_acc": 1.0, "p_min_acc": 0.5, "tau_wc_acc": 1.0,
                        "p_wc_acc": 0.5, "tau_a_auc": 1.0, "p_a_auc": 0.5}],
               "trend": [{"method": XSS, "n_regimes": 2, "rho_fraction": 1.0, "p_fraction": 1.0, "n_runs": 6,
                          "rho_runs": 0.5, "p_runs": 0.3, "rho_norm": 0.4, "p_norm": 0.4, "trend": "no trend"}],
               "regs": ["full"]}
    links = {k: {"csv": f"data/{k}.csv", "json": f"data/{k}.json"} for k, _ in anytime.DOWNLOADS}
    html = env.from_string('{% import "anytime.html" as at with context %}{{ at.section(a, "toy", links) }}').render(
        a=section, links=links, scale=100.0, root="")
    assert XSS not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5  # legend, gap grid, ranks, trend
    assert "Any-time evaluation" in html and "harness_eval_model_now" in html


# ---------------------------------------------------------------- whole sites

def _with_curve(d: dict, dip: float) -> dict:
    """A record with a two-point-per-task curve consistent with its accuracy matrix: each task's mid point
    shows the old tasks `dip` below their previous end (a stability gap), its end point the matrix row."""
    R, T, every = d["acc_matrix"], len(d["acc_matrix"]), 10
    steps, task, end, acc = [0], [0], [False], [[d["init_acc"][0]] + [None] * (T - 1)]
    for t in range(T):
        prev = R[t - 1] if t else R[t]
        mid = [max(0.0, prev[j] - dip) if j < t else R[t][j] for j in range(t + 1)]
        for s, row, e in ((every, mid, False), (2 * every, R[t][:t + 1], True)):
            steps.append(t * 2 * every + s)
            task.append(t)
            end.append(e)
            acc.append(list(row) + [None] * (T - t - 1))
    d["curve"] = {"every": every, "subsample": 100, "n_rows": [100] * T, "steps": steps, "task": task, "end": end,
                  "acc": acc}
    d["spec"]["continual"] = {"every": every, "subsample": 100}
    return d


@pytest.fixture(scope="module")
def curve_site(tmp_path_factory):
    raw = json.loads(FIXTURE.read_text())
    evil = [copy.deepcopy(r) for r in raw if r["spec"]["method"] == "a"]
    for r in evil:
        r["run_id"] = "e" + r["run_id"][1:]
        r["spec"]["label"] = XSS
    records = [RunRecord.from_dict(_with_curve(r, 0.1 * (i % 3))) if r["status"] == "ok" else RunRecord.from_dict(r)
               for i, r in enumerate(raw + evil)]
    out = tmp_path_factory.mktemp("site")
    build_site(records, out, results_dir="results")
    return out, records


def test_site_with_curves_has_the_section_and_escapes(curve_site):
    out, records = curve_site
    html = (out / f"dataset-{slug('toy')}.html").read_text()
    assert 'id="anytime"' in html and "Old-task accuracy during training" in html
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for _, key in anytime.DOWNLOADS:
        assert (out / "data" / f"{slug('toy')}-{key}.csv").exists()
    method = (out / f"method-{slug('A')}.html").read_text()
    assert "Any-time evaluation" in method and "gap depth" in method
    rec = next(r for r in records if r.curve is not None)
    run = (out / "runs" / f"{slug(rec.run_id)}.html").read_text()
    assert "Accuracy during training" in run and "task end (evaluated model)" in run and "min-ACC" in run
    assert XSS not in (out / f"method-{slug(XSS)}.html").read_text()


@pytest.fixture(scope="module")
def plain_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain-site")
    build_site([RunRecord.from_dict(r) for r in json.loads(FIXTURE.read_text())], out, results_dir="results")
    return out


def test_site_without_curves_has_no_section(plain_site):
    for page in [*plain_site.glob("*.html"), *(plain_site / "runs").glob("*.html")]:
        html = page.read_text()
        assert "Any-time" not in html and "Accuracy during training" not in html, page.name
        assert "harness_eval_model_now" not in html
    assert not list((plain_site / "data").glob("*anytime*")) and not list((plain_site / "data").glob("*gap_trend*"))


# has_curve, each any-time metric and its CI bounds: spelt out here, not taken from outputs/downloads.py
ANYTIME_COLUMNS = {"has_curve", *(f"{m}{end}" for m in ANYTIME_NAMES for end in ("", "_lo", "_hi"))}


def _download_columns(folder: Path) -> dict[str, set]:
    """{download's name: its columns} of every CSV and JSON table a site wrote into data/."""
    out = {}
    for path in sorted((folder / "data").iterdir()):
        if path.suffix == ".csv":
            text = path.read_text()
            out[path.name] = set(next(csv.reader(io.StringIO(text)))) if text.strip() else set()
        elif path.suffix == ".json":
            out[path.name] = {k for row in json.loads(path.read_text()) for k in row}
    return out


def test_downloads_without_curves_have_no_anytime_columns(plain_site):
    # what the site wrote before continual evaluation existed: an all-NaN any-time column is a changed download
    columns = _download_columns(plain_site)
    assert {"runs.csv", "runs.json", f"method-{slug('A')}.csv", f"{slug('toy')}-methods.json"} <= set(columns)
    assert {"acc", "acc_lo", "forgetting"} <= columns[f"{slug('toy')}-methods.csv"]
    assert {name: sorted(cols & ANYTIME_COLUMNS) for name, cols in columns.items() if cols & ANYTIME_COLUMNS} == {}


def test_downloads_with_curves_keep_the_anytime_columns(curve_site):
    out, _ = curve_site
    columns = _download_columns(out)
    for name in ("runs.csv", "runs.json", f"{slug('toy')}-runs.csv"):
        assert {"has_curve", *ANYTIME_NAMES} <= columns[name], name
    for name in (f"{slug('toy')}-methods.csv", f"method-{slug('A')}.json"):
        assert ANYTIME_COLUMNS - {"has_curve"} <= columns[name], name


def test_run_page_metrics_from_the_curve_by_hand():
    from harness.outputs.site.run import _anytime_rows

    curve = {"every": 10, "subsample": 100, "n_rows": [100, 100], "steps": [0, 10, 20, 20, 30, 40, 40],
             "task": [0, 0, 0, 0, 1, 1, 1], "end": [False, False, False, True, False, False, True],
             "acc": [[0.5, None], [0.8, None], [0.9, None], [1.0, None], [0.6, 0.7], [0.8, 0.9], [0.85, 0.95]]}
    rec = RunRecord.from_dict({**json.loads(FIXTURE.read_text())[0], "curve": curve})
    (row,) = _anytime_rows(rec)
    v = row["values"]
    assert row["label"] == ""  # task-IL: one accuracy
    # task 1 after its last update (step 20): 0.6, 0.8, 0.85 -> min-ACC 0.6; WC-ACC = 0.95 / 2 + 0.6 / 2
    assert v["min_acc"] == pytest.approx(0.6) and v["wc_acc"] == pytest.approx(0.775)
    # the gap at task 2's start: 1.0 at task 1's end, 0.6 at its lowest during task 2; never back within 0.01
    assert v["gap_depth"] == pytest.approx(0.4) and v["gap_recovery"] is None and v["gap_unrecovered"] == 1
    assert _anytime_rows(RunRecord.from_dict(json.loads(FIXTURE.read_text())[0])) == []
    # a run that did not finish: its partial curve is drawn, not summarised (the frame's metrics are NaN too)
    failed = RunRecord.from_dict({**json.loads(FIXTURE.read_text())[0], "curve": curve, "status": "failed"})
    assert _anytime_rows(failed) == []
