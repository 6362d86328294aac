"""BiC, Bias Correction (Wu et al., "Large Scale Incremental Learning", CVPR 2019).

Stage 1 trains on the task's data plus a rehearsal memory, with a distillation loss on the old
classes' logits (temperature T, soft targets from the previous model, whose newest classes are
bias-corrected from the third task on); loss = (1 - λ)·CE + λ·distillation with λ = n_old / n_all.
Stage 2 (from the second task on) freezes the model and trains a bias layer — α·z + β on the
newest classes' logits — on a class-balanced validation memory held out of the data, with the
cross-entropy over the seen classes' logits only (the official code's `all_cl = range((itera+1)*nb_cl)`,
mammoth's `tout[:, :end_last_task]`; the harness's class-IL head is a growing one, harness/api/heads.py,
whose columns of classes still to come are neither trained nor predicted); the evaluated model
applies it. Stage 1's cross-entropy is the run's criterion (ctx.criterion: the seen columns).

Why not Avalanche 0.6's `BiCPlugin` (training/plugins/bic.py, after FACIL's bic.py) as it is: it
asserts a model that is not a `MultiTaskModule` (the harness's CLNet is one, with a single head in
class-IL), calls the old model without task labels (CLNet then returns a dict of heads), draws
memory batches through `ReplayDataLoader` over per-sample datasets (slower than the training on the
small embedded data), and applies the bias layer in `after_eval_forward`, which the harness's own
evaluator never calls. This plugin keeps its mathematics, tested against it on identical tensors
(tests/test_bic.py):

- the memories: an `ExperienceBalancedBuffer` for stage 1 (`BalancedReservoir`, methods/rehearsal.py)
  over the task's training rows after the validation rows left them, and per class a reservoir of
  validation rows (the class's first rows in the task's data; Avalanche's `val_buffer`), sharing the
  validation memory over every class seen (`ClassBalancedReservoir`, methods/gdumb.py);
- the class groups (initial / previous / current), the bias-corrected old logits, λ = n_old / n_all
  (or a fixed λ: loss + λ·distillation, Avalanche's `lamb`), Avalanche's `BiasLayer` itself, the
  stage-2 optimiser (SGD, momentum 0.9, lr 0.1, ×0.1 at 1/4, 1/2 and 3/4 of the epochs — Avalanche's
  milestones 50/100/150 of 200), and its L2 penalty 0.1·β²/2 (the official code's `gamma_l2_loss`).

Deliberate differences:
- Avalanche's distillation takes the softmax of the old logits over the *batch* axis (`dim=0`) and
  a hard-coded T = 2; the official code (wuyuebupt/LargeScaleIncrementalLearning, resnet.py:
  `tf.nn.softmax(distill_pred / T)`, T = 2) takes it over the classes, as this plugin does, with T
  the hyperparameter. The test checks that the two agree once Avalanche's softmax runs over classes.
- memory size: Avalanche keeps `mem_size` stage-1 rows *plus* ⌊val_percentage·mem_size⌋ validation
  rows; the paper (and the official code: `nb_val` of the stored exemplars) splits one memory. Here
  `mem_size` is the whole memory, as for replay: ⌊val_percentage·mem_size⌋ validation rows and the
  rest for stage 1 (so a BiC run and a replay run of one `mem_size` store as many examples).
- stage-1 memory batches come from a seeded stream over the memory tensors, as replay's
  (methods/rehearsal.py: each minibatch of B rows is followed by B memory rows); stage 2 computes
  the frozen model's validation logits once and shuffles them with a seeded generator.
- class-IL only (one head over every class: the bias between old and new classes is what BiC
  corrects); a task-IL run fails with one line saying so.
Stage 2 is work outside the training loop: the record's budget counts stage 1's steps.
"""
from __future__ import annotations

import copy
from collections import defaultdict

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from avalanche.models.bic_model import BiasLayer
from torch import nn

