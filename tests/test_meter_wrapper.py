"""A method that trains and evaluates its own model around the run's (strategy.model a wrapper: L2P's L2PNet): the
compute meter counts the wrapper's passes at its FLOPs, the initial row evaluates the wrapper, the record's params
count its own parameters (harness/run/compute.py, engine.py, regimes.method_parameter_counts)."""
from __future__ import annotations

import copy
import textwrap

import numpy as np
import pytest
import torch
from conftest import make_spec
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods.l2p import L2PNet, drop_regime_prompt, make_pool
from harness.run import compute
from harness.run.compute import ComputeMeter, wrapper_flops_per_sample
from harness.run.datasets import load_dataset
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.regimes import apply_regime, inject_adapters, parameter_counts

D, HIDDEN, DEPTH, PATCHES, CONV = 32, 64, 3, 16, 16 * 32 * (1 * 2 * 2) * 2  # vit-tiny on 1x8x8: 2x2 patches


def _blocks_flops(tokens: int) -> int:
    """vit-tiny's transformer blocks by hand (torch.utils.flop_counter's conventions: a matmul 2·M·K·N, attention
    4·N²·D): qkv, q·kᵀ and a·v, the projection, the MLP's two layers."""
    n = tokens
    return DEPTH * (2 * n * D * 3 * D + 4 * n * n * D + 2 * n * D * D + 2 * n * D * HIDDEN * 2)


def _l2p(pool_size=10, top_k=5, length=5, classes=10):
    model = inject_adapters(build_model("vit-tiny", (1, 8, 8), n_heads=1, head_classes=classes), f"prompt-l{length}")
    apply_regime(model, f"prompt-l{length}")
    drop_regime_prompt(model)
    torch.manual_seed(0)
    return model, L2PNet(model, make_pool(D, length, pool_size, top_k, True))


def test_the_wrapper_pass_costs_its_longer_sequence_by_hand_and_by_torchs_own_counter():
    """L2P on vit-tiny (digits-shaped input): a pass is the query (16 patches + class token) and the prompted pass
    (+ top_k·L = 25 prompt tokens), the key similarity and the head; the meta measurement (batch-wise choice off:
    torch.unique has no meta kernel) equals the hand formula and FlopCounterMode on real tensors."""
    compute._FLOPS_CACHE.clear()
    model, wrapper = _l2p()
    measured = wrapper_flops_per_sample(wrapper, model, (1, 8, 8))
    query = CONV + _blocks_flops(1 + PATCHES)
    prompted = CONV + 2 * D * 10 + _blocks_flops(1 + PATCHES + 5 * 5) + 2 * D * 10
    assert measured["whole"] == query + prompted, (measured, query + prompted)
    assert measured["forward"] == prompted  # the query is counted as the backbone pass it is
    assert compute.flops_per_sample(model, (1, 8, 8))["blocks"] and \
        sum(compute.flops_per_sample(model, (1, 8, 8))["blocks"]) == query
    real = copy.deepcopy(wrapper)
    real.pool.batchwise_prompt = False
    x = torch.randn(4, 1, 8, 8)
    # the math attention: CPU's fused kernel has no formula in FlopCounterMode (it would count 0 for attention)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = real(x)
    assert counter.get_total_flops() // 4 == measured["whole"]
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() // 4 == measured["backward"] > 0
    print("l2p vit-tiny pass FLOPs/sample: whole", measured["whole"], "prompted", prompted, "query", query)


def test_the_meter_counts_the_wrappers_calls_and_the_query_as_a_backbone_pass():
    """Three training calls of 8 rows with a loss: 24 wrapper passes, 24 query (backbone) passes, 24 backward; the
    record's FLOPs are those counts times the hand-checked figures; the run's model's own hooks add nothing else."""
    compute._FLOPS_CACHE.clear()
    model, wrapper = _l2p()
    meter = ComputeMeter(model, (1, 8, 8), "cpu")
    meter.watch(wrapper)
    meter.start_task(model)
    with meter.stage_of(compute.TRAIN):
        for _ in range(3):
            wrapper(torch.randn(8, 1, 8, 8), with_res=True)["logits"].sum().backward()
    with torch.no_grad():  # outside a stage (the harness's evaluation): not counted
        wrapper(torch.randn(8, 1, 8, 8))
    meter.close()
    out = meter.as_json()
    fps = wrapper_flops_per_sample(wrapper, model, (1, 8, 8))
    query = sum(compute.flops_per_sample(model, (1, 8, 8))["blocks"])
    assert out["forward_per_task"] == [48] and out["backward_per_task"] == [24]
    assert out["forward_flops"] == 24 * fps["forward"] + 24 * query == 24 * fps["whole"]
    assert out["backward_flops"] == 24 * fps["backward"]
    assert out["forward_flops_per_sample"] == [fps["whole"]] and out["backward_flops_per_sample"] == [fps["backward"]]


WRAPPED = textwrap.dedent('''
    import torch
    from avalanche.training.supervised import Naive

    NAME = "wrapped-naive"
    DEFAULTS = {}


    class Wrapped(torch.nn.Module):
        """The run's model plus a bias of its own that first answers every task's class 0."""

        def __init__(self, net):
            super().__init__()
            self.blocks, self.heads = net.blocks, net.heads
            self.block_names, self.frozen_blocks, self.frozen_modules = net.block_names, frozenset(), frozenset()
            object.__setattr__(self, "net", net)
            self.bias = torch.nn.Parameter(torch.tensor([50.0, 0.0]))

        def features(self, x):
            return self.net.features(x)

        def forward(self, x, task_labels=None):
            out = self.net(x, task_labels)
            return {t: v + self.bias for t, v in out.items()} if isinstance(out, dict) else out + self.bias


    class WrappedNaive(Naive):
        def forward(self):
            return self.model(self.mb_x, self.mb_task_id)


    def build(ctx):
        model = Wrapped(ctx.model)
        return WrappedNaive(**{**ctx.strategy_kwargs(), "model": model,
                        "optimizer": ctx.new_optimizer([p for p in model.parameters() if p.requires_grad])})
''')


