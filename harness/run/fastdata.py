"""Fast training data path: minibatches by tensor indexing instead of per-sample collation.

Avalanche's default loader fetches every sample through several dataset layers and
collates it back into a batch; for the small in-memory tensor datasets of this harness
that costs as much as the training itself. `install_fast_path` gives a strategy a
`make_train_dataloader` that yields `[x, y, t]` minibatches sliced from the task's
tensors (moved to the device once), reshuffled every epoch by a seeded generator.

Avalanche semantics are kept: the fast loader is used only when the strategy trains on
the plain experience dataset (the template's own `train_dataset_adaptation`, not replaced
by a plugin), or on a dataset the method built and tagged with its tensors
(`api.contract.tag_tensors`, e.g. joint training's concatenation, whose minibatches
mix tasks); otherwise (a plugin adding data or transforms) Avalanche's loader is built as
before. Plugins that replace or wrap `strategy.dataloader` themselves (replay's memory
batches) run after this and still do so.

On either path a last minibatch of one row is skipped when a forward of one row would fail
(`skip_lone_batches`): a BatchNorm layer normalising with batch statistics gets one value per
channel from it (harness.api.one_row; a 269-row task in batches of 67 ends with one). A batch of one
that the model can train on (BatchNorm on feature maps, as in small-cnn) trains as any other.
"""
from __future__ import annotations

import math

import torch

from ..api.contract import BATCH_GENERATOR_ATTRIBUTE, dataset_tensors
from ..api.one_row import one_row_fails

# Batches smaller than this get the frozen prefix run on them rather than cached features:
# BLAS kernels for a handful of rows may round differently from the big batches the cache
# was computed with, and the cached path must give the uncached path's numbers.
SMALL_BATCH = 8


class TensorBatches:
    """Iterable of `[x, y, t]` minibatches over in-memory tensors, shuffled per epoch.

    `transform(x_all)` (optional) returns features of the whole input tensor (or None),
    computed once, lazily at the first epoch: the frozen prefix's output (see
    harness.run.prefix_cache). `batch_cached` says whether the last batch holds features.
    """

    def __init__(self, x, y, task, batch_size: int, generator: torch.Generator,
                 device, shuffle: bool = True, transform=None):
        self.x, self.y = x.to(device), y.to(device)
        # `task`: the task of every row, or a tensor of each row's task (a mixed-task dataset)
        self.mixed = isinstance(task, torch.Tensor)
        self.task = None if self.mixed else int(task)
        self.t = (task.to(device) if self.mixed
                  else torch.full((len(y),), self.task, dtype=torch.long, device=device))
        self.batch_size, self.generator, self.shuffle = int(batch_size), generator, shuffle
        self.transform, self.features, self.batch_cached = transform, None, False
        self.skip_lone = _never  # () -> whether a last batch of one row is skipped (see skip_lone_batches)

    def __len__(self) -> int:
        n = len(self.y)
        return math.ceil(n / self.batch_size) - (n % self.batch_size == 1 and self._skips_lone())

    def _skips_lone(self) -> bool:
        return len(self.y) > 1 < self.batch_size and self.skip_lone()

    def __iter__(self):
        if self.transform is not None and self.features is None:
            # after every before_training_exp plugin has run
            self.features, self.transform = self.transform(self.x), None
        n = len(self.y)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        order = order.to(self.x.device)
        for start in range(0, n, self.batch_size):
            idx = order[start:start + self.batch_size]
            if len(idx) == 1 and self._skips_lone():
                break  # the last batch, of one row
            self.batch_cached = self.features is not None and len(idx) >= SMALL_BATCH
            x = self.features if self.batch_cached else self.x
            yield [x[idx], self.y[idx], self.t[idx] if self.mixed else self.t[:len(idx)]]
        self.batch_cached = False


def _never() -> bool:
    return False


class SkipLone:
    """A training loader without its batches of one row while `skip()` says so (Avalanche's loaders)."""

    def __init__(self, loader, skip):
        self.loader, self.skip = loader, skip

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if len(batch[0]) == 1 and self.skip():
                continue
            yield batch


