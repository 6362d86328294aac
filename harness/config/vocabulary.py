"""The one vocabulary of cl-bench, defined once and importable without torch.

Every name a protocol, a record, the CLI or the leaderboard uses is defined here: run
statuses, scenarios and pre-training modes, the regime grammar, the backbones' blocks,
the data sets' facts, metric names, optimizers, the name pattern and the entry-point
group. Modules that need one of them import it from here rather than restating it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# -- runs and protocols -------------------------------------------------------------------
STATUSES = ("ok", "failed", "diverged", "timeout")
SCENARIOS = ("task-il", "class-il")
PRETRAIN_MODES = ("first-task", "none")
OPTIMIZERS = ("sgd", "adam", "adamw")

# Names appear in comma-separated CLI filters, folder and file names and URLs of the site.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 100  # a protocol name is a folder under --results: keep it well below NAME_MAX
NAME_RULE = f"up to {MAX_NAME} letters, digits, '.', '_', '-'"
ENTRY_POINT_GROUP = "cl_bench.methods"


def is_valid_name(name) -> bool:
    """True for a string matching NAME_PATTERN of at most MAX_NAME characters."""
    return isinstance(name, str) and bool(NAME_PATTERN.match(name)) and len(name) <= MAX_NAME


# -- metrics ------------------------------------------------------------------------------
METRICS = ("acc", "la", "bwt", "forgetting", "fwt", "aia")
# Learning checks (harness/run/checks.py): a record with any of these warnings is flagged.
WARNINGS = {
    "chance": "a task's accuracy right after training it is at chance level",
    "below-probe": "learning accuracy far below a linear probe on the same features",
    "loss-flat": "the training loss of a task never fell",
}


# -- regimes ------------------------------------------------------------------------------
BASE_REGIMES = ("head", "last-1", "last-2", "last-3", "full")
REGIME_GRAMMAR = "head, last-k (k >= 1, up to the model's depth) or full"
_LAST_K = re.compile(r"^last-([1-9][0-9]*)$")


def is_regime_name(name) -> bool:
    """True for `head`, `full` and `last-k` with k >= 1."""
    return name in ("head", "full") or bool(_LAST_K.match(str(name)))


def regime_depth(name: str, n_blocks: int) -> int:
    """Number of trainable blocks under the regime (head = 0, full = n_blocks)."""
    if name == "head":
        return 0
    if name == "full":
        return n_blocks
    match = _LAST_K.match(str(name))
    if not match:
        raise ValueError(f"unknown regime {name!r}; allowed: {REGIME_GRAMMAR}")
    k = int(match.group(1))
    if k > n_blocks:
        raise ValueError(f"regime {name!r} needs {k} blocks; the model has {n_blocks}")
    return k


def regime_sort_key(name: str) -> tuple:
    """Order by the name alone: head < last-1 < last-2 < ... < full < anything else."""
    if name == "head":
        return (0, 0, name)
    match = _LAST_K.match(str(name))
    if match:
        return (1, int(match.group(1)), name)
    if name == "full":
        return (2, 0, name)
    return (3, 0, name)


# -- backbones ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """A backbone's parametrised blocks, input side first (the units depth regimes count)."""

    blocks: tuple[str, ...]
    description: str

    @property
    def n_blocks(self) -> int:
        """How many blocks a depth regime can train."""
        return len(self.blocks)


MODELS = {
    "mlp": ModelFacts(("fc1", "fc2", "fc3", "fc4"), "4 fully connected blocks"),
    "mlp-bn": ModelFacts(("fc1", "fc2", "fc3", "fc4"), "4 fully connected blocks with BatchNorm"),
    "small-cnn": ModelFacts(("conv1", "conv2", "conv3", "fc"), "3 conv blocks with BatchNorm, 1 fc block"),
    "cnn1d": ModelFacts(("conv1", "conv2", "conv3", "fc"), "small-cnn for 1-D signals: 3 conv blocks with BatchNorm, 1 fc block"),
    "resnet18-reduced": ModelFacts(("stem", "layer1", "layer2", "layer3", "layer4"),
                                   "reduced ResNet-18 (width 20), stem + 4 stages"),
}


# -- data sets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetFacts:
    """What a protocol is validated against without loading data."""

    n_classes: int
    default_model: str
    source: str  # "embedded" (ships with a package) or "torchvision" (--data-dir, --download)


DATASETS = {
    "digits": DatasetFacts(10, "mlp", "embedded"),
    "mnist1d": DatasetFacts(10, "mlp", "embedded"),
    "mnist": DatasetFacts(10, "small-cnn", "torchvision"),
    "fashion-mnist": DatasetFacts(10, "small-cnn", "torchvision"),
    "kmnist": DatasetFacts(10, "small-cnn", "torchvision"),
    "qmnist": DatasetFacts(10, "small-cnn", "torchvision"),
    "cifar100": DatasetFacts(100, "resnet18-reduced", "torchvision"),
}
DATASET_NAMES = tuple(DATASETS)
NPZ_PREFIX = "npz:"
USER_DATA_DEFAULT_MODEL = "mlp"


def is_dataset_name(name) -> bool:
    """True for a registered name or `npz:PATH`."""
    return name in DATASETS or str(name).startswith(NPZ_PREFIX)
