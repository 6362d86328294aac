"""iCaRL (Rebuffi et al., CVPR 2017): herding exemplars, sigmoid/BCE distillation, nearest-mean-of-exemplars.

Avalanche 0.6's `training.supervised.ICaRL` builds its own `TrainEvalModel(feature_extractor,
classifier, NCMClassifier)` and trains that, but the harness must keep training (and checking) its
own model (`strategy.model`, regimes, frozen blocks). So `ICaRLStrategy` is a SupervisedTemplate over
the harness's model that keeps Avalanche's pieces and mathematics (`_ICaRLPlugin`, `ICaRLLossPlugin`,
`NCMClassifier`; the official code srebuffi/iCaRL, whose herding and loss Avalanche follows):

- memory: a fixed total of `mem_size` exemplars, `mem_size // k` per class once k classes are
  seen (mammoth's models/icarl.py split, which never exceeds the budget; Avalanche and the official
  code take the ceiling, which can). After each task each new class's exemplars are chosen by
  herding on the L2-normalised features of its training data (`_ICaRLPlugin.construct_exemplar_set`:
  the same loop, the same picks, in herding order), and the old classes keep the first of theirs
  (`reduce_exemplar_set`);
- training: the current task's data plus every exemplar, shuffled together (Avalanche's
  `after_train_dataset_adaptation`, as tensors: the harness's mixed minibatches); loss =
  `ICaRLLossPlugin`'s: BCE on the sigmoid of the single head's outputs of the classes seen so far
  (the harness's growing head, api/heads.py; mammoth's `outputs[:, :ac]`; Avalanche's with an
  IncrementalClassifier), targets one-hot except the columns of past tasks' classes, which take the
  sigmoid outputs of the model as it was after the previous task;
- evaluation: the nearest mean of exemplars (`methods.prototypes.NearestMeanClassifier`): after each
  task, every class's mean of the normalised exemplar features, normalised, with the current model
  (`_ICaRLPlugin.compute_class_means`), the logits of `NCMClassifier(normalize=True)`.

Departures, each for the harness's setting: the previous model runs in eval mode (mammoth's
`deepcopy(self.net.eval())`; Avalanche leaves its copy in train mode, whose BatchNorm outputs then
depend on the minibatch); class means are not averaged with horizontally flipped exemplars
(Avalanche and the official code do so for 4-D inputs; the harness trains without augmentation and
its data include digits, which flipping changes); a zero feature vector normalises to zero, not NaN.

Class-incremental only (`scenarios`): the loss needs one head over every class (in task-IL the past
classes' columns are the current task's); a task-IL protocol pairing it is refused at load.
"""
from __future__ import annotations

import copy

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.training.losses import ICaRLLossPlugin
from avalanche.training.templates import SupervisedTemplate

from ..api.contract import MemoryUse, MethodAdapter, Range, tag_tensors
from ..config.vocabulary import Scenario
from .prototypes import ClassMeans, features_of, head_index, nearest_mean_model, unit_mean
from .rehearsal import rows_of

HERDING_STEPS = 1000  # the official loop's cap on herding iterations (Avalanche's `i < 1000`)


@torch.no_grad()
def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """Indices of the `m` herding picks among `features` rows, in the order picked (official iCaRL, as
    Avalanche's `construct_exemplar_set`: a pick already taken moves the target without being added)."""
    D = F.normalize(features, dim=1).T
    mu = torch.mean(D, dim=1)
    w_t, selected, steps = mu, [], 0
    while len(selected) < m and steps < HERDING_STEPS:
        ind_max = int(torch.argmax(torch.mm(w_t.unsqueeze(0), D)))
        if ind_max not in selected:
            selected.append(ind_max)
        w_t = w_t + mu - D[:, ind_max]
        steps += 1
    return torch.tensor(selected, dtype=torch.long, device=features.device)


class ExemplarMemory:
    """Per class (in the order seen): its exemplars' `(x, task label)` rows, best herding rank first."""

    def __init__(self, memory_size: int):
        self.memory_size = int(memory_size)
        self.classes: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (head, label) -> (x, t)

    def per_class(self, n_classes: int) -> int:
        return self.memory_size // n_classes

    def add_task(self, model, x, y, t, batch_size: int) -> None:
        """Herd the new classes' exemplars (features of the model now), then shrink every class to its share."""
        new = [(task, label) for task in torch.unique(t).tolist() for label in torch.unique(y[t == task]).tolist()]
        m = self.per_class(len(self.classes) + len(new))
        feats = features_of(model, x, batch_size)
        for task, label in new:
            rows = torch.nonzero((t == task) & (y == label)).view(-1)
            pick = rows[herding(feats[rows], m)]
            self.classes[(head_index(model, task), label)] = (x[pick], t[pick])
        self.classes = {k: (cx[:m], ct[:m]) for k, (cx, ct) in self.classes.items()}

    def rows(self) -> tuple:
        """`(x, y, t)` of every exemplar, class after class."""
        if not self.classes:
            return ()
        xs, ys, ts = [], [], []
        for (_, label), (cx, ct) in self.classes.items():
            xs.append(cx)
            ys.append(torch.full((len(cx),), label, dtype=torch.long, device=cx.device))
            ts.append(ct)
        return torch.cat(xs), torch.cat(ys), torch.cat(ts)

    def __len__(self) -> int:
        return sum(len(cx) for cx, _ in self.classes.values())


