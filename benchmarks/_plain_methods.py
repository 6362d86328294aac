"""Plain PyTorch loops that do each method's work, for benchmarks/same_work.py.

`Plain` is `_common.plain_run` written as a class with hooks (a per-task data source, one
before each iteration, one after backward, one after each task); each method below adds
its own work through them and nothing else. They follow the method semantics the harness
implements (same data, model, regime, optimizer reset per task, batch size, epochs, the
harness's minibatch order and seeded memory streams), so that where the harness is
exact, the accuracy matrix comes out equal. References, not products: short on purpose.
"""
from __future__ import annotations

import random

import _common as C
import numpy as np
import torch

from harness.api.contract import make_optimizer
from harness.methods._gpm_math import (
    PROJECTED_TYPES,
    closed_form_alpha,
    diag_fisher,
    energy_threshold,
    layer_input_matrix,
    merge_tensors,
    project_gradient_,
    update_basis_from_gram,
)
from harness.methods.gpm import sample_indices
from harness.run.datasets import load_dataset
from harness.run.engine import build_run_model, seed_everything
from harness.run.evaluation import evaluate_tasks
from harness.run.fastdata import batch_generator
from harness.run.regimes import apply_regime, inject_adapters, trainable_blocks
from harness.run.streams import split_tasks


def flat_grad(model) -> torch.Tensor:
    """Every parameter's gradient, flattened and concatenated (zeros where there is none)."""
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel(), device=p.device)
                      for p in model.parameters()])


@torch.no_grad()
def write_grad(model, flat: torch.Tensor) -> None:
    """Copy `flat` back into the parameters' gradients (those that have one)."""
    start = 0
    for p in model.parameters():
        if p.grad is not None:
            p.grad.copy_(flat[start:start + p.numel()].view_as(p))
        start += p.numel()


class Plain:
    """Naive fine-tuning as a plain loop (`_common.plain_run`), with hooks for a method's work."""

    def __init__(self, spec, device: str = "cpu"):
        self.spec, self.device = spec, device
        self.hp, self.B = dict(spec.hparams), spec.training.batch_size

    def run(self) -> list:
        """The accuracy matrix: the row before training, then one row after each task."""
        spec = self.spec
        seed_everything(spec.seed)
        data = load_dataset(spec.dataset.name)
        self.tasks = split_tasks(data, spec.class_order, spec.dataset.n_tasks,
                                 spec.dataset.classes_per_task, spec.scenario)
        self.model = inject_adapters(build_run_model(spec, data.input_shape), spec.regime).to(self.device)
        self.gen = batch_generator(spec.seed)  # the harness's minibatch order
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.setup()
        rows = [evaluate_tasks(self.model, self.tasks, spec.eval_batch_size, self.device)]
        for t, task in enumerate(self.tasks):
            apply_regime(self.model, "full" if t == 0 and spec.pretrain.first_task else spec.regime)
            self.train_task(t, task)
            self.after_task(t, task)
            rows.append(evaluate_tasks(self.model, self.tasks, spec.eval_batch_size, self.device))
        return rows

    def new_optimizer(self):
        return make_optimizer(self.spec.training, [p for p in self.model.parameters() if p.requires_grad])

    def train_task(self, t, task):
        self.train_epochs(t, task, self.spec.training.epochs, self.new_optimizer())

    def train_epochs(self, t, task, epochs, opt):
        self.model.train()
        for _ in range(epochs):
            for x, y, tl in self.epoch_batches(t, task):
                self.before_iteration(t, opt)
                x, y, tl = self.extend_batch(t, x, y, tl)
                opt.zero_grad()
                self.loss_fn(self.model(x, tl), y).backward()
                self.after_backward(t)
                opt.step()

    def epoch_batches(self, t, task):
        """One epoch of (x, y, task label) minibatches of the task, in the harness's order."""
        x, y = task.x_train.to(self.device), task.y_train.to(self.device)
        order = torch.randperm(len(y), generator=self.gen)
        for start in range(0, len(y), self.B):
            idx = order[start:start + self.B]
            yield x[idx], y[idx], task.index

    # the hooks: naive does nothing in them
    def setup(self):
        pass

    def before_iteration(self, t, opt):
        pass

    def extend_batch(self, t, x, y, tl):
        return x, y, tl

    def after_backward(self, t):
        pass

    def after_task(self, t, task):
        pass


