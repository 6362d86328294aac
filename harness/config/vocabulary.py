"""The one vocabulary of cl-bench, defined once and importable without torch.

Every name a protocol, a record, the CLI or the leaderboard uses is defined here: run
statuses, scenarios (the `pretrain:` forms: config/pretrain.py), the regime grammar, the backbones' blocks,
the data sets' facts, optimizers, the name pattern and the entry-point group (the metrics
have their own table, config/metrics.py). Modules that need one of them import it from here
rather than restating it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from .shapes import ANY_SHAPE, InputShapes, shape_problem


# -- runs and protocols -------------------------------------------------------------------
# StrEnums: a member is its string (== "ok", json.dumps writes "ok"), so records, specs and run
# ids serialise exactly as the plain strings did.
class Status(StrEnum):
    """How a run ended; every run leaves a record, whatever its status."""

    OK = "ok"
    FAILED = "failed"  # the method or the harness raised; the error is recorded
    DIVERGED = "diverged"  # the loss became NaN or inf
    TIMEOUT = "timeout"  # the timeout executor stopped the run past its limit


class Scenario(StrEnum):
    """Task-incremental (one head per task, task id given) or class-incremental (one growing head)."""

    TASK_IL = "task-il"
    CLASS_IL = "class-il"
OPTIMIZERS = ("sgd", "adam", "adamw")

# Names appear in comma-separated CLI filters, folder and file names and URLs of the site.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 100  # a protocol name is a folder under --results: keep it well below NAME_MAX
NAME_RULE = f"up to {MAX_NAME} letters, digits, '.', '_', '-'"
ENTRY_POINT_GROUP = "cl_bench.methods"
# Plug-ins beyond methods (harness/api/plugins.py): the entry-point group of each kind.
PLUGIN_GROUPS = {"backbone": "cl_bench.backbones", "dataset": "cl_bench.datasets", "regime": "cl_bench.regimes"}


def is_valid_name(name) -> bool:
    """True for a string matching NAME_PATTERN of at most MAX_NAME characters."""
    return isinstance(name, str) and bool(NAME_PATTERN.match(name)) and len(name) <= MAX_NAME


# -- learning checks ----------------------------------------------------------------------
# Learning checks (harness/run/checks.py): a record with any of these warnings is flagged.
WARNINGS = {
    "chance": "a task's accuracy right after training it is at chance level",
    "below-probe": "learning accuracy far below a linear probe on the same features",
    "loss-flat": "the training loss of a task never fell",
}


# -- regimes ------------------------------------------------------------------------------
# A regime is a trainable subspace: a depth (which shared blocks train) and a family (what in
# those blocks trains). Heads always train. `head` trains no shared block; `full` and the
# families without a depth prefix act on every shared block.
class Family(StrEnum):
    """What a regime trains within its blocks (the order is the sort order of regime names)."""

    DEPTH = "depth"
    BITFIT = "bitfit"
    NORM = "norm"
    LORA = "lora"
    PROMPT = "prompt"
    PROMPT_DEEP = "prompt-deep"


REGIME_FAMILIES = tuple(Family)  # the built-in families; plug-in families register beside them
FAMILY_DESCRIPTIONS = {
    Family.DEPTH: "every parameter of the trainable blocks (head, last-k, full)",
    Family.BITFIT: "the biases of the trainable blocks (BatchNorm's shift included), base weights frozen",
    Family.NORM: "the affine scale and shift of the normalisation layers of the trainable blocks",
    Family.LORA: ("rank-R adapters (peft LoRA) on every Linear/Conv of the trainable blocks (on a ViT: attention "
                  "and MLP layers), base frozen"),
    Family.PROMPT: "L prompt tokens prepended at the input of the first transformer block (VPT-shallow), "
                   "backbone frozen",
    Family.PROMPT_DEEP: "L prompt tokens at every transformer block of the trainable blocks (VPT-deep: the first "
                        "prepends, each later one replaces the previous block's), backbone frozen",
}
MAX_LORA_RANK = 4096  # the largest argument of lora and of a plug-in family
MAX_PROMPT_TOKENS = 1024  # the largest L of the prompt families (VPT's largest is 200; a ViT has 197 tokens)
REGIME_GRAMMAR = ("head, full, last-k, bitfit, norm, lora-rR, prompt-lL, prompt-deep-lL, or last-k:bitfit, "
                  "last-k:norm, last-k:lora-rR, last-k:prompt-deep-lL (k >= 1 up to the model's depth, "
                  f"R >= 1, 1 <= L <= {MAX_PROMPT_TOKENS})")
# The subspace families' grammar: the letter of a family's integer argument (`lora-r4`), None for a
# family written by its name alone. Plug-in families (harness/api/plugins.py) add theirs.
FAMILY_ARGUMENTS: dict[Family | str, str | None] = {Family.BITFIT: None, Family.NORM: None, Family.LORA: "r",
                                                    Family.PROMPT: "l", Family.PROMPT_DEEP: "l"}
# The largest argument of a family (MAX_LORA_RANK for one not listed).
FAMILY_MAXIMA: dict[Family | str, int] = {Family.PROMPT: MAX_PROMPT_TOKENS, Family.PROMPT_DEEP: MAX_PROMPT_TOKENS}
# Families acting at the input alone: no depth composes with them (`last-k:prompt-lL` is refused).
INPUT_FAMILIES = (Family.PROMPT,)
# Families that put tokens into a backbone's token_blocks (its transformer blocks).
TOKEN_FAMILIES = (Family.PROMPT, Family.PROMPT_DEEP)
HEAD, FULL, LAST = "head", "full", "last"  # the depth words: `head`, `full`, `last-k`
# Reserved by the grammar: a plug-in family cannot take these names (harness/api/plugins.py checks).
GRAMMAR_WORDS = (HEAD, FULL, LAST, Family.DEPTH)
_LAST_K = re.compile(rf"^{LAST}-([1-9][0-9]*)$")
# A family's name (words joined by '-', e.g. prompt-deep), then its argument `-<letter>N` if it takes one: the
# name is matched lazily, so `prompt-deep-l4` is prompt-deep with l = 4 and `bitfit` has no argument.
_FAMILY = re.compile(r"^([a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*?)(?:-([a-z])([1-9][0-9]*))?$")


@dataclass(frozen=True)
class Regime:
    """A parsed regime name: `depth` shared blocks train (None: all of them; 0: `head`), and within
    them what `family` selects (`rank`: the family's integer argument, lora's rank R)."""

    name: str
    depth: int | None
    family: Family | str  # a plug-in family is its registered name
    rank: int | None = None

    def blocks(self, n_blocks: int) -> int:
        """Number of trainable blocks on a backbone of `n_blocks` (head = 0, all = n_blocks)."""
        return n_blocks if self.depth is None else self.depth


def parse_regime(name) -> Regime:
    """Parse a regime name of REGIME_GRAMMAR; anything else raises ValueError naming the grammar."""
    text = str(name)
    if text == HEAD:
        return Regime(text, 0, Family.DEPTH)
    if text == FULL:
        return Regime(text, None, Family.DEPTH)
    prefix, sep, rest = text.partition(":")
    depth_match = _LAST_K.match(prefix)
    if sep:
        if not depth_match or ":" in rest:
            raise ValueError(f"unknown regime {text!r}; allowed: {REGIME_GRAMMAR}")
        family = _family_part(rest, text)
        if family[0] in INPUT_FAMILIES:
            raise ValueError(f"regime {text!r} is not allowed: {family[0]}-lL puts its prompt tokens at the input "
                             f"only, so no depth composes with it; allowed: {family[0]}-lL, or "
                             f"{Family.PROMPT_DEEP}-lL and last-k:{Family.PROMPT_DEEP}-lL (prompts at every "
                             "transformer block of the last k blocks)")
        return Regime(text, int(depth_match.group(1)), family[0], family[1])
    if depth_match:
        return Regime(text, int(depth_match.group(1)), Family.DEPTH)
    family, rank = _family_part(text, text)
    return Regime(text, None, family, rank)


def _family_part(part: str, whole: str) -> tuple[Family | str, int | None]:
    match = _FAMILY.match(part)
    if match and match.group(1) in FAMILY_ARGUMENTS and FAMILY_ARGUMENTS[match.group(1)] == match.group(2):
        argument = int(match.group(3)) if match.group(3) else None
        if argument is None or argument <= FAMILY_MAXIMA.get(match.group(1), MAX_LORA_RANK):
            return _as_family(match.group(1)), argument
    plugins = [f for f in FAMILY_ARGUMENTS if f not in REGIME_FAMILIES]
    also = f"; plug-in families: {', '.join(plugins)}" if plugins else ""
    raise ValueError(f"unknown regime {whole!r}; allowed: {REGIME_GRAMMAR}{also}")


def runs_under_family(family: str, declared) -> bool:
    """A method runs under the families it declares; one declaring every built-in family also under
    plug-in families (it does not depend on which parameters train)."""
    return family in declared or (family not in REGIME_FAMILIES and set(REGIME_FAMILIES) <= set(declared))


def _as_family(name: str) -> Family | str:
    """A built-in family as its enum member; a plug-in family stays its registered name."""
    return Family(name) if name in REGIME_FAMILIES else name


def is_regime_name(name) -> bool:
    """True for a name of REGIME_GRAMMAR."""
    return regime_error(name) is None


def regime_error(name) -> str | None:
    """Why `name` is not a regime of REGIME_GRAMMAR (one line naming it and what is allowed), else None."""
    try:
        parse_regime(name)
    except ValueError as exc:
        return str(exc)
    return None


def regime_family(name: str) -> Family | str:
    """The regime's family: depth, bitfit, norm, lora (a Family) or a plug-in family (its name)."""
    return parse_regime(name).family


