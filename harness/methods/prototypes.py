"""Nearest-class-mean classification on the trained model's features (`ncm`), and the module that
evaluates it (shared with iCaRL's nearest-mean-of-exemplars classifier, methods/icarl.py).

`ncm` trains exactly as `naive` (sequential fine-tuning of what the regime trains, its head
included); after each task it computes, with the model of that time, the mean of the L2-normalised
training features of each of that task's classes, itself L2-normalised (Avalanche's
`training.plugins.update_ncm.compute_class_means` with `normalize=True`, as its
`CurrentDataNCMUpdate` feeds `models.NCMClassifier`; Mensink et al., TPAMI 2013; the prototype
classifier of SimpleCIL, Zhou et al., IJCV 2024, and FeCAM's Euclidean baseline). The model the
harness evaluates is a `NearestMeanClassifier`: it shares the trained blocks (no copy), and its logits
are the negative Euclidean distances between the normalised features and the stored means
(`NCMClassifier.forward`), -inf for a class that has no mean yet. Exemplar-free: it keeps the means
only (one vector per class seen).

Old means are never refreshed: the data of a past task is gone, so its means stay those of the model
that had just learnt it while the features drift under later training (the drift is what the method
measures). Under a frozen backbone (regime `head`, after the first task with first-task
pre-training) the features do not drift, and `ncm` is SimpleCIL's prototype classifier on them.
In task-IL the means are kept per task head (the task's own classes), and a task's logits compare
with those only; in class-IL every class seen is a candidate.

Deviation from Avalanche, on degenerate inputs only: a feature vector of zeros (a class mean of them) is
normalised to zeros (`F.normalize`), where Avalanche divides by its zero norm and gets NaN; on every
other row the two compute the same (tests/test_ncm.py). Dead features (a backbone whose ReLUs all went
to zero, as naive fine-tuning at a high learning rate can leave it) are then at distance 1 from every
mean, and the lowest known class wins: such runs score at chance, not at an artefact of NaN.
"""
from __future__ import annotations

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin

from ..api.contract import MemoryUse, MethodAdapter
from .rehearsal import rows_of


class ClassMeans:
    """Unit-norm class means per head: `means[h, c]` (zeros where none), `known[h, c]`."""

    def __init__(self, n_heads: int, head_classes: int):
        self.shape = (int(n_heads), int(head_classes))
        self.means: torch.Tensor | None = None  # allocated at the first write (the feature width is known then)
        self.known = torch.zeros(self.shape, dtype=torch.bool)

    def set(self, head: int, label: int, mean: torch.Tensor) -> None:
        if self.means is None:
            self.means = mean.new_zeros((*self.shape, mean.numel()))
            self.known = self.known.to(mean.device)
        self.means[head, label] = mean
        self.known[head, label] = True

    def tensors(self) -> tuple:
        return () if self.means is None else (self.means, self.known)


def head_index(model, task: int) -> int:
    """The head a task's rows use (CLNet: the single head in class-IL, one per task in task-IL)."""
    return 0 if len(model.heads) == 1 else int(task)


@torch.no_grad()
def features_of(model, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """`model.features` of every row of `x`, in batches, in eval mode (the model's mode restored)."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([model.features(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])
    finally:
        model.train(was_training)


def unit_mean(features: torch.Tensor) -> torch.Tensor:
    """Avalanche's normalised class mean: sum of the L2-normalised rows / their count, L2-normalised
    (zeros where every row is zero: dead features, e.g. a collapsed backbone, give a mean of zeros, no NaN)."""
    v = torch.sum(F.normalize(features, dim=1), dim=0) / len(features)
    return F.normalize(v, dim=0)


class NearestMeanClassifier(torch.nn.Module):
    """The evaluated model of a nearest-mean method: the trained model's blocks (shared, not copied),
    then `-‖f/‖f‖ − μ_c‖` for the classes of the sample's head (`NCMClassifier`'s logits), -inf for a
    class without a mean. Same interface as CLNet: `forward(x, task_labels)`, `features(x)`, `blocks`."""

    def __init__(self, model, means: torch.Tensor, known: torch.Tensor):
        super().__init__()
        self.blocks = model.blocks  # the trained modules themselves (update norms read them here)
        object.__setattr__(self, "net", model)  # not a submodule: no second name for the same weights
        self.register_buffer("means", means)  # (heads, classes, width)
        self.register_buffer("known", known)
        self.training = model.training

    def train(self, mode: bool = True):
        """The trained model's own train(): CLNet keeps the blocks a regime froze in eval mode."""
        self.training = mode
        self.net.train(mode)
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.features(x)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        f = F.normalize(self.features(x), dim=1)
        n_heads, n_classes, width = self.means.shape
        if n_heads == 1 or isinstance(task_labels, int):
            h = 0 if n_heads == 1 else int(task_labels)
            logits = -torch.cdist(self.means[h].to(f.dtype), f).T  # NCMClassifier's orientation
            return logits.masked_fill(~self.known[h], float("-inf"))
        heads = torch.as_tensor(task_labels, device=f.device).long().view(-1)
        dist = torch.cdist(self.means.reshape(n_heads * n_classes, width).to(f.dtype), f).T
        rows = torch.arange(len(f), device=f.device)
        logits = -dist.view(len(f), n_heads, n_classes)[rows, heads]
        return logits.masked_fill(~self.known[heads], float("-inf"))


def nearest_mean_model(model, means: ClassMeans):
    """The NearestMeanClassifier over `means`, or None (the model itself is evaluated) before any mean."""
    if means.means is None:
        return None
    return NearestMeanClassifier(model, means.means, means.known)


class NCMPlugin(SupervisedPlugin):
    """After each task: the unit-norm mean of the normalised training features of each of its classes,
    with the model of that time; the harness evaluates the nearest stored mean (EvalModelHook)."""

    def __init__(self):
        super().__init__()
        self.model, self.means = None, None

    @torch.no_grad()
    def after_training_exp(self, strategy, **kwargs):
        model = self.model = strategy.model
        if self.means is None:
            self.means = ClassMeans(len(model.heads), model.head_classes)
        x, y, t = rows_of(strategy.experience.dataset, device=strategy.device)
        feats = features_of(model, x, strategy.eval_mb_size)
        for task in torch.unique(t).tolist():
            for label in torch.unique(y[t == task]).tolist():
                rows = (t == task) & (y == label)
                self.means.set(head_index(model, task), int(label), unit_mean(feats[rows]))

    def harness_eval_model(self):
        return None if self.means is None else nearest_mean_model(self.model, self.means)

    def harness_memory(self) -> MemoryUse:
        return MemoryUse(samples=0, tensors=() if self.means is None else self.means.tensors())


def build_ncm(ctx):
    """Sequential fine-tuning (Avalanche Naive); evaluated by the nearest class mean of each task's data."""
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs(NCMPlugin()))


ADAPTERS = (
    MethodAdapter("ncm", {}, build_ncm,
                  "Nearest class mean on the trained features (exemplar-free; means of each task's training "
                  "data with the model of that time, never refreshed)",
                  "Mensink et al., TPAMI 2013 (NCM); Zhou et al., IJCV 2024 (SimpleCIL); Avalanche NCMClassifier",
                  family="prototype"),
)