def stream_take(gen: torch.Generator, size: int, pending: torch.Tensor, k: int):
    """The next k indices of a cyclic stream of randperm(size, gen) permutations; (indices, rest).

    A fresh permutation is drawn when the pending one runs out, so a take may span two."""
    while len(pending) < k:
        pending = torch.cat([pending, torch.randperm(size, generator=gen)])
    return pending[:k], pending[k:]


class Replay(Plain):
    """Experience replay, Avalanche's experience-balanced reservoir buffer (adaptive sizes):
    every minibatch of the current task gets B memory samples from a seeded stream."""

    def setup(self):
        self.M = int(self.hp.get("mem_size", 200))
        self.groups: list[torch.Tensor] = []  # per past task: its kept indices, highest weight first
        self.mem_gen = torch.Generator().manual_seed(self.spec.seed * 7919 + 29)
        self.mem = None

    def after_task(self, t, task):
        weights = torch.rand(len(task.y_train))  # the global RNG, as ReservoirSamplingBuffer
        self.groups.append(weights.sort(descending=True).indices)
        g = len(self.groups)
        base = self.M // g
        lens = [base + (1 if i < self.M - base * g else 0) for i in range(g)]
        self.groups = [idx[:n] for idx, n in zip(self.groups, lens)]
        seen = self.tasks[:g]
        self.mem = (torch.cat([s.x_train[idx] for s, idx in zip(seen, self.groups)]).to(self.device),
                    torch.cat([s.y_train[idx] for s, idx in zip(seen, self.groups)]).to(self.device),
                    torch.cat([torch.full((len(idx),), s.index) for s, idx in zip(seen, self.groups)]))
        self.pending = torch.empty(0, dtype=torch.long)  # the new buffer's stream starts afresh

    def extend_batch(self, t, x, y, tl):
        if self.mem is None:
            return x, y, tl
        mx, my, mt = self.mem
        idx, self.pending = stream_take(self.mem_gen, len(my), self.pending, self.B)
        t_cur = torch.full((len(y),), tl)
        return torch.cat([x, mx[idx]]), torch.cat([y, my[idx]]), torch.cat([t_cur, mt[idx]]).to(self.device)


class Joint(Plain):
    """Joint training: after task t, on tasks 0..t's training data concatenated."""

    def train_task(self, t, task):
        seen = self.tasks[:t + 1]
        self.joint = (torch.cat([s.x_train for s in seen]).to(self.device),
                      torch.cat([s.y_train for s in seen]).to(self.device),
                      torch.cat([torch.full((len(s.y_train),), s.index) for s in seen]).to(self.device))
        super().train_task(t, task)

    def epoch_batches(self, t, task):
        x, y, tl = self.joint
        order = torch.randperm(len(y), generator=self.gen)
        for start in range(0, len(y), self.B):
            idx = order[start:start + self.B]
            yield x[idx], y[idx], tl[idx]


def gem_project(G: torch.Tensor, g: torch.Tensor, margin: float) -> torch.Tensor:
    """GEM's projected gradient: the QP of the original code (Avalanche GEMPlugin.solve_quadprog)."""
    import qpsolvers

    mem, grad = G.cpu().double().numpy(), g.cpu().contiguous().view(-1).double().numpy()
    t = mem.shape[0]
    P = mem @ mem.T
    P = 0.5 * (P + P.T) + np.eye(t) * 1e-3
    q = -(mem @ grad)
    h = np.zeros(t) + margin
    v = qpsolvers.solve_qp(P=P, q=-q, G=-np.eye(t), h=-h, solver="quadprog")
    return torch.from_numpy(v @ mem + grad).float().to(g.device)


