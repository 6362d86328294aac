"""Pure merge rules on task vectors (dicts name -> tensor), batch and running forms.

Batch rules take the list of task vectors τ_1..τ_n (same keys, same shapes) and return
the merged vector; the running "mergers" see one τ at a time and keep constant memory
where the rule allows it (MagMax, sum/mean, RandMix). The scale λ is applied by the
caller: θ = θ0 + λ·merged.
"""
from __future__ import annotations

import torch

TaskVector = dict  # name -> tensor


def _check(taus) -> None:
    if not taus:
        raise ValueError("merging needs at least one task vector")


def magmax(taus) -> TaskVector:
    """Per element, the τ_i with the largest |τ_i|; ties go to the later task."""
    _check(taus)
    out = {k: v.clone() for k, v in taus[0].items()}
    for tau in taus[1:]:
        for k, v in tau.items():
            out[k] = torch.where(v.abs() >= out[k].abs(), v, out[k])
    return out


def task_sum(taus) -> TaskVector:
    """Σ τ_i (task arithmetic before scaling)."""
    _check(taus)
    return {k: sum(tau[k] for tau in taus) for k in taus[0]}


def mean(taus) -> TaskVector:
    """(1/n) Σ τ_i (weight averaging)."""
    return {k: v / len(taus) for k, v in task_sum(taus).items()}


def _flatten(tau: TaskVector) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in tau.values()]) if tau else torch.zeros(0)


def _unflatten(flat: torch.Tensor, like: TaskVector) -> TaskVector:
    out, start = {}, 0
    for k, v in like.items():
        out[k] = flat[start:start + v.numel()].view_as(v).clone()
        start += v.numel()
    return out


def trim_top_k(flat: torch.Tensor, top_k: float) -> torch.Tensor:
    """Keep the int(d·k)+1 largest |values| (k = top_k %), ties at the threshold kept; zero the rest.

    The official `topk_values_mask` (TIES-merging repository) takes the (d − int(d·k))-th
    smallest magnitude as the threshold and keeps every entry at or above it, i.e. int(d·k)+1
    entries without ties; at k = 100 % (where the official code fails) everything is kept.
    """
    if not 0 < top_k <= 100:
        raise ValueError(f"ties: top_k must be a percentage in (0, 100], got {top_k!r}")
    d = flat.numel()
    smallest_kept = d - int(d * (top_k / 100))  # 1-based rank from the bottom, as the official code
    if d == 0 or smallest_kept < 1:
        return flat.clone()
    kth = flat.abs().kthvalue(smallest_kept).values
    return torch.where(flat.abs() >= kth, flat, torch.zeros_like(flat))


def elect_signs(trimmed: torch.Tensor) -> torch.Tensor:
    """Per element sign(Σ_i trimmed τ_i); a zero sum takes the majority (total-mass) sign."""
    signs = torch.sign(trimmed.sum(dim=0))
    majority = torch.sign(signs.sum())
    return torch.where(signs == 0, majority, signs)


