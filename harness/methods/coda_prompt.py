"""CODA-Prompt (Smith et al., CVPR 2023) as its official code implements it (GT-RIPL/CODA-Prompt models/zoo.py
CodaPrompt, gram_schmidt, ortho_penalty; learners/prompt.py; experiments/*.sh `--prompt_param 100 8 0.0`), by
prefix tuning of the frozen pretrained ViT (methods/_prompt_pool.py).

At each layer of `e_layers` a pool of `pool_size` prompt components P (pool, L, D) with keys K and attention
vectors A (pool, D): the prompt of a sample with query q is sum_m alpha_m P_m, alpha_m = cos(q * A_m, K_m) (the
query attended by A_m, compared with K_m); its first L/2 tokens are the prefix keys, the rest the values. The
pool is split across the tasks (pool_size // n_tasks components each): training task t uses components
[0, f) with those of past tasks [0, s) detached (frozen), at test time every component learnt so far [0, f).
Before task t > 0 the new components [s, f) of K, A and P are initialised by Gram-Schmidt against the earlier
ones (random normal draws projected out; the later ones stay zero), as the official `process_task_count`
does (the first task's at build, as the official __init__). Loss: ortho_mu x (ortho_penalty(K) +
ortho_penalty(A) + ortho_penalty(P flattened)) per layer, ortho_penalty(t) = mean((t t^T - I)^2) (official
default ortho_mu 0.0: "with updated code, now can be 0"). L: the regime's `prompt-lL` (official 8);
`pool_size`: 100; layers (0-based transformer blocks): [0, 1, 2, 3, 4] (official; vit-tiny has 3 blocks,
its protocols set them).

Deviations, harness-imposed: the protocol's optimizer, schedule, epochs and batch size (official: Adam 1e-3,
cosine, 20 epochs on CIFAR-100, batch 128; its weight decay 0 is what keeps the frozen components still, as
zero gradients under momentum do: a protocol with weight decay > 0 would shrink them, as the official code would
with it); heads as the harness builds them; the random init draws from the run's own generator on the CPU
(the official: the global RNG), the identity in ortho_penalty on the tensor's device (the official: `.cuda()`).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..api.contract import MethodAdapter, Range
from ..config.vocabulary import Family
from ._prompt_pool import build_prompt_pool, half_length, regime_refusal, uniform_prompt


def ortho_penalty(t: torch.Tensor) -> torch.Tensor:
    """mean((t t^T - I)^2): the official orthogonality penalty (its identity on t's device)."""
    return ((t @ t.T - torch.eye(t.shape[0], device=t.device, dtype=t.dtype)) ** 2).mean()


def gram_schmidt(vv: torch.Tensor, s: int, f: int, generator: torch.Generator) -> torch.Tensor:
    """The official CodaPrompt.gram_schmidt: rows [0, s) kept, rows [s, f) new random normal vectors with their
    projections on every earlier row removed, then normalised; rows from f on zero. `vv` (n, d) or (n, L, d)."""
    def projection(u, v):
        denominator = (u * u).sum()
        return None if denominator < 1e-8 else (v * u).sum() / denominator * u

    shape = copy.deepcopy(vv.shape)
    vv = vv.reshape(vv.shape[0], -1).T
    uu = torch.zeros_like(vv)
    if s > 0:
        uu[:, 0:s] = vv[:, 0:s].clone()
    for k in range(s, f):
        redo = True
        while redo:  # a zero earlier row restarts the draw, as the official loop does
            redo = False
            vk = torch.randn(vv.shape[0], generator=generator).to(vv)
            uk = 0
            for j in range(0, k):
                if not redo:
                    proj = projection(uu[:, j].clone(), vk)
                    if proj is None:
                        redo = True
                    else:
                        uk = uk + proj
            if not redo:
                uu[:, k] = vk - uk
    for k in range(s, f):
        uk = uu[:, k].clone()
        uu[:, k] = uk / (uk.norm())
    return uu.T.reshape(shape)


class CodaPromptPool(nn.Module):
    """Per layer l: components `e_p_<l>` (pool, L, D), keys `e_k_<l>` and attention vectors `e_a_<l>` (pool, D)
    (the official names); `layer(q, l, train)` is the official forward of one layer."""

    def __init__(self, width: int, length: int, pool_size: int, n_tasks: int, layers, ortho_mu: float,
                 generator: torch.Generator):
        super().__init__()
        self.task_count, self.emb_d, self.key_d, self.n_tasks = 0, int(width), int(width), int(n_tasks)
        self.e_pool_size, self.e_p_length, self.e_layers = int(pool_size), int(length), [int(i) for i in layers]
        self.ortho_mu = float(ortho_mu)
        self.generator = generator
        for e in self.e_layers:  # the official __init__: p, k, a drawn uniform, then Gram-Schmidt of p, k, a
            p = uniform_prompt(generator, self.e_pool_size, self.e_p_length, width)
            k = uniform_prompt(generator, self.e_pool_size, self.key_d)
            a = uniform_prompt(generator, self.e_pool_size, self.key_d)
            for name, t in (("p", p), ("k", k), ("a", a)):
                setattr(self, f"e_{name}_{e}", t)
                self._reinit(t)

    def span(self) -> tuple[int, int]:
        """(s, f): the current task's components are [s, f)."""
        pt = int(self.e_pool_size / self.n_tasks)
        return int(self.task_count * pt), int((self.task_count + 1) * pt)

    def live_rows(self) -> int:
        """Components in use so far (past tasks' and the current task's): the rows update norms compare."""
        return self.span()[1]

    @torch.no_grad()
    def _reinit(self, t: nn.Parameter) -> None:
        t.copy_(gram_schmidt(t.detach(), *self.span(), self.generator))  # in place: the optimizer keeps it

    def process_task_count(self) -> None:
        """The next task: its components of K, A and P (in the official order) initialised by Gram-Schmidt."""
        self.task_count += 1
        for e in self.e_layers:
            for name in ("k", "a", "p"):
                self._reinit(getattr(self, f"e_{name}_{e}"))

    def layer(self, x_querry: torch.Tensor, li: int, train: bool = False, task_id=None):
        """([Ek, Ev] or None, loss) of layer `li`: models/zoo.py CodaPrompt.forward."""
        if li not in self.e_layers:
            return None, 0
        K, A, p = getattr(self, f"e_k_{li}"), getattr(self, f"e_a_{li}"), getattr(self, f"e_p_{li}")
        s, f = self.span()
        if train and self.task_count > 0:  # past components frozen
            K = torch.cat((K[:s].detach().clone(), K[s:f]), dim=0)
            A = torch.cat((A[:s].detach().clone(), A[s:f]), dim=0)
            p = torch.cat((p[:s].detach().clone(), p[s:f]), dim=0)
        elif train:
            K, A, p = K[s:f], A[s:f], p[s:f]
        else:
            K, A, p = K[0:f], A[0:f], p[0:f]
        a_querry = torch.einsum("bd,kd->bkd", x_querry, A)
        aq_k = torch.einsum("bkd,kd->bk", nn.functional.normalize(a_querry, dim=2), nn.functional.normalize(K, dim=1))
        P_ = torch.einsum("bk,kld->bld", aq_k, p)
        i = int(self.e_p_length / 2)
        loss = 0
        if train and self.ortho_mu > 0:
            loss = ortho_penalty(K) * self.ortho_mu
            loss += ortho_penalty(A) * self.ortho_mu
            loss += ortho_penalty(p.view(p.shape[0], -1)) * self.ortho_mu
        return [P_[:, :i, :], P_[:, i:, :]], loss

    def prefixes(self, q: torch.Tensor, train: bool = False, task_id=None):
        """({layer: (Pk, Pv)}, the summed loss of every prompted layer)."""
        out, loss = {}, 0
        for li in sorted(set(self.e_layers)):
            p, layer_loss = self.layer(q, li, train=train)
            out[li] = tuple(p)
            loss = loss + layer_loss
        return out, loss


def build_coda_prompt(ctx, e_layers, pool_size: int, ortho_mu: float, mask_past_classes: bool):
    """CODA-Prompt on the harness ViT (prefix tuning with attention-weighted prompt components)."""
    if int(pool_size) < ctx.n_tasks:
        raise ValueError(f"coda-prompt: pool_size = {pool_size} < {ctx.n_tasks} tasks; each task gets "
                         f"pool_size // n_tasks components; allowed: >= {ctx.n_tasks}")

    def make_pool(length: int, width: int, generator):
        half_length(length, f"coda-prompt: the regime's prompt length L ({ctx.regime})")
        return CodaPromptPool(width, length, int(pool_size), ctx.n_tasks, e_layers, float(ortho_mu), generator)

    return build_prompt_pool(ctx, make_pool, list(e_layers), mask_past_classes)


ADAPTERS = (
    MethodAdapter(
        "coda-prompt",
        {"e_layers": [0, 1, 2, 3, 4], "pool_size": 100, "ortho_mu": 0.0, "mask_past_classes": True},
        build_coda_prompt,
        "CODA-Prompt: prefix prompts as attention-weighted sums of learned components (keys, attention vectors), "
        "components of past tasks frozen, new ones Gram-Schmidt initialised; the regime's L is the prompt length",
        "Smith et al., CVPR 2023 (CODA-Prompt); official: github.com/GT-RIPL/CODA-Prompt (models/zoo.py)",
        family="prompt-pool",
        version="1",
        hparam_ranges={"pool_size": Range(low=1), "ortho_mu": Range(low=0)},
        regime_families=(Family.PROMPT,), regimes_allowed=regime_refusal,
        regime_note="a prompt pool trains its components and the heads on the frozen backbone; prompt-lL gives the "
                    "prompt length L (even: halves for keys and values), the pool replaces the VPT prompt",
        check_hparams={"e_layers": [0, 1, 2], "pool_size": 10},  # ViT-B/16's blocks 0-4 as vit-tiny's 0-2
    ),
)
