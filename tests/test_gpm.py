"""GPM: basis maths, im2col, projection, and regime compliance (digits, tiny models)."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.api.contract import MethodContext, make_optimizer
from harness.api.registry import get_registry
from harness.config.pretrain import Pretrain
from harness.config.specs import TrainingSpec
from harness.methods._gpm_math import layer_input_matrix, update_basis_from_gram
from harness.methods.gpm import GPMMemory, sample_indices
from harness.run.datasets import load_dataset
from harness.run.evaluation import evaluate_tasks
from harness.run.models import build_model
from harness.run.plugins import HarnessPlugin
from harness.run.regimes import apply_regime, trainable_blocks
from harness.run.streams import split_tasks, to_avalanche

CPU = torch.device("cpu")


def orthonormal(n: int, k: int, seed: int) -> torch.Tensor:
    """n × k matrix with orthonormal columns (float64)."""
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def with_singular_values(d: int, n: int, sigmas, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """R = U diag(σ) Vᵀ of shape d × n with the given singular values; returns (R, U)."""
    u, v = orthonormal(d, len(sigmas), seed), orthonormal(n, len(sigmas), seed + 1)
    return u @ torch.diag(torch.tensor(sigmas, dtype=torch.float64)) @ v.T, u


@functools.lru_cache(maxsize=1)
def digits_tasks():
    """digits, natural class order, 5 tasks x 2 classes (cached: tensors are never modified)."""
    return tuple(split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2))


def drive(method: str, regime: str, hparams=None, *, model="mlp", n_tasks=5, epochs=2, pretrain="first-task",
          momentum=0.9, seed=0, after_task=None, tasks=None):
    """Train `method` task after task like the engine does; `after_task(t, strategy)` observes it."""
    torch.manual_seed(seed)
    tasks = tuple(tasks or digits_tasks())[:n_tasks]
    net = build_model(model, (1, 8, 8), n_heads=len(tasks), head_classes=2)
    first = "full" if pretrain == "first-task" else regime
    apply_regime(net, first)
    training = TrainingSpec(lr=0.05, momentum=momentum, epochs=epochs, batch_size=32)
    adapter = get_registry()[method]
    ctx = MethodContext(model=net, optimizer=make_optimizer(training, (p for p in net.parameters() if p.requires_grad)),
                        criterion=nn.CrossEntropyLoss(), train_mb_size=32, eval_mb_size=256,
                        train_epochs=epochs, device=CPU, plugins=(HarnessPlugin(),), n_tasks=len(tasks),
                        regime=regime, pretrain=Pretrain(pretrain), scenario="task-il", seed=seed, training=training,
                        tasks=tuple(tasks), regime_blocks=tuple(trainable_blocks(net, regime)),
                        accuracy=lambda model, task: evaluate_tasks(model, [task], 256, CPU)[0])
    from harness.run.engine import keep_optimizer_on_trainable

    strategy = adapter.build(ctx, **{**adapter.defaults, **(hparams or {})})
    keep_optimizer_on_trainable(strategy)
    for t, exp in enumerate(to_avalanche(tasks).train_stream):
        apply_regime(strategy.model, first if t == 0 else regime)
        strategy.train(exp)
        if after_task:
            after_task(t, strategy)
    return strategy, tasks


def memory_of(strategy) -> GPMMemory:
    """The GPM memory of a gpm (plugin) or became (strategy attribute) strategy."""
    if hasattr(strategy, "memory"):
        return strategy.memory
    return next(p.memory for p in strategy.plugins if hasattr(p, "memory"))


# --- basis maths -------------------------------------------------------------------------

def update_basis(basis, rep, eps):
    """The GPM update from one representation matrix R (the method sums G = R Rᵀ over batches)."""
    rep = rep.detach().to(torch.float64)
    return update_basis_from_gram(basis, rep @ rep.T, eps)


@pytest.mark.parametrize("eps, rank", [(0.5, 1), (0.95, 2), (0.97, 3), (0.995, 4), (0.9999, 5), (1.0, 6)])
def test_energy_criterion_picks_smallest_rank_reaching_eps(eps, rank):
    sigmas = [10.0, 5.0, 2.0, 1.0, 0.5, 0.1]  # cumulative energy: .768 .960 .990 .998 .9999 1
    rep, u = with_singular_values(8, 40, sigmas)
    basis = update_basis(None, rep, eps).to(torch.float64)
    assert basis.shape == (8, rank)
    assert torch.allclose(basis.T @ basis, torch.eye(rank, dtype=torch.float64), atol=1e-5)
    # same subspace as the top-r left singular vectors
    assert torch.allclose(basis @ basis.T, u[:, :rank] @ u[:, :rank].T, atol=1e-5)


def test_second_task_update_projects_out_existing_memory():
    d, n = 10, 40
    e = torch.eye(d, dtype=torch.float64)
    v = orthonormal(n, 4, seed=5)
    first = update_basis(None, e[:, :2] @ v[:, :2].T * 3.0, 0.97)  # memory = span(e1, e2)
    # Task 2: energy 50 inside the memory (e1), new directions e5, e6, e7 with σ² = 40, 9, 1.
    # acc starts at 50/100 = .5; +.40 → .90 < .97; +.09 → .99 ≥ .97: two new vectors (e5, e6).
    rep = (50 ** 0.5 * torch.outer(e[0], v[:, 0]) + 40 ** 0.5 * torch.outer(e[4], v[:, 1])
           + 3.0 * torch.outer(e[5], v[:, 2]) + 1.0 * torch.outer(e[6], v[:, 3]))
    second = update_basis(first, rep, 0.97).to(torch.float64)
    assert second.shape == (d, 4)
    assert torch.equal(second[:, :2], first.to(torch.float64))  # old vectors kept as they were
    new = second[:, 2:]
    assert torch.allclose(first.to(torch.float64).T @ new, torch.zeros(2, 2, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(new @ new.T, e[:, 4:6] @ e[:, 4:6].T, atol=1e-5)
    assert torch.allclose(second.T @ second, torch.eye(4, dtype=torch.float64), atol=1e-5)
    # Everything already remembered: nothing is added.
    assert update_basis(second, e[:, :1] @ v[:, :1].T, 0.97).shape == (d, 4)


def test_memory_is_capped_at_the_row_dimension():
    rep = torch.randn(5, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    basis = update_basis(update_basis(None, rep, 1.0), rep * 2 + 1, 1.5)
    assert basis.shape == (5, 5)


# --- representations: Linear, Conv1d and Conv2d (im2col) ----------------------------------

@pytest.mark.parametrize("kwargs", [dict(padding=2), dict(padding=1, stride=2, dilation=2)])
def test_conv1d_im2col_matches_the_convolution(kwargs):
    gen = torch.Generator().manual_seed(0)
    conv = nn.Conv1d(2, 3, 5, bias=False, **kwargs)
    x = torch.randn(4, 2, 11, generator=gen)
    rep = layer_input_matrix(conv, x)
    out = conv(x)  # (N, C_out, L): column order of rep is (n, l)
    assert torch.allclose(conv.weight.view(3, -1) @ rep, out.permute(1, 0, 2).reshape(3, -1), atol=1e-5)
    # independent: explicit patches in weight.view(C_out, -1) order (C_in major, then taps)
    (p,), (st,), (dl,) = conv.padding, conv.stride, conv.dilation
    xp = F.pad(x, (p, p))
    cols = [xp[b, :, i * st:i * st + 4 * dl + 1:dl].reshape(-1) for b in range(4) for i in range(out.shape[2])]
    assert torch.allclose(rep, torch.stack(cols, dim=1))


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(padding=2, stride=2, dilation=2), dict(stride=(1, 2))])
def test_conv_im2col_matches_the_convolution(kwargs):
    gen = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, bias=False, **kwargs)
    x = torch.randn(4, 2, 7, 6, generator=gen)
    rep = layer_input_matrix(conv, x)
    out = conv(x)  # (N, C_out, H, W): column order of rep is (n, h, w)
    expected = out.permute(1, 0, 2, 3).reshape(3, -1)
    assert torch.allclose(conv.weight.view(3, -1) @ rep, expected, atol=1e-5)
    # independent im2col: explicit loops over patches in weight.view(C_out, -1) order
    ph, pw = conv.padding
    xp = F.pad(x, (pw, pw, ph, ph))
    (sh, sw), (dh, dw) = conv.stride, conv.dilation
    cols = [xp[b, :, i * sh:i * sh + 2 * dh + 1:dh, j * sw:j * sw + 2 * dw + 1:dw].reshape(-1)
            for b in range(4) for i in range(out.shape[2]) for j in range(out.shape[3])]
    assert torch.allclose(rep, torch.stack(cols, dim=1))


def test_linear_representation_is_inputs_as_columns():
    x = torch.randn(7, 5)
    assert torch.equal(layer_input_matrix(nn.Linear(5, 2), x), x.T)


def test_conv_gradient_projection_is_orthogonal_to_memory():
    """A small CNN: after projection, G.view(C_out, -1) @ M = 0 per layer; 1-D grads are zero."""
    torch.manual_seed(0)
    net = build_model("small-cnn", (1, 8, 8), n_heads=1, head_classes=2)
    apply_regime(net, "full")
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 2, (40,))
    data = torch.utils.data.TensorDataset(x, y, torch.zeros(40, dtype=torch.long))
    memory = GPMMemory(trainable_blocks(net, "full"), 0.99, 0.0, 30, seed=0)
    memory.update(net, data)
    assert set(memory.bases) == {"blocks.conv1.0", "blocks.conv2.0", "blocks.conv3.0", "blocks.fc.1"}
    assert memory.bases["blocks.conv1.0"].shape[0] == 9 and memory.bases["blocks.conv2.0"].shape[0] == 32 * 9
    F.cross_entropy(net(torch.randn(16, 1, 8, 8), 0), torch.randint(0, 2, (16,))).backward()
    params = dict(net.named_parameters())
    before = {n: params[f"{n}.weight"].grad.clone() for n in memory.bases}
    memory.project(net)
    for name, basis in memory.bases.items():
        grad, g0 = params[f"{name}.weight"].grad, before[name].view(before[name].shape[0], -1)
        assert (grad.view(grad.shape[0], -1) @ basis).abs().max() < 1e-5 * g0.abs().max()
        # what is left is exactly the part of G outside span(M)
        assert torch.allclose(grad.view_as(g0), g0 - g0 @ basis @ basis.T, atol=1e-6 * float(g0.abs().max()))
    assert memory.bases["blocks.conv2.0"].shape[1] < 32 * 9  # a layer with a non-trivial complement
    assert params["blocks.conv2.0.weight"].grad.abs().sum() > 0
    one_d = [p.grad for n, p in net.blocks.named_parameters() if p.dim() == 1]
    assert one_d and all(g.abs().sum() == 0 for g in one_d)
    assert net.heads[0].weight.grad.abs().sum() > 0  # heads are never projected


# --- training: projection protects task-1 inputs -----------------------------------------

def _task1_inputs(strategy, tasks, memory):
    """Inputs of every memory layer on task 1's memory sample, at the model after task 1."""
    layers = memory.layers(strategy.model)
    idx = sample_indices(len(tasks[0].x_train), memory.n_samples, memory.seed, 0)
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, n=n: seen.__setitem__(n, inp[0].detach()))
             for n, m in layers.items()]
    strategy.model.eval()
    with torch.no_grad():
        strategy.model.features(tasks[0].x_train[idx])
    for h in hooks:
        h.remove()
    return {n: (seen[n], {k: v.clone() for k, v in layers[n].state_dict().items()}) for n in layers}


