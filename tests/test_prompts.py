"""The prompt regime families (VPT-shallow `prompt-lL`, VPT-deep `prompt-deep-lL`): the grammar, injection
that changes the forward and nothing else, what trains, the accounting (counts, update norms, merges, FLOPs)
and the refusals. On `vit-tiny` (timm blocks) and on a small token model declared here as a plug-in (its
blocks implement harness/api/prompts.py's API as a third-party backbone would; its arithmetic is easy by hand)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import make_spec
from torch import nn

from harness.api import plugins, registry
from harness.api.plugins import Backbone
from harness.api.prompts import insert_prompt, is_token_block, prompt_parameters, token_blocks, vpt_bound
from harness.api.subspace import effective_weights
from harness.config import vocabulary as v
from harness.config.specs import TrainingSpec
from harness.run.compute import flops_per_sample
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.prefix_cache import frozen_prefix
from harness.run.regimes import (
    apply_regime,
    changed_frozen,
    frozen_state,
    inject_adapters,
    parameter_counts,
    selected_parameters,
    trained_effective,
)

D, PATCH, TOKENS = 8, 4, 5  # width, patch side (4x4 patches of digits' 8x8: 4 patches + the class token)
BLOCKS = ("embed", "tok1", "tok2", "tok3", "norm")
TOKEN_BLOCKS = ("tok1", "tok2", "tok3")
FAST = TrainingSpec(lr=0.1, momentum=0.9, epochs=1, batch_size=64)


class Embed(nn.Module):
    """(B, 1, 8, 8) -> (B, 1 + 4, D): 4x4 patches, a class token, positions."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(PATCH * PATCH, D)
        self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, TOKENS, D) * 0.02)

    def forward(self, x):
        patches = x.unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH).reshape(x.shape[0], -1, PATCH * PATCH)
        tokens = self.proj(patches)
        return torch.cat((self.cls.expand(x.shape[0], -1, -1), tokens), dim=1) + self.pos


class TokenBlock(nn.Module):
    """A one-head self-attention block with the token-block API (as the ViT blocks implement it)."""

    def __init__(self):
        super().__init__()
        self.embed_dim, self.prefix_tokens = D, 1
        self.norm = nn.LayerNorm(D)
        self.fc = nn.Linear(D, D)
        self.register_parameter("prompt", None)
        self.replace = False

    def add_prompt(self, n_tokens: int, replace: bool) -> None:
        bound = vpt_bound(PATCH * PATCH, D)
        self.prompt = nn.Parameter(torch.empty(n_tokens, D).uniform_(-bound, bound))
        self.replace = replace

    def forward(self, x):
        if self.prompt is not None:
            x = insert_prompt(x, self.prompt, self.prefix_tokens, self.replace)
        h = self.fc(self.norm(x))
        return x + torch.softmax(h @ h.transpose(1, 2) / math.sqrt(D), dim=-1) @ h


class Pool(nn.Module):
    def forward(self, x):
        return x[:, 0]


def build(input_shape):
    return [Embed(), TokenBlock(), TokenBlock(), TokenBlock(), nn.LayerNorm(D)]


TOY = Backbone("toy-vit", build, BLOCKS, (1, 8, 8), "a 3-block token model", norm_blocks=(*TOKEN_BLOCKS, "norm"),
               bias_blocks=BLOCKS, feature_dim=D, tail={"pool": Pool}, token_blocks=TOKEN_BLOCKS)


@pytest.fixture(autouse=True)
def toy_backbone():
    """The token backbone registered as a plug-in for each test; the tables as they were afterwards."""
    from harness.run import datasets, regimes  # noqa: F401  (their built-ins register on import)

    tables = [*plugins._TABLE.values(), v.MODELS, v.DATASETS, v.FAMILY_ARGUMENTS, v.FAMILY_DESCRIPTIONS]
    saved = [dict(t) for t in tables]
    plugins.register((TOY,), "tests/test_prompts.py", "sha256:test")
    yield
    for table, old in zip(tables, saved):
        table.clear()
        table.update(old)
    registry._CACHE.clear()


