"""DualPrompt (Wang et al., ECCV 2022) as GT-RIPL/CODA-Prompt implements it (models/zoo.py DualPrompt,
learners/prompt.py; experiments/*.sh `--prompt_param 10 20 6`), by prefix tuning of the frozen pretrained ViT.

A G-prompt (shared by all tasks) at each layer of `g_layers` and an E-prompt pool (one prompt and one key per
task) at each layer of `e_layers`; each prompt of L tokens is split in halves, the first L/2 the prefix keys,
the rest the prefix values (methods/_prompt_pool.py). The query is the frozen model's [CLS] feature. Training
on task t uses E-prompt t (the task index, `task_id_bootstrap`) and adds the pull constraint
sum over the batch of (1 - cos(q, k_t)) per E-layer (no coefficient, as the official learner adds
`prompt_loss.sum()`); at test time each E-layer takes the prompt whose key is the most cosine-similar to the
query (top-1, each layer with its own keys). Prompts and keys: uniform [0, 1) init (`tensor_prompt`).
L: the regime's `prompt-lL` (E-prompt length; official 20); `g_length`: 6; layers (0-based transformer
blocks): G [0, 1], E [2, 3, 4] (official; vit-tiny has 3 blocks, its protocols set them); `e_pool_size`: 0
means one per task (the official scripts set it to the number of tasks, 10).

Where the two official codes differ, this follows GT-RIPL/CODA-Prompt; the PyTorch port of the JAX original
(JH-LEE-KR/dualprompt-pytorch) differs in: one key set shared by the E-layers (one selection per sample, not
per layer); prompt length counted per keys and per values (its 5 = 5 keys + 5 values, not split); uniform
[-1, 1) init; pull constraint = coeff (1.0) x the batch *mean* of the cosine, subtracted; at test time the
batch's majority prompt (`batchwise_prompt`); in training the logits of every class outside the current task
masked (here: the past tasks' classes; the harness loss already excludes classes not seen yet: the same).
Harness deviations: the protocol's optimizer, schedule, epochs and batch size (official: Adam 1e-3, cosine,
20 epochs on CIFAR-100, batch 128); heads as the harness builds them; pool init from the run's own generator.
"""
from __future__ import annotations

import torch
from torch import nn

from ..api.contract import MethodAdapter, Range
from ..config.vocabulary import Family
from ._prompt_pool import build_prompt_pool, half_length, regime_refusal, uniform_prompt


class DualPromptPool(nn.Module):
    """G-prompts `g_p_<l>` (g_length, D), E-prompts `e_p_<l>` (pool, L, D) and keys `e_k_<l>` (pool, D) per layer
    (the official attribute names); `layer(q, l, train, task_id)` is the official forward of one layer."""

    def __init__(self, width: int, e_length: int, g_length: int, pool_size: int, g_layers, e_layers,
                 generator: torch.Generator, top_k: int = 1):
        super().__init__()
        self.task_count, self.top_k, self.emb_d = 0, int(top_k), int(width)
        self.g_layers, self.e_layers = [int(i) for i in g_layers], [int(i) for i in e_layers]
        self.g_p_length, self.e_p_length, self.e_pool_size = int(g_length), int(e_length), int(pool_size)
        for g in self.g_layers:  # the official init order: every G-prompt, then each layer's E-prompts and keys
            setattr(self, f"g_p_{g}", uniform_prompt(generator, self.g_p_length, width))
        for e in self.e_layers:
            setattr(self, f"e_p_{e}", uniform_prompt(generator, self.e_pool_size, self.e_p_length, width))
            setattr(self, f"e_k_{e}", uniform_prompt(generator, self.e_pool_size, width))

    def process_task_count(self) -> None:
        """The next task starts (DualPrompt keeps nothing per task beyond the index it is given)."""
        self.task_count += 1

    def layer(self, x_querry: torch.Tensor, li: int, train: bool = False, task_id: int | None = None):
        """([Pk, Pv] or None, loss) of layer `li`: models/zoo.py DualPrompt.forward (task_id_bootstrap)."""
        loss = 0
        e_valid = li in self.e_layers
        if e_valid:
            B = x_querry.shape[0]
            K, p = getattr(self, f"e_k_{li}"), getattr(self, f"e_p_{li}")
            cos_sim = torch.einsum("bj,kj->bk", nn.functional.normalize(x_querry, dim=1).detach(),
                                   nn.functional.normalize(K, dim=1))
            i = int(self.e_p_length / 2)
            if train:  # the task's own E-prompt, its key pulled to the query
                loss = (1.0 - cos_sim[:, task_id]).sum()
                P_ = p[task_id].expand(len(x_querry), -1, -1)
                Ek, Ev = P_[:, :i, :].reshape((B, -1, self.emb_d)), P_[:, i:, :].reshape((B, -1, self.emb_d))
            else:
                P_ = p[torch.topk(cos_sim, self.top_k, dim=1).indices]
                Ek, Ev = P_[:, :, :i, :].reshape((B, -1, self.emb_d)), P_[:, :, i:, :].reshape((B, -1, self.emb_d))
        g_valid = li in self.g_layers
        if g_valid:
            j = int(self.g_p_length / 2)
            P_ = getattr(self, f"g_p_{li}").expand(len(x_querry), -1, -1)
            Gk, Gv = P_[:, :j, :], P_[:, j:, :]
        if e_valid and g_valid:
            return [torch.cat((Ek, Gk), dim=1), torch.cat((Ev, Gv), dim=1)], (loss if train else 0)
        if e_valid:
            return [Ek, Ev], (loss if train else 0)
        if g_valid:
            return [Gk, Gv], 0
        return None, 0

    def prefixes(self, q: torch.Tensor, train: bool = False, task_id: int | None = None):
        """({layer: (Pk, Pv)}, the summed loss of every prompted layer)."""
        out, loss = {}, 0
        for li in sorted(set(self.g_layers) | set(self.e_layers)):
            p, layer_loss = self.layer(q, li, train=train, task_id=task_id)
            out[li] = tuple(p)
            loss = loss + layer_loss
        return out, loss


