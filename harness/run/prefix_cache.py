"""Frozen-prefix caching: run the frozen input-side blocks once per task, train the rest.

Under a depth regime the blocks before the first trainable one are frozen: no gradients,
eval mode (CLNet keeps them there), and the harness checks they do not change during a
task. With in-memory data and no augmentation their output for a training sample is
therefore the same at every epoch, so it is computed once per task (lazily, after every
`before_training_exp` plugin) and each minibatch runs only the trainable suffix + heads.

Only the strategy's own forward pass on its training minibatches sees the cached
features (`strategy.mb_x` holds them). Methods whose plugins run another model on
`strategy.mb_x` (LwF's previous model) must not use the cache; methods that run the model
on stored raw inputs (GEM, A-GEM memories, EWC/GPM/BECAME passes over the experience's
dataset) are unaffected, because the model itself is untouched.

Who caches: a strategy or one of its plugins may declare `harness_prefix_cache = True`
or `False` (api.contract.PrefixCacheDeclaration); otherwise the adapter's
`prefix_cache` field decides (set only once a test showed the method's records equal with
and without the cache, see tests/test_performance_paths.py).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from avalanche.training.templates.problem_type.supervised_problem import SupervisedProblem

from ..api.contract import declared_prefix_cache
from .evaluation import evaluate_tasks
from .fastdata import TensorBatches
from .models import CLNet
from .precision import as_float, autocast

# A cache larger than this (bytes) is not built: memory matters more than the speed-up.
MAX_CACHE_BYTES = 1 << 30


def cache_allowed(strategy, adapter) -> bool:
    """A strategy's (or plugin's) declaration wins; otherwise the adapter's `prefix_cache` field."""
    declared = declared_prefix_cache(strategy)
    return bool(adapter.prefix_cache) if declared is None else declared


def _stateless(block) -> bool:
    """A block without parameters, buffers or dropout gives the same output in any mode."""
    if any(True for _ in block.parameters()) or any(True for _ in block.buffers()):
        return False
    return not any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in block.modules())


def frozen_prefix(model) -> list[str]:
    """Leading blocks that are frozen (or stateless), input side first."""
    prefix = []
    for name, block in model.blocks.items():
        frozen = (name in model.frozen_blocks and not block.training
                  and not any(p.requires_grad for p in block.parameters()))
        if not (frozen or _stateless(block)):
            break
        prefix.append(name)
    # Trailing stateless blocks belong to the suffix unless everything is frozen.
    while prefix and prefix[-1] not in model.frozen_blocks and len(prefix) < len(model.blocks):
        prefix.pop()
    return prefix if any(n in model.frozen_blocks for n in prefix) else []


