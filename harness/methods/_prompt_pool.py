"""Shared machinery of the prefix-tuning prompt pools (DualPrompt, CODA-Prompt; methods/dualprompt.py,
methods/coda_prompt.py), after GT-RIPL/CODA-Prompt (models/vit.py, models/zoo.py ViTZoo, learners/prompt.py).

- Prefix tuning: the attention of a prompted transformer block gets per-sample prefixes (Pk, Pv), each
  (B, Lp, D), concatenated *before* its projected keys and values, split into heads as the keys are: exactly
  CODA-Prompt's `models/vit.py Attention.forward(x, prompt=(pk, pv))`. The harness ViT's blocks are timm
  Blocks; their attention module's class becomes `PrefixAttention` (timm's `Attention` with that one
  addition; no parameter added or renamed: without a prefix it is timm's own forward).
- The query: the frozen pretrained model's feature (final norm, [CLS] token; CLNet.features) with no prompt,
  without gradients, as ViTZoo.forward computes `q` (`with torch.no_grad(): q, _ = self.feat(x)`).
- `PromptPoolNet`: the model the strategy trains and the harness evaluates, with CLNet's interface
  (forward(x, task_labels), features(x), blocks, heads); it shares the run model's blocks and heads and adds the
  pool (`pool.*`); a forward is the query pass, then the run model's own forward with the pool's prefixes set.
- `PromptPoolStrategy` (SupervisedTemplate): the pool's loss is added to the harness criterion's loss
  (`total_loss + prompt_loss.sum()`), and in class-IL the logits of the classes of past tasks are set to -inf
  for the training loss (`logits[:, :last_valid_out_dim] = -inf`; the harness's SeenClassesLoss already cuts the
  columns of classes not seen yet, as the official `logits[:, :valid_out_dim]`). At each task's start the pool
  learns the task index (DualPrompt trains E-prompt `task_id`) and, from the second task on, moves to the next
  task (`process_task_count`: CODA's Gram-Schmidt init of the new components).

The regime `prompt-lL` gives the pool's prompt length L (split in halves for keys and values, as the official
code does: an odd L is refused, the official code would fail on it); the VPT prompt the regime put at the
first transformer block is replaced by an empty one (0 tokens: the regime still selects it, it changes nothing).
Layers are 0-based transformer-block indices. The pool's random init (uniform, Gram-Schmidt) draws from a
generator of the run's own (seeded from the run's seed, on the CPU, then moved to the device), where the
official code draws from the global RNG: records do not depend on the device or on other draws.
"""
from __future__ import annotations

from contextlib import contextmanager

import harness.compat  # noqa: F401

import torch
import torch.nn.functional as F
from avalanche.models.dynamic_modules import avalanche_model_adaptation
from avalanche.training.templates import SupervisedTemplate
from timm.models.vision_transformer import Attention
from torch import nn

from ..api.prompts import token_blocks
from .rehearsal import rows_of

POOL_SEED_OFFSET = 104_729  # the pool's generator seed = run seed + this (not the stream of any other draw)


class PrefixAttention(Attention):
    """timm's Attention; with `prefix = (pk, pv)` set (each (B, Lp, D)) the prefixes are concatenated before
    the keys and values (CODA-Prompt models/vit.py Attention.forward with `prompt`)."""

    prefix = None

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if self.prefix is None:
            return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        if attn_mask is not None or is_causal or self.gate is not None:
            raise ValueError("prefix tuning: attention masks and gated attention are not supported")
        return prefix_attention(self, x, *self.prefix)


def prefix_attention(attn: Attention, x: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor) -> torch.Tensor:
    """timm Attention `attn` on `x` (B, N, C) with prefix keys `pk` and values `pv` (B, Lp, C) before its own."""
    B, N, C = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    pk = pk.to(k.dtype).reshape(B, -1, attn.num_heads, attn.head_dim).permute(0, 2, 1, 3)
    pv = pv.to(v.dtype).reshape(B, -1, attn.num_heads, attn.head_dim).permute(0, 2, 1, 3)
    k, v = torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)
    if attn.fused_attn:
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
    else:
        a = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        x = attn.attn_drop(a) @ v
    x = attn.norm(x.transpose(1, 2).reshape(B, N, attn.attn_dim))
    return attn.proj_drop(attn.proj(x))


