"""magmax-clip: MagMax's home setting (CLIP ViT-B/16 image tower, full fine-tuning, class-IL) loads and plans."""
from __future__ import annotations

from test_vit_protocols import write_cifar100_every_class

from harness.api.registry import get_registry
from harness.config.protocol import load_protocol
from harness.config.vocabulary import Scenario


def test_magmax_clip_is_the_papers_setting_where_the_harness_can_express_it():
    p = load_protocol("magmax-clip", get_registry())
    assert p.scenario == Scenario.CLASS_IL and p.regimes == ("full",)
    assert p.pretrain.as_json()["timm"] == "vit_base_patch16_clip_224.openai"
    settings = {(d.name, d.n_tasks, d.classes_per_task, d.model) for d in p.datasets}
    assert settings == {("cifar100-pixels", 10, 10, "vit-b16-clip"), ("imagenet-r", 10, 20, "vit-b16-clip"),
                        ("cub200", 10, 20, "vit-b16-clip")}
    # the official finetune_splitted.py: AdamW, lr 1e-5, weight decay 0.1, batch 128, 10 epochs, fp32
    t = p.training
    assert (t.optimizer, t.lr, t.weight_decay, t.batch_size, t.epochs, t.precision) == (
        "adamw", 1e-5, 0.1, 128, 10, "fp32")
    methods = {m.display: (m.name, m.hparams) for m in p.methods}
    assert methods["magmax"] == ("magmax", {"lam": 0.5, "finetune": "sequential", "batchnorm": "recompute"})
    assert methods["magmax-ind"][1]["finetune"] == "independent"
    # the official merge_splitted.py's coefficients
    assert methods["ties"][1]["top_k"] == 20.0 and methods["ties"][1]["lam"] == 0.55
    assert methods["randmix"][1]["lam"] == 1.0
    assert set(methods) == {"naive", "magmax", "magmax-ind", "avg", "randmix", "ties"}


def test_magmax_clip_dry_runs_on_real_files_without_weights(tmp_path, cli):
    write_cifar100_every_class(tmp_path / "data")  # CIFAR-100's on-disk format; no ImageNet-R, CUB, weights
    code, out, err = cli("run", "--protocol", "magmax-clip", "--dry-run", "--data-dir", tmp_path / "data",
                         "--results", tmp_path / "res")
    assert code == 0, err
    assert "grid: 3 datasets x 1 regimes x 6 methods x 5 task orders x 1 seeds = 90 runs" in out
    assert "to run: 30" in out  # CIFAR-100's runs
    assert "not planned: 60 runs of cub200, imagenet-r" in out
    assert "weights missing: pretrain.timm vit_base_patch16_clip_224.openai" in out
    assert "--download" in out