def build_dualprompt(ctx, g_layers, e_layers, g_length: int, e_pool_size: int, top_k: int,
                     mask_past_classes: bool):
    """DualPrompt on the harness ViT (prefix tuning; G- and E-prompts; E-prompt pool of one per task)."""
    pool_size = int(e_pool_size) or ctx.n_tasks
    if pool_size < ctx.n_tasks:
        raise ValueError(f"dualprompt: e_pool_size = {e_pool_size} < {ctx.n_tasks} tasks; training task t uses "
                         "E-prompt t (the official task_id_bootstrap); allowed: 0 (one per task) or >= the tasks")
    if not 1 <= int(top_k) <= pool_size:
        raise ValueError(f"dualprompt: top_k = {top_k}; allowed: 1..{pool_size} (the E-prompt pool's size)")
    if g_layers:
        half_length(int(g_length), "dualprompt: g_length")

    def make_pool(length: int, width: int, generator):
        half_length(length, f"dualprompt: the regime's prompt length L ({ctx.regime})")
        return DualPromptPool(width, length, int(g_length), pool_size, g_layers, e_layers, generator, int(top_k))

    return build_prompt_pool(ctx, make_pool, [*g_layers, *e_layers], mask_past_classes)


ADAPTERS = (
    MethodAdapter(
        "dualprompt",
        {"g_layers": [0, 1], "e_layers": [2, 3, 4], "g_length": 6, "e_pool_size": 0, "top_k": 1,
         "mask_past_classes": True},
        build_dualprompt,
        "DualPrompt: prefix-tuned G-prompt (shared) and E-prompt pool (one per task, chosen by key-query "
        "matching at test time) on the frozen pretrained ViT; the regime's L is the E-prompt length",
        "Wang et al., ECCV 2022 (DualPrompt); official: github.com/google-research/l2p (JAX), as in "
        "github.com/GT-RIPL/CODA-Prompt models/zoo.py (followed) and github.com/JH-LEE-KR/dualprompt-pytorch",
        family="prompt-pool",
        version="1",
        hparam_ranges={"g_length": Range(low=0), "e_pool_size": Range(low=0), "top_k": Range(low=1)},
        regime_families=(Family.PROMPT,), regimes_allowed=regime_refusal,
        regime_note="a prompt pool trains its prompts and the heads on the frozen backbone; prompt-lL gives the "
                    "E-prompt length L (even: halves for keys and values), the pool replaces the VPT prompt",
        check_hparams={"g_layers": [0], "e_layers": [1, 2]},  # ViT-B/16's blocks 0-4 as vit-tiny's 0-2
    ),
)
