"""Gradient Projection Memory (Saha et al., ICLR 2021) under the run's depth regime.

Only Linear/Conv1d/Conv2d layers inside the blocks the run's regime trains (never the per-task
heads) get a memory and are projected. 1-D parameters (biases, BatchNorm scales/shifts) of
the projected blocks are frozen after task 1, as in the reference, by zeroing their
gradients after backward (`requires_grad` stays with the harness, which owns freezing).
As in the reference, the guarantee assumes plain SGD (momentum is fine: it sums projected
gradients); an optimizer's weight decay or Adam's per-element scaling is not projected.

BatchNorm (`batchnorm` hyperparameter): the reference models build every BatchNorm with
`track_running_stats=False`, so normalisation always uses the batch's own statistics and no
running statistics drift to the newest task. `batch-stats` (default) does the same for the
BatchNorm layers of the projected blocks, from the start of the run (evaluation then
normalises each test batch by its own statistics, as the reference does);
`frozen-stats` keeps their running statistics fixed from the end of task 1 (they normalise
training and evaluation alike); `running-stats` is plain BatchNorm, whose statistics follow
the newest task (unprotected; for ablations). Frozen blocks keep their statistics as always.
"""
from __future__ import annotations

import harness.compat  # noqa: F401

import torch
from avalanche.core import SupervisedPlugin

from ..api.contract import MethodAdapter, Range, dataset_tensors
from ..api.one_row import one_row_fails
from ..config.vocabulary import Family
from ._batchnorm import batchnorm_layers
from ._gpm_math import PROJECTED_TYPES, energy_threshold, layer_input_matrix, project_gradient_, update_basis_from_gram

GPM_DEFAULTS = {"eps_base": 0.97, "eps_step": 0.003, "n_samples": 200, "batchnorm": "batch-stats"}
BATCHNORM_POLICIES = ("batch-stats", "frozen-stats", "running-stats")
# The energy threshold is a fraction of the layer's input energy kept, (0, 1]; it grows by eps_step per
# task (a step < 0 would protect less each task); the basis is estimated from n_samples inputs.
GPM_RANGES = {"eps_base": Range(0, 1, low_open=True), "eps_step": Range(low=0), "n_samples": Range(low=1),
              "batchnorm": Range(choices=BATCHNORM_POLICIES)}


GPM_REGIME_NOTE = ("GPM projects the gradients of trainable weight matrices onto the complement of past inputs; "
                   "under bitfit/norm no weight matrix trains (the reference also freezes 1-D parameters after "
                   "task 1), a LoRA update BA cannot be kept in that complement by projecting its factors, and "
                   "a prompt token is no layer's weight matrix")


def check_gpm_hparams(method: str, eps_base, eps_step, n_samples) -> None:
    """One clear line for a bad GPM threshold or sample count."""
    if not 0 < float(eps_base) <= 1:
        raise ValueError(f"{method}: hparams.eps_base={eps_base!r}; allowed: a number in (0, 1]")
    if float(eps_step) < 0:
        raise ValueError(f"{method}: hparams.eps_step={eps_step!r}; allowed: a number >= 0")
    if int(n_samples) < 1 or int(n_samples) != n_samples:
        raise ValueError(f"{method}: hparams.n_samples={n_samples!r}; allowed: an integer >= 1")


def check_batchnorm_policy(method: str, policy) -> str:
    """One clear line for an unknown BatchNorm policy."""
    if policy not in BATCHNORM_POLICIES:
        raise ValueError(f"{method}: hparams.batchnorm={policy!r}; allowed: {', '.join(BATCHNORM_POLICIES)}")
    return policy


def apply_batchnorm_policy(model, blocks, policy: str, memory: GPMMemory) -> None:
    """Make the projected blocks' BatchNorm layers follow `policy` (see the module docstring)."""
    layers = batchnorm_layers(model, blocks)
    if policy == "batch-stats":
        for bn in layers:  # what track_running_stats=False builds: no buffers, batch statistics
            bn.track_running_stats = False
            bn.running_mean = bn.running_var = bn.num_batches_tracked = None
    elif policy == "frozen-stats":
        def keep_fixed(module, _inputs):
            if memory.tasks_seen:  # after task 1: normalise with the statistics task 1 left
                module.eval()
        for bn in layers:
            bn.register_forward_pre_hook(keep_fixed)