def written_family(name) -> Family | str | None:
    """The family a regime name is written with, read by the grammar alone, so a plug-in family need
    not be registered in this process (records are analysed where their plug-ins are not loaded);
    None for a name outside the grammar (a registered family with a wrong argument included)."""
    try:
        return parse_regime(name).family
    except ValueError:
        pass
    prefix, sep, rest = str(name).partition(":")
    match = _FAMILY.match(rest if sep else prefix)
    if (sep and not _LAST_K.match(prefix)) or not match:
        return None
    word = match.group(1)  # a plug-in family's name has no '-' (only built-ins, such as prompt-deep, do)
    return None if word in FAMILY_ARGUMENTS or word in GRAMMAR_WORDS or "-" in word else word


def regime_depth(name: str, n_blocks: int) -> int:
    """Number of shared blocks the regime acts on (head = 0, full and unprefixed families = n_blocks)."""
    regime = parse_regime(name)
    k = regime.blocks(n_blocks)
    if k > n_blocks:
        raise ValueError(f"regime {name!r} needs {k} blocks; the model has {n_blocks}")
    return k


def regime_sort_key(name: str) -> tuple:
    """Order by the name alone (analysis orders by measured trainable fraction first): head, then
    the families on every block (bitfit, norm, lora by rank), then by depth (last-k's families
    before last-k itself), full, anything else."""
    try:
        r = parse_regime(name)
    except ValueError:
        return (9, 0, 0, 0, str(name))
    family = REGIME_FAMILIES.index(r.family) if r.family in REGIME_FAMILIES else len(REGIME_FAMILIES)
    if r.depth == 0:
        return (0, 0, 0, 0, name)
    if r.depth is None:
        return (3, 0, 0, 0, name) if r.family == Family.DEPTH else (1, 0, family, r.rank or 0, name)
    return (2, r.depth, 1 if r.family == Family.DEPTH else 0, family * 10**6 + (r.rank or 0), name)


