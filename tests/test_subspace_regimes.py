"""Regimes beyond depth: bitfit, norm, LoRA (peft) and their composition with depth."""
import copy
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, make_spec
from torch import nn

from harness.api.subspace import effective_weights, lora_layers, write_effective
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.config.vocabulary import REGIME_GRAMMAR, parse_regime, regime_depth, regime_family
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.norms import update_norms
from harness.run.regimes import apply_regime, inject_adapters, parameter_counts, selected_parameters, trained_effective

FAST = TrainingSpec(lr=0.1, momentum=0.9, epochs=1, batch_size=32)


def _lora_net(regime="lora-r2", model="mlp-bn", shape=(1, 8, 8)):
    torch.manual_seed(0)
    net = inject_adapters(build_model(model, shape, 3, 2), regime)
    apply_regime(net, regime)
    return net


# -- the grammar -----------------------------------------------------------------------------
def test_regime_grammar_parses_families_depths_and_ranks():
    assert parse_regime("lora-r16") == parse_regime("lora-r16").__class__("lora-r16", None, "lora", 16)
    assert (parse_regime("last-2:lora-r4").depth, parse_regime("last-2:lora-r4").rank) == (2, 4)
    assert [regime_family(r) for r in ("head", "last-1", "full", "bitfit", "last-1:norm", "lora-r1")] == \
        ["depth", "depth", "depth", "bitfit", "norm", "lora"]
    assert regime_depth("bitfit", 4) == 4 and regime_depth("last-3:bitfit", 4) == 3 and regime_depth("head", 4) == 0


BAD_REGIMES = ["lora-r0", "lora-rx", "lora", "last-2:lora", "bitfit:last-1", "last-0:bitfit", "last-2:full",
               "last-1:head", "lora-r4:", "LORA-R4", "last-2:lora-r4:bitfit", "norm-only"]


@pytest.mark.parametrize("bad", BAD_REGIMES)
def test_bad_regime_strings_give_one_line_with_the_grammar(bad):
    from harness.api.registry import get_registry
    from harness.config.protocol import ProtocolError, parse_protocol

    raw = {"name": "p", "version": "1", "datasets": ["digits"], "regimes": ["head", bad], "methods": ["naive"]}
    with pytest.raises(ProtocolError) as caught:
        parse_protocol(raw, "p.yaml", get_registry())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("p.yaml: regimes[1]:") and repr(bad) in message and REGIME_GRAMMAR in message


def test_a_bad_regime_on_the_command_line_exits_2_with_one_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nversion: '1'\ndatasets: [digits]\nregimes: [head, 'last-2:lora']\nmethods: [naive]\n")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--protocol", str(path), "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "regimes[1]" in done.stderr and "Traceback" not in done.stderr


def test_a_family_that_selects_nothing_is_refused_at_load(tmp_path):
    from harness.api.registry import get_registry
    from harness.config.protocol import ProtocolError, parse_protocol

    raw = {"name": "p", "version": "1", "datasets": [{"name": "digits", "model": "small-cnn"}],
           "regimes": ["last-1:norm"], "methods": ["naive"]}
    with pytest.raises(ProtocolError, match=r"regimes\[0\]: 'last-1:norm' trains nothing on model 'small-cnn'"):
        parse_protocol(raw, "p.yaml", get_registry())


# -- what trains ------------------------------------------------------------------------------
def test_bitfit_and_norm_select_biases_and_normalisation_parameters_only():
    net = build_model("small-cnn", (1, 8, 8), 2, 2)
    bitfit = selected_parameters(net, "bitfit")
    assert bitfit and all(n.endswith(".bias") for n in bitfit)
    # the convolutions have no bias: bitfit trains BatchNorm's shift and the fc layer's bias
    assert set(bitfit) == {"blocks.conv1.1.bias", "blocks.conv2.1.bias", "blocks.conv3.1.bias", "blocks.fc.1.bias"}
    norm = selected_parameters(net, "norm")
    assert set(norm) == {f"blocks.conv{i}.1.{w}" for i in (1, 2, 3) for w in ("weight", "bias")}
    assert set(selected_parameters(net, "last-1:bitfit")) == {"blocks.fc.1.bias"}


def test_lora_injects_adapters_only_in_the_regime_blocks_and_starts_at_the_same_function():
    torch.manual_seed(0)
    plain = build_model("small-cnn", (1, 16, 16), 2, 2).eval()
    net = inject_adapters(copy.deepcopy(plain), "last-2:lora-r3").eval()
    assert sorted(lora_layers(net)) == ["blocks.conv3.0", "blocks.fc.1"]
    x = torch.randn(4, 1, 16, 16)
    assert torch.equal(plain(x, 0), net(x, 0))  # B = 0: the adapters add nothing yet
    assert effective_weights(net).keys() == dict(plain.blocks.named_parameters(prefix="blocks")).keys()
    counts = parameter_counts(net, "last-2:lora-r3")
    conv3, fc = net.blocks["conv3"][0].base_layer, net.blocks["fc"][1].base_layer
    by_hand = 3 * (conv3.in_channels * 9 + conv3.out_channels) + 3 * (fc.in_features + fc.out_features)
    assert counts["trainable_shared"] == counts["adapters"] == by_hand
    assert counts["total"] == sum(p.numel() for p in plain.parameters())
    assert counts["fraction"] == pytest.approx(counts["trainable"] / counts["total"])


