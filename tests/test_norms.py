"""Update norms on hand-made parameter snapshots."""
import math

import pytest
import torch

from harness.run.norms import update_norms


def snap(a, b):
    return {"blocks.fc1.weight": torch.tensor(a, dtype=torch.float32),
            "blocks.fc2.weight": torch.tensor(b, dtype=torch.float32)}


def test_update_norms_by_hand():
    s1 = snap([3.0, 0.0], [0.0])
    s2 = snap([3.0, 4.0], [0.0])        # fc1 moved by (0, 4)
    s3 = snap([3.0, 4.0], [12.0])       # fc2 moved by 12
    out = update_norms([s1, s2, s3])
    assert out["shared"] == [None, pytest.approx(4.0), pytest.approx(12.0)]
    assert out["per_block"]["fc1"] == [None, pytest.approx(4.0), pytest.approx(0.0)]
    assert out["per_block"]["fc2"] == [None, pytest.approx(0.0), pytest.approx(12.0)]
    assert out["relative"][1] == pytest.approx(4.0 / 3.0)
    assert out["relative"][2] == pytest.approx(12.0 / 5.0)
    assert out["drift"] == pytest.approx(math.sqrt(4.0**2 + 12.0**2))


def test_single_task_has_no_update():
    out = update_norms([snap([1.0], [2.0])])
    assert out["shared"] == [None] and out["drift"] is None
