"""benchmarks/published.py: A_last and A-bar from accuracy matrices, grouped and set beside published figures."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import record_from

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402  (benchmarks/published.py)

R = [[0.9, 0.0, 0.0],
     [0.6, 0.8, 0.0],
     [0.5, 0.4, 0.7]]


def _record(R, method="ncm", regime="head", n_test=None, status="ok", dataset="cifar100", order=0):
    T = len(R)
    spec = {"method": method, "regime": regime, "order": order, "scenario": "class-il",
            "dataset": {"name": dataset, "n_tasks": T, "classes_per_task": 10, "model": "vit-b16"}}
    return record_from({"spec": spec, "acc_matrix": R, "status": status,
                        "checks": {"n_test": n_test} if n_test else {}})


def test_unweighted_metrics_by_hand():
    # A_last = (0.5 + 0.4 + 0.7) / 3; A-bar = (0.9 + (0.6 + 0.8) / 2 + 1.6 / 3) / 3
    assert published.a_last(R) == pytest.approx(1.6 / 3)
    assert published.a_bar(R) == pytest.approx((0.9 + 0.7 + 1.6 / 3) / 3)


def test_sample_weighted_metrics_by_hand():
    n = [100, 300, 100]
    # last row: (50 + 120 + 70) / 500; after task 2: (60 + 240) / 400
    assert published.a_last(R, n) == pytest.approx(240 / 500)
    assert published.a_bar(R, n) == pytest.approx((0.9 + 300 / 400 + 240 / 500) / 3)


def test_cells_average_over_orders_and_skip_failed_runs():
    other = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.3, 0.3, 0.3]]
    recs = [_record(R, order=0), _record(other, order=1), _record(R, order=2, status="failed")]
    (cell,) = published.cells(recs)
    assert (cell.setting, cell.method, cell.regime, cell.runs) == ("cifar100 3x10", "ncm", "head", 2)
    lasts = [100 * 1.6 / 3, 100 * 0.3]
    assert cell.a_last == pytest.approx(sum(lasts) / 2)
    assert cell.a_last_std == pytest.approx(abs(lasts[0] - lasts[1]) / 2 ** 0.5)  # n-1 std of two values
    bars = [100 * (0.9 + 0.7 + 1.6 / 3) / 3, 100 * (1.0 + 0.5 + 0.3) / 3]
    assert cell.a_bar == pytest.approx(sum(bars) / 2)


def test_matching_cells_get_their_published_rows_and_the_difference():
    R10 = [[0.9 if j <= t else 0.0 for j in range(10)] for t in range(10)]  # A_last 90 %, A-bar 90 %
    recs = [_record(R10, "ncm", "head"), _record(R10, "naive", "full"), _record(R10, "replay", "head")]
    found = published.cells(recs)
    assert {c.setting for c in found} == {"CIFAR-100 B0Inc10"}
    lines = published.comparison_lines(found)
    ncm = [line for line in lines if " ncm " in line]
    assert len(ncm) == 2  # RanPAC's "NCM only" and Janson et al.'s NMC
    assert "A_last 83.40 (diff +6.60;" in ncm[0] and "RanPAC/RanPAC" in ncm[0]
    assert "A_last 83.70 (diff +6.30;" in ncm[1]
    (replay,) = [line for line in lines if " replay " in line]
    assert replay.endswith("  -")  # no published row for this cell
    (naive,) = [line for line in lines if " naive " in line]
    assert naive.endswith("  -")  # fine-tuning: no figure was found in a source (docs/published.md)


def test_every_published_figure_names_its_source_and_metric():
    for p in published.PUBLISHED:
        assert p.metric in ("A_last", "A_bar") and p.source and p.weights
        assert p.setting in published.SETTINGS.values()


def test_an_empty_results_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert published.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no records found" in err


def test_without_a_sweep_it_lists_the_figures(capsys):
    assert published.main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(published.PUBLISHED) and "83.40" in lines[0]
