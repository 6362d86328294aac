"""benchmarks/continual_cost.py's pure helpers: the summary of timed pairs, the rotation, the sample.

No timings here (the benchmark prints those); hand-computed values on constructed pairs.
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import continual_cost as CC  # noqa: E402


def test_summary_of_pairs_by_hand():
    pairs = [CC.Pair(off_s=1.0, on_s=1.1, curve_s=0.1, off_cpu=1.0, on_cpu=1.05),
             CC.Pair(off_s=2.0, on_s=2.4, curve_s=0.2, off_cpu=2.0, on_cpu=2.2),
             CC.Pair(off_s=1.0, on_s=0.9, curve_s=0.0, off_cpu=1.0, on_cpu=1.0)]
    s = CC.summarize(pairs)
    assert s["n"] == 3
    assert s["median"] == pytest.approx(1.1)  # ratios 1.1, 1.2, 0.9
    assert (s["low"], s["high"]) == (pytest.approx(0.9), pytest.approx(1.2))
    assert (s["off_s"], s["on_s"]) == (pytest.approx(4.0), pytest.approx(4.4))
    assert s["total_ratio"] == pytest.approx(1.1)  # 4.4 / 4.0, not the mean of the ratios
    assert s["curve_share"] == pytest.approx(0.3 / 4.4)
    assert s["cpu_ratio"] == pytest.approx(4.25 / 4.0)
    assert s["cpu_median"] == pytest.approx(1.05)  # cpu ratios 1.05, 1.1, 1.0


def test_worst_group_is_the_highest_median():
    groups = {("digits", "naive"): [CC.Pair(1.0, 1.05), CC.Pair(1.0, 1.5), CC.Pair(1.0, 1.04)],
              ("mnist1d", "lwf"): [CC.Pair(1.0, 1.2), CC.Pair(1.0, 1.1)]}
    assert CC.worst(groups) == ("mnist1d", "lwf")  # median 1.15 beats 1.05 despite digits' 1.5 outlier
    shares = {"a": [CC.Pair(1.0, 1.0, curve_s=0.1)], "b": [CC.Pair(1.0, 2.0, curve_s=0.1)]}
    assert CC.worst(shares, "curve_share") == "a"  # 10 % of its on side vs 5 %


def test_rotation_alternates_which_variant_goes_first():
    assert [CC.rotated([None, 5], k)[0] for k in range(4)] == [None, 5, None, 5]
    assert CC.rotated([None, 5, 10, 20], 5) == [5, 10, 20, None]
    for k in range(8):
        assert sorted(CC.rotated([0, 1, 2], k)) == [0, 1, 2]


def test_sample_is_order_zero_unless_all():
    specs = [SimpleNamespace(order=o, name=n) for n in "ab" for o in range(3)]
    assert [(s.name, s.order) for s in CC.sample(specs)] == [("a", 0), ("b", 0)]
    assert CC.sample(specs, all_orders=True) == specs
