"""SLCA: Slow Learner with Classifier Alignment (Zhang et al., ICCV 2023), class-IL.

Follows the official code (github.com/GengDavid/SLCA, commit 169d4e6, models/slca.py and models/base.py):

- Slow learner (stage 1, `_stage1_training`): sequential fine-tuning with two parameter groups, the backbone's
  trainable parameters at `bcb_lrscale` × the head's learning rate (official 0.01: lr 0.01 for the head and
  1e-4 for the backbone). Here the head's learning rate is the protocol's `training.lr` and the backbone's is
  `bcb_lrscale` × it, in the protocol's optimizer (ctx's kind: SGD / Adam / AdamW, its momentum and weight decay;
  the official code: SGD, momentum 0.9, weight decay 5e-4 on both groups, batch 128, 20 epochs on CIFAR-100: the
  protocol's settings). "Backbone" is what the run's regime trains (last-k blocks, every block, or the LoRA
  adapters), so SLCA runs under the depth regimes last-k and full and under LoRA; `head` (no trainable backbone:
  no slow learner) is refused. The loss is the cross-entropy over the current task's classes only
  (`logits[:, known:]`, targets shifted, as the official code), and the previous tasks' head rows stay as they
  were (the official code freezes old heads: `update_fc(freeze_old=True)`; here the rows outside the task are
  restored after every optimizer step, so neither weight decay nor momentum moves them). A task's head rows start
  from the official initialisation (truncated normal, std 0.02; zero bias). The official MultiStepLR (×0.1 at
  epoch 18 of 20 on CIFAR-100, 40 of 50 on ImageNet-R) is `lr_decay_at` (a fraction of the task's epochs, the
  milestone epoch is ceil(fraction × epochs); 1.0 switches it off) and `lr_decay`.
- Class statistics (`_compute_class_mean`, after each task, with the model of that time, eval mode, the task's
  training data without augmentation): each class's feature mean (kept in float64, as the official numpy array)
  and covariance `torch.cov` in float64 + `cov_eps`·I (official 1e-4), kept in float32 as the official tensor.
  Old statistics are never refreshed.
- Classifier alignment (`_stage2_compact_classifier`, from the second task on, when `ca_epochs` > 0): a copy of the
  head is trained for `ca_epochs` epochs on features sampled from each seen class's Gaussian
  (`MultivariateNormal(mean·(0.9 + 0.1·(t+1)/(T+1)), cov)` for a class of task t after task T: the official mean
  scaling), `ca_samples_per_class` per class per epoch (official 256), shuffled, in batches of that size (one per
  class), with the logits divided by the mean of their per-task L2 norms and by `ca_logit_norm` (official 0.1;
  0 switches it off), cross-entropy over the seen classes, a cosine schedule over the epochs (T_max = ca_epochs),
  at learning rate `ca_lr` (None: the protocol's lr, the official code's `lrate`) in the protocol's optimizer
  (the official: the same SGD settings as stage 1). The harness evaluates the aligned head; training continues
  from the head as stage 1 left it (the official code backs the head up before the alignment and restores it in
  `after_task`). The sampling draws from torch's global generators forked and seeded with (run seed, task), so a
  run is reproducible and the training's random stream is not moved by the alignment.

Deviations: the protocol's optimizer, learning rate, batch size and epochs replace the official SGD/0.01/128/20
(the ratio of the two learning rates is kept: `bcb_lrscale`); the classifier is the harness's one growing
class-IL head (the official code grows one Linear per task and concatenates them: the same function; head rows of
classes not seen yet are neither trained nor evaluated). Class-IL only (the alignment calibrates old against new
classes of one head; task-IL has no such bias). Not implemented: SLCA++ (symmetric cross-entropy, head scaling,
its LoRA backbone; models/slca_pp.py); the official repository has no storage-efficient variant of the statistics.

What it keeps between tasks (harness_memory): the class means (float64, classes × width) and covariances
(float32, classes × width × width), as the official code keeps them, and the aligned head.
Compute: the statistics' feature passes are backbone passes the harness counts; the alignment's head-only passes
on sampled features do not pass through the model, so they are in the diagnostics, per task: `slca_ca_steps`
(optimizer steps), `slca_ca_rows` (sampled rows, each one forward and one backward head pass) and `slca_ca_flops`
(4·width·head outputs per row: the forward matmul and the weight gradient; the inputs need no gradient).
"""
from __future__ import annotations

import copy
import math

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from torch.distributions.multivariate_normal import MultivariateNormal

from ..api.contract import MemoryUse, MethodAdapter, Range, make_optimizer
from ..config.vocabulary import Family, Scenario, parse_regime
from .prototypes import features_of
from .rehearsal import rows_of

