"""Learning to Prompt (`l2p`; Wang et al., CVPR 2022): a pool of prompts with learnable keys on a frozen ViT.

Each sample's query is the frozen model's class-token feature without prompts (`embedding_key='cls'`: the
harness ViT's own `features`, the regime having frozen the backbone). The `top_k` keys nearest in cosine to the
query pick their prompts (`batchwise_prompt`: the `top_k` most frequent choices of the batch serve every sample
of it, as official L2P does in training and evaluation alike); their tokens (top_k x L, with the class token's
position embedding) go between the class token and the patch tokens at the input; the head reads the mean of
their outputs after the final norm (`head_type='prompt'`). Training masks the logits to the task's classes and
subtracts `sim_coefficient` x the summed query-key cosine of the chosen keys (the pull constraint).

Through Avalanche: the pool is `avalanche.models.prompt.Prompt` (its port of l2p-pytorch's `Prompt`), the
strategy subclasses `avalanche.training.supervised.LearningToPrompt` and keeps its `criterion` (loss −
sim_coefficient · reduce_sim) and its training mask; it skips LearningToPrompt's constructor (which builds its
own timm ViT-B and an Adam optimizer) and trains the harness's model with the protocol's optimizer.
The official code followed is JH-LEE-KR/l2p-pytorch (the PyTorch port of google-research/l2p):
`prompt.py`, `vision_transformer.py` (forward_features / forward_head, resize_pos_embed), `engine.py`, and its
`configs/cifar100_l2p.py` defaults: pool size 10, top-k 5, batchwise prompt, pull-constraint coefficient 0.1,
uniform(-1, 1) prompts and keys, logits masked to the task's classes in training, gradient clipping at norm 1;
the prompt length is the regime's L (`prompt-lL`; official 5). tests/test_l2p.py checks the selection, the
batched prompts, reduce_sim and the logits against the official code on identical tensors.

Deviations (each where it has one, a hyperparameter):
- Evaluation batch of the batch-wise choice: the official code votes over its evaluation batch (16 per
  device, `--batch-size 16`); the harness evaluates a task's test set in batches of the protocol's size (1024 in
  vit-sweep-mini), over which the vote would all but know the task. `eval_prompt_batch` (default 16) makes
  evaluation vote over consecutive chunks of that many test rows (0: over the harness's batch).
- Optimizer and learning rate: the protocol's (official: Adam, lr 0.03 x batch / 256, constant), so every
  method of a protocol trains alike; the optimizer is reset at every task, as official `reinit_optimizer`.
- The regime's own VPT prompt (harness/api/prompts.py, on the first transformer block) is resized to zero
  tokens: the pool replaces it. The parameter stays registered because the harness re-applies the regime at
  every task and a prompt regime must select a prompt; with zero tokens the block computes exactly timm's
  Block. The record's `params` count the pool (`method_owned`, in `adapters` and `trainable`) and not the
  emptied regime prompt (harness/run/regimes.py: method_parameter_counts).
- Prompt positions: the class token's position embedding, which l2p-pytorch's `resize_pos_embed` gives the
  prompt positions of the pretrained weights it loads (norm_pre, CLIP's, applied to the prompts as to every
  token).
- `use_prompt_mask` / `shared_prompt_pool` (task-specific prompt ranges, off in the official CIFAR-100 config)
  are not offered.
Compute: the meter counts L2PNet's passes as the method's model's (harness/run/compute.py: the query pass as a
backbone pass, the prompted pass with its backward at the FLOPs of its longer sequence, `harness_flops_forward`).
Under the harness's class-IL growing head the loss covers the seen classes' columns (ctx.criterion) of logits
already masked to the task's classes: the same loss as official L2P's fixed head with its mask.
"""
from __future__ import annotations

from contextlib import nullcontext

import harness.compat  # noqa: F401

import numpy as np
import torch
from avalanche.models.prompt import Prompt
from avalanche.training.supervised import LearningToPrompt
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from ..api.contract import MethodAdapter, Range
from ..api.prompts import token_blocks
from ..config.vocabulary import Family, Scenario, parse_regime

PROMPT_HEAD, TOKEN_PROMPT_HEAD, TOKEN_HEAD = "prompt", "token+prompt", "token"
# l2p-pytorch's forward_head (gap needs global_pool avg: not here)
HEAD_TYPES = (PROMPT_HEAD, TOKEN_PROMPT_HEAD, TOKEN_HEAD)
AUTOCAST_ATTRIBUTE = "harness_autocast"  # the run's precision on its model (harness/run/precision.py)


