"""The `pretrain:` value of a protocol, validated and normalised (torch-free).

Four forms:

- `first-task` or `none` (PRETRAIN_MODES), kept as the string;
- `{checkpoint: PATH}` -> `{"checkpoint": "<absolute path>", "sha256": "<hex>"}`: PATH is relative
  to the protocol's folder, and the file's content hash makes the weights part of every run id;
- `{dataset: NAME | same, ...}` -> the recipe with every default filled in (equal settings, equal
  run ids): `same` pretrains each data set on a held-out fraction `holdout` of its own training
  split (removed from its stream); NAME pretrains on another data set's whole training split;
- `{torchvision: IMAGENET1K_V1}` -> unchanged: torchvision's ImageNet weights (model resnet18).

`resolve_for_dataset` turns `same` into the data set's own name when run specs are expanded; a
resolved `same` recipe is recognised by its `holdout` key (a NAME recipe never has one).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import UserError
from .vocabulary import DATASETS, PRETRAIN_MODES, PRETRAIN_SOURCES, pretrain_source


class PretrainError(UserError, ValueError):
    """A `pretrain:` mistake or an unusable pretrained backbone: one line saying what and why."""


SAME = "same"
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed
# The weights torchvision ships per model; `DEFAULT` is left out: it names different weights
# in different torchvision versions, so it cannot be part of a run's identity.
TORCHVISION_WEIGHTS = {"resnet18": ("IMAGENET1K_V1",)}
TORCHVISION_NAMES = tuple(sorted({w for names in TORCHVISION_WEIGHTS.values() for w in names}))
CHECKPOINT_KEYS = ("checkpoint",)
TORCHVISION_KEYS = ("torchvision",)
FORMS = ("first-task, none, {checkpoint: PATH}, {dataset: NAME or same, holdout, epochs, lr, batch_size, seed} "
         f"or {{torchvision: {' or '.join(TORCHVISION_NAMES)}}}")


@dataclass(frozen=True)
class DatasetRecipe:
    """How a backbone is pretrained on a data set; `holdout` is None unless it is the stream's own."""

    dataset: str
    holdout: float | None = 0.25
    epochs: int = 5
    lr: float = 0.05
    batch_size: int = 64
    seed: int = 0

    def as_dict(self) -> dict:
        """The normalised protocol form (no `holdout` key for another data set)."""
        d = asdict(self)
        if self.holdout is None:
            del d["holdout"]
        return d

    @staticmethod
    def from_dict(d: dict) -> "DatasetRecipe":
        """The recipe of a normalised `{dataset: ...}` value."""
        return DatasetRecipe(**{**d, "holdout": d.get("holdout")})


DATASET_KEYS = tuple(k for k in asdict(DatasetRecipe(SAME)))
_DEFAULTS = DatasetRecipe(SAME)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
    """Errors that read `file: pretrain.<key>: value ...; allowed: ...`, as the protocol's do."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str):
        raise PretrainError(f"{self.source}: {key}: {message}")

    def keys(self, value: dict, allowed: tuple) -> None:
        for k in value:
            if k not in allowed:
                self.fail(f"pretrain.{k}", f"unknown key; allowed: {', '.join(allowed)}")

    def integer(self, value, key: str, minimum: int, maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {_show(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            self.fail(key, f"{_show(value)} is out of range; allowed: an integer >= {minimum}{upper}")
        return value

    def number(self, value, key: str, rule: str, ok) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {_show(value)}")
        if not math.isfinite(value) or not ok(value):
            self.fail(key, f"{_show(value)} is out of range; allowed: {rule}")
        return float(value)


def parse_pretrain(value, source: str, protocol_dir: Path) -> str | dict:
    """Validate a protocol's `pretrain:` value and return its normalised form (see the module)."""
    check = _Checker(source)
    if isinstance(value, str):
        if value not in PRETRAIN_MODES:
            check.fail("pretrain", f"{_show(value)} is not allowed; allowed: {FORMS}")
        return value
    if not isinstance(value, dict):
        check.fail("pretrain", f"expected a string or a mapping, got {_show(value)}; allowed: {FORMS}")
    sources = [k for k in PRETRAIN_SOURCES if k in value]
    if not sources:
        if not value:
            check.fail("pretrain", f"an empty mapping names no backbone; allowed: {FORMS}")
        check.fail(f"pretrain.{next(iter(value))}", f"unknown key; allowed: one of {', '.join(PRETRAIN_SOURCES)}")
    if len(sources) > 1:
        check.fail("pretrain", f"names {len(sources)} backbones ({', '.join(sources)}); "
                               f"allowed: exactly one of {', '.join(PRETRAIN_SOURCES)}")
    parse = {"checkpoint": _checkpoint, "dataset": _dataset, "torchvision": _torchvision}[sources[0]]
    return parse(value, check, Path(protocol_dir))