from ..api.contract import MemoryUse, MethodAdapter, Range, tag_tensors
from ..config.vocabulary import Scenario
from .gdumb import ClassBalancedReservoir
from .rehearsal import BalancedReservoir, MemorySampler, MixedBatches, memory_generator, rows_of

# Seed offsets of BiC's generators: stage-1 memory batches, stage-2 validation order.
MEMORY_STREAM, STAGE_STREAM = 37, 41
BETA_L2 = 0.1  # the official code's weight of the L2 penalty on the bias layer's β
STAGE_MOMENTUM = 0.9


def distillation_loss(new_logits: torch.Tensor, old_logits: torch.Tensor, T: float) -> torch.Tensor:
    """Cross-entropy of the new logits / T against softmax(old logits / T) over the classes, batch mean."""
    return F.cross_entropy(new_logits / T, F.softmax(old_logits / T, dim=1))


class BiasCorrected(nn.Module):
    """The trained model with the bias layer on its logits: what the harness evaluates (shares the model)."""

    def __init__(self, model: nn.Module, bias_layer: nn.Module):
        super().__init__()
        self.model, self.bias_layer = model, bias_layer

    @property
    def blocks(self):
        return self.model.blocks

    @property
    def heads(self):
        return self.model.heads

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.features(x)

    def forward(self, x: torch.Tensor, task_labels=None) -> torch.Tensor:
        return self.bias_layer(self.model(x, task_labels))