def sample_indices(n: int, k: int, seed: int, task: int) -> torch.Tensor:
    """A seeded random subset of min(k, n) indices of a dataset of n samples."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(task))
    return torch.randperm(n, generator=gen)[:min(int(k), n)].sort().values


def dataset_batches(dataset, indices, batch_size: int, device):
    """Yield (x, task_labels) batches of `dataset[indices]` in index order.

    Indexes the dataset directly (no DataLoader): drawing these samples must not consume
    the global RNG that shuffles training batches. A dataset tagged with its tensors (every
    experience's, see contract.dataset_tensors) is sliced as tensors: the same rows, the
    same values, without collating sample by sample.
    """
    tensors = dataset_tensors(dataset)
    if tensors is not None:
        x_all, _, t_all = tensors
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            yield x_all[chunk].to(device), t_all[chunk].to(device)
        return
    idx = indices.tolist()
    for start in range(0, len(idx), batch_size):
        items = [dataset[i] for i in idx[start:start + batch_size]]
        x = torch.stack([torch.as_tensor(item[0]) for item in items])
        t = torch.tensor([int(item[2]) for item in items])
        yield x.to(device), t.to(device)


def without_lone_batches(model, batches):
    """`batches` less a batch of one row after the first that `model` cannot take now (`one_row_fails`,
    asked when the batch comes: the model's modes then), as the training loops skip it
    (harness.run.fastdata.skip_lone_batches)."""
    for i, batch in enumerate(batches):
        if not (i > 0 and len(batch[0]) == 1 and one_row_fails(model)):
            yield batch


class GPMMemory:
    """Per-layer orthonormal bases M_l of past tasks' input spaces, and the projection."""

    def __init__(self, blocks, eps_base: float, eps_step: float, n_samples: int, seed: int):
        self.blocks, self.seed = tuple(blocks), seed
        self.eps_base, self.eps_step, self.n_samples = float(eps_base), float(eps_step), int(n_samples)
        self.bases: dict[str, torch.Tensor] = {}
        self.projectors: dict[str, torch.Tensor] = {}
        self.dims: dict[str, list[int]] = {}
        self.tasks_seen = 0
        self._layers = None

    def layers(self, model) -> dict[str, torch.nn.Module]:
        """Linear/Conv2d layers of the blocks the run's regime trains, by qualified name."""
        if self._layers is not None and self._layers[0] is model:
            return self._layers[1]
        out = {}
        for block in self.blocks:
            for name, module in model.blocks[block].named_modules():
                if isinstance(module, PROJECTED_TYPES):
                    out[f"blocks.{block}.{name}"] = module
        self._layers = (model, out)
        return out

    @torch.no_grad()
    def update(self, model, dataset, batch_size: int = 256) -> None:
        """Add task `tasks_seen`'s input space (sampled from `dataset`) to every layer's memory."""
        layers = self.layers(model)
        task = self.tasks_seen
        self.tasks_seen += 1
        if not layers:
            return
        grams = self._grams(model, layers, dataset, task, batch_size)
        eps = energy_threshold(task, self.eps_base, self.eps_step)
        for name, gram in grams.items():
            if gram is None:  # the layer never ran on this data (not on the features path)
                continue
            basis = update_basis_from_gram(self.bases.get(name), gram, eps).to(gram.device)
            self.bases[name] = basis.to(next(model.parameters()).device)
            self.projectors[name] = self.bases[name] @ self.bases[name].T
            self.dims.setdefault(name, []).append(int(basis.shape[1]))

    def _grams(self, model, layers, dataset, task, batch_size) -> dict[str, torch.Tensor]:
        """R Rᵀ per layer over the sampled inputs, accumulated batch by batch (float64)."""
        device = next(model.parameters()).device
        grams = {n: None for n in layers}
        hooks = [layer.register_forward_hook(self._hook(n, layer, grams)) for n, layer in layers.items()]
        was_training = model.training
        model.eval()  # the inputs the evaluated model sees
        try:
            idx = sample_indices(len(dataset), self.n_samples, self.seed, task)
            for x, _ in dataset_batches(dataset, idx, batch_size, device):
                model.features(x)
        finally:
            for h in hooks:
                h.remove()
            model.train(was_training)
        return grams

    @staticmethod
    def _hook(name, layer, grams):
        def hook(module, inputs, output):
            rep = layer_input_matrix(layer, inputs[0].detach()).to(torch.float64)
            g = rep @ rep.T
            grams[name] = g if grams[name] is None else grams[name] + g
        return hook

    def project(self, model) -> None:
        """Project the gradients of the remembered, trainable layers; zero their blocks' 1-D grads."""
        if not self.projectors:
            return
        for name, layer in self.layers(model).items():
            if name in self.projectors and layer.weight.requires_grad:
                project_gradient_(layer.weight, self.projectors[name])
        for block in self._projected_blocks():
            for p in model.blocks[block].parameters():
                if p.dim() == 1 and p.grad is not None:
                    p.grad.zero_()

    def _projected_blocks(self) -> set[str]:
        return {name.split(".")[1] for name in self.projectors}

    def diagnostics(self) -> dict:
        """{"gpm_memory_dims": {layer: [memory dimension after each task]}}."""
        return {"gpm_memory_dims": {n: list(d) for n, d in self.dims.items()}}


class GPMPlugin(SupervisedPlugin):
    """Projects gradients after backward (from task 2 on); updates the memory after each task."""

    def __init__(self, memory: GPMMemory, batch_size: int = 256):
        super().__init__()
        self.memory, self.batch_size = memory, batch_size

    def after_backward(self, strategy, **kwargs):
        self.memory.project(strategy.model)

    def after_training_exp(self, strategy, **kwargs):
        self.memory.update(strategy.model, strategy.experience.dataset, self.batch_size)

    def harness_diagnostics(self) -> dict:
        """Memory dimension per layer after each task."""
        return self.memory.diagnostics()


def build_gpm(ctx, eps_base: float, eps_step: float, n_samples: int, batchnorm: str):
    """Naive training with GPM gradient projection on the regime's shared trainable layers."""
    from avalanche.training.supervised import Naive

    check_gpm_hparams("gpm", eps_base, eps_step, n_samples)
    memory = GPMMemory(ctx.regime_blocks, eps_base, eps_step, n_samples, ctx.seed)
    apply_batchnorm_policy(ctx.model, ctx.regime_blocks, check_batchnorm_policy("gpm", batchnorm), memory)
    return Naive(**ctx.strategy_kwargs(GPMPlugin(memory, ctx.eval_mb_size)))


ADAPTERS = (
    MethodAdapter("gpm", dict(GPM_DEFAULTS), build_gpm,
                  "Gradient Projection Memory: gradients orthogonal to past tasks' input spaces",
                  "Saha, Garg & Roy, ICLR 2021", family="gpm", prefix_cache=True,
                  version="2",  # 2: BatchNorm policy, batch statistics in projected blocks by default
                  captions={"gpm_memory_dims": "GPM memory dimension per layer after each task"},
                  hparam_ranges=GPM_RANGES, regime_families=(Family.DEPTH,), regime_note=GPM_REGIME_NOTE),
)
