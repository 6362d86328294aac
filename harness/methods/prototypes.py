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

from copy import deepcopy

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from avalanche.training.templates import SupervisedTemplate

from ..api.contract import TRAINING_STAGE_ATTRIBUTE, MemoryUse, MethodAdapter
from ..api.prompts import token_blocks
from ..config.vocabulary import FULL, HEAD, Family, Scenario, parse_regime
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


NCM = MethodAdapter("ncm", {}, build_ncm,
                  "Nearest class mean on the trained features (exemplar-free; means of each task's training "
                  "data with the model of that time, never refreshed)",
                  "Mensink et al., TPAMI 2013 (NCM); Zhou et al., IJCV 2024 (SimpleCIL); Avalanche NCMClassifier",
                  family="prototype")


# -- SimpleCIL and APER: cosine prototypes on frozen features ---------------------------------------
# The regimes of the frozen-feature methods: the PEFT families, trained on task 1 only (a first-session
# adaptation); `head` trains no backbone parameter.
PEFT_FAMILIES = (Family.BITFIT, Family.NORM, Family.LORA, Family.PROMPT, Family.PROMPT_DEEP)
PEFT_WORDS = ", ".join(PEFT_FAMILIES)


def simplecil_regimes(regime: str) -> str | None:
    """SimpleCIL never trains its backbone: `head` only."""
    if regime == HEAD:
        return None
    return "SimpleCIL never trains the pretrained backbone (its prototypes are the frozen model's); allowed: head"


def aper_regimes(regime: str) -> str | None:
    """APER adapts in task 1 under a PEFT family or fully (APER-Finetune); `head` and `last-k` are refused."""
    parsed = parse_regime(regime)
    if parsed.family in PEFT_FAMILIES or regime == FULL:
        return None
    if regime == HEAD:
        return ("under head its adapted branch would equal the pretrained one (that is simplecil); allowed: "
                f"a PEFT first session ({PEFT_WORDS}, with or without last-k:) or full (APER-Finetune)")
    return (f"the official code adapts a PEFT module or the full network in task 1; allowed: {PEFT_WORDS} "
            "(with or without last-k:) or full (APER-Finetune)")


def adapts_first_session(ctx) -> bool:
    """Whether task 1 takes SGD steps: under a regime that trains a backbone part (a first-session adaptation)
    or under first-task pre-training (task 1 is the harness's pre-training of the full network)."""
    return ctx.pretrain.first_task or ctx.regime != HEAD


