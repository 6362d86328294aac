"""Per-run metrics against matrices computed by hand, and the metric table."""
import numpy as np
import pytest

from harness.config.metrics import METRIC_NAMES, METRICS, Metric, all_metrics, forgetting, step_forgetting

# R[i][j]: accuracy on task j after training task i.
R = np.array([[0.9, 0.1, 0.2],
              [0.6, 0.8, 0.3],
              [0.7, 0.5, 0.9]])
INIT = np.array([0.5, 0.2, 0.1])


def test_metrics_match_hand_computation():
    m = all_metrics(R.tolist(), INIT.tolist())
    assert m["acc"] == pytest.approx((0.7 + 0.5 + 0.9) / 3)
    assert m["la"] == pytest.approx((0.9 + 0.8 + 0.9) / 3)
    assert m["bwt"] == pytest.approx(((0.7 - 0.9) + (0.5 - 0.8)) / 2)
    # max over l in [j, T-1) of R[l][j] minus R[T][j]: task 1 max(0.9, 0.6) - 0.7, task 2 0.8 - 0.5
    assert m["forgetting"] == pytest.approx(((0.9 - 0.7) + (0.8 - 0.5)) / 2)
    assert m["fwt"] == pytest.approx(((0.1 - 0.2) + (0.3 - 0.1)) / 2)
    assert m["aia"] == pytest.approx((0.9 + (0.6 + 0.8) / 2 + (0.7 + 0.5 + 0.9) / 3) / 3)


def test_forgetting_is_max_based_not_last_minus_first():
    # Task 1 peaks after task 2 (0.95), then drops: max-based forgetting sees 0.95 - 0.6.
    R2 = np.array([[0.7, 0.0, 0.0], [0.95, 0.8, 0.0], [0.6, 0.8, 0.9]])
    assert forgetting(R2, np.zeros(3)) == pytest.approx(((0.95 - 0.6) + (0.8 - 0.8)) / 2)


@pytest.mark.parametrize("seed", range(5))
def test_acc_equals_la_plus_scaled_bwt(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(2, 8))
    M = rng.random((T, T))
    m = all_metrics(M.tolist(), rng.random(T).tolist())
    assert m["acc"] == pytest.approx(m["la"] + (T - 1) / T * m["bwt"])


def test_step_forgetting():
    f = step_forgetting(R)
    assert f[0] is None
    assert f[1] == pytest.approx(0.9 - 0.6)
    assert f[2] == pytest.approx(((0.6 - 0.7) + (0.8 - 0.5)) / 2)


def test_non_square_matrix_is_rejected():
    with pytest.raises(ValueError, match="square"):
        all_metrics([[0.5, 0.5]], [0.1, 0.1])


def test_the_table_is_the_records_metrics_in_order():
    # A record's `metrics` keys come from the table in its order (the on-disk JSON sorts keys,
    # the in-memory record and the analysis columns do not).
    assert METRIC_NAMES == ("acc", "la", "bwt", "forgetting", "fwt", "aia")
    assert list(all_metrics(R.tolist(), INIT.tolist())) == list(METRIC_NAMES)
    assert all(isinstance(m, Metric) and m.name == k and m.label and m.unit and m.description
               for k, m in METRICS.items())


def test_only_forgetting_is_lower_is_better():
    assert {k for k, m in METRICS.items() if not m.higher_is_better} == {"forgetting"}


def test_each_function_is_its_metric():
    # Perturb one entry at a time: each metric moves the way its definition says.
    up = R.copy()
    up[-1, 0] += 0.05  # final accuracy of task 1 rises
    m0, m1 = all_metrics(R, INIT), all_metrics(up, INIT)
    assert m1["acc"] > m0["acc"] and m1["bwt"] > m0["bwt"] and m1["forgetting"] < m0["forgetting"]
    assert (m1["la"], m1["fwt"]) == (m0["la"], m0["fwt"])


def test_importing_the_table_does_not_import_numpy():
    import subprocess
    import sys

    code = "import sys, harness.config.metrics; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
