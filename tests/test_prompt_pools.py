"""DualPrompt and CODA-Prompt (harness/methods/dualprompt.py, coda_prompt.py, _prompt_pool.py): faithful by test
against the official code (tests/official/coda_prompt_zoo.py, GT-RIPL/CODA-Prompt) on identical tensors, then
runs through the harness (class-IL digits, vit-tiny, prompt-l4): a record, the same record twice, the pool's
state for update norms, the frozen backbone, and the refusals (odd L, a layer beyond the depth)."""
from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from conftest import make_spec
from official import coda_prompt_zoo as official
from torch import nn

from harness.config.specs import DatasetSpec, TrainingSpec
from harness.methods._prompt_pool import PrefixAttention, PromptPoolNet, regime_refusal, replace_vpt_prompt
from harness.methods.coda_prompt import CodaPromptPool, gram_schmidt, ortho_penalty
from harness.methods.dualprompt import DualPromptPool
from harness.run.engine import run_one
from harness.run.models import build_model
from harness.run.regimes import apply_regime, inject_adapters

D, B, TASKS = 32, 6, 5  # vit-tiny's width, rows, tasks
TOL = 1e-6  # float32 rounding of one op chain; a whole model (3 blocks, LayerNorms, fused vs manual attention): MODEL_TOL
MODEL_TOL = 1e-5