def _two_tasks(method):
    state = {}

    def after(t, strategy):
        if t == 0:
            state["params"] = {n: p.detach().clone() for n, p in strategy.model.named_parameters()}
            if method == "gpm":
                memory = memory_of(strategy)
                state["inputs"] = _task1_inputs(strategy, tasks_holder[0], memory)
                state["bases"] = {n: b.clone() for n, b in memory.bases.items()}
    tasks_holder = [digits_tasks()]
    strategy, _ = drive(method, "last-2", n_tasks=2, epochs=3, after_task=after)
    return strategy, state


def test_gpm_moves_task1_outputs_far_less_than_naive():
    gpm, g = _two_tasks("gpm")
    naive, n = _two_tasks("naive")
    assert all(torch.equal(g["params"][k], n["params"][k]) for k in g["params"])  # same task-1 model
    ratios = []
    for name, (x, old_state) in g["inputs"].items():
        layer_g = memory_of(gpm).layers(gpm.model)[name]
        layer_n = dict(naive.model.named_modules())[name]
        old = nn.functional.linear(x, old_state["weight"], old_state["bias"])
        moved_g = (layer_g(x) - old).norm() / old.norm()
        moved_n = (layer_n(x) - old).norm() / old.norm()
        ratios.append(float((moved_g / moved_n).detach()))
        # the discarded-energy bound: ‖ΔW X‖ ≤ ‖ΔW‖₂ ‖X − MMᵀX‖ (biases are frozen: Δb = 0)
        dw = layer_g.weight.detach() - old_state["weight"]
        basis = g["bases"][name]
        assert torch.equal(layer_g.bias, old_state["bias"])
        assert (dw @ basis).abs().max() < 1e-4 * dw.abs().max()
        resid = x.T - basis @ (basis.T @ x.T)
        bound = torch.linalg.matrix_norm(dw, ord=2) * resid.norm()
        assert (dw @ x.T).norm() <= bound * 1.001 + 1e-6
    print("gpm/naive output-change ratios", ratios)
    assert len(ratios) == 2 and max(ratios) < 0.25, ratios


