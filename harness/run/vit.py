"""Vision transformers (timm's VisionTransformer) as cl-bench blocks, and timm state dicts mapped onto them.

The blocks (vocabulary MODELS["vit-*"]): `embed` = the input stage (uint8 pixels -> /255 -> the weights'
mean/std; any image size resized to the model's on the device, batched) + timm's PatchEmbed + class token
+ position embedding (+ CLIP's norm_pre), giving (B, 1+P, D) with the class token at index 0; then
`block1`..`blockN` (timm Blocks, subclassed by `PromptBlock` for the prompt API of harness/api/prompts.py);
`norm` (the final LayerNorm); models.PLUGINS adds the parameter-free `pool` (token 0 -> (B, D)). So
CLNet.features computes exactly timm's `forward_head(forward_features(x), pre_logits=True)` with token
pooling. Every module keeps timm's name inside its block, so a timm key maps by a prefix:
`patch_embed.proj.weight` -> `blocks.embed.patch_embed.proj.weight`, `blocks.3.attn.qkv.weight` ->
`blocks.block4.attn.qkv.weight`, `norm.weight` -> `blocks.norm.weight`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import timm
import torch
from timm.models.vision_transformer import Block
from torch import nn
from torch.nn import functional as F

from ..config.errors import PretrainError
from ..config.vocabulary import MODELS

CLS_TOKENS = 1  # timm's ViTs here have one class token and no register tokens
INCEPTION_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # timm's cfg of the augreg in21k weights
CLIP_MEAN_STD = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))  # OPENAI_CLIP_*


@dataclass(frozen=True)
class VitConfig:
    """What a cl-bench ViT is built as: timm's architecture name and the arguments that differ from it."""

    arch: str  # the timm model whose architecture this is (timm.create_model name)
    mean_std: tuple
    img_size: int | None = None  # None: the sample's own size (vit-tiny)
    kwargs: tuple = ()  # extra keyword arguments to timm.create_model, as (key, value) pairs


VIT_CONFIGS = {
    # timm's jax init (xavier Linear layers): under timm's default (std 0.02) a model this narrow starts with
    # class-token features nearly equal across samples, and SGD (lr 0.01 or 0.05, momentum 0.9, 4 epochs of
    # digits) left it at chance; with the jax init the same runs reach 52% (Adam: 62% either way).
    "vit-tiny": VitConfig("vit_tiny_patch16_224", INCEPTION_MEAN_STD,
                          kwargs=(("embed_dim", 32), ("num_heads", 2), ("mlp_ratio", 2.0), ("weight_init", "jax"))),
    "vit-b16": VitConfig("vit_base_patch16_224", INCEPTION_MEAN_STD, 224),
    # The OpenAI CLIP tower is natively QuickGELU (timm's note on `.openai`): built so, its features are CLIP's.
    "vit-b16-clip": VitConfig("vit_base_patch16_clip_224", CLIP_MEAN_STD, 224,
                              (("act_layer", "quick_gelu"),)),
}
TINY_GRID = 4  # vit-tiny's patch size is min(H, W) // TINY_GRID: 4x4 patches on a square sample


def depth(name: str) -> int:
    """The number of transformer blocks of the ViT `name` (its vocabulary facts' token blocks)."""
    return len(MODELS[name].token_blocks)


class PromptBlock(Block):
    """timm's transformer Block with the prompt API (harness/api/prompts.py): `embed_dim`, `prefix_tokens`,
    `prompt`, `add_prompt(n_tokens, replace)`; without a prompt it computes exactly timm's Block."""

    lora_targets = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")  # regimes._inject_lora: attention and MLP

    def __init__(self, dim: int, *args, patch_area: int = 1, **kwargs):
        super().__init__(dim, *args, **kwargs)
        self.embed_dim = int(dim)
        self.prefix_tokens = CLS_TOKENS
        self.patch_area = int(patch_area)
        self.prompt_replace = False
        self.register_parameter("prompt", None)

    def add_prompt(self, n_tokens: int, replace: bool) -> None:
        """Create `prompt` (n_tokens, D), VPT's uniform(-v, v) init with v = sqrt(6 / (3 * patch_area + D))."""
        bound = math.sqrt(6.0 / (3 * self.patch_area + self.embed_dim))
        ref = self.norm1.weight
        self.prompt = nn.Parameter(torch.empty(int(n_tokens), self.embed_dim, device=ref.device,
                                               dtype=ref.dtype).uniform_(-bound, bound))
        self.prompt_replace = bool(replace)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if self.prompt is not None:
            p, n = self.prefix_tokens, self.prompt.shape[0]
            rest = x[:, p + n:] if self.prompt_replace else x[:, p:]
            x = torch.cat((x[:, :p], self.prompt.to(x.dtype).expand(x.shape[0], -1, -1), rest), dim=1)
        return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)