def disjoint_mean(trimmed: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Mean over the tasks whose (non-zero) entry agrees with the elected sign; 0 if none."""
    agree = ((signs > 0) & (trimmed > 0)) | ((signs < 0) & (trimmed < 0))
    total = (trimmed * agree).sum(dim=0)
    return total / agree.sum(dim=0).clamp(min=1)


def ties(taus, top_k: float = 20.0) -> TaskVector:
    """TIES-merging (Yadav et al. 2023): trim each τ to its top-k %, elect signs, disjoint mean.

    Trimming ranks the magnitudes of the whole task vector (all tensors together), as the
    reference implementation does on the flattened state dict.
    """
    _check(taus)
    trimmed = torch.stack([trim_top_k(_flatten(tau), top_k) for tau in taus])
    return _unflatten(disjoint_mean(trimmed, elect_signs(trimmed)), taus[0])


# --- running forms ---------------------------------------------------------------------

class RunningMerger:
    """One τ at a time; `merged()` is the batch rule applied to every τ seen so far."""

    def __init__(self):
        self.n = 0

    def add(self, tau: TaskVector) -> None:
        """Fold in the next task vector."""
        raise NotImplementedError

    def merged(self) -> TaskVector:
        """The merge of every task vector added so far."""
        raise NotImplementedError

    def tensors(self):
        """Every tensor this merger stores (for memory accounting)."""
        raise NotImplementedError


class MagMaxMerger(RunningMerger):
    """Running max-|τ| (ties → later task): one stored vector, whatever the number of tasks."""

    def __init__(self):
        super().__init__()
        self.best: TaskVector = {}

    def add(self, tau):
        self.n += 1
        self.best = {k: v.clone() for k, v in tau.items()} if self.n == 1 else magmax([self.best, tau])

    def merged(self):
        return self.best

    def tensors(self):
        return list(self.best.values())


class SumMerger(RunningMerger):
    """Running Σ τ_i; `average=True` divides by the count (Avg), else task arithmetic's sum."""

    def __init__(self, average: bool):
        super().__init__()
        self.average = average
        self.total: TaskVector = {}

    def add(self, tau):
        self.n += 1
        self.total = {k: v.clone() for k, v in tau.items()} if self.n == 1 else task_sum([self.total, tau])

    def merged(self):
        return {k: v / self.n for k, v in self.total.items()} if self.average else self.total

    def tensors(self):
        return list(self.total.values())


class RandMixMerger(RunningMerger):
    """Per-element reservoir: the n-th τ replaces the kept entry with probability 1/n.

    By induction every τ_i is kept with probability 1/n, so the merge is uniform over the
    tasks (each element is τ_i of a uniformly random task i) in constant memory. Draws come from a
    seeded CPU generator.
    """

    def __init__(self, seed: int):
        super().__init__()
        self.generator = torch.Generator().manual_seed(int(seed))
        self.kept: TaskVector = {}

    def add(self, tau):
        self.n += 1
        if self.n == 1:
            self.kept = {k: v.clone() for k, v in tau.items()}
            return
        for k, v in tau.items():
            take = torch.rand(v.shape, generator=self.generator).to(v.device) < 1.0 / self.n
            self.kept[k] = torch.where(take, v, self.kept[k])

    def merged(self):
        return self.kept

    def tensors(self):
        return list(self.kept.values())


class TiesMerger(RunningMerger):
    """TIES needs every τ_i (trimming and the sign election see all of them): memory grows with T."""

    def __init__(self, top_k: float):
        super().__init__()
        if not 0 < float(top_k) <= 100:
            raise ValueError(f"ties: top_k must be a percentage in (0, 100], got {top_k!r}")
        self.top_k = float(top_k)
        self.taus: list = []

    def add(self, tau):
        self.n += 1
        self.taus.append({k: v.clone() for k, v in tau.items()})

    def merged(self):
        return ties(self.taus, self.top_k)

    def tensors(self):
        return [v for tau in self.taus for v in tau.values()]


class SignCounter:
    """Per-element counts of positive and negative entries over the task vectors seen.

    Sign-conflict fraction: among elements where at least two task vectors are non-zero,
    the fraction where both a positive and a negative entry occur. None with fewer than
    two such elements' worth of evidence (e.g. a single task vector). Constant memory.
    """

    def __init__(self):
        self.pos: dict = {}
        self.neg: dict = {}

    def add(self, tau: TaskVector) -> None:
        """Count the signs of one more task vector."""
        for k, v in tau.items():
            p, n = (v > 0).to(torch.int32), (v < 0).to(torch.int32)
            self.pos[k] = self.pos[k] + p if k in self.pos else p
            self.neg[k] = self.neg[k] + n if k in self.neg else n

    def conflict_fraction(self) -> float | None:
        """Fraction of multiply-moved elements whose non-zero signs disagree."""
        moved = conflicts = 0
        for k in self.pos:
            p, n = self.pos[k], self.neg[k]
            moved += int(((p + n) >= 2).sum())
            conflicts += int(((p > 0) & (n > 0)).sum())
        return conflicts / moved if moved else None

    def tensors(self):
        """Every tensor this counter stores."""
        return [*self.pos.values(), *self.neg.values()]