# -- backbones ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """A backbone's parametrised blocks, input side first (the units depth regimes count)."""

    blocks: tuple[str, ...]
    description: str
    # Blocks with normalisation layers / with bias terms (what `norm` and `bitfit` can train).
    norm_blocks: tuple[str, ...] = ()
    bias_blocks: tuple[str, ...] = ()
    accepts: InputShapes = ANY_SHAPE  # the sample shapes it can be built for (config/shapes.py)
    # Transformer blocks taking (batch, tokens, width) with leading class token(s): where the `prompt`
    # families insert prompt tokens (harness/api/prompts.py states what such a block provides).
    token_blocks: tuple[str, ...] = ()

    @property
    def n_blocks(self) -> int:
        """How many blocks a depth regime can train."""
        return len(self.blocks)


def _vit(depth: int, description: str, accepts: InputShapes, pre_norm: bool = False) -> ModelFacts:
    """A ViT's facts (harness/run/vit.py): embed, block1..blockN, norm; biases in every block, LayerNorms in
    every block but embed (whose norm_pre only CLIP has); prompts go into the transformer blocks."""
    tokens = tuple(f"block{i}" for i in range(1, depth + 1))
    blocks = ("embed", *tokens, "norm")
    return ModelFacts(blocks, description, blocks if pre_norm else blocks[1:], blocks, accepts, tokens)