# --- regimes -------------------------------------------------------------------------------

def frozen_state(model, regime: str) -> dict:
    """Clones of the parameters and buffers of the blocks the regime freezes."""
    frozen = [b for b in model.block_names if b not in trainable_blocks(model, regime)]
    return {f"{b}.{k}": v.detach().clone() for b in frozen
            for k, v in [*model.blocks[b].named_parameters(), *model.blocks[b].named_buffers()]}


def check_regime(method: str, regime: str, hparams=None):
    """Frozen parameters/buffers bitwise unchanged after task 1; memory only on trainable blocks."""
    snapshots = []
    strategy, _ = drive(method, regime, hparams, model="small-cnn", n_tasks=2, epochs=1,
                        after_task=lambda t, s: snapshots.append(frozen_state(s.model, regime)))
    final = frozen_state(strategy.model, regime)
    assert set(final) == set(snapshots[0]) and final
    assert all(torch.equal(final[k], snapshots[0][k]) for k in final)
    assert any("running_mean" in k for k in final)  # buffers were checked too
    memory = memory_of(strategy)
    trainable = set(trainable_blocks(strategy.model, regime))
    assert {n.split(".")[1] for n in memory.bases} == trainable
    assert all(len(d) == 2 for d in memory.dims.values())
    return memory


@pytest.mark.parametrize("regime", ["head", "last-1"])
def test_gpm_respects_regime(regime):
    memory = check_regime("gpm", regime)
    expected = {"head": set(), "last-1": {"blocks.fc.1"}}[regime]
    assert set(memory.bases) == expected


def test_threshold_past_one_never_fills_the_memory_with_zero_energy_directions():
    """With ε_base + ε_step·t > 1 (task 12 and later with the defaults) the memory must stop
    at the representation's rank, not span the whole input space (found in review)."""
    import torch

    from harness.methods._gpm_math import energy_threshold

    assert energy_threshold(11, 0.97, 0.003) == 1.0
    rep = torch.randn(64, 10, generator=torch.Generator().manual_seed(0))
    for eps in (0.97, 1.0, 1.003, 1.027):
        assert update_basis(None, rep, eps).shape[1] <= 10
