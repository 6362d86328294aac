"""L2P (`l2p`, harness/methods/l2p.py) against the official code on identical tensors: the prompt selection,
batched prompts and pull constraint of l2p-pytorch's `Prompt` and of Avalanche's port; the whole prompted forward
(logits) of l2p-pytorch's VisionTransformer.forward_features/forward_head on the same timm weights; the training
loss of l2p-pytorch's engine.py; then a class-IL run through the harness, twice (the same record)."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from avalanche.models.prompt import Prompt as AvalanchePrompt
from conftest import make_spec
from official.l2p_pytorch_prompt import Prompt as OfficialPrompt
from official.l2p_pytorch_vision_transformer import VisionTransformer as OfficialViT, resize_pos_embed

from harness.api.contract import MethodContext, make_optimizer
from harness.api.heads import SeenClassesLoss
from harness.api.prompts import token_blocks
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.config.vocabulary import Scenario
from harness.execution.reproduce import compare
from harness.methods.l2p import L2PNet, build_l2p, drop_regime_prompt, make_pool
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.regimes import apply_regime, inject_adapters
from harness.run.vit import timm_to_blocks

TINY = dict(embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0, patch_size=2)  # vit-tiny as the vocabulary states
D, LENGTH, POOL, TOP_K, CLASSES = 32, 5, 10, 5, 10
POOL_ARGS = dict(length=LENGTH, embed_dim=D, embedding_key="cls", prompt_init="uniform", prompt_pool=True,
                 prompt_key=True, pool_size=POOL, top_k=TOP_K, prompt_key_init="uniform")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


@pytest.mark.parametrize("batchwise", [True, False])
def test_prompt_selection_equals_the_official_and_avalanches(batchwise):
    torch.manual_seed(0)
    official = OfficialPrompt(**POOL_ARGS, batchwise_prompt=batchwise)
    mine = make_pool(D, LENGTH, POOL, TOP_K, batchwise)
    avalanche = AvalanchePrompt(**POOL_ARGS, batchwise_prompt=batchwise)
    mine.load_state_dict(official.state_dict())
    avalanche.load_state_dict(official.state_dict())
    x_embed, query = torch.randn(12, 16, D), torch.randn(12, D)
    ref = official(x_embed, cls_features=query)
    for other in (mine(x_embed, cls_features=query), avalanche(x_embed, cls_features=query)):
        assert torch.equal(other["prompt_idx"], ref["prompt_idx"])
        diffs = {k: _max_diff(other[k], ref[k]) for k in ("prompted_embedding", "reduce_sim", "similarity")}
        print("selection max abs diff", batchwise, diffs)
        assert max(diffs.values()) <= 1e-6
    if batchwise:  # one set of prompts for the batch: the top_k most frequent of the samples' choices
        assert (ref["prompt_idx"] == ref["prompt_idx"][:1]).all()


def _timm_tiny(seed=0):
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", **TINY, img_size=(8, 8), in_chans=1, num_classes=0).eval()


def _harness_l2p(vit, batchwise: bool, head_type: str, n_heads: int = 1, head_classes: int = CLASSES):
    """The harness's L2P model on vit's weights: regime prompt-l5 injected, applied, then replaced by the pool."""
    net = build_model("vit-tiny", (1, 8, 8), n_heads, head_classes)
    net.load_state_dict({**net.state_dict(), **timm_to_blocks(vit.state_dict(), 3)})
    inject_adapters(net, f"prompt-l{LENGTH}")
    apply_regime(net, f"prompt-l{LENGTH}")
    drop_regime_prompt(net)
    torch.manual_seed(1)
    return L2PNet(net, make_pool(D, LENGTH, POOL, TOP_K, batchwise), head_type).eval()


def _official_l2p(vit, model: L2PNet, batchwise: bool, head_type: str):
    """l2p-pytorch's prompted ViT on the same weights: the pool copied into its Prompt, the position embedding
    extended as its checkpoint_filter_fn does when it loads pretrained weights, the harness head as its head."""
    off = copy.deepcopy(vit)
    off.prompt = OfficialPrompt(**POOL_ARGS, batchwise_prompt=batchwise)
    off.prompt.load_state_dict(model.pool.state_dict())
    new = torch.zeros(1, 1 + TOP_K * LENGTH + off.patch_embed.num_patches, D)
    off.pos_embed = torch.nn.Parameter(resize_pos_embed(vit.pos_embed, new, 1, off.patch_embed.grid_size))
    off.head = copy.deepcopy(model.heads[0])
    off.class_token, off.head_type, off.prompt_pool, off.use_prompt_mask = True, head_type, True, False
    return off


@pytest.mark.parametrize("batchwise,head_type", [(True, "prompt"), (False, "prompt"), (True, "token+prompt")])
def test_the_prompted_forward_equals_the_official_vit_on_the_same_weights(batchwise, head_type):
    vit = _timm_tiny()
    model = _harness_l2p(vit, batchwise, head_type)
    official = _official_l2p(vit, model, batchwise, head_type)
    x = torch.randn(12, 1, 8, 8)  # float at the model's size: the harness's input stage passes it unchanged
    with torch.no_grad():
        query = vit.forward_head(vit.forward_features(x), pre_logits=True)  # official original_model's pre_logits
        ref = OfficialViT.forward_head(official, OfficialViT.forward_features(official, x, cls_features=query))
        mine = model.logits(x, 0)
    diffs = {"query": _max_diff(model.query(x), query), "logits": _max_diff(mine["logits"], ref["logits"]),
             "pre_logits": _max_diff(mine["pre_logits"], ref["pre_logits"]),
             "reduce_sim": _max_diff(mine["reduce_sim"], ref["reduce_sim"])}
    print("forward max abs diff", batchwise, head_type, diffs)
    assert torch.equal(mine["prompt_idx"], ref["prompt_idx"])
    assert max(diffs.values()) <= 1e-5
    assert torch.equal(model(x, 0), mine["logits"])  # what the harness evaluates


def test_the_regime_prompt_is_replaced_and_the_query_is_the_frozen_model_without_prompts():
    vit = _timm_tiny()
    model = _harness_l2p(vit, True, "prompt")
    assert [tuple(b.prompt.shape) for b in token_blocks(model.net).values() if b.prompt is not None] == [(0, D)]
    plain = build_model("vit-tiny", (1, 8, 8), 1, CLASSES)
    plain.load_state_dict({**plain.state_dict(), **timm_to_blocks(vit.state_dict(), 3)})
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model.query(x), plain.eval().features(x))


def _ctx(model, scenario=Scenario.CLASS_IL, n_tasks=5):
    training = TrainingSpec(lr=0.01, momentum=0.9, epochs=1, batch_size=8)
    criterion = SeenClassesLoss() if scenario == Scenario.CLASS_IL else torch.nn.CrossEntropyLoss()
    return MethodContext(model=model, optimizer=make_optimizer(training, [p for p in model.parameters()
                                                                          if p.requires_grad]),
                         criterion=criterion, train_mb_size=8, eval_mb_size=64, train_epochs=1,
                         device=torch.device("cpu"), plugins=(), n_tasks=n_tasks, regime=f"prompt-l{LENGTH}",
                         pretrain=make_spec().pretrain, scenario=scenario, seed=0, training=training)


def test_the_training_loss_equals_the_official_engines():
    vit = _timm_tiny()
    net = build_model("vit-tiny", (1, 8, 8), 1, CLASSES)
    net.load_state_dict({**net.state_dict(), **timm_to_blocks(vit.state_dict(), 3)})
    inject_adapters(net, f"prompt-l{LENGTH}")
    apply_regime(net, f"prompt-l{LENGTH}")
    ctx = _ctx(net)
    ctx.criterion.seen = 4  # task 2 of 5 x 2 classes
    torch.manual_seed(1)
    strategy = build_l2p(ctx)
    official = _official_l2p(vit, strategy.model, True, "prompt")
    x, y = torch.randn(8, 1, 8, 8), torch.tensor([2, 3, 3, 2, 2, 3, 2, 3])
    strategy.mbatch, strategy.is_training, strategy.task_classes = [x, y, torch.ones(8, dtype=torch.long)], True, \
        torch.tensor([2, 3]).numpy()
    strategy.model.eval()  # dropout-free either way; eval mode keeps the frozen blocks' state as it is
    strategy.mb_output = strategy.forward()
    loss = strategy.criterion()
    with torch.no_grad():  # l2p-pytorch engine.train_one_epoch, verbatim arithmetic
        query = vit.forward_head(vit.forward_features(x), pre_logits=True)
        output = OfficialViT.forward_head(official, OfficialViT.forward_features(official, x, cls_features=query))
        not_mask = torch.tensor([c for c in range(CLASSES) if c not in (2, 3)])
        logits = output["logits"].index_fill(dim=1, index=not_mask, value=float("-inf"))
        ref = torch.nn.CrossEntropyLoss()(logits, y) - 0.1 * output["reduce_sim"]
    print("loss max abs diff", _max_diff(loss.detach(), ref))
    assert _max_diff(loss.detach(), ref) <= 1e-5
    loss.backward()  # the chosen prompts and keys learn (keys through the pull constraint only), the backbone not
    pool, chosen = strategy.model.pool, output["prompt_idx"][0]
    others = [i for i in range(POOL) if i not in chosen.tolist()]
    assert pool.prompt.grad[chosen].abs().sum() > 0 and pool.prompt_key.grad[chosen].abs().sum() > 0
    assert pool.prompt.grad[others].abs().sum() == 0 and pool.prompt_key.grad[others].abs().sum() == 0
    assert all(p.grad is None for n, p in net.blocks.named_parameters() if not n.endswith("prompt"))
    state = strategy.harness_state()
    assert set(state) == {"prompts.pool", "prompts.keys"} and state["prompts.pool"].shape == (POOL, LENGTH, D)
    assert not any(t.requires_grad for t in state.values())


def test_build_refuses_a_top_k_beyond_the_pool_and_a_regime_without_prompts():
    net = build_model("vit-tiny", (1, 8, 8), 1, CLASSES)
    inject_adapters(net, "prompt-l5")
    apply_regime(net, "prompt-l5")
    with pytest.raises(ValueError, match="top_k=11 exceeds pool_size=10"):
        build_l2p(_ctx(net), top_k=11)
    ctx = _ctx(build_model("vit-tiny", (1, 8, 8), 1, CLASSES))
    with pytest.raises(ValueError, match="regime 'head'; allowed: prompt-lL"):
        build_l2p(MethodContext(**{**ctx.__dict__, "regime": "head"}))
    with pytest.raises(ValueError, match="l2p: blocks fc1, fc2, fc3, fc4; allowed: a cl-bench ViT"):
        build_l2p(_ctx(build_model("mlp", (1, 8, 8), 1, CLASSES)))


@pytest.mark.parametrize("scenario", ["class-il", "task-il"])
def test_a_digits_run_completes_and_repeats_bitwise(scenario):
    spec = make_spec(dataset=DatasetSpec("digits", 5, 2, "vit-tiny"), method="l2p", regime="prompt-l5",
                     scenario=scenario, pretrain="none", hparams={"pool_size": 4, "top_k": 2},
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=64))
    first, second = run_one(spec, device="cpu"), run_one(spec, device="cpu")
    assert first.status == "ok", first.error
    assert len(first.acc_matrix) == 5 and first.diagnostics["l2p_pool_parameters"] == 4 * 5 * D + 4 * D
    assert compare(first, second)[0] == "bitwise"
    assert len(first.diagnostics["l2p_prompts_used"]) == 5
    assert all(2 <= n <= 4 for n in first.diagnostics["l2p_prompts_used"])  # at least top_k, at most the pool
    # the backbone is frozen: only the pool (method state, block `prompts`) moves, and it is all of u_t
    per_block = first.update_norms["per_block"]
    assert all(u == 0.0 for b, us in per_block.items() if b != "prompts" for u in us[1:] if u is not None)
    assert all(u > 0 for u in per_block["prompts"][1:])
    assert first.update_norms["shared"][1:] == pytest.approx(per_block["prompts"][1:], rel=1e-12)


def test_a_protocol_pairs_l2p_with_prompt_regimes_only(tmp_path):
    from harness.api.registry import get_registry
    from harness.config.errors import ProtocolError
    from harness.config.protocol import load_protocol

    text = ("name: p\nversion: '1'\nscenario: class-il\npretrain: none\ndatasets:\n"
            "  - {name: digits, n_tasks: 5, classes_per_task: 2, model: vit-tiny}\nregimes: [%s]\nmethods: [l2p]\n")
    path = tmp_path / "p.yaml"
    path.write_text(text % "prompt-l5")
    assert load_protocol(path, get_registry()).methods[0].name == "l2p"
    path.write_text(text % "prompt-l5, head")
    with pytest.raises(ProtocolError, match="l2p cannot run faithfully under regime 'head'"):
        load_protocol(path, get_registry())


def test_evaluation_votes_over_chunks_of_the_official_evaluation_batch():
    model = _harness_l2p(_timm_tiny(), batchwise=True, head_type="prompt")
    x = torch.randn(40, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    whole = model(x, 0)  # eval_prompt_batch 0: one vote over the 40 rows
    model.eval_prompt_batch = 16
    chunked = model(x, 0)
    model.eval_prompt_batch = 0
    by_hand = torch.cat([model(x[s:s + 16], 0) for s in (0, 16, 32)])  # three official evaluation batches
    assert torch.equal(chunked, by_hand)
    assert torch.equal(torch.cat([model.features(x[s:s + 16]) for s in (0, 16, 32)]),
                       (setattr(model, "eval_prompt_batch", 16), model.features(x))[1])
    assert not torch.equal(whole, chunked)  # the vote does depend on its batch: the chunking is not a no-op
    model.train()
    assert torch.equal(model(x, 0), model(x, 0))  # training batches are the harness's own: never chunked