def exemplar_means(model, memory: ExemplarMemory, batch_size: int) -> ClassMeans:
    """Every class's unit-norm mean of its exemplars' normalised features, with `model` now
    (`_ICaRLPlugin.compute_class_means` without the flip); a class without exemplars has none."""
    means = ClassMeans(len(model.heads), model.head_classes)
    for (head, label), (cx, _) in memory.classes.items():
        if len(cx):  # mem_size below the number of classes seen leaves a class without exemplars
            means.set(head, label, unit_mean(features_of(model, cx, batch_size)))
    return means


class DistillationLoss(ICaRLLossPlugin):
    """Avalanche's ICaRLLossPlugin (its `__call__` is the loss) over the columns of the classes seen so far,
    with the previous model run as the harness's model is (with each row's task label) and in eval mode.

    `columns`: the harness's criterion, whose `seen` (set by the harness before each task in class-IL: the
    growing head) bounds the columns; without one, every column (a fixed head, Avalanche's example).
    """

    harness_prefix_cache = False  # the previous model reads strategy.mb_x: raw inputs only

    def __init__(self, columns=None):
        super().__init__()
        self.columns = columns

    def __call__(self, logits, targets):
        seen = getattr(self.columns, "seen", None)
        return super().__call__(logits if seen is None else logits[:, :seen], targets)

    def before_forward(self, strategy, **kwargs):
        if self.old_model is not None:
            with torch.no_grad():
                self.old_logits = self.old_model(strategy.mb_x, strategy.mb_task_id)

    def after_training_exp(self, strategy, **kwargs):
        if self.old_model is None:
            self.old_model = copy.deepcopy(strategy.model).to(strategy.device)
            for p in self.old_model.parameters():
                p.requires_grad_(False)
        self.old_model.load_state_dict(strategy.model.state_dict())
        self.old_model.eval()
        self.old_classes += torch.unique(rows_of(strategy.experience.dataset)[1]).tolist()  # np.unique(targets)

    def tensors(self) -> tuple:
        if self.old_model is None:
            return ()
        return (*self.old_model.parameters(), *self.old_model.buffers())


class ICaRLStrategy(SupervisedTemplate):
    """iCaRL over the harness's model (see the module docstring)."""

    def __init__(self, *, mem_size: int, **kwargs):
        self.icarl_loss = DistillationLoss(columns=kwargs.get("criterion"))
        kwargs["criterion"] = self.icarl_loss
        kwargs["plugins"] = [*kwargs.get("plugins", ()), self.icarl_loss]
        super().__init__(**kwargs)
        self.memory = ExemplarMemory(mem_size)
        self.means: ClassMeans | None = None

    def train_dataset_adaptation(self, **kwargs):
        """The experience's data plus every exemplar (Avalanche's concatenation), tagged with its tensors."""
        from avalanche.benchmarks.utils import _make_taskaware_tensor_classification_dataset as tensor_dataset
        from avalanche.benchmarks.utils.utils import concat_datasets

        super().train_dataset_adaptation(**kwargs)
        current = rows_of(self.experience.dataset, device=self.device)
        memory = self.memory.rows()
        if memory:
            x, y, t = (v.cpu() for v in memory)
            stored = tensor_dataset(x, y, task_labels=t.tolist(), targets=y)
            self.adapted_dataset = concat_datasets([self.adapted_dataset, stored])
            current = tuple(torch.cat([c, m.to(c.device)]) for c, m in zip(current, memory))
        tag_tensors(self.adapted_dataset, *current)

    def _after_training_exp(self, **kwargs):
        """Exemplars of the new classes, the reduced memory and every class mean, before the plugins run."""
        model = self.model
        x, y, t = rows_of(self.experience.dataset, device=self.device)
        self.memory.add_task(model, x, y, t, self.eval_mb_size)
        self.means = exemplar_means(model, self.memory, self.eval_mb_size)
        super()._after_training_exp(**kwargs)

    def harness_eval_model(self):
        return None if self.means is None else nearest_mean_model(self.model, self.means)

    def harness_memory(self) -> MemoryUse:
        rows = self.memory.rows()
        means = self.means.tensors() if self.means is not None else ()
        return MemoryUse(samples=len(self.memory), tensors=(*rows, *means, *self.icarl_loss.tensors()))


def build_icarl(ctx, mem_size: int):
    """iCaRL on the harness's model: herding exemplars, BCE distillation, nearest mean of exemplars."""
    if ctx.scenario != Scenario.CLASS_IL:
        raise ValueError("icarl runs in class-il only (one head over every class); this run is task-il")
    return ICaRLStrategy(mem_size=int(mem_size), **ctx.strategy_kwargs())


ADAPTERS = (
    # mem_size: 200 exemplars on the embedded data (the replay buffer of the other rehearsal methods
    # here); the paper, DER and mammoth use 2000 on CIFAR-100. At least one exemplar per class once all
    # are seen is the protocol's to ensure (mem_size // classes_seen may reach 0).
    MethodAdapter("icarl", {"mem_size": 200}, build_icarl,
                  "iCaRL: herding exemplars, sigmoid distillation, nearest-mean-of-exemplars classifier",
                  "Rebuffi et al., CVPR 2017 (Avalanche ICaRL)", family="rehearsal",
                  hparam_ranges={"mem_size": Range(low=1)}, scenarios=(Scenario.CLASS_IL,)),
)