def skip_lone_batches(strategy) -> None:
    """Make the strategy's training loaders (fast or Avalanche's) skip a batch of one row that the model
    cannot train on now (`one_row_fails`) while minibatches are larger (a batch size of 1 stays the
    method's own)."""
    made = strategy.make_train_dataloader

    def skip() -> bool:
        return strategy.train_mb_size > 1 and one_row_fails(strategy.model)

    def make_train_dataloader(**kwargs):
        made(**kwargs)
        if isinstance(strategy.dataloader, TensorBatches):
            strategy.dataloader.skip_lone = skip
        else:
            strategy.dataloader = SkipLone(strategy.dataloader, skip)

    strategy.make_train_dataloader = make_train_dataloader


def plain_task_index(strategy, tasks) -> int | None:
    """Index of the task whose tensors *are* the strategy's training data, else None."""
    if getattr(strategy, "_harness_adapted", None) is not strategy.adapted_dataset:
        return None  # a plugin replaced the adapted dataset (added data or transforms)
    t = getattr(strategy.experience, "current_experience", None)
    if not isinstance(t, int) or not 0 <= t < len(tasks):
        return None
    if len(strategy.adapted_dataset) != len(tasks[t].y_train):
        return None
    return t


def batch_generator(seed: int) -> torch.Generator:
    """The run's minibatch-order generator (its own: the global RNG is the methods')."""
    return torch.Generator().manual_seed(int(seed) * 7_919 + 17)


def has_plain_adaptation(strategy) -> bool:
    """True when the strategy trains on each experience's own dataset (template default)."""
    from avalanche.training.templates import SupervisedTemplate

    adapt = getattr(type(strategy), "train_dataset_adaptation", None)
    # e.g. joint training overrides it to concatenate every experience seen so far
    return (adapt is SupervisedTemplate.train_dataset_adaptation
            and "train_dataset_adaptation" not in vars(strategy))


def tensor_source(strategy, tasks, plain: bool):
    """`(x, y, task or task-label tensor, task index or None)` the strategy trains on now, else None."""
    if plain:
        t = plain_task_index(strategy, tasks)
        return None if t is None else (tasks[t].x_train, tasks[t].y_train, tasks[t].index, t)
    if getattr(strategy, "_harness_adapted", None) is not strategy.adapted_dataset:
        return None  # a plugin replaced the method's dataset
    tensors = dataset_tensors(strategy.adapted_dataset)
    return None if tensors is None else (*tensors, None)


def install_fast_path(strategy, tasks, seed: int, transform_for=None) -> bool:
    """Give `strategy` the tensor-indexing train loader.

    Per task, the loader falls back to Avalanche's when a plugin changed the data, or when
    a method's own adaptation (not the template's) built a dataset without tensors.
    `transform_for(strategy, t)` may return a function applied once to the task's inputs
    (frozen-prefix caching, plain single-task data only) or None. Returns whether the
    strategy trains on the plain experience datasets.
    """
    plain = has_plain_adaptation(strategy)
    generator = batch_generator(seed)
    setattr(strategy, BATCH_GENERATOR_ATTRIBUTE, generator)  # a method training in stages may save/restore it
    original_adapt = strategy.train_dataset_adaptation
    original_loader = strategy.make_train_dataloader

    def train_dataset_adaptation(**kwargs):
        original_adapt(**kwargs)
        strategy._harness_adapted = strategy.adapted_dataset

    def make_train_dataloader(shuffle=True, **kwargs):
        source = tensor_source(strategy, tasks, plain)
        if source is None:
            return original_loader(shuffle=shuffle, **kwargs)
        x, y, task, t = source
        transform = transform_for(strategy, t) if transform_for and t is not None else None
        strategy.dataloader = TensorBatches(x, y, task, strategy.train_mb_size, generator, strategy.device,
                                            shuffle=shuffle, transform=transform)

    # The adaptation is wrapped to see whether a plugin replaces its result afterwards.
    strategy.train_dataset_adaptation = train_dataset_adaptation
    strategy.make_train_dataloader = make_train_dataloader
    return plain