@pytest.fixture
def wrapped(tmp_path):
    path = tmp_path / "wrapped.py"
    path.write_text(WRAPPED)
    return str(path)


def test_a_wrapper_around_the_run_model_costs_what_its_calls_run(wrapped):
    """A wrapper whose forward calls the run's model with gradients: that pass is the wrapper's own (counted once),
    so its compute is naive's to the sample and the FLOP (the bias adds element-wise ops only); the initial row
    evaluates the wrapper (its bias answers class 0); params count the bias."""
    spec = make_spec(hparams={}, training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))
    naive = run_one(spec, device="cpu")
    mine = run_one(make_spec(method="wrapped-naive", hparams={},
                             training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32)),
                   device="cpu", method_files=(wrapped,))
    assert naive.status == mine.status == "ok", mine.error
    a, b = naive.budget["compute"], mine.budget["compute"]
    assert b["forward_per_task"] == a["forward_per_task"]
    assert b["backward_per_task"] == a["backward_per_task"]
    assert (b["forward_flops"], b["backward_flops"]) == (a["forward_flops"], a["backward_flops"])
    y = load_dataset("digits").y_test.numpy() if hasattr(load_dataset("digits").y_test, "numpy") \
        else np.asarray(load_dataset("digits").y_test)
    first = [float(np.mean(y[(y == 2 * t) | (y == 2 * t + 1)] == 2 * t)) for t in range(5)]
    assert mine.init_acc == pytest.approx(first) and naive.init_acc != pytest.approx(first)
    assert mine.params["method_owned"] == 2 and "method_owned" not in naive.params
    assert mine.params["trainable"] == naive.params["trainable"] + 2
    assert mine.params["adapters"] == naive.params["adapters"] + 2


def test_l2p_records_count_its_pool_and_its_prompted_passes():
    """An L2P run: params count the pool (not the emptied regime prompt); two forward passes per training sample
    (query, prompted), one backward."""
    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), method="l2p", regime="prompt-l5",
                     pretrain="none", hparams={"pool_size": 4, "top_k": 2},
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=64))
    record = run_one(spec, device="cpu")
    assert record.status == "ok", record.error
    pool = record.diagnostics["l2p_pool_parameters"]
    before = parameter_counts(inject_adapters(build_model("vit-tiny", (1, 8, 8), 5, 2), "prompt-l5"), "prompt-l5")
    assert record.params["method_owned"] == pool == 4 * 5 * D + 4 * D
    assert record.params["adapters"] == pool and before["adapters"] == 5 * D
    assert record.params["trainable"] == before["trainable"] - 5 * D + pool
    c = record.budget["compute"]
    assert c["forward_per_task"] == [2 * n for n in c["backward_per_task"]] and all(c["backward_per_task"])
    prompted = CONV + 2 * D * 4 + _blocks_flops(1 + PATCHES + 2 * 5) + 2 * D * 2  # task-IL: 2 outputs per head
    assert c["forward_flops_per_sample"] == [CONV + _blocks_flops(1 + PATCHES) + prompted] * 5


def test_a_prefix_prompt_wrapper_is_measured_even_holding_its_last_loss():
    """DualPrompt's wrapper: the query (no gradients) is a backbone pass, the prompted pass through the run model's
    forward (with gradients) is the wrapper's own; its measurement (FlopCounterMode on real tensors agrees) survives
    the loss tensor it keeps between tasks."""
    import torch as _torch

    from harness.run import engine
    from harness.run.plugins import HarnessPlugin

    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), method="dualprompt", regime="prompt-l4",
                     scenario="class-il", hparams={"g_layers": [0], "e_layers": [1, 2]},
                     training=TrainingSpec(lr=0.01, momentum=0.9, epochs=1, batch_size=32))
    model = engine.inject_adapters(engine.build_run_model(spec, (1, 8, 8)), spec.regime)
    apply_regime(model, spec.regime)
    wrapper = engine._build_strategy(spec, model, HarnessPlugin(None), _torch.device("cpu"), (), ()).model
    compute._FLOPS_CACHE.clear()
    fps = wrapper_flops_per_sample(wrapper, model, (1, 8, 8))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        wrapper(_torch.randn(4, 1, 8, 8), 0)
    assert counter.get_total_flops() // 4 == fps["whole"]
    assert fps["forward"] == fps["whole"] - sum(compute.flops_per_sample(model, (1, 8, 8))["blocks"])
    wrapper.prompt_loss = wrapper.pool.parameters().__next__().sum() * 2  # not a leaf: a plain deepcopy refuses
    compute._FLOPS_CACHE.clear()
    assert wrapper_flops_per_sample(wrapper, model, (1, 8, 8)) == fps
    record = run_one(spec, device="cpu")
    c = record.budget["compute"]
    assert c["forward_per_task"] == [2 * n for n in c["backward_per_task"]] and all(c["backward_per_task"])
    assert record.params["method_owned"] > 0