MODELS = ("toy-vit", "vit-tiny")
# vit-tiny: embed, block1..block3 (its 3 transformer blocks), norm
TOKEN_BLOCKS_OF = {"toy-vit": TOKEN_BLOCKS, "vit-tiny": ("block1", "block2", "block3")}
WIDTH = {"toy-vit": D, "vit-tiny": 32}
SEQUENCE = {"toy-vit": TOKENS, "vit-tiny": 1 + 16}  # vit-tiny: 4x4 patches of any sample, + the class token


def _net(regime=None, seed=0, model="toy-vit"):
    torch.manual_seed(seed)
    net = build_model(model, (1, 8, 8), 2, 3)
    if regime:
        inject_adapters(net, regime)
        apply_regime(net, regime)
    return net


def _x(rows=6):
    return torch.randn((rows, 1, 8, 8), generator=torch.Generator().manual_seed(1))


# -- the grammar -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, depth, family, tokens", [
    ("prompt-l4", None, "prompt", 4), ("prompt-deep-l4", None, "prompt-deep", 4),
    ("last-2:prompt-deep-l1", 2, "prompt-deep", 1), ("prompt-l1024", None, "prompt", v.MAX_PROMPT_TOKENS),
    ("lora-r4", None, "lora", 4), ("last-1:norm", 1, "norm", None)])
def test_the_grammar_reads_prompt_families_and_keeps_the_others(name, depth, family, tokens):
    r = v.parse_regime(name)
    assert (r.depth, r.family, r.rank) == (depth, family, tokens) and v.written_family(name) == family


@pytest.mark.parametrize("bad", ["prompt", "prompt-deep", "prompt-l0", "prompt-l1025", "prompt-r4",
                                 "prompt-deep-r4", "prompt-deep-l", "deep-l4", "prompt-deeper-l4",
                                 "last-2:prompt-deep", "prompt-l4:last-1"])
def test_bad_prompt_names_are_unknown_with_the_grammar(bad):
    assert v.regime_error(bad) == f"unknown regime {bad!r}; allowed: {v.REGIME_GRAMMAR}"
    assert v.written_family(bad) == ("deep" if bad == "deep-l4" else None)  # `deep`: an unloaded plug-in's


def test_prompt_at_the_input_takes_no_depth_with_one_line():
    assert v.regime_error("last-2:prompt-l4") == (
        "regime 'last-2:prompt-l4' is not allowed: prompt-lL puts its prompt tokens at the input only, so no "
        "depth composes with it; allowed: prompt-lL, or prompt-deep-lL and last-k:prompt-deep-lL (prompts at "
        "every transformer block of the last k blocks)")


def test_prompt_regimes_sort_after_lora_and_before_deeper_depths():
    names = ["full", "last-2:prompt-deep-l4", "prompt-deep-l2", "prompt-l8", "prompt-l2", "lora-r4", "head",
             "last-2", "last-2:lora-r4", "bitfit"]
    assert sorted(names, key=v.regime_sort_key) == [
        "head", "bitfit", "lora-r4", "prompt-l2", "prompt-l8", "prompt-deep-l2", "last-2:lora-r4",
        "last-2:prompt-deep-l4", "last-2", "full"]


def test_a_plug_in_family_still_parses_beside_the_hyphenated_ones():
    v.FAMILY_ARGUMENTS["weights"] = "w"
    assert v.parse_regime("last-1:weights-w3").family == "weights" and v.parse_regime("weights-w3").rank == 3
    assert v.written_family("other-x2") == "other"  # an unloaded plug-in's family, read from the name


def test_regime_problem_on_models_without_token_blocks_and_depths_without_them():
    assert v.regime_problem("prompt-l4", "toy-vit") is None and v.regime_problem("last-2:prompt-deep-l4", "toy-vit") \
        is None
    assert v.regime_problem("prompt-l4", "small-cnn", "mnist") == (
        "'prompt-l4' cannot run on model 'small-cnn' of dataset 'mnist': it has no transformer blocks (token_blocks) "
        "to take prompt tokens; allowed: prompt regimes on a backbone with token_blocks (vit-tiny, vit-b16, vit-b16-clip, "
        "toy-vit)")
    assert v.regime_problem("last-1:prompt-deep-l4", "toy-vit") == (
        "'last-1:prompt-deep-l4' puts no prompt on model 'toy-vit': its blocks norm hold none of the transformer "
        "blocks tok1, tok2, tok3; allowed: last-k with k >= 2")