_FC4 = ("fc1", "fc2", "fc3", "fc4")
_CONV3_FC = ("conv1", "conv2", "conv3", "fc")
_RESNET = ("stem", "layer1", "layer2", "layer3", "layer4")
# MLPs flatten any sample; the CNNs pool three times by 2 (L, H, W >= 8); ResNets pool adaptively.
_IMAGES, _SIGNALS = InputShapes((3,), spatial=2, minimum=8), InputShapes((1, 2), spatial=1, minimum=8)
MODELS = {
    "mlp": ModelFacts(_FC4, "4 fully connected blocks", norm_blocks=(), bias_blocks=_FC4),
    "mlp-bn": ModelFacts(_FC4, "4 fully connected blocks with BatchNorm", _FC4, _FC4),
    "small-cnn": ModelFacts(_CONV3_FC, "3 conv blocks with BatchNorm, 1 fc block", _CONV3_FC[:3], _CONV3_FC,
                            _IMAGES),
    "cnn1d": ModelFacts(_CONV3_FC, "small-cnn for 1-D signals: 3 conv blocks with BatchNorm, 1 fc block",
                        _CONV3_FC, _CONV3_FC, _SIGNALS),
    "resnet18-reduced": ModelFacts(_RESNET, "reduced ResNet-18 (width 20), stem + 4 stages", _RESNET, _RESNET,
                                   InputShapes((3,))),
    "resnet18": ModelFacts(_RESNET, "torchvision's ResNet-18 (width 64; ImageNet weights with --download), "
                           "stem + 4 stages", _RESNET, _RESNET, InputShapes((3,))),
    "vit-tiny": _vit(3, "a small timm ViT (3 blocks, width 32, 2 heads; 4x4 patches of any (C, H, W) sample), "
                     "for the embedded data and the tests", InputShapes((3,), spatial=2, minimum=4)),
    "vit-b16": _vit(12, "timm's ViT-B/16 (vit_base_patch16_224; ImageNet-21k weights with --download), inputs "
                        "resized to 224x224", InputShapes((3,))),
    "vit-b16-clip": _vit(12, "timm's CLIP ViT-B/16 image tower (vit_base_patch16_clip_224, QuickGELU; OpenAI "
                             "weights with --download), inputs resized to 224x224", InputShapes((3,)), pre_norm=True),
}


def regime_problem(regime: str, model: str, dataset: str | None = None) -> str | None:
    """Why `regime` cannot run on backbone `model` (too deep, or its family selects nothing), else None."""
    facts = MODELS[model]
    on = f"model {model!r}" + (f" of dataset {dataset!r}" if dataset else "")
    r = parse_regime(regime)
    n = facts.n_blocks
    k = r.blocks(n)
    if k > n:
        return f"{regime!r} is deeper than {on} ({n} blocks); allowed: head, last-1..last-{n}, full (k up to {n})"
    blocks = facts.blocks[n - k:] if k else ()
    if r.family in TOKEN_FAMILIES:
        return _token_problem(regime, on, blocks, facts)
    if r.family == Family.LORA and facts.token_blocks and not set(blocks) & set(facts.token_blocks):
        # a transformer's LoRA targets (attention and MLP layers) are all inside its transformer blocks
        first = len(facts.blocks) - facts.blocks.index(facts.token_blocks[-1])
        return (f"{regime!r} trains nothing on {on}: its blocks {', '.join(blocks)} hold no attention or MLP layer "
                f"for LoRA adapters (transformer blocks: {', '.join(facts.token_blocks)}); allowed: last-k with "
                f"k >= {first}")
    needed = {Family.NORM: facts.norm_blocks, Family.BITFIT: facts.bias_blocks}.get(r.family)
    if needed is not None and not set(blocks) & set(needed):
        what = "normalisation layers" if r.family == Family.NORM else "bias terms"
        return (f"{regime!r} trains nothing on {on}: its blocks {', '.join(blocks) or '(none)'} have no "
                f"{what}; allowed: a regime whose blocks have some ({', '.join(needed) or 'none on this model'})")
    return None