class CosinePrototypes:
    """SimpleCIL's classifier (official models/simplecil.py `replace_fc` + convs/linears.py `CosineLinear`): the
    prototype of a class is the plain mean of its training features, set once when its task arrives; logits are
    the cosine of the feature with each prototype (`F.normalize` of both, sigma 1), -inf for a class not seen yet."""

    def __init__(self, n_classes: int):
        self.n_classes = int(n_classes)
        self.protos: torch.Tensor | None = None  # (classes, width), float32; zeros where unknown
        self.known = torch.zeros(self.n_classes, dtype=torch.bool)

    def learn(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Set the prototype of every class in `labels` to the mean of its rows of `features`."""
        features = features.float()
        if self.protos is None:
            self.protos = features.new_zeros(self.n_classes, features.shape[1])
            self.known = self.known.to(features.device)
        for label in torch.unique(labels).tolist():
            self.protos[label] = features[labels == label].mean(0)
            self.known[label] = True

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        out = F.linear(F.normalize(features.float(), p=2, dim=1), F.normalize(self.protos, p=2, dim=1))
        return out.masked_fill(~self.known, float("-inf"))

    def state(self) -> dict:
        """`prototypes.class_means`: the prototypes of the classes seen so far (class-IL: a prefix of the order)."""
        return {} if self.protos is None else {"prototypes.class_means": self.protos[self.known].detach()}

    def tensors(self) -> tuple:
        return () if self.protos is None else (self.protos, self.known)


class FeatureClassifier(torch.nn.Module):
    """The evaluated model of a frozen-feature method: the method's features of x (the trained model's, or APER's
    concatenation with the pretrained model's), then its classifier. Shares the trained model's blocks (update
    norms read them here); same interface as CLNet: `forward(x, task_labels)`, `features(x)`, `blocks`."""

    def __init__(self, model, features, classifier):
        super().__init__()
        self.blocks = model.blocks
        object.__setattr__(self, "net", model)  # not a submodule: no second name for the same weights
        object.__setattr__(self, "_features", features)
        object.__setattr__(self, "classifier", classifier)
        self.training = model.training

    def train(self, mode: bool = True):
        """The trained model's own train(): CLNet keeps the blocks a regime froze in eval mode."""
        self.training = mode
        self.net.train(mode)
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._features(x)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        return self.classifier.logits(self._features(x))


class FrozenFeatureStrategy(SupervisedTemplate):
    """Task 1 trains what the regime trains (a first-session adaptation) when `adapt_first`; then every task's
    training data passes once through the frozen features (eval mode, no gradient), in the harness's
    minibatches, and the method's classifier learns from them in closed form. No SGD step after task 1.

    The feature pass is a training epoch of its own stage ("features"): the plugins see each minibatch as a
    training iteration (before/after_training_iteration), the record's budget counts it as one epoch and no
    optimizer step, and the compute meter counts its forward passes."""

    FEATURES = "features"
    ADAPT = "adapt"

    def __init__(self, *, classifier, features, adapt_first: bool, **kwargs):
        super().__init__(**kwargs)
        self.classifier = classifier
        self.method_features = features  # (model, x) -> the method's features of x
        self.adapt_first = bool(adapt_first)
        self.tasks_done = 0
        self.pretrained_branch = None  # APER's frozen copy of the pretrained model (kept: its memory counts)
        setattr(self, TRAINING_STAGE_ATTRIBUTE, None)

    def _train_exp(self, experience, eval_streams=None, **kwargs):
        if self.adapt_first and self.tasks_done == 0:
            setattr(self, TRAINING_STAGE_ATTRIBUTE, self.ADAPT)
            super()._train_exp(experience, eval_streams, **kwargs)
        setattr(self, TRAINING_STAGE_ATTRIBUTE, self.FEATURES)
        self._before_training_epoch(**kwargs)
        self.feature_epoch(**kwargs)
        self._after_training_epoch(**kwargs)
        self.tasks_done += 1

    def feature_epoch(self, **kwargs) -> None:
        """One pass over the task's training data: features in eval mode, then the classifier's closed form."""
        feats, labels = [], []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for batch in self.dataloader:
                    self.mbatch = batch
                    self._unpack_minibatch()
                    self._before_training_iteration(**kwargs)
                    feats.append(self.method_features(self.model, self.mb_x).float())
                    labels.append(self.mb_y)
                    self._after_training_iteration(**kwargs)
        finally:
            self.model.train(was_training)
        self.classifier.learn(torch.cat(feats), torch.cat(labels).long())

    def harness_eval_model(self):
        """The method's classifier on its features (None before any task: the model itself)."""
        if self.tasks_done == 0:
            return None
        model = self.model
        return FeatureClassifier(model, lambda x: self.method_features(model, x), self.classifier)

    def harness_memory(self) -> MemoryUse:
        """The classifier's tensors and, for APER, the pretrained branch kept beside the trained model."""
        branch = self.pretrained_branch
        kept = () if branch is None else (*branch.parameters(), *branch.buffers())
        return MemoryUse(samples=0, tensors=(*self.classifier.tensors(), *kept))

    def harness_state(self) -> dict:
        """The classifier's class-row tensors (`prototypes.<name>`), for update norms and drift."""
        return self.classifier.state()

    def harness_diagnostics(self) -> dict:
        return getattr(self.classifier, "diagnostics", dict)()


def model_features(model, x: torch.Tensor) -> torch.Tensor:
    """The trained model's own features (SimpleCIL, RanPAC)."""
    return model.features(x)


def pretrained_copy(model):
    """A frozen copy of the model as it is now (before any training), without the regime's added prompts: the
    pretrained branch of APER (the official `construct_dual_branch_network` builds the backbone again without
    its VPT/SSF/adapter). LoRA adapters start at B = 0, so they leave it the pretrained model."""
    copy = deepcopy(model)
    for block in token_blocks(copy).values():
        block.prompt = None
    for p in copy.parameters():
        p.requires_grad_(False)
    return copy.eval()


def class_il_only(ctx, name: str) -> None:
    if len(ctx.model.heads) != 1:
        raise ValueError(f"{name} is defined in class-IL only (one classifier over every class)")


def build_simplecil(ctx):
    """Prototypes (class means of the frozen backbone's features) with a cosine classifier; no gradient step."""
    class_il_only(ctx, "simplecil")
    return FrozenFeatureStrategy(classifier=CosinePrototypes(ctx.model.head_classes), features=model_features,
                                 adapt_first=adapts_first_session(ctx), **ctx.strategy_kwargs())


def build_aper(ctx):
    """Task 1 adapts (the regime's PEFT parameters and the head); then prototypes on [pretrained, adapted] features."""
    class_il_only(ctx, "aper")
    if ctx.pretrain.first_task:
        # No pretrained weights: task 1 trains the whole model (APER-Finetune's adaptation), and the model the
        # protocol pretrains is that same task-1 model, so both branches are it. [f, f] has the cosine similarities
        # of f: APER is SimpleCIL on the task-1 model, run as that (no copy of an initial model of random weights).
        return FrozenFeatureStrategy(classifier=CosinePrototypes(ctx.model.head_classes), features=model_features,
                                     adapt_first=True, **ctx.strategy_kwargs())
    pretrained = pretrained_copy(ctx.model)

    def features(model, x):
        return torch.cat((pretrained.features(x), model.features(x)), dim=1)

    strategy = FrozenFeatureStrategy(classifier=CosinePrototypes(ctx.model.head_classes), features=features,
                                     adapt_first=adapts_first_session(ctx), **ctx.strategy_kwargs())
    strategy.pretrained_branch = pretrained
    return strategy


FROZEN_NOTE = "a prototype method on a frozen backbone (optionally a first-session PEFT adaptation)"
SIMPLECIL = MethodAdapter(
    "simplecil", {}, build_simplecil,
    "SimpleCIL: class prototypes (feature means) of the frozen pretrained model, cosine classifier; no training",
    "Zhou et al., IJCV 2024 (Revisiting class-incremental learning with pre-trained models: generalizability and "
    "adaptivity are all you need); github.com/zhoudw-zdw/RevisitingCIL models/simplecil.py",
    family="prototype", regime_families=(Family.DEPTH,), regime_note="SimpleCIL never trains the backbone",
    scenarios=(Scenario.CLASS_IL,), regimes_allowed=simplecil_regimes)
APER = MethodAdapter(
    "aper", {}, build_aper,
    "APER: task 1 adapts the pretrained model (the regime's PEFT parameters or full); then SimpleCIL's cosine "
    "prototypes on the concatenated pretrained and adapted features",
    "Zhou et al., IJCV 2024 (APER, formerly ADAM); github.com/zhoudw-zdw/RevisitingCIL models/aper_*.py",
    family="prototype", regime_families=(Family.DEPTH, *PEFT_FAMILIES), regime_note=FROZEN_NOTE,
    scenarios=(Scenario.CLASS_IL,), regimes_allowed=aper_regimes)
ADAPTERS = (NCM, SIMPLECIL, APER)