class TensorBiCPlugin(SupervisedPlugin):
    """BiC's memories, distillation and bias correction; `BiCStrategy` trains on `split()`'s rows."""

    def __init__(self, train_size: int, val_size: int, T: float = 2.0, stage_2_epochs: int = 200,
                 lamb: float | str = "auto", lr: float = 0.1, seed: int = 0):
        super().__init__()
        self.reservoir, self.val = BalancedReservoir(train_size), ClassBalancedReservoir(val_size)
        self.T, self.stage_2_epochs, self.lamb, self.lr = float(T), int(stage_2_epochs), lamb, float(lr)
        self.generator = memory_generator(seed, MEMORY_STREAM)
        self.stage_generator = memory_generator(seed, STAGE_STREAM)
        self.class_to_tasks: dict[int, int] = {}
        self.train_rows: tuple | None = None
        self.sampler: MemorySampler | None = None
        self.model_old: nn.Module | None = None
        self.bias_layer: BiasLayer | None = None
        self.model: nn.Module | None = None
        self.alphas: list = []
        self.betas: list = []
        # per task: stage 2's optimizer steps and the network forward passes it took (rows), which the
        # training loop's budget does not see (stage 2 trains the bias layer on cached logits)
        self.stage_2_steps: list = []
        self.stage_2_rows: list = []

    # -- the memories ---------------------------------------------------------------------
    def split(self, x, y, t, task: int) -> torch.Tensor:
        """Hold each class's first rows out into the validation memory; returns the training rows' indices
        (grouped by class, in the order the classes first occur, as Avalanche concatenates them)."""
        by_class = defaultdict(list)
        for i, label in enumerate(y.tolist()):
            by_class[int(label)].append(i)
        for c in by_class:
            self.class_to_tasks[c] = task
        share = self.val.update(x, y, t, [int(v) for v in y.tolist()], first_only=True)
        keep = torch.as_tensor([i for c, idx in by_class.items() for i in idx[share[c]:]], dtype=torch.long)
        self.train_rows = tuple(v[keep.to(v.device)] for v in (x, y, t))
        return keep

    def classes_groups(self, task: int) -> tuple[list, list, list]:
        """(initial, previous, current) classes: seen before task - 1, in task - 1, in `task`."""
        groups = ([], [], [])
        for c, k in self.class_to_tasks.items():
            groups[0 if k < task - 1 else 1 if k == task - 1 else 2].append(c)
        return tuple(sorted(g) for g in groups)

    # -- stage 1 --------------------------------------------------------------------------
    def before_training_exp(self, strategy, **kwargs):
        if self.sampler is not None and len(self.sampler):
            strategy.dataloader = MixedBatches(strategy.dataloader, self.sampler, strategy.train_mb_size)

    def before_backward(self, strategy, **kwargs):
        if self.model_old is None:
            return
        initial, previous, current = self.classes_groups(strategy.experience.current_experience)
        with torch.no_grad():
            out_old = self.model_old(strategy.mb_x, strategy.mb_task_id)
            if initial:  # from the third task on, the old model's newest classes are bias-corrected
                out_old = self.bias_layer(out_old)
        old = initial + previous
        loss = distillation_loss(strategy.mb_output[:, old], out_old[:, old], self.T)
        if self.lamb == "auto":
            lam = len(old) / (len(old) + len(current))
            strategy.loss = (1.0 - lam) * strategy.loss + lam * loss
        else:
            strategy.loss = strategy.loss + float(self.lamb) * loss

    def after_training_exp(self, strategy, **kwargs):
        self.model = strategy.model
        self.model_old = copy.deepcopy(strategy.model).eval()
        for p in self.model_old.parameters():
            p.requires_grad_(False)
        self.reservoir.add(*self.train_rows)
        self.sampler = MemorySampler(*self.reservoir.rows(), self.generator)
        task = strategy.experience.current_experience
        steps = rows = 0
        if task > 0:
            steps, rows = self.bias_correction(strategy.model, task, strategy.train_mb_size, strategy.device)
        self.stage_2_steps.append(steps)
        self.stage_2_rows.append(rows)
        self.alphas.append(None if self.bias_layer is None else float(self.bias_layer.alpha))
        self.betas.append(None if self.bias_layer is None else float(self.bias_layer.beta))

    # -- stage 2 --------------------------------------------------------------------------
    def seen_classes(self) -> int:
        """The classes seen so far: labels are positions in the task order, so those of columns 0 .. max."""
        return max(self.class_to_tasks) + 1

    def bias_correction(self, model, task: int, batch_size: int, device) -> tuple[int, int]:
        """Train a new bias layer on the newest classes' logits over the validation memory (model frozen);
        the loss covers the seen classes' columns. Returns (its optimizer steps, rows the network saw)."""
        x, y, t = self.val.rows()
        logits = self._frozen_logits(model, x, t, batch_size)[:, :self.seen_classes()]
        self.bias_layer = BiasLayer(self.classes_groups(task)[2]).to(device)
        optimizer = torch.optim.SGD(self.bias_layer.parameters(), lr=self.lr, momentum=STAGE_MOMENTUM)
        epochs = self.stage_2_epochs
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [epochs // 4, epochs // 2, 3 * epochs // 4], 0.1)
        self.bias_layer.train()
        steps = 0
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=self.stage_generator).to(y.device)
            for start in range(0, len(y), batch_size):
                idx = order[start:start + batch_size]
                loss = F.cross_entropy(self.bias_layer(logits[idx]), y[idx])
                loss = loss + BETA_L2 * (self.bias_layer.beta.sum() ** 2) / 2
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
            scheduler.step()
        self.bias_layer.eval()
        for p in self.bias_layer.parameters():
            p.requires_grad_(False)
        return steps, len(y)

    @staticmethod
    @torch.no_grad()
    def _frozen_logits(model, x, t, batch_size: int) -> torch.Tensor:
        was_training = model.training
        model.eval()
        try:
            return torch.cat([model(x[s:s + batch_size], t[s:s + batch_size]) for s in range(0, len(x), batch_size)])
        finally:
            model.train(was_training)

    # -- the harness's hooks ----------------------------------------------------------------
    def harness_eval_model(self):
        """The model with the newest bias layer on its logits (after the first task: the model)."""
        if self.bias_layer is None or self.model is None:
            return None
        return BiasCorrected(self.model, self.bias_layer)

    def harness_diagnostics(self) -> dict:
        return {"bic_alpha": list(self.alphas), "bic_beta": list(self.betas),
                "bic_stage_2_steps": list(self.stage_2_steps), "bic_stage_2_rows": list(self.stage_2_rows)}

    def harness_memory(self) -> MemoryUse:
        """The tensors kept, as kept (no copy, no side effect): the stage-1 memory's (the sampler's; the
        reservoir's groups are views of them), each class's validation rows, the old model, the bias layer."""
        replayed = (self.sampler.x, self.sampler.y, self.sampler.t) if self.sampler is not None else ()
        kept = [*replayed, *(v for group in self.val.groups.values() if len(group) for v in group.rows)]
        for module in (self.model_old, self.bias_layer):  # the previous model's copy, the bias layer
            if module is not None:
                kept += [*module.parameters(), *module.buffers()]
        samples = (len(self.sampler) if self.sampler is not None else 0) + len(self.val)
        return MemoryUse(samples=samples, tensors=tuple(kept))