class GEM(Plain):
    """GEM: per iteration, the gradient on every past task's memory; a QP projection on conflict."""

    def setup(self):
        self.P, self.margin = int(self.hp.get("patterns_per_exp", 64)), float(self.hp.get("memory_strength", 0.5))
        self.memory = []

    def after_task(self, t, task):
        # P random samples: the first P of Avalanche's DataLoader(shuffle=True), whose draws this
        # repeats (the iterator's base seed, then RandomSampler's randperm seeded from the global RNG).
        torch.empty((), dtype=torch.int64).random_()
        gen = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        idx = torch.randperm(len(task.y_train), generator=gen)[:self.P]
        self.memory.append((task.x_train[idx].to(self.device), task.y_train[idx].to(self.device), task.index))

    def before_iteration(self, t, opt):
        if not self.memory:
            return
        rows = []
        for mx, my, mt in self.memory:
            self.model.train()
            opt.zero_grad()
            self.loss_fn(self.model(mx, mt), my).backward()
            rows.append(flat_grad(self.model))
        self.G = torch.stack(rows)

    @torch.no_grad()
    def after_backward(self, t):
        if not self.memory:
            return
        g = flat_grad(self.model)
        if (self.G @ g < 0).any():
            write_grad(self.model, gem_project(self.G, g, self.margin))


class AGEM(Plain):
    """A-GEM: per iteration, one reference gradient on a memory sample; project on conflict."""

    def setup(self):
        self.P, self.S = int(self.hp.get("patterns_per_exp", 64)), int(self.hp.get("sample_size", 64))
        self.buffers = []  # per past task: (x, y, task label, generator, pending stream)

    def after_task(self, t, task):
        order = list(range(len(task.y_train)))
        random.shuffle(order)  # the global Python RNG, as Avalanche's AGEMPlugin
        idx = torch.tensor(order[:self.P])
        gen = torch.Generator().manual_seed(self.spec.seed * 7919 + 31 + len(self.buffers))
        self.buffers.append([task.x_train[idx].to(self.device), task.y_train[idx].to(self.device), task.index,
                             gen, torch.empty(0, dtype=torch.long)])

    def before_iteration(self, t, opt):
        if not self.buffers:
            return
        per_buffer = self.S // len(self.buffers)
        xs, ys, ts = [], [], []
        for buf in self.buffers:
            bx, by, bt, gen, pending = buf
            idx, buf[4] = stream_take(gen, len(by), pending, per_buffer)
            xs.append(bx[idx])
            ys.append(by[idx])
            ts.append(torch.full((len(idx),), bt))
        self.model.train()
        opt.zero_grad()
        self.loss_fn(self.model(torch.cat(xs), torch.cat(ts).to(self.device)), torch.cat(ys)).backward()
        self.g_ref = flat_grad(self.model)
        opt.zero_grad()

    @torch.no_grad()
    def after_backward(self, t):
        if not self.buffers:
            return
        g = flat_grad(self.model)
        dot = torch.dot(g, self.g_ref)
        if dot < 0:
            write_grad(self.model, g - self.g_ref * (dot / torch.dot(self.g_ref, self.g_ref)))


