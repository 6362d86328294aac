"""Memory-based methods: GEM, A-GEM and experience replay.

Each keeps Avalanche's strategy and its plugin's mathematics (GEM's QP, A-GEM's projection,
replay's experience-balanced reservoir buffer); replay and A-GEM keep their memories as
tensors and draw memory minibatches by indexing them (`MemorySampler`), instead of through
Avalanche's per-sample datasets and loaders, which cost more than the training itself on
small data. The memories hold the rows Avalanche's would (tested against Avalanche's own).
"""
from __future__ import annotations

import random

import harness.compat  # noqa: F401

import torch
from avalanche.training.plugins import AGEMPlugin, GEMPlugin, ReplayPlugin

from ..api.contract import MemoryUse, MethodAdapter, Range, dataset_tensors

# Seed offsets of the memory samplers' generators (independent of the training batch order).
REPLAY_STREAM, AGEM_STREAM = 29, 31


class MemorySampler:
    """An endless stream of minibatches over memory tensors: each pass is a fresh seeded permutation.

    `take(n)` returns the next `n` rows, continuing into the next permutation when one is
    used up, so every memory batch has exactly `n` rows whatever the memory's size.
    """

    def __init__(self, x, y, t, generator: torch.Generator):
        self.x, self.y, self.t, self.generator = x, y, t, generator
        self.order, self.pos = torch.empty(0, dtype=torch.long), 0

    def __len__(self) -> int:
        return len(self.y)

    def take(self, n: int) -> list:
        """`[x, y, t]` of the next `n` rows of the stream."""
        parts, need = [], int(n)
        while need > 0:
            if self.pos >= len(self.order):
                self.order, self.pos = torch.randperm(len(self.y), generator=self.generator), 0
            part = self.order[self.pos:self.pos + need]
            parts.append(part)
            self.pos += len(part)
            need -= len(part)
        idx = torch.cat(parts).to(self.x.device)
        return [self.x[idx], self.y[idx], self.t[idx]]


def memory_generator(seed: int, stream: int) -> torch.Generator:
    """The seeded generator of one memory sampler (its own: the global RNGs belong to the methods)."""
    return torch.Generator().manual_seed(int(seed) * 7_919 + int(stream))


def rows_of(dataset, indices=None, device="cpu") -> tuple:
    """`(x, y, t)` tensors of `dataset`'s rows (all, or `indices`), by tensor indexing where it is tagged."""
    tensors = dataset_tensors(dataset)
    if tensors is not None:
        idx = torch.arange(len(dataset)) if indices is None else torch.as_tensor(indices, dtype=torch.long)
        return tuple(v[idx].to(device) for v in tensors)
    order = range(len(dataset)) if indices is None else indices
    items = [dataset[int(i)] for i in order]
    return (torch.stack([torch.as_tensor(item[0]) for item in items]).to(device),
            torch.tensor([int(item[1]) for item in items], device=device),
            torch.tensor([int(item[-1]) for item in items], device=device))


class MixedBatches:
    """The strategy's minibatches, each followed by as many memory rows (replay's batches)."""

    def __init__(self, loader, sampler: MemorySampler, memory_batch: int):
        self.loader, self.sampler, self.memory_batch = loader, sampler, int(memory_batch)

    def __len__(self) -> int:
        return len(self.loader)  # an epoch is one pass over the current task's data

    def __iter__(self):
        for x, y, t in self.loader:
            xm, ym, tm = self.sampler.take(self.memory_batch)
            yield [torch.cat([x, xm]), torch.cat([y, ym]), torch.cat([t.to(tm.device), tm])]


