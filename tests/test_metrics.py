"""Per-run metrics against matrices computed by hand."""
import numpy as np
import pytest

from harness.run.metrics import all_metrics, forgetting, step_forgetting

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
    assert forgetting(R2) == pytest.approx(((0.95 - 0.6) + (0.8 - 0.8)) / 2)


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