def report(what: str, a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> float:
    """Max |a - b|, printed (pytest -s shows the cross-check figures) and checked."""
    diff = float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0
    print(f"cross-check {what}: max abs diff {diff:.3g}")
    assert a.shape == b.shape, what
    assert diff <= tol, what
    return diff


def copy_into(ours: nn.Module, theirs: nn.Module) -> None:
    """The official module's parameters (same names) into ours."""
    state = dict(theirs.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(state[name])


def query(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, D, generator=torch.Generator().manual_seed(seed))


# -- DualPrompt: per-layer prefixes and the pull constraint ---------------------------------------------------------
def dual_pair(seed: int = 0):
    torch.manual_seed(seed)
    theirs = official.DualPrompt(D, TASKS, [TASKS, 8, 6], key_dim=D)  # pool 5, E-length 8, G-length 6
    ours = DualPromptPool(D, 8, 6, TASKS, [0, 1], [2, 3, 4], torch.Generator().manual_seed(seed))
    return ours, theirs


def test_dualprompt_init_equals_the_official_from_the_same_seed():
    ours, theirs = dual_pair(3)
    for name, p in theirs.named_parameters():
        report(f"dualprompt init {name}", dict(ours.named_parameters())[name], p)


@pytest.mark.parametrize("train", [True, False])
def test_dualprompt_prefixes_and_loss_equal_the_official_per_layer(train):
    ours, theirs = dual_pair()
    copy_into(ours, theirs)
    q = query()
    with torch.no_grad():  # keys near the query's rows: the top-1 differs across samples
        theirs.e_k_3[:3] = q[:3] + 0.1 * theirs.e_k_3[:3]
        ours.e_k_3.copy_(theirs.e_k_3)
    for layer in range(5):
        p_theirs, loss_theirs, _ = theirs.forward(q, layer, None, train=train, task_id=2)
        p_ours, loss_ours = ours.layer(q, layer, train=train, task_id=2)
        for part, a, b in zip(("Pk", "Pv"), p_ours, p_theirs):
            report(f"dualprompt {'train' if train else 'eval'} layer {layer} {part}", a, b)
        report(f"dualprompt {'train' if train else 'eval'} layer {layer} loss", torch.as_tensor(loss_ours),
               torch.as_tensor(loss_theirs))
    if not train:  # the selection is per sample: rows matched to different keys get different prompts
        pk = ours.layer(q, 3)[0][0]
        assert not torch.equal(pk[0], pk[1])


def test_dualprompt_pull_constraint_trains_the_task_key_only_as_the_official():
    ours, theirs = dual_pair()
    copy_into(ours, theirs)
    q = query()
    _, loss_ours = ours.prefixes(q, train=True, task_id=1)
    loss_theirs = sum(theirs.forward(q, layer, None, train=True, task_id=1)[1] for layer in range(5))
    report("dualprompt summed pull loss", loss_ours, loss_theirs)
    loss_ours.backward()
    loss_theirs.backward()
    for name, p in theirs.named_parameters():
        if p.grad is not None:
            report(f"dualprompt grad {name}", dict(ours.named_parameters())[name].grad, p.grad)
    grad = ours.e_k_2.grad
    assert grad[1].abs().sum() > 0 and grad[[0, 2, 3, 4]].abs().sum() == 0


# -- CODA-Prompt: components, attention, ortho penalty, Gram-Schmidt ------------------------------------------------
def coda_pair(seed: int = 0, mu: float = 0.1):
    torch.manual_seed(seed)
    theirs = official.CodaPrompt(D, TASKS, [10, 8, mu], key_dim=D)  # 10 components, 2 per task, L 8
    ours = CodaPromptPool(D, 8, 10, TASKS, [0, 1, 2, 3, 4], mu, torch.Generator().manual_seed(seed))
    return ours, theirs


def test_coda_init_and_gram_schmidt_of_the_next_tasks_equal_the_official_from_the_same_rng_state():
    ours, theirs = coda_pair(5)
    for t in range(3):
        if t:
            torch.manual_seed(100 + t)
            ours.generator.manual_seed(100 + t)
            theirs.process_task_count()
            ours.process_task_count()
        mine = dict(ours.named_parameters())
        for name, p in theirs.named_parameters():
            report(f"coda gram-schmidt task {t + 1} {name}", mine[name], p)
    s, f = ours.span()
    k = ours.e_k_0.detach()
    gram = k[:f] @ k[:f].T
    assert torch.allclose(gram.diagonal(), torch.ones(f), atol=1e-5)  # new components unit norm
    assert k[f:].abs().sum() == 0  # later tasks' components still zero


def test_gram_schmidt_keeps_the_past_rows_and_orthogonalises_the_new_ones():
    vv = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    out = gram_schmidt(vv, 2, 4, torch.Generator().manual_seed(1))
    assert torch.equal(out[:2], vv[:2]) and out[4:].abs().sum() == 0
    first = gram_schmidt(vv, 0, 3, torch.Generator().manual_seed(1))  # the first task's: orthonormal
    assert torch.allclose(first[:3] @ first[:3].T, torch.eye(3), atol=1e-6) and first[3:].abs().sum() == 0


@pytest.mark.parametrize("task_count", [0, 2])
@pytest.mark.parametrize("train", [True, False])
def test_coda_prompts_and_ortho_penalty_equal_the_official(task_count, train):
    ours, theirs = coda_pair()
    for _ in range(task_count):
        theirs.process_task_count()
    ours.task_count = task_count
    copy_into(ours, theirs)  # the official's components (trained ones would be as arbitrary)
    q = query(2)
    for layer in range(5):
        p_theirs, loss_theirs, _ = theirs.forward(q, layer, None, train=train)
        p_ours, loss_ours = ours.layer(q, layer, train=train)
        for part, a, b in zip(("Pk", "Pv"), p_ours, p_theirs):
            report(f"coda {'train' if train else 'eval'} task {task_count + 1} layer {layer} {part}", a, b)
        report(f"coda {'train' if train else 'eval'} task {task_count + 1} layer {layer} loss",
               torch.as_tensor(loss_ours), torch.as_tensor(loss_theirs))


def test_coda_attention_weighted_prompt_by_hand_and_past_components_get_no_gradient():
    ours, _ = coda_pair()
    ours.process_task_count()  # task 2: components [2, 4) drawn, [0, 2) the past task's
    q = query(3)
    (pk, pv), loss = ours.layer(q, 0, train=True)
    K, A, P = ours.e_k_0[:4], ours.e_a_0[:4], ours.e_p_0[:4]
    alpha = torch.stack([torch.cosine_similarity(q * A[m], K[m].expand_as(q), dim=1) for m in range(4)], dim=1)
    prompt = (alpha[:, :, None, None] * P[None]).sum(1)
    report("coda attention-weighted prompt by hand", torch.cat((pk, pv), dim=1), prompt)
    t = torch.cat((K[:2].detach(), K[2:4]))
    report("coda ortho penalty by hand", ortho_penalty(t), ((t @ t.T - torch.eye(4)) ** 2).mean())
    (pk.sum() + pv.sum() + loss).backward()
    assert ours.e_p_0.grad[:2].abs().sum() == 0 and ours.e_p_0.grad[2:4].abs().sum() > 0


# -- prefix tuning on the harness ViT -------------------------------------------------------------------------------
def tiny_net(regime: str = "prompt-l4"):
    torch.manual_seed(0)
    net = inject_adapters(build_model("vit-tiny", (1, 8, 8), n_heads=1, head_classes=10), regime)
    apply_regime(net, regime)
    return net


def test_one_prefix_tuned_block_equals_the_official_attention_with_prompt():
    block = tiny_net().blocks["block2"]
    theirs = official.Block(D, 2, mlp_ratio=2.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    theirs.load_state_dict(block.state_dict(), strict=True)
    g = torch.Generator().manual_seed(4)
    x, pk, pv = torch.randn(B, 17, D, generator=g), torch.randn(B, 5, D, generator=g), torch.randn(B, 5, D, generator=g)
    block.attn.__class__ = PrefixAttention
    block.attn.prefix = (pk, pv)
    with torch.no_grad():
        ours, expected = block(x), theirs(x, prompt=[pk, pv])
        report("prefix-tuned block forward", ours, expected)
        block.attn.fused_attn = not block.attn.fused_attn  # the other attention path of timm
        report("prefix-tuned block forward (other timm attention path)", block(x), expected)
        block.attn.prefix = None
        report("block without prefix vs the official without prompt", block(x), theirs(x))


@pytest.mark.parametrize("kind", ["dual", "coda"])
@pytest.mark.parametrize("train", [False, True])
def test_the_prompted_model_equals_the_official_vit_loop(kind, train):
    """PromptPoolNet's features and loss vs the official ViT loop (prompt.forward(q, i) per block, its Blocks
    loaded with the harness weights, then the final norm and [CLS]), the query the harness model's unprompted
    feature (ViTZoo.forward's `q`)."""
    net = tiny_net()
    assert replace_vpt_prompt(net) == 4  # as build does: the regime's 4-token VPT prompt is emptied
    ours_pool, theirs_pool = dual_pair() if kind == "dual" else coda_pair()
    copy_into(ours_pool, theirs_pool)
    if kind == "dual":
        ours_pool.g_layers, ours_pool.e_layers = [0, 1], [2]
    else:
        ours_pool.e_layers = [0, 1, 2]
    layers = {i: b for i, b in enumerate(list(net.blocks.values())[1:4])}
    model = PromptPoolNet(net, ours_pool, layers)
    model.train(train)
    model.task_id = 1 if train else None
    x = torch.randint(0, 256, (B, 1, 8, 8), generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    feats = model.features(x)
    loss = model.prompt_loss if train else 0
    with torch.no_grad():
        q = net.features(x)
        h = net.blocks["embed"](x)
    expected_loss = 0
    for i, name in enumerate(["block1", "block2", "block3"]):
        blk = official.Block(D, 2, mlp_ratio=2.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
        state = {k: v for k, v in net.blocks[name].state_dict().items() if k != "prompt"}
        blk.load_state_dict(state, strict=True)
        p_list, layer_loss, h = theirs_pool.forward(q, i, h, train=train, task_id=1)
        expected_loss = expected_loss + layer_loss
        h = blk(h, prompt=p_list)
    expected = net.blocks["norm"](h)[:, 0]
    report(f"{kind} prompted model features ({'train' if train else 'eval'})", feats, expected, MODEL_TOL)
    report(f"{kind} prompted model loss ({'train' if train else 'eval'})", torch.as_tensor(loss),
           torch.as_tensor(expected_loss))
    report("the query: the model's features without prompts", model.query(x), q)


# -- runs through the harness ---------------------------------------------------------------------------------------
QUICK = TrainingSpec(lr=0.01, momentum=0.9, epochs=1, batch_size=64)


def run(method: str, regime: str = "prompt-l4", observer=None, **hparams):
    spec = make_spec(dataset=DatasetSpec("digits", 3, 2, "vit-tiny"), regime=regime, method=method,
                     hparams=hparams, pretrain="none", scenario="class-il", training=QUICK)
    return run_one(spec, device="cpu", observer=observer)


def comparable(record) -> dict:
    out = json.loads(json.dumps(record.to_dict()))
    for key in ("run_id", "timings", "provenance"):
        out.pop(key, None)
    compute = out["budget"].get("compute") or {}
    for key in [k for k in compute if "memory" in k or k.endswith("_s")]:
        compute.pop(key)
    return out


@pytest.mark.parametrize("method, hparams", [("dualprompt", {"g_layers": [0], "e_layers": [1, 2]}),
                                             ("coda-prompt", {"e_layers": [0, 1, 2], "pool_size": 9})])
def test_a_class_il_run_on_vit_tiny_gives_a_record_and_the_same_record_twice(method, hparams):
    seen = {}

    def observe(event, t, strategy):
        whole = {n: p.detach().clone() for n, p in strategy.model.pool.named_parameters()}
        seen[event, t] = whole  # every row of the pool, before and after each task
        if event == "after_task":
            assert strategy.past_classes == 2 * t  # class-IL: the official last_valid_out_dim, masked in training
            seen[t] = ({k: v.clone() for k, v in strategy.harness_state().items()},
                       {n: p.detach().clone() for n, p in strategy.model.blocks.named_parameters(prefix="blocks")})

    first = run(method, observer=observe, **hparams)
    assert first.status == "ok", first.error
    assert len(first.acc_matrix) == 3 and all(len(row) == 3 for row in first.acc_matrix)
    state, backbone = seen[2]
    pool = dict(seen[0][0])
    assert state and all(k.startswith("prompts.") for k in state)
    if method == "coda-prompt":  # the norms see the components in use: 3 per task of 3 (pool 9)
        assert {v.shape[0] for v in pool.values()} == {3} and {v.shape[0] for v in state.values()} == {9}
        assert all(torch.equal(state[k][:3], pool[k]) for k in state)  # task 1's components: frozen after it
        # past components are frozen and a task's own are new rows: CODA's prompt updates are 0 by construction
        assert first.update_norms["per_block"]["prompts"][1:] == [0.0, 0.0]
    for t in range(3):  # the pool trains in every task
        before, after = seen["before_task", t], seen["after_task", t]
        assert any(not torch.equal(before[k], after[k]) for k in before)
    for name, tensor in backbone.items():  # the backbone frozen; the regime's VPT prompt emptied
        assert torch.equal(tensor, seen[0][1][name]), name
    assert backbone["blocks.block1.prompt"].numel() == 0
    forward = first.budget["compute"]["forward_per_task"]
    assert forward == [2 * s for s in first.budget["samples_per_task"]]  # the query pass, then the prompted one
    assert comparable(run(method, **hparams)) == comparable(first)


def test_an_odd_prompt_length_and_a_layer_beyond_the_depth_fail_in_one_line():
    odd = run("coda-prompt", regime="prompt-l3", e_layers=[0, 1, 2])
    assert odd.status == "failed" and "allowed: an even length" in odd.error and "\n" not in odd.error
    deep = run("dualprompt", g_layers=[0, 1], e_layers=[2, 3, 4])
    assert deep.status == "failed" and "[3, 4] not transformer blocks" in deep.error and "\n" not in deep.error
    assert regime_refusal("prompt-l3") and regime_refusal("prompt-l4") is None