def _token_problem(regime: str, on: str, blocks: tuple[str, ...], facts: ModelFacts) -> str | None:
    """Why a prompt regime puts no token on the model: no token_blocks at all, or none among its blocks."""
    if not facts.token_blocks:
        takers = ", ".join(m for m, f in MODELS.items() if f.token_blocks) or "none registered"
        return (f"{regime!r} cannot run on {on}: it has no transformer blocks (token_blocks) to take prompt tokens; "
                f"allowed: prompt regimes on a backbone with token_blocks ({takers})")
    if not set(blocks) & set(facts.token_blocks):
        first = len(facts.blocks) - facts.blocks.index(facts.token_blocks[-1])
        return (f"{regime!r} puts no prompt on {on}: its blocks {', '.join(blocks) or '(none)'} hold none of the "
                f"transformer blocks {', '.join(facts.token_blocks)}; allowed: last-k with k >= {first}")
    return None


def sample_shape_problem(model: str, dataset: str, shape) -> str | None:
    """Why backbone `model` cannot take `dataset`'s samples of `shape` (config/shapes.py), else None."""
    return shape_problem(model, dataset, shape, {name: facts.accepts for name, facts in MODELS.items()})


# -- data sets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetFacts:
    """What a protocol is validated against without loading data."""

    n_classes: int
    default_model: str
    # "embedded" (ships with a package), "torchvision" (--data-dir, --download), "files" (its own published files:
    # --data-dir, --download; harness/run/image_sets.py) or "plug-in"
    source: str
    sample_shape: tuple[int, ...] | None = None  # one sample's shape; None: known once the data is loaded


DATASETS = {
    "digits": DatasetFacts(10, "mlp", "embedded", (1, 8, 8)),
    "mnist1d": DatasetFacts(10, "mlp", "embedded", (40,)),
    "mnist": DatasetFacts(10, "small-cnn", "torchvision", (1, 28, 28)),
    "fashion-mnist": DatasetFacts(10, "small-cnn", "torchvision", (1, 28, 28)),
    "kmnist": DatasetFacts(10, "small-cnn", "torchvision", (1, 28, 28)),
    "qmnist": DatasetFacts(10, "small-cnn", "torchvision", (1, 28, 28)),
    "cifar100": DatasetFacts(100, "resnet18-reduced", "torchvision", (3, 32, 32)),
    # The data sets pretrained-model CL publishes on, held as uint8 pixels (0..255; docs/datasets.md): ImageNet-R
    # and CUB-200-2011 stored at 224x224, CIFAR-100's own 32x32 (the same files as cifar100).
    "imagenet-r": DatasetFacts(200, "vit-b16", "files", (3, 224, 224)),
    "cub200": DatasetFacts(200, "vit-b16", "files", (3, 224, 224)),
    "cifar100-pixels": DatasetFacts(100, "vit-b16", "files", (3, 32, 32)),
}
# Data sets held as uint8 pixels rather than float32 (harness/run/image_sets.py).
PIXEL_DATASETS = ("imagenet-r", "cub200", "cifar100-pixels")
NPZ_PREFIX = "npz:"
USER_DATA_DEFAULT_MODEL = "mlp"


def is_dataset_name(name) -> bool:
    """True for a registered name or `npz:PATH`."""
    return name in DATASETS or str(name).startswith(NPZ_PREFIX)