def test_a_protocol_with_a_prompt_regime_on_a_cnn_is_refused_at_load(tmp_path, cli):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nversion: '1'\ndatasets: [{name: mnist, n_tasks: 5, classes_per_task: 2}]\n"
                    "regimes: [head, prompt-l4]\nmethods: [naive]\n")
    code, _, err = cli("run", "--protocol", path, "--dry-run")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.endswith(
        "regimes[1]: 'prompt-l4' cannot run on model 'small-cnn' of dataset 'mnist': it has no transformer blocks "
        "(token_blocks) to take prompt tokens; allowed: prompt regimes on a backbone with token_blocks (vit-tiny, "
        "vit-b16, vit-b16-clip, toy-vit)\n")


def test_a_protocol_with_last_k_prompt_is_refused_at_load(tmp_path, cli):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nversion: '1'\ndatasets: [digits]\nregimes: [head, 'last-1:prompt-l4']\nmethods: [naive]\n")
    code, _, err = cli("run", "--protocol", path, "--dry-run")
    assert code == 2 and err.count("\n") == 1
    assert err.endswith(f"regimes[1]: {v.regime_error('last-1:prompt-l4')}\n")
    assert "regime 'last-1:prompt-l4' is not allowed: prompt-lL puts its prompt tokens" in err


def test_methods_run_under_prompt_families_except_the_projection_methods():
    adapters = registry.get_registry()
    refused = sorted(n for n, a in adapters.items() for f in (v.Family.PROMPT, v.Family.PROMPT_DEEP)
                     if not v.runs_under_family(f, a.regime_families))
    # prompt pools (family "prompt-pool") own `prompt` (their pool replaces its prompt) and refuse prompt-deep
    pools = [n for n, a in adapters.items() if a.family == "prompt-pool"]
    assert all(v.runs_under_family(v.Family.PROMPT, adapters[n].regime_families) for n in pools)
    assert refused == sorted(["became", "became", "gpm", "gpm", *pools])


# -- injection: the forward changes, nothing else ------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_the_token_blocks_implement_the_api_and_only_they(model):
    net = _net(model=model)
    names = TOKEN_BLOCKS_OF[model]
    assert [n for n, b in net.blocks.items() if is_token_block(b)] == list(names) == list(v.MODELS[model].token_blocks)
    assert list(token_blocks(net, ["embed", names[-1], "norm"])) == [names[-1]]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("regime, prompted", [("prompt-l3", slice(0, 1)), ("prompt-deep-l3", slice(None)),
                                              ("last-3:prompt-deep-l3", slice(-2, None))])
def test_injection_adds_prompts_and_changes_no_existing_tensor(model, regime, prompted):
    prompted = list(TOKEN_BLOCKS_OF[model][prompted])
    net = _net(model=model)
    before = {k: t.clone() for k, t in net.state_dict().items()}
    x = _x()
    with torch.no_grad():
        plain = net.eval()(x, 0)
        inject_adapters(net, regime)
        prompted_out = net(x, 0)
    after = net.state_dict()
    assert set(after) - set(before) == {f"blocks.{b}.prompt" for b in prompted}
    assert all(torch.equal(after[k], t) for k, t in before.items())
    assert {n: tuple(p.shape) for n, p in prompt_parameters(net).items()} == {
        f"blocks.{b}.prompt": (3, WIDTH[model]) for b in prompted}
    assert not torch.allclose(plain, prompted_out)
    bound = vpt_bound(PATCH * PATCH if model == "toy-vit" else 2 * 2, WIDTH[model])  # vit-tiny: 2x2 patches of 8x8
    assert all(float(p.detach().abs().max()) <= bound for p in prompt_parameters(net).values())
    inject_adapters(net, regime)  # a second call adds nothing
    assert len(prompt_parameters(net)) == len(prompted)


