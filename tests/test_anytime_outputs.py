"""Any-time metrics in the outputs (issue 29): the export's columns, the report's min-ACC and gap-depth
tables and `--metric gap_depth`, the any-time figures; and records without curves give what they gave."""
import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import fixture_records, make_spec, record_from

from harness.analysis import stats
from harness.analysis.frame import COLUMNS
from harness.analysis.tables import analyse
from harness.config.errors import UsageError
from harness.config.metrics import ANYTIME_NAMES
from harness.outputs import figures
from harness.outputs.export import export_table
from harness.outputs.report import grids, report_latex, report_markdown

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
OLD_FIGURES = ["rank-shift", "tau", "norm-forgetting", "curves", "acc-forgetting"]
DEPTH = {("head", "a"): [0.0, 0.0, 0.0], ("head", "b"): [0.0, 0.0, 0.0],
         ("full", "a"): [0.1, 0.2, 0.4], ("full", "b"): [0.02, 0.04, 0.03]}


def _curve(depth: float) -> dict:
    """Two tasks, every 2 steps, of 2 and 4 steps: old task 0 at 0.9 before task 1, 0.9 - depth at its first
    point (step 4), back to 0.9 at the next (step 6, recovered 4 steps into it) and its end; task 1 at 0.8."""
    return {"every": 2, "subsample": 100, "n_rows": [100, 100], "steps": [0, 2, 2, 4, 6, 6],
            "task": [0, 0, 0, 1, 1, 1], "end": [False, False, True, False, False, True],
            "acc": [[0.5, None], [0.9, None], [0.9, None], [0.9 - depth, 0.8], [0.9, 0.8], [0.9, 0.8]]}


def _rec(method, regime, order, depth=None):
    spec = make_spec(method=method, regime=regime, order=order)
    rec = {"spec": spec.to_dict(), "run_id": f"{method}-{regime}-{order}",
           "metrics": {"acc": 0.8 + 0.01 * order, "forgetting": 0.05, "la": 0.85, "bwt": -0.05},
           "params": {"trainable": 10 if regime == "head" else 100, "total": 100},
           "update_norms": {"shared": [1.0, 1.0 + depth if depth is not None else 1.0]}}
    if depth is not None:
        rec["curve"] = _curve(depth)
    return record_from(rec)


@pytest.fixture(scope="module")
def curve_records():
    return [_rec(m, rg, o, d) for (rg, m), ds in DEPTH.items() for o, d in enumerate(ds)]


@pytest.fixture(scope="module")
def curve_tables(curve_records):
    return analyse(curve_records)


@pytest.fixture(scope="module")
def plain_records():
    return fixture_records(FIXTURE)


@pytest.fixture(scope="module")
def plain_tables(plain_records):
    return analyse(plain_records)


# ------------------------------------------------------------------------------------ export

def _header(path: Path) -> list:
    return next(csv.reader(io.StringIO(path.read_text())))


def test_export_carries_the_anytime_columns_with_curves(tmp_path, curve_records):
    out = export_table(curve_records, "csv", tmp_path / "runs.csv")
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert {"has_curve", *ANYTIME_NAMES} <= set(rows[0])
    full_a = [r for r in rows if r["method"] == "a" and r["regime"] == "full"]
    assert sorted(float(r["gap_depth"]) for r in full_a) == pytest.approx([0.1, 0.2, 0.4])
    assert all(r["has_curve"] == "True" and float(r["gap_recovery"]) == 4 for r in full_a if float(r["gap_depth"]) > 0)
    parquet = pd.read_parquet(export_table(curve_records, "parquet", tmp_path / "runs.parquet"))
    assert parquet["has_curve"].all() and parquet["min_acc"].notna().all()


def test_export_without_curves_has_the_columns_it_had(tmp_path, plain_records):
    old = [c for c in COLUMNS if c not in ("has_curve", *ANYTIME_NAMES)]
    assert _header(export_table(plain_records, "csv", tmp_path / "runs.csv")) == old
    assert list(pd.read_parquet(export_table(plain_records, "parquet", tmp_path / "r.parquet")).columns) == old


# ------------------------------------------------------------------------------------ report

def test_report_without_curves_is_acc_and_forgetting_only(plain_tables):
    assert [[g.metric for g in ds] for ds in grids(plain_tables)] == [["acc", "forgetting"]] * len(grids(plain_tables))
    text = report_markdown(plain_tables)
    assert "min-ACC" not in text and "gap depth" not in text and text.count("| method |") == 2 * len(
        grids(plain_tables))
    with pytest.raises(UsageError, match="--metric gap_depth: no run has a continual-evaluation curve"):
        report_markdown(plain_tables, "gap_depth")