@pytest.mark.slow
def test_lora_trains_only_adapter_parameters_and_heads():
    """A whole run: the optimizer holds adapters and heads only; base weights and BatchNorm
    statistics of the shared blocks are bitwise unchanged; the adapters moved."""
    seen = {}

    def observer(event, t, strategy):
        model = strategy.model
        state = {n: p.detach().clone() for n, p in model.named_parameters()}
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        seen[(event, t)] = (state, buffers)
        if event == "before_task":
            optimized = {id(p) for g in strategy.optimizer.param_groups for p in g["params"]}
            names = {n for n, p in model.named_parameters() if id(p) in optimized}
            seen.setdefault("optimized", []).append(names)

    spec = make_spec(regime="lora-r4", pretrain="none", training=FAST, dataset=DatasetSpec("digits", 3, 2, "mlp-bn"))
    from harness.run.engine import _execute, _Progress  # noqa: F401  (the observer is run_one's hook)

    record = run_one(spec, device="cpu", observer=observer)
    assert record.status == "ok", record.error
    first, last = seen[("before_task", 0)], seen[("after_task", 2)]
    for names in seen["optimized"]:
        assert names and all(".lora_" in n or n.startswith("heads.") for n in names), names
        assert any(".lora_" in n for n in names)
    for name, before in first[0].items():
        moved = not torch.equal(before, last[0][name])
        if ".lora_B" in name or name.startswith("heads."):
            assert moved, name
        elif ".lora_A" in name:
            continue  # A moves once B is non-zero
        elif name.startswith("blocks."):
            assert not moved, name  # base weights, biases and BatchNorm affine: frozen
    for name, before in first[1].items():
        assert torch.equal(before, last[1][name]), name  # running statistics: frozen modules in eval mode
    assert record.params["adapters"] == record.params["trainable_shared"] > 0
    assert record.update_norms["drift"] > 0  # measured on effective weights W + BA


# -- effective weights -------------------------------------------------------------------------
def test_effective_weights_and_update_norms_equal_a_hand_computation():
    net = _lora_net("lora-r2", model="mlp", shape=(5,))
    layer = lora_layers(net)["blocks.fc2.0"]
    base = layer.base_layer.weight.detach().clone()
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    snaps = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            A.copy_(torch.randn(A.shape, generator=g))
            B.copy_(torch.randn(B.shape, generator=g))
        eff = effective_weights(net)
        # scale = lora_alpha / r = 1: W + B A
        torch.testing.assert_close(eff["blocks.fc2.0.weight"], base + B.detach() @ A.detach(), rtol=0, atol=1e-6)
        snaps.append({k: v.clone() for k, v in eff.items()})
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    products = []
    for g in (g1, g2):
        a = torch.randn(A.shape, generator=g)
        b = torch.randn(B.shape, generator=g)
        products.append(b @ a)
    by_hand = float((products[1] - products[0]).double().pow(2).sum().sqrt())
    norms = update_norms(snaps)
    assert norms["shared"][1] == pytest.approx(by_hand, rel=1e-6)
    assert norms["per_block"]["fc2"][1] == pytest.approx(by_hand, rel=1e-6)
    assert norms["per_block"]["fc1"][1] == 0.0