CA_STREAM = 53  # seed offset of the alignment's sampling
HEAD_INIT_STD = 0.02  # the official head initialisation (trunc_normal_, std 0.02; zero bias)
MEAN_SHRINK, MEAN_DECAY = 0.9, 0.1  # the official sampled mean: mean * (0.9 + 0.1 * (t + 1) / (T + 1))


def refused_regime(regime: str) -> str | None:
    """Why SLCA does not run under `regime` (None: it does): a slow learner needs a trainable backbone."""
    if parse_regime(regime).depth == 0:
        return ("slca's slow learner trains the backbone at a small learning rate: regime 'head' trains no "
                "backbone; allowed: last-k, full, lora-rR")
    return None


def class_statistics(features: torch.Tensor, cov_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, covariance + cov_eps·I) of one class's features (the official `_compute_class_mean`): the mean of the
    float32 features kept in float64 (the official numpy array), the covariance computed in float64 and kept in
    float32 (the official `_class_covs` is a float32 tensor)."""
    mean = features.float().mean(0).double()
    cov = torch.cov(features.double().T) + torch.eye(features.shape[1], dtype=torch.float64,
                                                     device=features.device) * cov_eps
    return mean, cov.float()


def sampled_features(means, covs, task_size: int, cur_task: int, per_class: int, device):
    """One epoch's shuffled samples: `per_class` rows from each class's Gaussian (the official mean scaling)."""
    data, labels = [], []
    for c in range(len(means)):
        decay = (c // task_size + 1) / (cur_task + 1) * MEAN_DECAY
        mean = means[c].to(device) * (MEAN_SHRINK + decay)
        m = MultivariateNormal(mean.float(), covs[c].to(device).float())
        data.append(m.sample(sample_shape=(per_class,)))
        labels.extend([c] * per_class)
    inputs = torch.cat(data, dim=0).float().to(device)
    targets = torch.tensor(labels).long().to(device)
    order = torch.randperm(inputs.size(0))  # on the CPU generator, as the official code
    return inputs[order.to(device)], targets[order.to(device)]


def current_task_loss(logits: torch.Tensor, y: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Stage 1's cross-entropy over the current task's columns lo..hi-1 (targets shifted; others ignored)."""
    targets = torch.where(y - lo >= 0, y - lo, -100)
    return F.cross_entropy(logits[:, lo:hi], targets)


def alignment_loss(logits: torch.Tensor, targets: torch.Tensor, task_sizes: list, logit_norm: float | None):
    """Cross-entropy over the seen classes, the logits divided by their mean per-task L2 norm and `logit_norm`."""
    seen = sum(task_sizes)
    if not logit_norm:
        return F.cross_entropy(logits[:, :seen], targets)
    norms, start = [], 0
    for size in task_sizes:
        norms.append(torch.norm(logits[:, start:start + size], p=2, dim=-1, keepdim=True) + 1e-7)
        start += size
    norms = torch.cat(norms, dim=-1).mean(dim=-1, keepdim=True)
    return F.cross_entropy(torch.div(logits[:, :seen], norms) / logit_norm, targets)


def align_classifier(head: torch.nn.Linear, means, covs, task_sizes: list, epochs: int, per_class: int,
                     logit_norm: float | None, new_optimizer) -> int:
    """Train `head` in place on sampled class features (official `_stage2_compact_classifier`); returns its steps."""
    params = list(head.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = new_optimizer(params)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer=optimizer, T_max=epochs)
    device, n_classes, steps = params[0].device, len(means), 0
    for _ in range(epochs):
        inputs, targets = sampled_features(means, covs, task_sizes[-1], len(task_sizes) - 1, per_class, device)
        for it in range(n_classes):
            rows = slice(it * per_class, (it + 1) * per_class)
            loss = alignment_loss(head(inputs[rows]), targets[rows], task_sizes, logit_norm)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        scheduler.step()
    return steps


class AlignedModel(torch.nn.Module):
    """The trained model's blocks (shared, not copied) with the aligned head: what the harness evaluates."""

    def __init__(self, model, head: torch.nn.Linear):
        super().__init__()
        self.blocks = model.blocks
        object.__setattr__(self, "net", model)  # not a submodule: no second name for the same weights
        self.heads = torch.nn.ModuleList([head])
        self.head_classes = model.head_classes
        self.training = model.training

    def train(self, mode: bool = True):
        """The trained model's own train(): CLNet keeps the blocks a regime froze in eval mode."""
        self.training = mode
        self.net.train(mode)
        self.heads.train(mode)
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.features(x)

    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        return self.heads[0](self.features(x))


