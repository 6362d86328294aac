"""Depth regimes: which blocks train, and that frozen blocks stay bitwise unchanged."""
import pytest
import torch
from conftest import make_spec

from harness.config.specs import DatasetSpec
from harness.config.vocabulary import regime_depth as regime_k
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.regimes import apply_regime, changed_frozen, frozen_state, trainable_blocks


def test_regime_blocks():
    model = build_model("mlp", (1, 8, 8), 5, 2)
    assert trainable_blocks(model, "head") == []
    assert trainable_blocks(model, "last-1") == ["fc4"]
    assert trainable_blocks(model, "last-3") == ["fc2", "fc3", "fc4"]
    assert trainable_blocks(model, "full") == ["fc1", "fc2", "fc3", "fc4"]
    with pytest.raises(ValueError, match="needs 5 blocks; the model has 4"):
        regime_k("last-5", 4)


def test_apply_regime_freezes_and_keeps_frozen_blocks_in_eval_mode():
    model = build_model("small-cnn", (1, 8, 8), 5, 2)
    apply_regime(model, "last-1")
    model.train()
    assert model.blocks["conv1"].training is False and model.blocks["fc"].training is True
    assert not any(p.requires_grad for p in model.blocks["conv2"].parameters())
    assert all(p.requires_grad for p in model.blocks["fc"].parameters())
    assert all(p.requires_grad for p in model.heads.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["head", "last-1", "last-2", "last-3", "full"])
def test_frozen_parameters_and_buffers_unchanged_in_every_regime(regime, tmp_path):
    """An independent observer plugin snapshots frozen state after task 1 and at the end."""
    observer = tmp_path / "observer.py"
    observer.write_text(OBSERVER)
    spec = make_spec(regime=regime, method="observer", dataset=DatasetSpec("digits", 3, 2, "small-cnn"),
                     training=make_spec().training.__class__(lr=0.1, momentum=0.9, epochs=1, batch_size=32))
    record = run_one(spec, device="cpu", method_files=(str(observer),))
    assert record.status == "ok", record.error
    snaps = record.diagnostics["observer"]
    frozen = [b for b in ("conv1", "conv2", "conv3", "fc") if b not in trainable_blocks(
        build_model("small-cnn", (1, 8, 8), 3, 2), regime)]
    for block in frozen:
        assert snaps["after_task_1"][block] == snaps["end"][block], block
    for block in set(("conv1", "conv2", "conv3", "fc")) - set(frozen):
        assert snaps["after_task_1"][block] != snaps["end"][block], block


OBSERVER = '''
"""Test adapter: naive training plus a plugin that fingerprints each block (params + buffers)."""
import hashlib
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive

NAME = "observer"
DEFAULTS = {}


def fingerprint(block):
    h = hashlib.sha256()
    for _, t in [*block.named_parameters(), *block.named_buffers()]:
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


class Observer(SupervisedPlugin):
    def __init__(self):
        super().__init__()
        self.snaps, self.count = {}, 0

    def after_training_exp(self, strategy, **kw):
        self.count += 1
        fp = {n: fingerprint(b) for n, b in strategy.model.blocks.items()}
        self.snaps["after_task_1" if self.count == 1 else "end"] = fp

    def harness_diagnostics(self):
        return {"observer": self.snaps}


def build(ctx):
    return Naive(**ctx.strategy_kwargs(Observer()))
'''


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["head", "bitfit", "lora-r2", "last-1:lora-r2"])
def test_engine_rejects_a_method_that_changes_frozen_weights(tmp_path, regime):
    """fc1's weight is frozen in every one of these regimes (under LoRA: the base of its adapter)."""
    cheat = tmp_path / "cheat.py"
    cheat.write_text(CHEAT)
    record = run_one(make_spec(regime=regime, method="cheat"), device="cpu", method_files=(str(cheat),))
    assert record.status == "failed"
    assert f"frozen parameters/buffers changed under regime {regime!r}" in record.error


def test_batchnorm_of_a_lora_block_stays_in_eval_mode_and_its_statistics_are_checked():
    from harness.run.regimes import inject_adapters

    model = inject_adapters(build_model("mlp-bn", (1, 8, 8), 2, 2), "lora-r2")
    apply_regime(model, "lora-r2")
    model.train()
    bn = model.blocks["fc2"][1]
    assert isinstance(bn, torch.nn.BatchNorm1d) and bn.training is False and model.blocks["fc2"].training
    before = frozen_state(model)
    assert "blocks.fc2.1.running_mean" in before and "blocks.fc2.0.base_layer.weight" in before
    bn.running_mean.add_(1.0)
    assert changed_frozen(model, before) == ["blocks.fc2.1.running_mean"]
    apply_regime(model, "norm")  # norm trains BatchNorm's affine: it trains, in train mode, statistics move
    model.train()
    assert bn.training and "blocks.fc2.1.running_mean" not in frozen_state(model)


CHEAT = '''
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive

NAME = "cheat"
DEFAULTS = {}


class Nudge(SupervisedPlugin):
    def after_training_exp(self, strategy, **kw):
        with torch.no_grad():
            strategy.model.blocks["fc1"][1].weight.add_(1e-3)


def build(ctx):
    return Naive(**ctx.strategy_kwargs(Nudge()))
'''


def test_frozen_state_helpers_detect_a_change():
    model = build_model("small-cnn", (1, 8, 8), 2, 2)
    apply_regime(model, "last-1")
    before = frozen_state(model)
    assert changed_frozen(model, before) == []
    model.blocks["conv1"][1].running_mean.add_(1.0)
    assert changed_frozen(model, before) == ["blocks.conv1.1.running_mean"]
