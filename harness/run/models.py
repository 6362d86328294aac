"""Backbones as an ordered list of named blocks plus per-task heads."""
from __future__ import annotations

from collections import OrderedDict

import torch
from avalanche.models.dynamic_modules import MultiTaskModule
from torch import nn

from ..api.plugins import Backbone, PluginError, lookup, register_builtins
from ..config.vocabulary import MODELS
from .precision import as_float, autocast


class CLNet(MultiTaskModule):
    """Blocks applied in order, then the head of the sample's task.

    `frozen_blocks` names blocks that a regime froze, `frozen_modules` the modules (by name
    inside `blocks`, e.g. a BatchNorm under LoRA) whose parameters and buffers it froze inside
    trainable blocks: `train()` keeps both in eval mode so their running statistics cannot
    drift while the rest trains.
    """

    def __init__(self, blocks: OrderedDict[str, nn.Module], feature_dim: int,
                 n_heads: int, head_classes: int):
        super().__init__()
        self.blocks = nn.ModuleDict(blocks)
        self.heads = nn.ModuleList(nn.Linear(feature_dim, head_classes) for _ in range(n_heads))
        self.head_classes = head_classes
        self.frozen_blocks: frozenset[str] = frozenset()
        self.frozen_modules: frozenset[str] = frozenset()

    @property
    def block_names(self) -> list[str]:
        """Block names, input side first."""
        return list(self.blocks.keys())

    def pixels(self, x: torch.Tensor) -> torch.Tensor:
        """The first block's input: uint8 pixels (the image data sets, harness/run/image_sets.py) as float / 255
        where x is (on its device), unless the first block takes pixels itself (`takes_pixels`: a ViT's input
        stage, which also normalises them); anything else unchanged."""
        if x.dtype != torch.uint8 or getattr(next(iter(self.blocks.values())), "takes_pixels", False):
            return x
        return x.float() / 255.0  # a division, not * (1/255): bitwise what a float copy of the data set holds

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Output of the last block (under the run's precision: harness/run/precision.py; float32 out)."""
        x = self.pixels(x)
        with autocast(self, x):
            for block in self.blocks.values():
                x = block(x)
        return as_float(x)

    def forward_single_task(self, x: torch.Tensor, task_label: int) -> torch.Tensor:
        with autocast(self, x):
            out = self.heads[self._head_index(task_label)](self.features(x))
        return as_float(out)

    def forward(self, x: torch.Tensor, task_labels=None):
        """Task-aware forward: one head per sample's task; `None` gives every known head."""
        with autocast(self, x):
            if task_labels is None:
                return as_float(self.forward_all_tasks(x))
            feats = self.features(x)
            if isinstance(task_labels, int):
                out = self.heads[self._head_index(task_labels)](feats)
            else:
                out = self.heads_forward(feats, task_labels)
        return as_float(out)

    def heads_forward(self, feats: torch.Tensor, task_labels: torch.Tensor) -> torch.Tensor:
        """Apply each sample's head to precomputed features."""
        if len(self.heads) == 1:
            return self.heads[0](feats)
        first = int(task_labels[0])
        if bool((task_labels == first).all()):  # the common case: a single-task batch
            return self.heads[first](feats)
        out = feats.new_zeros(feats.shape[0], self.head_classes)
        for task in torch.unique(task_labels).tolist():
            mask = task_labels == task
            # under bf16 autocast a head answers in bf16: the rows take the buffer's dtype (float32)
            out[mask] = self.heads[task](feats[mask]).to(out.dtype)
        return out

    def forward_all_tasks(self, x: torch.Tensor) -> dict:
        feats = self.features(x)
        return {t: self.heads[self._head_index(t)](feats) for t in self.known_train_tasks_labels}

    def adaptation(self, experience):
        # Heads are created up front; only remember which tasks exist (LwF distils them).
        if self.training:
            self.known_train_tasks_labels = self.known_train_tasks_labels | set(experience.task_labels)

    def _head_index(self, task_label: int) -> int:
        return 0 if len(self.heads) == 1 else int(task_label)

    def train(self, mode: bool = True):
        super().train(mode)
        for name in self.frozen_blocks:
            self.blocks[name].eval()
        for name in self.frozen_modules:
            self.blocks.get_submodule(name).eval()
        return self


def _mlp(input_shape, feature_dim: int = 100, batchnorm: bool = False) -> list[nn.Module]:
    in_dim = int(torch.tensor(input_shape).prod())
    depth = MODELS["mlp"].n_blocks
    dims = [in_dim] + [feature_dim] * depth
    blocks = []
    for i in range(depth):
        layers = [nn.Flatten()] if i == 0 else []
        layers += [nn.Linear(dims[i], dims[i + 1])]
        layers += [nn.BatchNorm1d(dims[i + 1])] if batchnorm else []
        blocks.append(nn.Sequential(*layers, nn.ReLU()))
    return blocks


def _mlp_bn(input_shape, feature_dim: int = 100) -> list[nn.Module]:
    """The MLP with BatchNorm after every linear layer: the features a frozen prefix hands a new
    head stay normalised (without it, a head trained by SGD on the ReLU features of a network
    fitted to one earlier task learns far less than those features allow; benchmarks/demo_tuning.py)."""
    return _mlp(input_shape, feature_dim, batchnorm=True)


def _conv_bn(c_in: int, c_out: int, pool: bool) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def _small_cnn(input_shape, width: int = 32, feature_dim: int = 128) -> list[nn.Module]:
    c, h, w = input_shape
    flat = 2 * width * (h // 8) * (w // 8)
    return [_conv_bn(c, width, pool=True), _conv_bn(width, 2 * width, pool=True),
            _conv_bn(2 * width, 2 * width, pool=True),
            nn.Sequential(nn.Flatten(), nn.Linear(flat, feature_dim), nn.ReLU())]


def _conv1d_bn(c_in: int, c_out: int, kernel: int) -> list[nn.Module]:
    return [nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2, bias=False), nn.BatchNorm1d(c_out), nn.ReLU(),
            nn.MaxPool1d(2)]


def _cnn1d(input_shape, width: int = 16, feature_dim: int = 100) -> list[nn.Module]:
    """small-cnn's design for 1-D signals such as mnist1d's (an MLP leaves some mnist1d class pairs
    at chance; benchmarks/demo_tuning.py): conv blocks of width w, 2w, 2w with max-pooling, then one
    fc block, all with BatchNorm (normalised features for a head trained on a frozen prefix, as in
    mlp-bn). Strided convolutions instead of the pools were 28% cheaper per mnist1d run but left a
    first task 12 points below its probe in every run of one task order."""
    length = int(input_shape[-1])
    channels = int(input_shape[0]) if len(input_shape) == 2 else 1
    first = [nn.Unflatten(1, (1, length))] if len(input_shape) == 1 else []
    flat = 2 * width * (length // 8)
    return [nn.Sequential(*first, *_conv1d_bn(channels, width, 5)), nn.Sequential(*_conv1d_bn(width, 2 * width, 3)),
            nn.Sequential(*_conv1d_bn(2 * width, 2 * width, 3)),
            nn.Sequential(nn.Flatten(), nn.Linear(flat, feature_dim), nn.BatchNorm1d(feature_dim), nn.ReLU())]


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs with BatchNorm and a shortcut)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def _reduced_resnet18(input_shape, nf: int = 20) -> list[nn.Module]:
    """The reduced ResNet-18 of Lopez-Paz & Ranzato (2017): width nf=20 instead of 64."""
    c = input_shape[0]
    blocks = [nn.Sequential(nn.Conv2d(c, nf, 3, 1, 1, bias=False), nn.BatchNorm2d(nf), nn.ReLU())]
    widths, c_in = [nf, 2 * nf, 4 * nf, 8 * nf], nf
    for i, width in enumerate(widths):
        stride = 1 if i == 0 else 2
        blocks.append(nn.Sequential(BasicBlock(c_in, width, stride), BasicBlock(width, width, 1)))
        c_in = width
    return blocks


def _torchvision_resnet18(input_shape) -> list[nn.Module]:
    """torchvision's ResNet-18 split into stem + 4 stages (harness/run/resnet.py maps its weights)."""
    from .resnet import resnet18_blocks

    return resnet18_blocks(input_shape)


def _vit(name: str):
    """The builder of timm ViT `name` (harness/run/vit.py: embed, block1..blockN, norm)."""
    def build(input_shape) -> list[nn.Module]:
        from .vit import vit_blocks

        return vit_blocks(name, input_shape)

    build.__name__ = build.__qualname__ = f"_vit_{name.replace('-', '_')}"
    return build


def _vit_width(name: str) -> int:
    return 32 if name == "vit-tiny" else 768


def _token_pool() -> nn.Module:
    from .vit import Pool

    return Pool()


def _pool() -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _builtin(name: str, build, input_shape: tuple, feature_dim, tail=None) -> Backbone:
    """A built-in backbone: its facts (blocks, description, norm and bias blocks, the sample shapes it
    takes) are the vocabulary's."""
    facts = MODELS[name]
    return Backbone(name, build, facts.blocks, input_shape, facts.description, facts.norm_blocks,
                    facts.bias_blocks, feature_dim, tail or {}, accepts=facts.accepts, token_blocks=facts.token_blocks)


# The built-in backbones, declared as a plug-in file declares its own (harness/api/plugins.py).
PLUGINS = register_builtins(
    _builtin("mlp", _mlp, (1, 8, 8), lambda kw: kw.get("feature_dim", 100)),
    _builtin("mlp-bn", _mlp_bn, (1, 8, 8), lambda kw: kw.get("feature_dim", 100)),
    _builtin("small-cnn", _small_cnn, (1, 28, 28), lambda kw: kw.get("feature_dim", 128)),
    _builtin("cnn1d", _cnn1d, (40,), lambda kw: kw.get("feature_dim", 100)),
    _builtin("resnet18-reduced", _reduced_resnet18, (3, 32, 32), lambda kw: 8 * kw.get("nf", 20), {"pool": _pool}),
    _builtin("resnet18", _torchvision_resnet18, (3, 32, 32), 512, {"pool": _pool}),
    _builtin("vit-tiny", _vit("vit-tiny"), (1, 8, 8), _vit_width("vit-tiny"), {"pool": _token_pool}),
    _builtin("vit-b16", _vit("vit-b16"), (3, 224, 224), _vit_width("vit-b16"), {"pool": _token_pool}),
    _builtin("vit-b16-clip", _vit("vit-b16-clip"), (3, 224, 224), _vit_width("vit-b16-clip"),
             {"pool": _token_pool}),
)
# Blocks without parameters cannot be "trained", so regimes count only parametrised blocks.
_PARAMETER_FREE = {"pool"}


def build_model(name: str, input_shape, n_heads: int, head_classes: int, **kwargs) -> CLNet:
    """Build the named backbone (built-in or plug-in) with `n_heads` heads of `head_classes` outputs."""
    found = lookup("backbone", name)
    backbone = found.plugin
    modules = list(backbone.build(tuple(input_shape), **kwargs))
    if len(modules) != len(backbone.blocks) or not all(isinstance(m, nn.Module) for m in modules):
        raise PluginError(f"{found.source}: backbone {name!r}: build returned {_kinds(modules)} for the "
                          f"{len(backbone.blocks)} blocks {', '.join(backbone.blocks)}; allowed: one torch "
                          "module per block, input side first")
    blocks = OrderedDict(zip(backbone.blocks, modules))
    blocks.update((block, make()) for block, make in backbone.tail.items())
    return CLNet(blocks, _feature_dim(backbone, blocks, tuple(input_shape), kwargs), n_heads, head_classes)


def _kinds(modules: list) -> str:
    return f"{len(modules)} value(s) ({', '.join(sorted({type(m).__name__ for m in modules}))})"


def _feature_dim(backbone: Backbone, blocks: OrderedDict, input_shape: tuple, kwargs: dict) -> int:
    """The declared width of the features, else the last block's output width on a zero batch (eval mode,
    no gradient: no statistics move and no random number is drawn)."""
    declared = backbone.feature_dim
    if declared is not None:
        return declared(kwargs) if callable(declared) else int(declared)
    modes = {m: m.training for block in blocks.values() for m in block.modules()}
    x = torch.zeros((2, *input_shape))
    try:
        with torch.no_grad():
            for block in blocks.values():
                x = block.eval()(x)
    finally:
        for module, mode in modes.items():
            module.training = mode
    if x.ndim != 2:
        raise PluginError(f"backbone {backbone.name!r}: the last block's output has shape {tuple(x.shape[1:])} per "
                          "sample; allowed: flat features (batch, width) the heads read (end with nn.Flatten())")
    return int(x.shape[1])


def trainable_block_names(model: CLNet) -> list[str]:
    """Blocks that carry parameters, input side first (the units a depth regime counts)."""
    return [n for n in model.block_names
            if n not in _PARAMETER_FREE and any(True for _ in model.blocks[n].parameters())]


def shared_effective_weights(model: CLNet) -> dict[str, torch.Tensor]:
    """The blocks' effective weights by plain name (W + BA under LoRA; the parameters otherwise)."""
    from ..api.subspace import effective_weights

    return effective_weights(model)