class SLCAPlugin(SupervisedPlugin):
    """Two learning rates, the current task's head rows only, then class statistics and classifier alignment."""

    def __init__(self, training, bcb_lrscale: float, lr_decay_at: float, lr_decay: float, ca_epochs: int,
                 ca_samples_per_class: int, ca_logit_norm: float | None, ca_lr: float | None, cov_eps: float,
                 classes_per_task: int, seed: int):
        super().__init__()
        self.training, self.bcb_lrscale = training, float(bcb_lrscale)
        self.lr_decay_at, self.lr_decay = float(lr_decay_at), float(lr_decay)
        self.ca_epochs, self.per_class = int(ca_epochs), int(ca_samples_per_class)
        self.logit_norm = float(ca_logit_norm) if ca_logit_norm else None
        self.ca_lr = training.lr if ca_lr is None else float(ca_lr)
        self.cov_eps, self.cpt, self.seed = float(cov_eps), int(classes_per_task), int(seed)
        self.means: torch.Tensor | None = None  # (classes seen, width) float64
        self.covs: torch.Tensor | None = None  # (classes seen, width, width) float32
        self.task_sizes: list = []
        self.model, self.aligned = None, None
        self.columns = (0, 0)  # the current task's head columns
        self.head_start: tuple | None = None  # the head as the task started (its other rows are kept so)
        self.ca_steps: list = []
        self.ca_rows: list = []
        self.ca_flops: list = []

    # -- stage 1: the slow learner ---------------------------------------------------------
    def before_training_exp(self, strategy, **kwargs):
        task = strategy.experience.current_experience
        self.columns = (task * self.cpt, (task + 1) * self.cpt)
        head = strategy.model.heads[0]
        with torch.no_grad():
            lo, hi = self.columns
            torch.nn.init.trunc_normal_(head.weight[lo:hi], std=HEAD_INIT_STD)
            head.bias[lo:hi] = 0.0
        self.head_start = (head.weight.detach().clone(), head.bias.detach().clone())
        split_groups(strategy.optimizer, strategy.model, self.training.lr, self.bcb_lrscale)

    def before_training_epoch(self, strategy, **kwargs):
        milestone = math.ceil(self.lr_decay_at * strategy.train_epochs - 1e-9)
        scale = self.lr_decay if strategy.clock.train_exp_epochs >= milestone else 1.0
        backbone, head = strategy.optimizer.param_groups
        backbone["lr"] = self.training.lr * self.bcb_lrscale * scale
        head["lr"] = self.training.lr * scale

    @torch.no_grad()
    def keep_other_rows(self, model) -> None:
        """Put back the head rows outside the current task (old heads frozen, future ones not created yet)."""
        head, (w, b), (lo, hi) = model.heads[0], self.head_start, self.columns
        keep = torch.ones(len(b), dtype=torch.bool, device=b.device)
        keep[lo:hi] = False
        head.weight[keep] = w[keep]
        head.bias[keep] = b[keep]

    # -- after the task: statistics, then the alignment ---------------------------------------
    @torch.no_grad()
    def after_training_exp(self, strategy, **kwargs):
        self.head_start = None
        model = self.model = strategy.model
        x, y, _ = rows_of(strategy.experience.dataset, device=strategy.device)
        feats = features_of(model, x, strategy.eval_mb_size)
        lo, hi = self.columns
        stats = [class_statistics(feats[y == c], self.cov_eps) for c in range(lo, hi)]
        means, covs = torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats])
        self.means = means if self.means is None else torch.cat([self.means, means])
        self.covs = covs if self.covs is None else torch.cat([self.covs, covs])
        self.task_sizes.append(hi - lo)
        task = len(self.task_sizes) - 1
        steps = 0
        if task > 0 and self.ca_epochs > 0:
            with torch.enable_grad():
                steps = self.align(model, task)
        else:
            self.aligned = None
        head = model.heads[0]
        self.ca_steps.append(steps)
        self.ca_rows.append(steps * self.per_class)
        self.ca_flops.append(4 * head.in_features * head.out_features * steps * self.per_class)

    def align(self, model, task: int) -> int:
        """The aligned copy of the head (the model's own head is left as stage 1 left it)."""
        head = copy.deepcopy(model.heads[0])
        devices = [head.weight.device] if head.weight.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 1_000_003 + CA_STREAM * (task + 1))
            steps = align_classifier(head, self.means, self.covs, self.task_sizes, self.ca_epochs, self.per_class,
                                     self.logit_norm,
                                     lambda params: make_optimizer(self.training, params, lr=self.ca_lr))
        head.eval()
        for p in head.parameters():
            p.requires_grad_(False)
        self.aligned = head
        return steps

    # -- the harness's hooks ------------------------------------------------------------------
    def harness_eval_model(self):
        """The trained blocks with the aligned head (None before the first alignment: the model itself)."""
        return None if self.aligned is None else AlignedModel(self.model, self.aligned)

    def harness_diagnostics(self) -> dict:
        return {"slca_ca_steps": list(self.ca_steps), "slca_ca_rows": list(self.ca_rows),
                "slca_ca_flops": list(self.ca_flops)}

    def harness_memory(self) -> MemoryUse:
        """The class means and covariances, and the aligned head."""
        kept = [t for t in (self.means, self.covs) if t is not None]
        if self.aligned is not None:
            kept += list(self.aligned.parameters())
        return MemoryUse(samples=0, tensors=tuple(kept))