def _checkpoint(value: dict, check: _Checker, protocol_dir: Path) -> dict:
    check.keys(value, CHECKPOINT_KEYS)
    raw = value["checkpoint"]
    if not isinstance(raw, str) or not raw.strip():
        check.fail("pretrain.checkpoint", f"expected a path, got {_show(raw)}; allowed: a path to a state-dict "
                                          "file, relative to the protocol's folder")
    try:
        path = Path(raw).expanduser()
        path = (path if path.is_absolute() else protocol_dir / path).resolve()
        found = path.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # ~nobody, a NUL byte, a loop of links
        check.fail("pretrain.checkpoint", f"{_show(raw)} is not a usable path ({exc})")
    if not found:
        check.fail("pretrain.checkpoint", f"{_show(raw)}: no such file ({path}); allowed: a path to a state-dict "
                                          "file (torch.save of model.state_dict()), relative to the protocol's folder")
    try:
        digest = file_sha256(path)
    except OSError as exc:
        check.fail("pretrain.checkpoint", f"{_show(raw)}: cannot read {path} ({exc.strerror or exc})")
    return {"checkpoint": str(path), "sha256": digest}


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks (checkpoints can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dataset(value: dict, check: _Checker, _protocol_dir: Path) -> dict:
    check.keys(value, DATASET_KEYS)
    name = value["dataset"]
    problem = dataset_name_problem(name)
    if problem:
        check.fail("pretrain.dataset", problem)
    same = name == SAME
    if "holdout" in value and not same:
        check.fail("pretrain.holdout", f"not allowed with dataset {name!r} (it pretrains on that data set's whole "
                                       "training split); allowed: holdout only with dataset: same")
    d = _DEFAULTS
    recipe = DatasetRecipe(
        dataset=name,
        holdout=check.number(value.get("holdout", d.holdout), "pretrain.holdout", "0 < holdout < 1",
                             lambda h: 0 < h < 1) if same else None,
        epochs=check.integer(value.get("epochs", d.epochs), "pretrain.epochs", 1),
        lr=check.number(value.get("lr", d.lr), "pretrain.lr", "a number > 0", lambda x: x > 0),
        batch_size=check.integer(value.get("batch_size", d.batch_size), "pretrain.batch_size", 1),
        seed=check.integer(value.get("seed", d.seed), "pretrain.seed", 0, MAX_SEED))
    return recipe.as_dict()


def dataset_name_problem(name) -> str | None:
    """Why `name` cannot be a pretraining data set (`same` or a registered, non-npz name), else None."""
    allowed = f"allowed: {SAME} (a held-out part of each data set) or one of {', '.join(DATASETS)}"
    if not isinstance(name, str):
        return f"expected a data set name, got {_show(name)}; {allowed}"
    if name != SAME and name not in DATASETS:
        return f"unknown dataset {name!r}; {allowed}"
    return None


def _torchvision(value: dict, check: _Checker, _protocol_dir: Path) -> dict:
    check.keys(value, TORCHVISION_KEYS)
    weights = value["torchvision"]
    if weights not in TORCHVISION_NAMES:
        check.fail("pretrain.torchvision", f"{_show(weights)} is not allowed; allowed: {', '.join(TORCHVISION_NAMES)}")
    return {"torchvision": weights}


def resolve_for_dataset(pretrain, dataset_name: str) -> str | dict:
    """The `pretrain` of one data set's runs: `dataset: same` becomes that data set's name."""
    if isinstance(pretrain, dict) and pretrain.get("dataset") == SAME:
        return {**pretrain, "dataset": dataset_name}
    return pretrain


def is_own_holdout(pretrain, dataset_name: str) -> bool:
    """True when `pretrain` pretrains on a held-out part of `dataset_name` (a `same` recipe)."""
    return (isinstance(pretrain, dict) and "holdout" in pretrain
            and pretrain.get("dataset") in (SAME, dataset_name))


def check_pretrain_for_model(pretrain, model_name: str, dataset_name: str, source: str) -> None:
    """Raise a one-line PretrainError if `pretrain` cannot serve `dataset_name`'s runs on `model_name`."""
    check = _Checker(source)
    kind = pretrain_source(pretrain)
    if kind == "torchvision":
        models = [m for m, names in TORCHVISION_WEIGHTS.items() if pretrain["torchvision"] in names]
        if model_name not in models:
            check.fail("pretrain.torchvision", f"{pretrain['torchvision']} weights are for model "
                                               f"{' or '.join(models)}, but dataset {dataset_name!r} uses model "
                                               f"{model_name!r}; allowed: model: {' or '.join(models)} for that "
                                               "data set, or another pretrain form")
    if kind == "dataset":
        name = pretrain["dataset"]
        if is_own_holdout(pretrain, dataset_name):
            return
        problem = dataset_name_problem(name)
        if problem or name == SAME:  # a `same` recipe lost its holdout: not a parsed value
            check.fail("pretrain.dataset", problem or f"{name!r} without holdout; allowed: a parsed pretrain value")
        if "holdout" in pretrain:  # `same` resolved for another data set
            check.fail("pretrain.holdout", f"holds out part of {name!r}, not of the stream {dataset_name!r}; "
                                           "allowed: holdout only on the stream's own data set (dataset: same)")
        if name == dataset_name:
            check.fail("pretrain.dataset", f"{name!r} is the stream's own data set: its whole training split would "
                                           "overlap the stream; allowed: same (pretrain on a held-out part) or "
                                           "another data set")