def prompt_length(regime: str) -> int:
    """The L of a `prompt-lL` regime: each pool prompt's length."""
    parsed = parse_regime(regime)
    if parsed.family != Family.PROMPT or not parsed.rank:
        raise ValueError(f"l2p: regime {regime!r}; allowed: prompt-lL (L = each pool prompt's length)")
    return int(parsed.rank)


EMBED_API = ("pos_embed", "pos_drop", "norm_pre")  # the harness ViT's input stage (harness/run/vit.py: Embed)


def check_vit(model) -> None:
    """The model must be a harness ViT: blocks embed (with the attributes above), token blocks, norm, pool."""
    names = list(model.blocks)
    embed = model.blocks[names[0]]
    if names[-1] != "pool" or not all(hasattr(embed, a) for a in EMBED_API) or not token_blocks(model):
        raise ValueError(f"l2p: blocks {', '.join(names)}; allowed: a cl-bench ViT (vit-tiny, vit-b16, "
                         "vit-b16-clip: embed with a position embedding, transformer blocks, norm, pool)")


def drop_regime_prompt(model) -> None:
    """Resize the regime's VPT prompt to zero tokens: the pool replaces it (module docstring)."""
    for block in token_blocks(model).values():
        if block.prompt is not None:
            block.prompt = nn.Parameter(block.prompt.detach()[:0].clone())


def _autocast(model, x: torch.Tensor):
    dtype = getattr(model, AUTOCAST_ATTRIBUTE, None)
    return nullcontext() if dtype is None else torch.autocast(device_type=x.device.type, dtype=dtype)