def test_insert_prompt_prepends_after_the_class_token_and_replaces_the_previous_prompts():
    x = torch.arange(2 * 4 * 1.0).reshape(1, 4, 2).repeat(2, 1, 1)
    prompt = torch.full((2, 2), -1.0)
    assert insert_prompt(x, prompt, 1, replace=False)[0, :, 0].tolist() == [0, -1, -1, 2, 4, 6]
    grown = insert_prompt(x, prompt, 1, replace=False)
    assert insert_prompt(grown, prompt * 2, 1, replace=True)[1, :, 0].tolist() == [0, -2, -2, 2, 4, 6]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("regime, grows", [("prompt-l2", slice(None)), ("prompt-deep-l2", slice(None)),
                                           ("last-2:prompt-deep-l2", slice(-1, None))])
def test_one_prompt_per_prompted_block_and_each_output_pooled_at_the_class_token(model, regime, grows):
    """The first prompted block prepends L tokens, each later one swaps its predecessor's L prompt outputs for
    its own: every block from the first prompted one on sees exactly one prompt (L more tokens, never 2L)."""
    net = _net(regime, model=model)
    names = TOKEN_BLOCKS_OF[model]
    lengths = {}
    handles = [net.blocks[b].register_forward_hook(lambda m, a, out, b=b: lengths.__setitem__(b, out.shape[1]))
               for b in names]
    net.eval()(_x(), 0)
    for h in handles:
        h.remove()
    longer = set(names[grows])
    assert lengths == {b: SEQUENCE[model] + (2 if b in longer else 0) for b in names}


# -- what trains --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("regime", ["prompt-l2", "prompt-deep-l2", "last-2:prompt-deep-l2"])
def test_training_changes_the_prompts_and_heads_only(model, regime):
    net = _net(regime, model=model)
    prompts = prompt_parameters(net)
    assert selected_parameters(net, regime) == list(prompts)
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trainable == set(prompts) | {n for n, _ in net.heads.named_parameters(prefix="heads")}
    frozen = frozen_state(net)
    backbone = {n: p.detach().clone() for n, p in net.blocks.named_parameters(prefix="blocks") if n not in prompts}
    start = {n: p.detach().clone() for n, p in prompts.items()}
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.5)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in prompts.values()} | {id(p) for p in net.heads.parameters()}
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(net.train()(_x(), 0), y).backward()
        optimizer.step()
    assert not changed_frozen(net, frozen)
    current = dict(net.blocks.named_parameters(prefix="blocks"))
    assert all(torch.equal(current[n], t) for n, t in backbone.items())
    assert all(not torch.equal(prompts[n], t) for n, t in start.items())
    # the frozen prefix: the blocks before the first prompted block (a prompted block is not frozen)
    names = TOKEN_BLOCKS_OF[model]
    first = names[-1] if regime.startswith("last-2") else names[0]
    assert frozen_prefix(net.eval()) == net.block_names[:net.block_names.index(first)]


def test_parameter_counts_and_fraction_by_hand():
    net = _net("prompt-deep-l4")
    embed = 16 * D + D + D + TOKENS * D  # proj, cls, positions
    block = 2 * D + D * D + D  # LayerNorm, Linear
    base = embed + 3 * block + 2 * D
    heads = 2 * (D * 3 + 3)
    prompts = 3 * 4 * D
    counts = parameter_counts(net, "prompt-deep-l4")
    assert counts == {"trainable": prompts + heads, "total": base + heads, "trainable_shared": prompts,
                      "total_shared": base, "per_head": heads // 2, "adapters": prompts,
                      "fraction": (prompts + heads) / (base + heads)}
    assert parameter_counts(_net("prompt-l4"), "prompt-l4")["trainable_shared"] == 4 * D
    vit = _net("prompt-deep-l4", model="vit-tiny")
    plain = sum(p.numel() for p in _net(model="vit-tiny").blocks.parameters())  # the model without prompts
    vit_heads = 2 * (32 * 3 + 3)
    vit_prompts = 3 * 4 * 32  # 3 transformer blocks x 4 tokens x width 32
    assert parameter_counts(vit, "prompt-deep-l4") == {
        "trainable": vit_prompts + vit_heads, "total": plain + vit_heads, "trainable_shared": vit_prompts,
        "total_shared": plain, "per_head": vit_heads // 2, "adapters": vit_prompts,
        "fraction": (vit_prompts + vit_heads) / (plain + vit_heads)}
    assert trained_effective(net, "prompt-deep-l4") == [f"blocks.{b}.prompt" for b in TOKEN_BLOCKS]
    weights = effective_weights(net, trained_effective(net, "prompt-deep-l4"))
    assert all(torch.equal(weights[n], p) for n, p in prompt_parameters(net).items())


