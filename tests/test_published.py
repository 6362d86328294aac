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


def _record(R, method="ncm", regime="head", n_test=None, status="ok", dataset="cifar100", order=0, cpt=10):
    T = len(R)
    spec = {"method": method, "regime": regime, "order": order, "scenario": "class-il",
            "dataset": {"name": dataset, "n_tasks": T, "classes_per_task": cpt, "model": "vit-b16"}}
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
    assert "sequential fine-tuning A_last 33.61 (diff +56.39;" in naive and "GengDavid/SLCA" in naive


def test_every_published_figure_names_its_source_and_metric():
    for p in published.PUBLISHED:
        assert p.metric in published.METRICS and p.source and p.weights
        assert p.setting in published.SETTINGS.values()


def test_an_empty_results_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert published.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no records found" in err


def test_without_a_sweep_it_lists_the_figures(capsys):
    assert published.main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(published.PUBLISHED) and "83.40" in lines[0]


def test_task_weighted_last_accuracy_by_hand():
    # L2P/DualPrompt's Acc@1: the plain mean of the last row, whatever the tasks' sizes
    assert published.a_last_tasks(R) == pytest.approx(1.6 / 3)
    (cell,) = published.cells([_record(R, n_test=[100, 300, 100])])
    assert cell.a_last_tasks == pytest.approx(100 * 1.6 / 3)
    assert cell.a_last == pytest.approx(100 * 240 / 500)  # sample-weighted: another number
    assert cell.value("A_last_tasks") == cell.a_last_tasks and cell.value("A_bar") == cell.a_bar


@pytest.mark.parametrize("method, regime, expected", [
    ("l2p", "prompt-l5", ("L2P (paper)", "L2P (PyTorch port run)", "L2P (in SLCA's figure)")),
    ("dualprompt", "prompt-l5", ("DualPrompt (paper)", "DualPrompt (PyTorch port run)")),
    ("coda-prompt", "prompt-l8", ("CODA-Prompt",)),
    ("simplecil", "head", ("SimpleCIL",)),
    ("aper", "prompt-deep-l10", ("APER (VPT-deep)",)),
    ("aper", "prompt-l10", ("APER (VPT-shallow)",)),
    ("aper", "last-2:lora-r4", ("APER (adapter)",)),
    ("aper", "bitfit", ()),
    ("ranpac", "head", ("RanPAC (no Phase 1)",)),
    ("ranpac", "norm", ("RanPAC",)),
    ("slca", "last-3", ("SLCA",)),
    ("slca", "lora-r4", ("SLCA",)),
    ("magmax", "full", ("MagMax",)),
    ("magmax", "last-2", ()),
    ("l2p", "full", ()),
])
def test_the_new_methods_match_their_published_rows_by_regime(method, regime, expected):
    assert published.published_names(method, regime) == expected


def test_prompt_methods_are_compared_on_the_task_weighted_metric_and_unfound_figures_print_a_dash():
    R10 = [[0.9 if j <= t else 0.0 for j in range(10)] for t in range(10)]  # every metric 90 %
    R10[-1][0] = 0.4  # now A_last_tasks = 85 %
    recs = [_record(R10, "dualprompt", "prompt-l5", dataset="cifar100-pixels"),
            _record(R10, "coda-prompt", "prompt-l8", dataset="cifar100-pixels"),
            _record(R10, "magmax", "full", dataset="cifar100-pixels")]
    lines = published.comparison_lines(published.cells(recs))
    dual = [line for line in lines if " dualprompt " in line]
    assert len(dual) == 2
    assert "DualPrompt (paper) A_last_tasks 86.51 (diff -1.51;" in dual[0]
    assert "DualPrompt (PyTorch port run) A_last_tasks 86.13 (diff -1.13;" in dual[1]
    for name in ("coda-prompt", "magmax"):  # no figure found in a source (docs/published.md)
        (line,) = [line for line in lines if f" {name} " in line]
        assert line.endswith("  -")


def test_the_b0inc5_settings_of_simplecil_and_aper_logs_match_their_splits():
    R20 = [[0.8 if j <= t else 0.0 for j in range(20)] for t in range(20)]
    (cell,) = published.cells([_record(R20, "simplecil", "head", dataset="cifar100-pixels", cpt=5)])
    assert cell.setting == "CIFAR-100 B0Inc5"
    lines = published.comparison_lines([cell])
    assert "SimpleCIL A_last 81.28 (diff -1.28;" in lines[1] and "SimpleCIL A_bar 87.57 (diff -7.57;" in lines[2]
    assert published.SETTINGS[("imagenet-r", 40, 5)] == "ImageNet-R B0Inc5"