class L2PNet(nn.Module):
    """The trained and evaluated L2P model: the harness ViT's blocks and heads (shared, not copied) and the
    prompt pool. Same interface as CLNet: `forward(x, task_labels)`, `features(x)`, `blocks`, `heads`
    (plus what a regime sets on it: `frozen_blocks`, `frozen_modules`, kept on the ViT itself)."""

    def __init__(self, model, pool: Prompt, head_type: str = "prompt", eval_prompt_batch: int = 0):
        super().__init__()
        self.eval_prompt_batch = int(eval_prompt_batch)  # > 0: evaluation picks prompts per chunk of this many
        self.blocks = model.blocks
        self.heads = model.heads
        self.pool = pool
        self.head_type = head_type
        self.head_classes = model.head_classes
        object.__setattr__(self, "net", model)  # not a submodule: no second name for the same weights
        self.training = model.training

    # -- what a regime reads and sets on a CLNet, kept on the ViT (its train() honours them) --
    @property
    def block_names(self) -> list[str]:
        return self.net.block_names

    @property
    def frozen_blocks(self):
        return self.net.frozen_blocks

    @frozen_blocks.setter
    def frozen_blocks(self, value) -> None:
        self.net.frozen_blocks = value

    @property
    def frozen_modules(self):
        return self.net.frozen_modules

    @frozen_modules.setter
    def frozen_modules(self, value) -> None:
        self.net.frozen_modules = value

    def train(self, mode: bool = True):
        """The ViT's own train() (frozen blocks stay in eval mode); the pool has no mode-dependent layer."""
        self.training = mode
        self.pool.train(mode)
        self.net.train(mode)
        return self

    # -- the forward --
    @torch.no_grad()
    def query(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen model's class-token feature without prompts (official `original_model(x)['pre_logits']`)."""
        return self.net.features(x)

    def prompted(self, x: torch.Tensor, query: torch.Tensor) -> dict:
        """Official forward_features + forward_head up to the pre-logits: the pool's output dict with
        `pre_logits` (B, D)."""
        embed, *rest = [b for n, b in self.blocks.items() if n != "pool"]
        x = self.net.pixels(x)
        with _autocast(self.net, x):
            tokens = embed(x)  # (B, 1 + P, D): class token first, positions added (harness/run/vit.py)
            res = self.pool(tokens[:, 1:], cls_features=query)
            n = res["total_prompt_len"]
            prompts = res["prompted_embedding"][:, :n] + embed.pos_embed[:, :1]  # the class token's position
            prompts = embed.norm_pre(embed.pos_drop(prompts))
            h = torch.cat((tokens[:, :1], prompts, tokens[:, 1:]), dim=1)
            for block in rest:
                h = block(h)
            res["pre_logits"] = self.pre_logits(h, n).float()
        return res

    def pre_logits(self, h: torch.Tensor, n: int) -> torch.Tensor:
        """forward_head's pooling: the mean of the prompt tokens' outputs (or of them and the class token, or the
        class token)."""
        if self.head_type == PROMPT_HEAD:
            return h[:, 1:1 + n].mean(dim=1)
        if self.head_type == TOKEN_PROMPT_HEAD:
            return h[:, :1 + n].mean(dim=1)
        return h[:, 0]

    def logits(self, x: torch.Tensor, task_labels) -> dict:
        """The output dict with `logits` (the heads on the pre-logits: one per sample's task)."""
        res = self.prompted(x, self.query(x))
        feats = res["pre_logits"]
        with _autocast(self.net, feats):  # as CLNet.forward runs its heads
            if isinstance(task_labels, int) or task_labels is None:
                out = self.heads[0 if len(self.heads) == 1 else int(task_labels or 0)](feats)
            else:
                out = self.net.heads_forward(feats, task_labels)
        res["logits"] = out.float()
        return res

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the heads read: the pooled prompt outputs."""
        if self._chunked(x):
            return torch.cat([self.features(x[s:s + self.eval_prompt_batch]) for s in self._starts(x)])
        return self.prompted(x, self.query(x))["pre_logits"]

    def _chunked(self, x: torch.Tensor) -> bool:
        # Batch-wise selection votes over the batch: in evaluation it does so over the official evaluation batch
        # (`eval_prompt_batch`), not over whatever batch the harness evaluates with (most of a task's test set).
        return (not self.training and self.pool.batchwise_prompt and self.eval_prompt_batch > 0
                and len(x) > self.eval_prompt_batch)

    def _starts(self, x: torch.Tensor) -> range:
        return range(0, len(x), self.eval_prompt_batch)

    def forward(self, x: torch.Tensor, task_labels=None, with_res: bool = False):
        """The logits; with `with_res` the whole output dict, logits first (the strategy's training forward goes
        through here, so the compute meter's hook on this module counts it)."""
        if not with_res and self._chunked(x):
            n = self.eval_prompt_batch
            per_row = not (isinstance(task_labels, int) or task_labels is None)
            return torch.cat([self.forward(x[s:s + n], task_labels[s:s + n] if per_row else task_labels)
                              for s in self._starts(x)])
        res = self.logits(x, task_labels)
        return {"logits": res.pop("logits"), **res} if with_res else res["logits"]

    def harness_flops_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward the compute meter measures on a meta copy of this model (harness/run/compute.py): the
        batch-wise choice counts prompts with torch.unique, whose output shape meta tensors cannot know; the
        per-sample choice of as many (top_k) prompts has the same FLOPs."""
        self.pool.batchwise_prompt = False  # only ever called on the meter's copy
        return self(x)


class L2P(LearningToPrompt):
    """Avalanche's LearningToPrompt on the harness's model: its criterion and training mask, our model."""

    def __init__(self, *, ctx, model: L2PNet, sim_coefficient: float, use_mask: bool, clip_grad: float):
        trainable = [p for p in model.parameters() if p.requires_grad]
        kwargs = ctx.strategy_kwargs()
        kwargs.update(model=model, optimizer=ctx.new_optimizer(trainable))
        SupervisedTemplate.__init__(self, **kwargs)  # not LearningToPrompt's: it builds its own ViT and optimizer
        self.num_classes = model.head_classes
        self.sim_coefficient = float(sim_coefficient)
        self.use_mask = bool(use_mask)
        self.use_cls_features, self.use_vit, self.train_prompt_mask = True, True, False
        self.clip_grad = float(clip_grad)
        self.res, self.task_classes = None, None
        self.used: list[set] = []  # per task: the pool prompts chosen in its training batches

    def _before_training_exp(self, **kwargs):
        SupervisedTemplate._before_training_exp(self, **kwargs)  # the harness's optimizer reset, not a new Adam
        # official class_mask[task_id] (Avalanche: classes_in_this_experience): the labels of the task's data
        self.task_classes = np.unique(np.asarray(list(self.experience.dataset.targets), dtype=np.int64))
        self.used.append(set())

    def forward(self):
        """LearningToPrompt.forward with the harness model's query and heads."""
        self.res = self.model(self.mb_x, self.mb_task_id, with_res=True)
        logits = self.res["logits"]
        if self.is_training and self.used:
            self.used[-1].update(torch.unique(self.res["prompt_idx"]).tolist())
        if self.use_mask and self.is_training:
            mask = self.task_classes
            not_mask = np.setdiff1d(np.arange(self.num_classes), mask)
            not_mask = torch.tensor(not_mask, dtype=torch.int64).to(self.device)
            logits = logits.index_fill(dim=1, index=not_mask, value=float("-inf"))
        return logits

    def optimizer_step(self):
        """Official engine.py: clip the gradient norm before the step (0: no clipping)."""
        if self.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        super().optimizer_step()

    def harness_state(self) -> dict[str, torch.Tensor]:
        """The pool's prompts and keys (method-owned weights outside model.blocks)."""
        return {"prompts.pool": self.model.pool.prompt.detach(), "prompts.keys": self.model.pool.prompt_key.detach()}

    def harness_diagnostics(self) -> dict:
        """The pool's size (its parameters are trained weights the record's `params` do not count) and, per task,
        how many of its prompts the task's training batches chose."""
        return {"l2p_pool_parameters": int(sum(p.numel() for p in self.model.pool.parameters())),
                "l2p_prompts_used": [len(u) for u in self.used]}


def make_pool(embed_dim: int, length: int, pool_size: int, top_k: int, batchwise_prompt: bool) -> Prompt:
    """Avalanche's (l2p-pytorch's) Prompt with the official CIFAR-100 settings: learnable keys, cls query."""
    return Prompt(length=length, embed_dim=embed_dim, embedding_key="cls", prompt_init="uniform", prompt_pool=True,
                  prompt_key=True, pool_size=pool_size, top_k=top_k, batchwise_prompt=batchwise_prompt,
                  prompt_key_init="uniform")


def build_l2p(ctx, pool_size=10, top_k=5, batchwise_prompt=True, sim_coefficient=0.1, head_type="prompt",
              train_mask=True, clip_grad=1.0, eval_prompt_batch=16):
    """L2P on the regime-frozen ViT: its prompt pool replaces the regime's prompt."""
    if int(top_k) > int(pool_size):
        raise ValueError(f"l2p: top_k={top_k} exceeds pool_size={pool_size}; allowed: top_k <= pool_size")
    length = prompt_length(ctx.regime)
    check_vit(ctx.model)
    drop_regime_prompt(ctx.model)
    embed_dim = next(iter(token_blocks(ctx.model).values())).embed_dim
    pool = make_pool(embed_dim, length, int(pool_size), int(top_k), bool(batchwise_prompt))  # the run's seeded RNG
    model = L2PNet(ctx.model, pool.to(ctx.device), str(head_type), int(eval_prompt_batch))
    return L2P(ctx=ctx, model=model, sim_coefficient=sim_coefficient, use_mask=train_mask, clip_grad=clip_grad)


ADAPTERS = (
    MethodAdapter(
        "l2p",
        dict(pool_size=10, top_k=5, batchwise_prompt=True, sim_coefficient=0.1, head_type="prompt",
             train_mask=True, clip_grad=1.0, eval_prompt_batch=16),
        build_l2p,
        "Learning to Prompt: a pool of input prompts chosen per batch by key-query matching on the frozen "
        "model's class token, pull constraint on the chosen keys, logits masked to the task's classes",
        "Wang et al., CVPR 2022 (L2P); github.com/google-research/l2p, PyTorch port "
        "github.com/JH-LEE-KR/l2p-pytorch; Avalanche LearningToPrompt",
        family="prompt-pool",
        captions={"l2p_pool_parameters": "parameters of the prompt pool (prompts and keys)",
                  "l2p_prompts_used": "pool prompts the task's training batches chose"},
        hparam_ranges={"pool_size": Range(low=1), "top_k": Range(low=1), "sim_coefficient": Range(low=0),
                       "head_type": Range(choices=HEAD_TYPES), "clip_grad": Range(low=0),
                       "eval_prompt_batch": Range(low=0)},
        regime_families=(Family.PROMPT,),
        regime_note="its prompt pool replaces the regime's input prompt on a frozen backbone (prompt-lL: L is "
                    "each pool prompt's length)",
        scenarios=(Scenario.CLASS_IL, Scenario.TASK_IL),
    ),
)