def test_flops_count_the_prompt_tokens_by_hand():
    def block_flops(tokens):  # Linear D->D per token, then QK^T and AV
        return 2 * tokens * D * D + 4 * tokens * tokens * D

    plain = flops_per_sample(_net("head"), (1, 8, 8))["blocks"]
    shallow = flops_per_sample(_net("prompt-l3"), (1, 8, 8))["blocks"]
    deep = flops_per_sample(_net("prompt-deep-l3"), (1, 8, 8))["blocks"]
    assert plain[1:4] == [block_flops(TOKENS)] * 3
    assert shallow[1:4] == deep[1:4] == [block_flops(TOKENS + 3)] * 3
    assert shallow[0] == plain[0] == 2 * 4 * 16 * D


def test_flops_count_the_prompt_tokens_on_vit_tiny_by_hand():
    def block_flops(tokens, width=32):  # qkv, proj, fc1 (mlp_ratio 2), fc2: 16 T D^2; QK^T and AV: 4 T^2 D
        return 16 * tokens * width * width + 4 * tokens * tokens * width

    for regime, extra in (("head", 0), ("prompt-l3", 3), ("prompt-deep-l3", 3), ("last-2:prompt-deep-l3", 3)):
        flops = flops_per_sample(_net(regime, model="vit-tiny"), (1, 8, 8))["blocks"]
        grown = [0, 0, extra] if regime.startswith("last-2") else [extra] * 3  # last-2: block3 (+ norm) only
        assert flops[1:4] == [block_flops(SEQUENCE["vit-tiny"] + g) for g in grown], regime


# -- runs: update norms and a merge over the prompts --------------------------------------------------------------
def _prompt_run(method, regime="prompt-deep-l2", model="toy-vit", **hparams):
    spec = make_spec(dataset=make_spec().dataset.__class__("digits", 5, 2, model), regime=regime,
                     method=method, hparams=hparams, pretrain="none", training=FAST)
    seen = {}

    def observe(event, t, strategy):
        if event in ("before_task", "after_task"):
            net = strategy.model
            seen[(event, t)] = ({n: p.detach().clone() for n, p in prompt_parameters(net).items()},
                                {n: p.detach().clone() for n, p in net.blocks.named_parameters(prefix="blocks")})
            held = {id(p) for g in strategy.optimizer.param_groups for p in g["params"]}
            expect = {id(p) for p in [*prompt_parameters(net).values(), *net.heads.parameters()]}
            seen[("optimizer", event, t)] = held == expect

    record = run_one(spec, device="cpu", observer=observe)
    assert record.status == "ok", record.error
    return record, seen


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