class GPM(Plain):
    """GPM: gradients of the regime's shared layers projected off past tasks' input spaces."""

    project = True  # BECAME switches it per stage

    def setup(self):
        hp = self.hp
        self.eps_base, self.eps_step = float(hp.get("eps_base", 0.97)), float(hp.get("eps_step", 0.003))
        self.n_samples = int(hp.get("n_samples", 200))
        blocks = trainable_blocks(self.model, self.spec.regime)
        self.layers = {f"blocks.{b}.{n}": m for b in blocks for n, m in self.model.blocks[b].named_modules()
                       if isinstance(m, PROJECTED_TYPES)}
        self.bases, self.projectors = {}, {}
        for b in blocks:  # BatchNorm policy "batch-stats" (the default): batch statistics, no buffers
            for m in self.model.blocks[b].modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.track_running_stats = False
                    m.running_mean = m.running_var = m.num_batches_tracked = None

    def after_backward(self, t):
        if not (self.project and self.projectors):
            return
        for name, layer in self.layers.items():
            if name in self.projectors and layer.weight.requires_grad:
                project_gradient_(layer.weight, self.projectors[name])
        for block in {name.split(".")[1] for name in self.projectors}:
            for p in self.model.blocks[block].parameters():
                if p.dim() == 1 and p.grad is not None:
                    p.grad.zero_()

    def after_task(self, t, task):
        self.update_memory(t, task)

    @torch.no_grad()
    def update_memory(self, t, task):
        grams = {}

        def hook_for(name):
            def hook(layer, inputs, output):
                rep = layer_input_matrix(layer, inputs[0].detach()).to(torch.float64)
                grams[name] = rep @ rep.T if name not in grams else grams[name] + rep @ rep.T
            return hook

        hooks = [m.register_forward_hook(hook_for(n)) for n, m in self.layers.items()]
        self.model.eval()
        idx = sample_indices(len(task.y_train), self.n_samples, self.spec.seed, t)
        for start in range(0, len(idx), self.spec.eval_batch_size):
            self.model.features(task.x_train[idx[start:start + self.spec.eval_batch_size]].to(self.device))
        for h in hooks:
            h.remove()
        self.model.train()
        eps = energy_threshold(t, self.eps_base, self.eps_step)
        for name, gram in grams.items():
            self.bases[name] = update_basis_from_gram(self.bases.get(name), gram, eps).to(self.device)
            self.projectors[name] = self.bases[name] @ self.bases[name].T


class Became(GPM):
    """BECAME: a GPM stage and a free stage per task, merged with the closed-form Fisher α."""

    def setup(self):
        super().setup()
        self.fisher_samples = self.hp.get("fisher_samples", 2048)
        self.f_old = {}

    def train_task(self, t, task):
        E = self.spec.training.epochs
        if t == 0:
            self.project = False
            self.train_epochs(t, task, E, self.new_optimizer())
            self.f_old = self.fisher(t, task)
            return
        self.project = True  # stage 1: GPM
        self.train_epochs(t, task, E - E // 2, self.new_optimizer())
        gp = self.snapshot()
        self.project, state = False, self.gen.get_state()  # stage 2: free, batch order restored after
        self.train_epochs(t, task, E // 2, self.new_optimizer())
        self.gen.set_state(state)
        free = self.snapshot()
        f_free = self.fisher(t, task)
        params = [n for n, p in self.model.named_parameters() if p.requires_grad]
        alpha = closed_form_alpha(f_free, self.f_old, {n: free[n] - gp[n] for n in params})
        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        with torch.no_grad():
            for name in gp:
                tensors[name].copy_(merge_tensors(gp[name], free[name], alpha))
        for name, f in self.fisher(t, task).items():
            self.f_old[name] = self.f_old[name] + f if name in self.f_old else f.clone()

    def snapshot(self) -> dict:
        """Trainable parameters and the buffers outside frozen blocks."""
        out = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        frozen = tuple(f"blocks.{b}." for b in self.model.frozen_blocks)
        out.update({n: b.detach().clone() for n, b in self.model.named_buffers() if not n.startswith(frozen)})
        return out

    def fisher(self, t, task) -> dict:
        """Diagonal Fisher (train mode, own predictions) on a seeded subset; buffers kept."""
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        n = len(task.y_train)
        idx = sample_indices(n, self.fisher_samples or n, self.spec.seed + 7919, t)
        buffers = {k: b.detach().clone() for k, b in self.model.named_buffers()}
        self.model.train()
        batches = ((task.x_train[idx[s:s + self.B]].to(self.device), task.index) for s in range(0, len(idx), self.B))
        fisher = diag_fisher(self.model, batches, params)
        with torch.no_grad():
            for k, b in self.model.named_buffers():
                b.copy_(buffers[k])
        return fisher


def naive(spec, device: str = "cpu") -> list:
    return C.plain_run(spec, device=device)


PLAIN = {"naive": naive, "replay": Replay, "joint": Joint, "gem": GEM, "agem": AGEM, "gpm": GPM,
         "became": Became}


def plain_run(method: str, spec, device: str = "cpu") -> list:
    """The accuracy matrix (initial row first) of the plain loop doing `method`'s work."""
    loop = PLAIN[method]
    return loop(spec, device) if loop is naive else loop(spec, device).run()