def test_conv_effective_weight_is_the_reshaped_product():
    net = _lora_net("lora-r3", model="small-cnn", shape=(1, 8, 8))
    layer = lora_layers(net)["blocks.conv2.0"]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    W = layer.base_layer.weight
    by_hand = W + (B.flatten(1) @ A.flatten(1)).view_as(W)
    torch.testing.assert_close(effective_weights(net)["blocks.conv2.0.weight"], by_hand.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("model,shape", [("mlp-bn", (1, 8, 8)), ("small-cnn", (1, 8, 8)), ("cnn1d", (40,))])
def test_a_lora_model_with_its_adapters_merged_equals_the_unmerged_forward(model, shape):
    net = _lora_net("lora-r4", model=model, shape=shape)
    for layer in lora_layers(net).values():
        with torch.no_grad():
            layer.lora_B["default"].weight.normal_(std=0.1)
    net.eval()
    x = torch.randn(6, *shape)
    unmerged = net(x, 1)
    ours = copy.deepcopy(net)
    write_effective(ours, effective_weights(net))  # W + BA into the base, adapters zeroed
    peft_merged = copy.deepcopy(net)
    for layer in lora_layers(peft_merged).values():
        layer.merge()  # peft's own merge: an independent route
    torch.testing.assert_close(ours(x, 1), unmerged, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(peft_merged(x, 1), unmerged, rtol=1e-5, atol=1e-5)
    assert any(not torch.equal(net(x, 1), build_model(model, shape, 3, 2).eval()(x, 1)) for _ in [0])


def test_trained_effective_names_map_adapters_to_their_weights():
    net = _lora_net("last-1:lora-r2", model="mlp", shape=(5,))
    assert trained_effective(net, "last-1:lora-r2") == ["blocks.fc4.0.weight"]
    plain = build_model("mlp", (5,), 3, 2)
    assert trained_effective(plain, "last-1:bitfit") == ["blocks.fc4.0.bias"]
    assert trained_effective(plain, "last-1") == ["blocks.fc4.0.weight", "blocks.fc4.0.bias"]


# -- methods act on what trains ---------------------------------------------------------------
@pytest.mark.slow
def test_magmax_under_lora_merges_effective_task_vectors_from_theta0():
    """pretrain none: θ0 = the initial model and task 1 contributes τ_1. The evaluated model's
    effective weights are θ0 + λ·(per element the largest-|τ| task vector), τ on W + BA."""
    snapshots = []

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            snapshots.append({k: v.clone() for k, v in effective_weights(strategy.model).items()})
        if event == "after_task":
            from harness.api import contract
            snapshots.append(({k: v.clone() for k, v in effective_weights(strategy.model).items()},
                              {k: v.clone() for k, v in effective_weights(contract.evaluated_model(strategy)).items()}))

    spec = make_spec(regime="lora-r2", method="magmax", pretrain="none", training=FAST,
                     dataset=DatasetSpec("digits", 3, 2, "mlp"))
    record = run_one(spec, device="cpu", observer=observer)
    assert record.status == "ok", record.error
    theta0 = {k: v.clone() for k, v in snapshots[0].items()}
    taus = [{k: trained[k] - theta0[k] for k in theta0} for trained, _ in snapshots[1:]]
    merged_keys = set(trained_effective(_lora_net("lora-r2", "mlp", (64,)), "lora-r2"))
    for t in range(3):
        evaluated = snapshots[1 + t][1]
        for k in merged_keys:
            stack = torch.stack([tau[k] for tau in taus[:t + 1]])
            pick = stack.abs().flip(0).argmax(0)  # ties -> the later task
            tau_max = stack.flip(0).gather(0, pick.unsqueeze(0)).squeeze(0)
            torch.testing.assert_close(evaluated[k], theta0[k] + 0.5 * tau_max, rtol=0, atol=1e-5)
    assert record.diagnostics["merge"]["n_task_vectors"] == 3  # τ_1 counts: θ0 is not task 1


def test_gpm_is_refused_with_lora_and_allowed_when_restricted_to_depth(tmp_path):
    from harness.api.registry import get_registry
    from harness.config.protocol import ProtocolError, parse_protocol
    from harness.execution.plan import expand

    base = {"name": "p", "version": "1", "datasets": [{"name": "digits", "model": "mlp-bn"}],
            "regimes": ["head", "lora-r4", "last-1"]}
    with pytest.raises(ProtocolError, match=r"methods\[1\]: gpm cannot run faithfully under regime 'lora-r4'"):
        parse_protocol({**base, "methods": ["naive", "gpm"]}, "p.yaml", get_registry())
    with pytest.raises(ProtocolError, match=r"methods\[1\]\.regimes\[0\]: 'bitfit' is not a regime"):
        parse_protocol({**base, "methods": ["naive", {"name": "gpm", "regimes": ["bitfit"]}]}, "p.yaml", get_registry())
    protocol = parse_protocol({**base, "methods": ["naive", {"name": "gpm", "regimes": ["head", "last-1"]}]},
                              "p.yaml", get_registry())
    pairs = {(s.method, s.regime) for s in expand(protocol, fingerprints={"digits": "x"})}
    assert pairs == {("naive", "head"), ("naive", "lora-r4"), ("naive", "last-1"), ("gpm", "head"), ("gpm", "last-1")}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ewc-online", "lwf", "replay", "agem"])
def test_regularisers_and_rehearsal_run_on_lora_adapters(method):
    spec = make_spec(regime="last-2:lora-r2", method=method, pretrain="none", training=FAST,
                     dataset=DatasetSpec("digits", 3, 2, "mlp-bn"))
    record = run_one(spec, device="cpu")
    assert record.status == "ok", record.error  # the engine's frozen check ran after every task
    assert record.params["adapters"] > 0


def test_depth_regimes_keep_their_records_on_a_model_without_adapters():
    """Effective weights of a plain model are its parameters: same names, same tensors."""
    net = build_model("mlp-bn", (1, 8, 8), 2, 2)
    eff = effective_weights(net)
    params = dict(net.blocks.named_parameters(prefix="blocks"))
    assert eff.keys() == params.keys() and all(eff[k] is not None and torch.equal(eff[k], params[k]) for k in eff)
    assert isinstance(net.blocks["fc1"][1], nn.Linear)