@torch.no_grad()
def prefix_features(model, prefix: list[str], x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor | None:
    """The prefix blocks' output for every row of `x` (eval mode); None if too large."""
    blocks = [model.blocks[n] for n in prefix]
    chunks, limit = [], None
    for start in range(0, len(x), batch_size):
        h = model.pixels(x[start:start + batch_size])  # the prefix starts at the first block: CLNet.features' input
        with autocast(model, h):  # as CLNet.forward runs these blocks (the cached path computes the same)
            for block in blocks:
                h = block(h)
        if limit is None:
            limit = h[:1].nelement() * h.element_size() * len(x)
            if limit > MAX_CACHE_BYTES:
                return None
        chunks.append(h)
    return torch.cat(chunks) if chunks else x


class PrefixCache:
    """Per task: decides whether to cache, computes the features, runs the suffix."""

    def __init__(self, strategy, enabled: bool, batch_size: int = 1024):
        self.strategy, self.enabled, self.batch_size = strategy, enabled, batch_size
        self.suffix: list[str] | None = None  # trainable blocks after the cached prefix
        self.tasks_cached: list[int] = []
        self.meter = None  # the run's compute.ComputeMeter (None: not accounting): counts the passes run here

    def transform_for(self, strategy, t: int):
        """The per-task input transform for harness.run.fastdata (None: no caching this task)."""
        self.suffix = None
        prefix = frozen_prefix(strategy.model) if self.enabled else []
        if not prefix:
            return None
        model = strategy.model
        names = model.block_names
        suffix = names[len(prefix):]

        def transform(x):
            with _counted(self.meter):
                feats = prefix_features(model, prefix, x, self.batch_size)
            if feats is None:
                return None
            if self.meter is not None:
                self.meter.prefix_rows(len(x), len(prefix))
            self.suffix = suffix
            self.tasks_cached.append(t)
            return feats
        return transform

    def active(self) -> bool:
        """True while the strategy is training on this cache's features."""
        s = self.strategy
        return (self.suffix is not None and _single_task_batch(s) is not None
                and s.dataloader.batch_cached)

    def forward_suffix(self):
        """The model's output for cached features: trainable suffix blocks, then the head."""
        model, h = self.strategy.model, self.strategy.mb_x
        with _counted(self.meter), autocast(model, h):
            for name in self.suffix:
                h = model.blocks[name](h)
            out = as_float(_head(model, self.strategy.dataloader.task)(h))
        if self.meter is not None:
            self.meter.suffix_pass(out, len(model.block_names) - len(self.suffix))
        return out


def _counted(meter):
    """While the cache runs blocks itself, the meter's block hook leaves the counting to it."""
    return nullcontext() if meter is None else meter.cached()


def _head(model, task: int):
    """The head CLNet.forward uses for a batch of one task (its only head in class-IL)."""
    return model.heads[0] if len(model.heads) == 1 else model.heads[task]


def _single_task_batch(strategy) -> int | None:
    """The task of the current minibatch when it comes from harness.run.fastdata (one task)."""
    loader = strategy.dataloader
    if type(loader) is TensorBatches and strategy.is_training and isinstance(strategy.model, CLNet):
        return loader.task
    return None


def install_prefix_cache(strategy, enabled: bool, batch_size: int = 1024) -> PrefixCache:
    """Route the strategy's forward through the suffix while it trains on cached features."""
    cache = PrefixCache(strategy, enabled, batch_size)
    original_forward = strategy.forward
    if getattr(type(strategy), "forward", None) is not SupervisedProblem.forward:
        cache.enabled = False  # a strategy with its own forward keeps it, uncached
        return cache

    def forward():
        if cache.active():
            return cache.forward_suffix()
        task = _single_task_batch(strategy)
        # The same computation as avalanche_forward with a tensor of equal task labels,
        # without the per-batch check that every label is the same.
        return original_forward() if task is None else strategy.model(strategy.mb_x, task)

    strategy.forward = forward
    return cache


class EvalCache:
    """The harness's evaluation with the test sets' prefix features kept across evaluations.

    Valid while the evaluated model's frozen prefix is bitwise the one the features were
    computed with (checked at every evaluation); the features are computed batch by batch
    with the evaluator's own slices, so the accuracies are those of evaluate_tasks.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.prefix: list[str] = []
        self.state: dict = {}
        self.features: dict[int, list] = {}

    def evaluate(self, model, tasks, batch_size: int, device) -> list:
        """Accuracy on every task's test set (as harness.run.evaluation.evaluate_tasks)."""
        prefix = self._prefix(model) if self.enabled else []
        if not prefix:
            return evaluate_tasks(model, tasks, batch_size, device)
        was_training = model.training
        model.eval()
        try:
            return [self._accuracy(model, prefix, t, batch_size, device) for t in tasks]
        finally:
            model.train(was_training)

    def _prefix(self, model) -> list[str]:
        if type(model) is not CLNet or _changing_hooks(model):
            return []  # a subclass or a hook may change what forward computes
        prefix = frozen_prefix(model)
        state = {f"{n}.{k}": v for n in prefix
                 for k, v in [*model.blocks[n].named_parameters(), *model.blocks[n].named_buffers()]}
        if prefix != self.prefix or not _same_state(state, self.state):
            self.prefix, self.features = prefix, {}
            self.state = {k: v.detach().clone() for k, v in state.items()}
        return prefix

    @torch.no_grad()
    def _accuracy(self, model, prefix, task, batch_size: int, device) -> float:
        if len(task.y_test) == 0:
            return float("nan")
        chunks = self.features.get(task.index)
        if chunks is None:
            chunks = [_run_blocks(model, prefix, model.pixels(task.x_test[s:s + batch_size].to(device)))
                      for s in range(0, len(task.y_test), batch_size)]
            if sum(c.nelement() * c.element_size() for c in chunks) <= MAX_CACHE_BYTES:
                self.features[task.index] = chunks
        suffix = model.block_names[len(prefix):]
        head = _head(model, task.index)
        correct = 0
        for i, h in enumerate(chunks):
            yb = task.y_test[i * batch_size:(i + 1) * batch_size].to(device)
            with autocast(model, h):
                logits = as_float(head(_run_blocks(model, suffix, h)))
            correct += (logits.argmax(dim=1) == yb).sum()  # summed on the device: one sync per task
        return int(correct) / len(task.y_test)


def _changing_hooks(model) -> bool:
    """Forward hooks on the model other than the compute meter's (which change no output)."""
    hooks = [*model._forward_hooks.values(), *model._forward_pre_hooks.values()]
    return any(not getattr(h, "harness_counting", False) for h in hooks)


def _run_blocks(model, names, h):
    with autocast(model, h):
        for name in names:
            h = model.blocks[name](h)
    return h


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