def split_memory(mem_size: int, val_percentage: float) -> tuple[int, int]:
    """(stage-1 rows, validation rows) of a memory of `mem_size` examples."""
    val = int(float(val_percentage) * int(mem_size))
    if val < 1 or int(mem_size) - val < 1:
        raise ValueError(f"bic: mem_size {mem_size} with val_percentage {val_percentage} leaves {val} validation "
                         f"and {int(mem_size) - val} training rows; both must be >= 1")
    return int(mem_size) - val, val


def build_bic(ctx, mem_size: int, val_percentage: float, T: float, stage_2_epochs: int, lamb, lr: float):
    """BiC: replay + distillation, then a bias layer on the newest classes trained on held-out memory."""
    from avalanche.training.supervised import Naive

    if ctx.scenario == Scenario.TASK_IL:
        raise ValueError("bic corrects the bias between old and new classes of one head over all classes: it runs "
                         "in class-IL only (protocol scenario: class-il), this run is task-il")
    train_size, val_size = split_memory(mem_size, val_percentage)
    plugin = TensorBiCPlugin(train_size, val_size, T=T, stage_2_epochs=stage_2_epochs, lamb=lamb, lr=lr,
                             seed=ctx.seed)

    class BiCStrategy(Naive):
        """Naive training on the task's rows less the validation rows BiC holds out (tagged tensors)."""

        def train_dataset_adaptation(self, **kwargs):
            super().train_dataset_adaptation(**kwargs)
            x, y, t = rows_of(self.experience.dataset, device=self.device)
            keep = plugin.split(x, y, t, self.experience.current_experience)
            self.adapted_dataset = tag_tensors(self.adapted_dataset.subset(keep.tolist()), *plugin.train_rows)

    return BiCStrategy(**ctx.strategy_kwargs(plugin))


ADAPTERS = (
    # Avalanche's BiCPlugin defaults (val_percentage 0.1, T 2, 200 stage-2 epochs, λ = n_old/n_all,
    # stage-2 lr 0.1), which are the paper's; mem_size 200 (the paper's 2,000 on CIFAR-100) on the
    # embedded data, as replay.
    MethodAdapter("bic", {"mem_size": 200, "val_percentage": 0.1, "T": 2.0, "stage_2_epochs": 200,
                          "lamb": "auto", "lr": 0.1}, build_bic,
                  "BiC: replay with distillation, then a bias layer on the newest classes' logits trained on a "
                  "held-out class-balanced memory (class-IL only)",
                  "Wu et al., CVPR 2019", family="rehearsal",
                  hparam_types={"lamb": (str, float)},
                  hparam_ranges={"mem_size": Range(low=2), "val_percentage": Range(low=0, high=1, low_open=True,
                                                                                   high_open=True),
                                 "T": Range(low=0, low_open=True), "stage_2_epochs": Range(low=0),
                                 "lamb": Range(low=0, choices=("auto",)), "lr": Range(low=0, low_open=True)},
                  captions={"bic_alpha": "BiC bias layer's α on the newest classes' logits, per task",
                            "bic_beta": "BiC bias layer's β on the newest classes' logits, per task"},
                  scenarios=(Scenario.CLASS_IL,),  # a task-IL protocol naming it is refused at load
                  version="3"),  # 2: stage 2's cross-entropy over the seen classes' columns; 3: its steps recorded
)