@pytest.mark.parametrize("model", MODELS)
def test_update_norms_are_the_prompts_and_the_backbone_stays_bitwise(model):
    record, seen = _prompt_run("naive", model=model)
    after = [seen[("after_task", t)][0] for t in range(5)]
    expect = [_norm(after[t][n] - after[t - 1][n] for n in after[t]) for t in range(1, 5)]
    assert record.update_norms["shared"][1:] == pytest.approx(expect, rel=1e-9)
    per_block = record.update_norms["per_block"]
    assert all(per_block[b][1:] == [0.0] * 4 for b in ("embed", "norm"))
    for b in TOKEN_BLOCKS_OF[model]:
        key = f"blocks.{b}.prompt"
        assert per_block[b][1:] == pytest.approx([_norm([after[t][key] - after[t - 1][key]]) for t in range(1, 5)])
    assert all(seen[("optimizer", "after_task", t)] for t in range(5))  # the engine's optimizer: prompts, heads
    first, last = seen[("before_task", 0)][1], seen[("after_task", 4)][1]
    assert all(torch.equal(first[n], last[n]) for n in first if not n.endswith(".prompt"))
    n_blocks = len(TOKEN_BLOCKS_OF[model])
    assert record.params["trainable_shared"] == n_blocks * 2 * WIDTH[model] == record.params["adapters"]


@pytest.mark.parametrize("model", MODELS)
def test_magmax_merges_the_prompt_task_vectors(model):
    record, seen = _prompt_run("magmax", model=model)
    lam = registry.get_registry()["magmax"].defaults["lam"]
    theta0 = seen[("before_task", 0)][0]
    taus = [{n: seen[("after_task", t)][0][n] - theta0[n] for n in theta0} for t in range(5)]
    merged = []
    for t in range(5):  # max-|τ| per element, a later task winning a tie
        best = {}
        for tau in taus[:t + 1]:
            best = {n: tau[n] if n not in best else torch.where(tau[n].abs() >= best[n].abs(), tau[n], best[n])
                    for n in tau}
        merged.append({n: theta0[n] + lam * best[n] for n in best})
    expect = [_norm(merged[t][n] - merged[t - 1][n] for n in theta0) for t in range(1, 5)]
    assert record.update_norms["shared"][1:] == pytest.approx(expect, rel=1e-6)
    assert record.diagnostics["task_vector_norms"][-1] == pytest.approx([_norm(tau.values()) for tau in taus],
                                                                        rel=1e-6)


def test_plugin_check_applies_the_prompt_regimes_to_a_token_backbone():
    from harness.execution.plugin_check import _block_problem, _regimes_apply

    applied, failed = _regimes_apply(TOY)
    assert not failed and {"prompt-l2", "prompt-deep-l2"} <= set(applied)
    liar = Backbone("toy-liar", build, BLOCKS, (1, 8, 8), norm_blocks=TOY.norm_blocks, bias_blocks=BLOCKS,
                    feature_dim=D, tail={"pool": Pool}, token_blocks=("tok1",))
    assert "token_blocks declares (tok1), the built blocks with the token-block API are (tok1, tok2, tok3)" in \
        _block_problem(liar, _net())[0]



@pytest.mark.parametrize("model, regime", [pytest.param("vit-tiny", "prompt-l2", marks=pytest.mark.slow),
                                           ("toy-vit", "last-2:prompt-deep-l2"), ("toy-vit", "prompt-l2")])
def test_the_frozen_prefix_cache_gives_the_uncached_record_and_runs_repeat(model, regime):
    """The blocks before the first prompted one are cached (every task: pretrain none); numbers as uncached."""
    from test_performance_paths import make_spec as perf_spec, run, same_numbers

    spec = perf_spec("naive", regime, model=model, pretrain="none")
    cached, tasks = run(spec, cache=True)
    plain, none = run(spec, cache=False)
    again, _ = run(spec, cache=True)
    assert tasks == [0, 1, 2, 3, 4] and none == []
    assert same_numbers(cached, plain) and same_numbers(cached, again) and cached.run_id == again.run_id


def test_list_regimes_names_the_prompt_families_and_the_backbones_that_take_prompts(cli):
    code, out, _ = cli("list", "regimes")  # vit-tiny: embed + 3 transformer blocks + norm = 5 blocks
    assert code == 0 and "  prompt-lL  " in out and "  prompt-deep-lL  " in out
    assert "vit-tiny (5 blocks, 3 take prompts)" in out and "mlp (4 blocks)," in out
    assert f"prompt: {v.FAMILY_DESCRIPTIONS['prompt']}; prompt-deep: {v.FAMILY_DESCRIPTIONS['prompt-deep']}" in out