def prefix_blocks(model, layers) -> dict[int, nn.Module]:
    """The transformer blocks at the 0-based `layers` (every index checked against the depth), by index."""
    blocks = list(token_blocks(model).values())
    items = layers if isinstance(layers, (list, tuple)) else [layers]
    wrong = [i for i in items if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(blocks)]
    if wrong or not isinstance(layers, (list, tuple)):
        raise ValueError(f"prompt layers {layers!r}: {wrong or layers!r} not transformer blocks of this model; "
                         f"allowed: a list of 0-based indices 0..{len(blocks) - 1} ({len(blocks)} transformer blocks)")
    out = {}
    for i in sorted(set(layers)):
        attn = getattr(blocks[i], "attn", None)
        if type(attn) not in (Attention, PrefixAttention):
            raise ValueError(f"prompt layer {i}: its block's attention is {type(attn).__name__}; allowed: timm's "
                             "Attention (the harness ViTs)")
        out[i] = blocks[i]
    return out


def half_length(length: int, what: str) -> int:
    """L // 2, the official split of a prompt of L tokens into keys and values; an odd L is refused."""
    if length < 2 or length % 2:
        raise ValueError(f"{what} = {length}: the prompt is split in halves for keys and values (the official "
                         "code's L/2); allowed: an even length >= 2")
    return length // 2


def regime_refusal(regime: str) -> str | None:
    """Why `regime` cannot carry a prefix pool (an odd prompt length), else None (for a protocol-load check)."""
    from ..config.vocabulary import Family, parse_regime

    parsed = parse_regime(regime)
    if parsed.family == Family.PROMPT and parsed.rank is not None and int(parsed.rank) % 2:
        return (f"regime {regime!r}: prefix prompt pools split each prompt of L tokens in halves for keys and "
                "values (the official code); allowed: an even L")
    return None


def pool_generator(seed: int) -> torch.Generator:
    """The generator of a pool's random init, seeded from the run (CPU; values are moved to the device)."""
    return torch.Generator().manual_seed(int(seed) + POOL_SEED_OFFSET)


def uniform_prompt(generator: torch.Generator, *shape) -> nn.Parameter:
    """CODA-Prompt's tensor_prompt: a Parameter of `shape`, uniform in [0, 1) (nn.init.uniform_)."""
    return nn.Parameter(torch.rand(*shape, generator=generator))


def replace_vpt_prompt(model) -> int:
    """Replace the regime's VPT prompt (at the first transformer block) by an empty one; returns its length L."""
    prompted = [b for b in token_blocks(model).values() if b.prompt is not None]
    if not prompted:
        raise ValueError("prompt pools run under the regime family prompt (prompt-lL); no prompt found on the model")
    length = int(prompted[0].prompt.shape[0])
    for block in prompted:
        block.prompt = nn.Parameter(block.prompt.detach()[:0].clone(), requires_grad=block.prompt.requires_grad)
    return length