def split_groups(optimizer, model, lr: float, bcb_lrscale: float) -> None:
    """The optimizer's one group of trainable parameters as two: the backbone's (lr·bcb_lrscale), the heads' (lr)."""
    group = optimizer.param_groups[0]
    del optimizer.param_groups[1:]
    head_ids = {id(p) for p in model.heads.parameters()}
    params = group["params"]
    group["params"] = [p for p in params if id(p) not in head_ids]
    group["lr"] = lr * bcb_lrscale
    optimizer.add_param_group({"params": [p for p in params if id(p) in head_ids], "lr": lr})


def build_slca(ctx, bcb_lrscale: float, lr_decay_at: float, lr_decay: float, ca_epochs: int,
               ca_samples_per_class: int, ca_logit_norm, ca_lr, cov_eps: float):
    """SLCA: the slow learner (two learning rates, current-task cross-entropy), then classifier alignment."""
    from avalanche.training.supervised import Naive

    if ctx.scenario == Scenario.TASK_IL:
        raise ValueError("slca aligns the classifier of one head over every class: it runs in class-IL only "
                         "(protocol scenario: class-il), this run is task-il")
    refusal = refused_regime(ctx.regime)
    if refusal:
        raise ValueError(refusal)
    cpt = ctx.model.head_classes // ctx.n_tasks
    plugin = SLCAPlugin(ctx.training, bcb_lrscale, lr_decay_at, lr_decay, ca_epochs, ca_samples_per_class,
                        ca_logit_norm, ca_lr, cov_eps, cpt, ctx.seed)

    class SLCAStrategy(Naive):
        """Cross-entropy over the current task's classes; the other head rows kept after each step."""

        def criterion(self):
            return current_task_loss(self.mb_output, self.mb_y, *plugin.columns)

        def optimizer_step(self):
            super().optimizer_step()
            plugin.keep_other_rows(self.model)

    return SLCAStrategy(**ctx.strategy_kwargs(plugin))


ADAPTERS = (
    # Official defaults (exps/slca/slca_cifar.json and models/slca.py): bcb_lrscale 0.01, ca_epochs 5,
    # 256 samples per class, logit normalisation 0.1, the stage-1 learning rate for the alignment, covariance
    # + 1e-4·I, ×0.1 at epoch 18 of 20 (CIFAR-100; 40 of 50 elsewhere: lr_decay_at 0.8).
    MethodAdapter("slca", {"bcb_lrscale": 0.01, "lr_decay_at": 0.9, "lr_decay": 0.1, "ca_epochs": 5,
                           "ca_samples_per_class": 256, "ca_logit_norm": 0.1, "ca_lr": None, "cov_eps": 1e-4},
                  build_slca,
                  "SLCA: slow learner (backbone lr = bcb_lrscale x head lr, current-task cross-entropy), then "
                  "classifier alignment on features sampled from per-class Gaussians after each task (class-IL)",
                  "Zhang et al., ICCV 2023 (SLCA); github.com/GengDavid/SLCA", family="slow-learner",
                  regimes_allowed=refused_regime,
                  hparam_types={"ca_lr": (float, None), "ca_logit_norm": (float, None)},
                  hparam_ranges={"bcb_lrscale": Range(low=0), "lr_decay_at": Range(low=0, high=1),
                                 "lr_decay": Range(low=0, low_open=True), "ca_epochs": Range(low=0),
                                 "ca_samples_per_class": Range(low=1), "ca_logit_norm": Range(low=0),
                                 "ca_lr": Range(low=0, low_open=True), "cov_eps": Range(low=0)},
                  captions={"slca_ca_steps": "SLCA classifier-alignment optimizer steps (head only), per task",
                            "slca_ca_rows": "SLCA sampled feature rows the head trained on, per task"},
                  regime_families=(Family.DEPTH, Family.LORA),
                  regime_note=("a slow learner trains the backbone's blocks or LoRA adapters at a small learning rate "
                               "(regime head, no backbone, is refused too)"),
                  scenarios=(Scenario.CLASS_IL,)),
)
