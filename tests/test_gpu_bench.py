"""benchmarks/gpu.py's ViT unit without a GPU: the skip line, and a dry run that writes data the harness reads."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu  # noqa: E402  (benchmarks/gpu.py)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip line is for machines without CUDA")
def test_vit_unit_without_cuda_says_skipped(capsys):
    assert gpu.main(["--unit", "vit"]) == 0
    assert capsys.readouterr().out.strip() == gpu.SKIP_LINE


def test_vit_unit_dry_run_plans_bf16_runs_on_pixels_the_loader_reads(tmp_path, capsys):
    from harness.run.datasets import load_dataset

    out = tmp_path / "bench"
    code = gpu.main(["--unit", "vit", "--model", "vit-tiny", "--train-size", "300", "--test-size", "200",
                     "--out", str(out), "--dry-run"])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("--jobs") == 3  # levels 1, 2, 4
    proto = yaml.safe_load((out / "protocol.yaml").read_text())
    assert proto["scenario"] == "class-il" and proto["training"]["precision"] == "bf16"
    assert proto["regimes"] == ["head", "lora-r4", "full"]
    assert proto["datasets"][0] == {"name": gpu.default_vit_dataset(), "n_tasks": 10, "classes_per_task": 10,
                                    "model": "vit-tiny"}
    data = load_dataset("cifar100", str(out / "data"))
    assert len(data.y_train) == 300 and len(data.y_test) == 200
    assert sorted(set(data.y_train.tolist())) == list(range(100))  # balanced over the 100 classes
    assert tuple(data.x_train.shape[1:]) == (3, 32, 32)