class PromptPoolNet(nn.Module):
    """The run model (`net`, a CLNet: its blocks and heads are shared, not copied) with a prompt pool: a forward is
    the query pass (no prompts, no grad), then net's own forward with the pool's prefixes in the prompted layers.
    `task_id` is set by the strategy while training (the pool's training path), `prompt_loss` is the last
    training forward's pool loss."""

    def __init__(self, net, pool: nn.Module, layers: dict[int, nn.Module]):
        super().__init__()
        self.blocks = net.blocks
        self.heads = net.heads
        self.pool = pool
        object.__setattr__(self, "net", net)  # not a submodule: no second name for the same weights
        self.attns = {i: b.attn for i, b in layers.items()}  # plain dict: the attention modules stay net's
        for attn in self.attns.values():
            attn.__class__ = PrefixAttention  # a subclass without parameters of its own: names, state unchanged
        self.task_id: int | None = None
        self.prompt_loss: torch.Tensor | float = 0.0
        self.training = net.training

    # -- CLNet's interface (apply_regime, the frozen checks and the meter read these) --
    @property
    def block_names(self) -> list[str]:
        return self.net.block_names

    @property
    def head_classes(self) -> int:
        return self.net.head_classes

    @property
    def frozen_blocks(self):
        return self.net.frozen_blocks

    @frozen_blocks.setter
    def frozen_blocks(self, value):
        self.net.frozen_blocks = value

    @property
    def frozen_modules(self):
        return self.net.frozen_modules

    @frozen_modules.setter
    def frozen_modules(self, value):
        self.net.frozen_modules = value

    def train(self, mode: bool = True):
        """net's own train() (frozen blocks stay in eval mode), and the pool's."""
        self.training = mode
        self.net.train(mode)
        self.pool.train(mode)
        return self

    def pixels(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.pixels(x)

    # -- the prompted model --
    @torch.no_grad()
    def query(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen model's [CLS] feature (after the final norm) without prompts: the pool's query."""
        return self.net.features(x)

    @contextmanager
    def prefixed(self, x: torch.Tensor):
        """Within: the prompted layers' attention carries the pool's prefixes for the rows of `x`."""
        q = self.query(x)
        train = self.training and self.task_id is not None
        prefixes, loss = self.pool.prefixes(q, train=train, task_id=self.task_id)
        if train:
            self.prompt_loss = loss
        try:
            for i, attn in self.attns.items():
                attn.prefix = prefixes.get(i)
            yield
        finally:
            for attn in self.attns.values():
                attn.prefix = None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The prompted features (final norm, [CLS])."""
        with self.prefixed(x):
            return self.net.features(x)

    def forward(self, x: torch.Tensor, task_labels=None):
        """net's forward (its heads, its precision) with the pool's prefixes."""
        with self.prefixed(x):
            return self.net(x, task_labels)


class PromptPoolStrategy(SupervisedTemplate):
    """Avalanche's SupervisedTemplate training a PromptPoolNet: the pool's loss added to the harness criterion's,
    past classes' logits masked in class-IL (`mask_past`), the pool told each task's index."""

    def __init__(self, *, mask_past: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.mask_past = bool(mask_past)
        self.task_index = 0
        self.past_classes = 0  # class-IL: the official last_valid_out_dim (classes of earlier tasks)

    def model_adaptation(self, model=None):
        """Avalanche's adaptation of the run model (CLNet remembers its tasks); the pool does not grow."""
        model = self.model if model is None else model
        avalanche_model_adaptation(model.net, self.experience)
        return model.to(self.device)

    def _before_training_exp(self, **kwargs):
        model = self.model
        if self.task_index > 0:
            model.pool.process_task_count()  # the official trainer: before learning task i > 0
        model.task_id = self.task_index
        if len(model.heads) == 1:
            y = rows_of(self.experience.dataset)[1]
            self.past_classes = int(y.min()) if len(y) else 0
        super()._before_training_exp(**kwargs)

    def _after_training_exp(self, **kwargs):
        super()._after_training_exp(**kwargs)
        self.model.task_id = None
        self.task_index += 1

    def forward(self):
        return self.model(self.mb_x, self.mb_task_id)

    def criterion(self):
        logits = self.mb_output
        if self.is_training and self.mask_past and len(self.model.heads) == 1 and self.past_classes:
            logits = logits.clone()
            logits[:, :self.past_classes] = -float("inf")
        loss = self._criterion(logits, self.mb_y)
        if self.is_training:
            loss = loss + self.model.prompt_loss
        return loss

    def harness_state(self) -> dict[str, torch.Tensor]:
        """Every parameter of the pool, as `prompts.<name>` (detached); a pool that grows by components (CODA's
        `live_rows()`) gives only the rows in use, so that the norms compare learnt components and a task's
        freshly initialised ones count from the task that trains them (rows new at t add nothing to u_t)."""
        pool = self.model.pool
        rows = pool.live_rows() if hasattr(pool, "live_rows") else None
        return {f"prompts.{n}": (p if rows is None else p[:rows]).detach() for n, p in pool.named_parameters()}


def build_prompt_pool(ctx, make_pool, layers, mask_past: bool) -> PromptPoolStrategy:
    """The strategy of a prefix prompt pool: the regime's VPT prompt emptied, `make_pool(L, width, generator)`
    on the `layers` (0-based transformer blocks), the pool and heads trained by the protocol's optimizer."""
    blocks = prefix_blocks(ctx.model, layers)
    width = int(next(iter(blocks.values())).embed_dim)
    length = replace_vpt_prompt(ctx.model)
    pool = make_pool(length, width, pool_generator(ctx.seed)).to(ctx.device)
    model = PromptPoolNet(ctx.model, pool, blocks)
    optimizer = ctx.new_optimizer([p for p in model.parameters() if p.requires_grad])
    kwargs = ctx.strategy_kwargs()
    kwargs.update(model=model, optimizer=optimizer)
    return PromptPoolStrategy(mask_past=mask_past, **kwargs)