def test_report_adds_min_acc_and_gap_depth_with_curves(curve_tables):
    (ds,) = grids(curve_tables)
    assert [g.metric for g in ds] == ["acc", "forgetting", "min_acc", "gap_depth"]
    depth = ds[3]
    # full, a: depths 0.1, 0.2, 0.4 -> mean 23.3 points; CI half-width from the same bootstrap as the table
    mean, lo, hi = stats.bootstrap_mean([0.1, 0.2, 0.4])
    cell = depth.cells[("a", "full")]
    assert cell.mean == pytest.approx(100 * np.mean([0.1, 0.2, 0.4])) and cell.half == pytest.approx(50 * (hi - lo))
    assert depth.cells[("b", "full")].best and not cell.best  # lower is better
    text = report_markdown(curve_tables)
    assert "**gap depth (% points) (any-time; from the runs' continual-evaluation curves)**" in text
    assert "| a | **0.0 ± 0.0** | 23.3 ± " in text
    # min-ACC of a, full: the old task's lowest value after its end, 0.9 - depth
    assert ds[2].cells[("a", "full")].mean == pytest.approx(100 * (0.9 - np.mean([0.1, 0.2, 0.4])))


def test_metric_option_leads_with_any_anytime_metric(curve_tables):
    (ds,) = grids(curve_tables, "gap_recovery")
    assert [g.metric for g in ds] == ["gap_recovery", "forgetting", "min_acc", "gap_depth"]
    # steps are not scaled to percent: every gap deeper than the tolerance took 4 steps, the others 0
    assert ds[0].cells[("a", "full")].mean == pytest.approx(4.0) and ds[0].cells[("a", "head")].mean == 0
    tex = report_latex(curve_tables, "gap_depth")
    assert r"\label{tab:" in tex and "gap depth (\\% points)" in tex and tex.count(r"\begin{table}") == 3  # gap depth once
    assert [g.metric for g in grids(curve_tables, "min_acc")[0]] == ["min_acc", "forgetting", "gap_depth"]


def test_cli_accepts_the_anytime_metrics():
    from harness.cli.parser import build_parser

    args = build_parser().parse_args(["report", "--format", "markdown", "--metric", "gap_depth"])
    assert args.metric == "gap_depth"
    with pytest.raises(UsageError, match="invalid choice: 'gap'"):
        build_parser().parse_args(["report", "--format", "markdown", "--metric", "gap"])


# ------------------------------------------------------------------------------------ figures

def test_figures_without_curves_are_the_old_ones(tmp_path, plain_tables):
    written = figures.write_figures(plain_tables, tmp_path, formats=("png",))
    assert all(not any(p.name.endswith(f"-{k}.png") for p in written) for k in ("anytime-curves", "gap-depth"))
    assert all(any(p.name.endswith(f"-{k}.png") for p in written) for k in OLD_FIGURES)
    ds = plain_tables.methods["dataset"].iloc[0]
    assert figures.anytime_curves(plain_tables, ds) is None and figures.gap_depth(plain_tables, ds) is None


def test_anytime_figures_drawn_with_curves(tmp_path, curve_tables):
    written = figures.write_figures(curve_tables, tmp_path, formats=("png",))
    names = [p.name for p in written]
    assert any(n.endswith("-anytime-curves.png") for n in names) and any(n.endswith("-gap-depth.png") for n in names)
    again = figures.write_figures(curve_tables, tmp_path / "again", formats=("png",))
    assert [p.read_bytes() for p in written] == [p.read_bytes() for p in again]  # same records, same bytes
    fig = figures.anytime_curves(curve_tables, "digits")
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["head", "full"]


def test_anytime_segment_starts_at_the_pre_task_value(curve_tables):
    c = curve_tables.anytime_curves
    a = c[(c["regime"] == "full") & (c["method"] == "a")]
    x, y, lo, hi = figures._segment(a, 2)
    # pre-task: task 1's end point (x 1, seen accuracy 0.9); then the dip (x 1.5) and the recovery (x 2, twice:
    # the last mid point and the end point)
    assert x.tolist() == pytest.approx([1.0, 1.5, 2.0, 2.0])
    assert y.tolist() == pytest.approx([0.9, 0.9 - np.mean([0.1, 0.2, 0.4]), 0.9, 0.9])
    assert figures._segment(a, 1) is None  # no earlier task while task 1 trains


def test_dollar_signs_in_method_labels_are_text(curve_records):
    from dataclasses import replace

    label = r"a$\alpha_{$b"  # as mathtext: a syntax error when drawn
    recs = [replace(r, spec=replace(r.spec, label=label)) if r.method == "a" else r for r in curve_records]
    tables = analyse(recs)
    assert label in set(tables.anytime_curves["method"])
    for draw in figures.ANYTIME_FIGURES.values():
        draw(tables, "digits").canvas.draw()