class BalancedReservoir:
    """Avalanche's `ExperienceBalancedBuffer(max_size, adaptive_size=True)` over tensor rows.

    Per experience a reservoir (`ReservoirSamplingBuffer`): each row gets a weight from
    `torch.rand` (the global RNG, as Avalanche draws it) and the group keeps its rows of highest
    weight, best first; after experience g the groups share `max_size` (⌊max/g⌋ each, the
    remainder to the first groups) and each keeps the head of its list. The rows are the ones
    Avalanche's buffer holds, in its order (tests/test_fast_methods.py compares them).
    """

    def __init__(self, max_size: int):
        self.max_size, self.groups = int(max_size), []

    def add(self, x, y, t) -> None:
        """Add one experience's rows, then shrink every group to its share."""
        weights = torch.rand(len(y))
        order = weights.sort(descending=True).indices
        n = len(self.groups) + 1
        lengths = [self.max_size // n + (1 if i < self.max_size % n else 0) for i in range(n)]
        keep = order[:lengths[-1]].to(x.device)
        self.groups.append((x[keep], y[keep], t[keep]))
        self.groups = [tuple(v[:k] for v in group) for group, k in zip(self.groups, lengths)]

    def rows(self) -> tuple:
        """`(x, y, t)` of every group, in group order; the groups become views of them (one copy kept)."""
        rows = tuple(torch.cat([g[i] for g in self.groups]) for i in range(3))
        lengths = [len(g[1]) for g in self.groups]
        self.groups = list(zip(*(r.split(lengths) for r in rows)))
        return rows


class TensorReplayPlugin(ReplayPlugin):
    """Avalanche's replay (an experience-balanced reservoir buffer) with the buffer kept as tensors
    and memory minibatches drawn from them: each training minibatch of B rows is followed by B
    memory rows from a seeded stream over the buffer."""

    def __init__(self, mem_size: int, seed: int):
        super().__init__(mem_size=mem_size)
        self.reservoir = BalancedReservoir(mem_size)
        self.sampler: MemorySampler | None = None
        self.generator = memory_generator(seed, REPLAY_STREAM)

    def before_training_exp(self, strategy, **kwargs):
        if self.sampler is None or not len(self.sampler):
            return
        strategy.dataloader = MixedBatches(strategy.dataloader, self.sampler,
                                           self.batch_size_mem or strategy.train_mb_size)

    def after_training_exp(self, strategy, **kwargs):
        self.reservoir.add(*rows_of(strategy.experience.dataset, device=strategy.device))
        self.sampler = MemorySampler(*self.reservoir.rows(), self.generator)

    def harness_memory(self) -> MemoryUse:
        """The buffer's rows (x, y, task labels; the reservoir's groups are views of them)."""
        if self.sampler is None:
            return MemoryUse(samples=0)
        return MemoryUse(samples=len(self.sampler), tensors=(self.sampler.x, self.sampler.y, self.sampler.t))


class TensorAGEMPlugin(AGEMPlugin):
    """Avalanche's A-GEM (memory choice, reference gradient, projection), with the memory kept as
    tensors: the reference batch takes sample_size // k rows from each of the k task memories."""

    def __init__(self, patterns_per_experience: int, sample_size: int, seed: int):
        super().__init__(patterns_per_experience, sample_size)
        self.seed, self.samplers = seed, []

    def after_training_exp(self, strategy, **kwargs):
        self.update_memory(strategy.experience.dataset, device=strategy.device)

    @torch.no_grad()
    def update_memory(self, dataset, num_workers=0, device="cpu", **kwargs):
        """Keep `patterns_per_experience` random rows of the task (Avalanche's choice, Python's RNG)."""
        indices = list(range(len(dataset)))
        if len(dataset) > self.patterns_per_experience:
            random.shuffle(indices)
            indices = indices[:self.patterns_per_experience]
        generator = memory_generator(self.seed, AGEM_STREAM + len(self.samplers))
        self.samplers.append(MemorySampler(*rows_of(dataset, indices, device), generator))
        self.buffers.append(self.samplers[-1])  # A-GEM's own code checks `len(self.buffers) > 0`

    def harness_memory(self) -> MemoryUse:
        """Every task memory's rows (x, y, task labels)."""
        return MemoryUse(samples=sum(len(s) for s in self.samplers),
                         tensors=tuple(v for s in self.samplers for v in (s.x, s.y, s.t)))

    def sample_from_memory(self):
        """`[x, y, t]`: the next sample_size // k rows of every task memory, in task order."""
        per_task = self.sample_size // len(self.samplers)
        parts = [s.take(per_task) for s in self.samplers]
        return [torch.cat([p[i] for p in parts]) for i in range(3)]


def build_gem(ctx, patterns_per_exp: int, memory_strength: float):
    """Gradient Episodic Memory (needs a QP solver: qpsolvers[quadprog])."""
    from avalanche.training.supervised import GEM

    class ReportingGEM(GEM):
        """Avalanche's GEM, unchanged, reporting its GEMPlugin's memories."""

        def harness_memory(self) -> MemoryUse:
            """Every task memory's rows (x, y, task labels; not the gradient matrix G, which each
            training iteration recomputes from them)."""
            plugin = next(p for p in self.plugins if isinstance(p, GEMPlugin))
            parts = (plugin.memory_x, plugin.memory_y, plugin.memory_tid)
            return MemoryUse(samples=sum(len(v) for v in plugin.memory_y.values()),
                             tensors=tuple(v for part in parts for v in part.values()))

    return ReportingGEM(patterns_per_exp=int(patterns_per_exp), memory_strength=float(memory_strength),
                        **ctx.strategy_kwargs())


def build_agem(ctx, patterns_per_exp: int, sample_size: int):
    """Averaged GEM, memories as tensors."""
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs(TensorAGEMPlugin(int(patterns_per_exp), int(sample_size), ctx.seed)))


def build_replay(ctx, mem_size: int):
    """Experience replay with Avalanche's experience-balanced buffer, memory batches from tensors."""
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs(TensorReplayPlugin(int(mem_size), ctx.seed)))


ADAPTERS = (
    # Memories hold >= 1 sample; GEM's margin γ (memory_strength) is >= 0.
    MethodAdapter("gem", {"patterns_per_exp": 64, "memory_strength": 0.5}, build_gem,
                  "Gradient Episodic Memory", "Lopez-Paz & Ranzato, NeurIPS 2017", family="rehearsal",
                  prefix_cache=True, hparam_ranges={"patterns_per_exp": Range(low=1), "memory_strength": Range(low=0)}),
    MethodAdapter("agem", {"patterns_per_exp": 64, "sample_size": 64}, build_agem,
                  "Averaged GEM", "Chaudhry et al., ICLR 2019", family="rehearsal", prefix_cache=True,
                  hparam_ranges={"patterns_per_exp": Range(low=1), "sample_size": Range(low=1)},
                  version="2"),  # 2: memories as tensors, reference batches from seeded per-task streams
    MethodAdapter("replay", {"mem_size": 200}, build_replay, "Experience replay",
                  "Chaudhry et al. 2019 (ER)", family="rehearsal", hparam_ranges={"mem_size": Range(low=1)},
                  version="2"),  # 2: B memory rows per minibatch from a seeded stream over tensors
)