class InputStage(nn.Module):
    """uint8 pixels -> float / 255 -> (x - mean) / std; float input is taken as normalised; then a batched,
    antialiased bilinear resize to `img_size` when the sample's size differs."""

    def __init__(self, mean, std, img_size: tuple[int, int]):
        super().__init__()
        # Not persistent: constants of the weights, not part of a state dict (timm's files have none).
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.img_size = tuple(int(s) for s in img_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = (x.float() / 255.0 - self.mean) / self.std
        if tuple(x.shape[-2:]) != self.img_size:
            x = F.interpolate(x, size=self.img_size, mode="bilinear", align_corners=False, antialias=True)
        return x


class Embed(nn.Module):
    """The input stage, timm's patch embedding, class token, position embedding and norm_pre (timm's names)."""

    takes_pixels = True
    lora_targets = ()  # no adapter on the patch-embedding conv (regimes._inject_lora)

    def __init__(self, vit, mean, std):
        super().__init__()
        self.input = InputStage(mean, std, vit.patch_embed.img_size)
        self.patch_embed = vit.patch_embed
        self.cls_token = vit.cls_token
        self.pos_embed = vit.pos_embed
        self.pos_drop = vit.pos_drop
        self.norm_pre = vit.norm_pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(self.input(x))
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)  # timm's _pos_embed (cat promotes)
        return self.norm_pre(self.pos_drop(x + self.pos_embed))


class Pool(nn.Module):
    """Token pooling: the class token (index 0) of (B, T, D) as (B, D); no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


def _tiny_patch(input_shape) -> int:
    return max(1, min(int(input_shape[-2]), int(input_shape[-1])) // TINY_GRID)


def timm_kwargs(name: str, input_shape) -> dict:
    """timm.create_model's keyword arguments that build cl-bench's `name` (with the prompt block) for samples of
    `input_shape`: no classifier, token pooling."""
    cfg = VIT_CONFIGS[name]
    patch = _tiny_patch(input_shape) if cfg.img_size is None else None
    img = tuple(int(d) for d in input_shape[-2:]) if cfg.img_size is None else (cfg.img_size, cfg.img_size)
    area = (patch or 16) ** 2
    out = dict(cfg.kwargs, depth=depth(name), num_classes=0, global_pool="token", img_size=img,
               in_chans=int(input_shape[0]), block_fn=partial(PromptBlock, patch_area=area))
    if patch is not None:
        out["patch_size"] = patch
    return out


def mean_std(name: str, channels: int) -> tuple[tuple, tuple]:
    """The weights' per-channel mean and std; for other than 3 channels their average on every channel."""
    mean, std = VIT_CONFIGS[name].mean_std
    if len(mean) == channels:
        return mean, std
    return (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels


def timm_model(name: str, input_shape, **create):
    """timm's VisionTransformer of cl-bench's `name` (random init unless `create` asks timm for weights)."""
    arch = create.pop("tag", None) or VIT_CONFIGS[name].arch
    return timm.create_model(arch, **timm_kwargs(name, input_shape), **create)


def load_timm_file(name: str, input_shape, path, tag: str | None = None) -> dict:
    """The `blocks.*` state of cl-bench's ViT `name` with the weights file `path` (a download or a harness-made
    file alike), loaded by timm's own code: timm.create_model(tag, pretrained=True) with the file as its
    pretrained source (timm drops the classifier, adapts the input conv to the channels, resamples position
    embeddings); never the network."""
    vit = timm_model(name, tuple(input_shape), tag=tag, pretrained=True,
                     pretrained_cfg_overlay=dict(file=str(path)))
    return timm_to_blocks(vit.state_dict(), depth(name))


def split_blocks(name: str, vit, input_shape) -> list[nn.Module]:
    """A timm VisionTransformer as the cl-bench blocks embed, block1..blockN, norm (its own modules)."""
    mean, std = mean_std(name, int(input_shape[0]))
    return [Embed(vit, mean, std), *vit.blocks, vit.norm]


def vit_blocks(name: str, input_shape) -> list[nn.Module]:
    """cl-bench's ViT `name` (random init, timm's) for samples of `input_shape`."""
    return split_blocks(name, timm_model(name, tuple(input_shape)), tuple(input_shape))


FINAL_NORM = "norm"  # timm's name of the final LayerNorm, which is also its cl-bench block's name
_EMBED_KEYS = ("patch_embed", "cls_token", "pos_embed", "norm_pre")
_DROPPED = ("head", "fc_norm", "head_drop")  # the classifier (and its norm, Identity here): heads replace it


def timm_to_blocks(state_dict: dict, depth: int) -> dict:
    """A timm VisionTransformer state dict as `blocks.*` keys of build_model("vit-*"); the classifier is dropped."""
    out = {}
    for key, tensor in state_dict.items():
        head, _, rest = key.partition(".")
        if head in _DROPPED:
            continue
        if head in _EMBED_KEYS:
            out[f"blocks.embed.{key}"] = tensor
        elif head == FINAL_NORM:
            out[f"blocks.{key}"] = tensor
        elif head == "blocks" and rest.split(".")[0].isdigit() and int(rest.split(".")[0]) < depth:
            index, _, tail = rest.partition(".")
            out[f"blocks.block{int(index) + 1}.{tail}"] = tensor
        else:
            raise PretrainError(f"timm ViT weights: unexpected key {key!r}; allowed: patch_embed, cls_token, "
                                f"pos_embed, norm_pre, blocks.0..{depth - 1}, norm and head keys "
                                "(a timm VisionTransformer state dict)")
    return out


def blocks_to_timm(state_dict: dict) -> dict:
    """The inverse of timm_to_blocks for `blocks.*` keys (heads are dropped): a timm VisionTransformer's keys."""
    out = {}
    for key, tensor in state_dict.items():
        if not key.startswith("blocks."):
            continue
        block, _, rest = key[len("blocks."):].partition(".")
        if block == "embed":
            out[rest] = tensor
        elif block == FINAL_NORM:
            out[f"norm.{rest}"] = tensor
        elif block.startswith("block"):
            out[f"blocks.{int(block[len('block'):]) - 1}.{rest}"] = tensor
    return out
