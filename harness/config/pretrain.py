"""The `pretrain:` value of a protocol: one typed `Pretrain`, parsed once, resolved once (torch-free).

Five kinds (PretrainKind), as a protocol writes them:

- `first-task`: task 1 trains the full network, the regime applies from task 2 (θ0 for merging is the
  model after task 1);
- `none`: the regime applies from task 1 to the initial model (θ0 = the initial model);
- a pretrained backbone (θ0 = that model; the regime applies from task 1, so task 1 has a task vector):
  - `{checkpoint: PATH}`: PATH relative to the protocol's folder, made absolute; the file's sha256
    joins the value, so the weights are part of every run id;
  - `{dataset: NAME | same, ...}`: a DatasetRecipe with every default filled in (equal settings, equal
    run ids): `same` pretrains each data set on a held-out fraction `holdout` of its own training
    split (removed from its stream); NAME pretrains on another data set's whole training split;
  - `{torchvision: IMAGENET1K_V1}`: torchvision's ImageNet weights (model resnet18);
  - `{timm: TAG}` or `{timm: TAG, file: PATH}`: timm's published weights TAG (vit-b16, vit-b16-clip), read
    from cl-bench's weights folder (`timm_weights_dir()`, filled by `--download` through timm's own loading)
    or from PATH; the file's sha256 joins the value when it is there at load (so the weights are part of
    every run id); while it is missing the value says so (`missing`): the protocol loads, plans and
    dry-runs, and a run fetches the file first (--download) or stops with one line.

`parse_pretrain` reads the protocol's value once, at load; `Pretrain.for_dataset` turns `same` into
the data set's own name once, when run specs are expanded. Everything downstream asks the value
(`is_backbone`, `first_task`, `recipe`, `holdout`, `label`, `cache_key`). `as_json` is the form run ids
hash and records carry (the string for first-task and none, the normalised mapping otherwise);
`from_json` reads it back.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path

from .errors import PretrainError
from .files import file_sha256
from .paths import cache_dir
from .validate import MAX_SEED, Validator, show
from .vocabulary import DATASETS


class PretrainKind(StrEnum):
    """What a run's network starts from (see the module docstring)."""

    FIRST_TASK = "first-task"
    NONE = "none"
    CHECKPOINT = "checkpoint"
    DATASET = "dataset"
    TORCHVISION = "torchvision"
    TIMM = "timm"


MODES = (PretrainKind.FIRST_TASK, PretrainKind.NONE)  # written as a string
# a mapping's one key
SOURCES = (PretrainKind.CHECKPOINT, PretrainKind.DATASET, PretrainKind.TORCHVISION, PretrainKind.TIMM)
SAME = "same"
# The weights torchvision ships per model; `DEFAULT` is left out: it names different weights
# in different torchvision versions, so it cannot be part of a run's identity.
TORCHVISION_WEIGHTS = {"resnet18": ("IMAGENET1K_V1",)}
TORCHVISION_NAMES = tuple(sorted({w for names in TORCHVISION_WEIGHTS.values() for w in names}))
# timm's published weights per model (timm model tag: architecture.pretrained-tag), fetched only with --download.
TIMM_WEIGHTS = {"vit-b16": ("vit_base_patch16_224.augreg_in21k",),
                "vit-b16-clip": ("vit_base_patch16_clip_224.openai",)}
TIMM_NAMES = tuple(sorted({w for names in TIMM_WEIGHTS.values() for w in names}))
# The file names timm's hub download leaves (safetensors first), as kept in the weights folder.
TIMM_FILES = ("model.safetensors", "pytorch_model.bin")
CHECKPOINT_KEYS = ("checkpoint",)
TORCHVISION_KEYS = ("torchvision",)
TIMM_KEYS = ("timm", "file")
FORMS = ("first-task, none, {checkpoint: PATH}, {dataset: NAME or same, holdout, epochs, lr, batch_size, seed}, "
         f"{{torchvision: {' or '.join(TORCHVISION_NAMES)}}} or {{timm: {' or '.join(TIMM_NAMES)}, file: PATH "
         "(optional)}")
KEY_DIGITS = 32  # hex digits of a dataset-pretrained backbone's cache key


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


RECIPE_KEYS = tuple(asdict(DatasetRecipe(SAME)))
_DEFAULTS = DatasetRecipe(SAME)
# The fields each kind carries; every other field of a Pretrain is empty.
_FIELDS = {PretrainKind.CHECKPOINT: ("checkpoint", "sha256"), PretrainKind.DATASET: ("recipe",),
           PretrainKind.TORCHVISION: ("weights",), PretrainKind.TIMM: ("weights",)}
_OPTIONAL = {PretrainKind.TIMM: ("checkpoint", "sha256")}  # timm: the user's file (else the weights folder); its hash


@dataclass(frozen=True)
class Pretrain:
    """A protocol's `pretrain:` value: its kind and that kind's fields (the others stay empty)."""

    kind: PretrainKind
    checkpoint: str = ""  # checkpoint, timm with `file:`: the weights file's absolute path
    sha256: str = ""  # checkpoint, timm: the file's content hash when the protocol was loaded ("": timm's missing)
    recipe: DatasetRecipe | None = None  # dataset: how the backbone is pretrained
    weights: str = ""  # torchvision, timm: the weights' name

    def __post_init__(self):
        object.__setattr__(self, "kind", PretrainKind(self.kind))
        wanted, optional = _FIELDS.get(self.kind, ()), _OPTIONAL.get(self.kind, ())
        for name in ("checkpoint", "sha256", "recipe", "weights"):
            given = getattr(self, name)
            if name not in optional and (name in wanted) != (given is not None and given != ""):
                raise ValueError(f"pretrain {self.kind}: {name} {'missing' if name in wanted else 'not allowed'}")
        if self.recipe is not None and self.recipe.dataset == SAME and self.recipe.holdout is None:
            raise ValueError("pretrain dataset: same without holdout")

    @property
    def is_backbone(self) -> bool:
        """A pretrained backbone: θ0 is that model and the regime applies from task 1."""
        return self.kind in SOURCES

    @property
    def first_task(self) -> bool:
        """Task 1 trains the full network and the regime applies from task 2 (θ0 = the model after task 1)."""
        return self.kind is PretrainKind.FIRST_TASK

    @property
    def missing(self) -> bool:
        """timm weights whose file was not there when the protocol was loaded (no sha256 yet)."""
        return self.kind is PretrainKind.TIMM and not self.sha256

    @property
    def weights_file(self) -> Path:
        """timm: the file the weights are read from (the user's `file:`, else the weights folder's)."""
        return Path(self.checkpoint) if self.checkpoint else timm_weights_file(self.weights)

    def with_weights_hash(self) -> Pretrain:
        """timm: this value with its file's current sha256 (after --download fetched it); others: itself."""
        if self.kind is not PretrainKind.TIMM or not self.weights_file.is_file():
            return self
        return replace(self, sha256=file_sha256(self.weights_file))

    @property
    def holdout(self) -> float | None:
        """The fraction of the stream's own training split the backbone pretrains on (those samples
        leave the stream), or None."""
        return None if self.recipe is None else self.recipe.holdout

    @property
    def label(self) -> str:
        """A short display form: `first-task`, `none`, `checkpoint <sha12>`, `dataset digits (...)`."""
        if self.kind is PretrainKind.CHECKPOINT:
            return f"checkpoint {self.sha256[:12]}"
        if self.kind is PretrainKind.DATASET:
            extra = ", ".join(f"{k} {v}" for k, v in sorted(self.recipe.as_dict().items()) if k != "dataset")
            return f"dataset {self.recipe.dataset}" + (f" ({extra})" if extra else "")
        if self.kind is PretrainKind.TORCHVISION:
            return f"torchvision {self.weights}"
        if self.kind is PretrainKind.TIMM:
            return f"timm {self.weights} " + (self.sha256[:12] if self.sha256 else "(missing)")
        return self.kind.value

    def as_json(self) -> str | dict:
        """The canonical JSON form run ids hash and records carry: first-task and none as strings,
        a backbone as its normalised mapping."""
        if self.kind is PretrainKind.CHECKPOINT:
            return {"checkpoint": self.checkpoint, "sha256": self.sha256}
        if self.kind is PretrainKind.DATASET:
            return self.recipe.as_dict()
        if self.kind is PretrainKind.TORCHVISION:
            return {"torchvision": self.weights}
        if self.kind is PretrainKind.TIMM:  # the folder's path is not identity: the name and content are
            given = {"file": self.checkpoint} if self.checkpoint else {}
            return {"timm": self.weights, "sha256": self.sha256, **given}
        return self.kind.value

    @staticmethod
    def from_json(value) -> Pretrain:
        """The value whose canonical JSON form is `value` (a record's spec); ValueError for any other."""
        try:
            found = _from_json(value)
        except (TypeError, ValueError):
            found = None
        if found is None or found.as_json() != value:
            raise ValueError(f"pretrain: {show(value)} is not a canonical pretrain value")
        return found

    def for_dataset(self, name: str) -> Pretrain:
        """The value of one data set's runs: `dataset: same` becomes that data set's name."""
        if self.recipe is not None and self.recipe.dataset == SAME:
            return replace(self, recipe=replace(self.recipe, dataset=name))
        return self

    def check_fits(self, model: str, dataset: str, source: str) -> None:
        """Raise a one-line PretrainError if this value cannot serve `dataset`'s runs on `model`."""
        v = Validator(source, PretrainError)
        if self.kind is PretrainKind.TORCHVISION:
            models = [m for m, names in TORCHVISION_WEIGHTS.items() if self.weights in names]
            if model not in models:
                v.fail("pretrain.torchvision", f"{self.weights} weights are for model {' or '.join(models)}, but "
                                               f"dataset {dataset!r} uses model {model!r}; allowed: model: "
                                               f"{' or '.join(models)} for that data set, or another pretrain form")
        if self.kind is PretrainKind.TIMM:
            models = [m for m, names in TIMM_WEIGHTS.items() if self.weights in names]
            if model not in models:
                v.fail("pretrain.timm", f"{self.weights} weights are for model {' or '.join(models)}, but dataset "
                                        f"{dataset!r} uses model {model!r}; allowed: model: {' or '.join(models)} "
                                        "for that data set, or another pretrain form")
        if self.kind is PretrainKind.DATASET:
            self._check_recipe_fits(v, dataset)

    def _check_recipe_fits(self, v: Validator, dataset: str) -> None:
        name = self.recipe.dataset
        if self.holdout is not None and name == dataset:  # `same`, resolved for this stream
            return
        problem = _dataset_name_problem(name)
        if problem or name == SAME:
            v.fail("pretrain.dataset", problem or f"{name!r} is not resolved for a data set; allowed: the value "
                                                  "Pretrain.for_dataset gives (specs are expanded so)")
        if self.holdout is not None:  # `same` resolved for another data set
            v.fail("pretrain.holdout", f"holds out part of {name!r}, not of the stream {dataset!r}; "
                                       "allowed: holdout only on the stream's own data set (dataset: same)")
        if name == dataset:
            v.fail("pretrain.dataset", f"{name!r} is the stream's own data set: its whole training split would "
                                       "overlap the stream; allowed: same (pretrain on a held-out part) or "
                                       "another data set")

    def cache_key(self, **context) -> str | None:
        """The key a backbone is cached and reported under: `checkpoint:<sha256>`,
        `torchvision:<model>:<weights>`, or for a recipe a hash of it and `context` (everything else
        that decides the weights: model, data, code, device); None without a backbone."""
        if self.kind is PretrainKind.CHECKPOINT:
            return f"checkpoint:{self.sha256}"
        if self.kind is PretrainKind.TORCHVISION:
            model = next(m for m, names in TORCHVISION_WEIGHTS.items() if self.weights in names)
            return f"torchvision:{model}:{self.weights}"
        if self.kind is PretrainKind.TIMM:
            return f"timm:{self.weights}:{self.sha256}"
        if self.kind is PretrainKind.DATASET:
            canon = json.dumps({"recipe": self.recipe.as_dict(), **context}, sort_keys=True, separators=(",", ":"))
            return hashlib.sha256(canon.encode()).hexdigest()[:KEY_DIGITS]
        return None


def _from_json(value) -> Pretrain | None:
    """The Pretrain a JSON form names (checked against its canonical form by the caller), or None."""
    if isinstance(value, str):
        return Pretrain(value) if value in MODES else None
    if not isinstance(value, dict) or sum(k in value for k in SOURCES) != 1:
        return None
    if "dataset" in value:
        return Pretrain(PretrainKind.DATASET, recipe=DatasetRecipe(**{**value, "holdout": value.get("holdout")}))
    if not all(isinstance(v, str) for v in value.values()):
        return None
    if "checkpoint" in value:
        return Pretrain(PretrainKind.CHECKPOINT, checkpoint=value["checkpoint"], sha256=value.get("sha256", ""))
    if "timm" in value:
        return Pretrain(PretrainKind.TIMM, weights=value["timm"], sha256=value.get("sha256", ""),
                        checkpoint=value.get("file", ""))
    return Pretrain(PretrainKind.TORCHVISION, weights=value["torchvision"])


def parse_pretrain(value, source: str, protocol_dir: Path) -> Pretrain:
    """Validate a protocol's `pretrain:` value and return it typed (see the module)."""
    v = Validator(source, PretrainError)
    if isinstance(value, str):
        if value not in MODES:
            v.fail("pretrain", f"{show(value)} is not allowed; allowed: {FORMS}")
        return Pretrain(value)
    if not isinstance(value, dict):
        v.fail("pretrain", f"expected a string or a mapping, got {show(value)}; allowed: {FORMS}")
    sources = [k for k in SOURCES if k in value]
    if not sources:
        if not value:
            v.fail("pretrain", f"an empty mapping names no backbone; allowed: {FORMS}")
        v.fail(f"pretrain.{next(iter(value))}", f"unknown key; allowed: one of {', '.join(SOURCES)}")
    if len(sources) > 1:
        v.fail("pretrain", f"names {len(sources)} backbones ({', '.join(sources)}); "
                           f"allowed: exactly one of {', '.join(SOURCES)}")
    parse = {PretrainKind.CHECKPOINT: _checkpoint, PretrainKind.DATASET: _dataset,
             PretrainKind.TORCHVISION: _torchvision, PretrainKind.TIMM: _timm}[sources[0]]
    return parse(value, v, Path(protocol_dir))


def _checkpoint(value: dict, v: Validator, protocol_dir: Path) -> Pretrain:
    v.mapping(value, "pretrain", CHECKPOINT_KEYS)
    path, digest = _user_file(value["checkpoint"], "pretrain.checkpoint", "a state-dict file (torch.save of "
                              "model.state_dict())", v, protocol_dir)
    return Pretrain(PretrainKind.CHECKPOINT, checkpoint=str(path), sha256=digest)


def _user_file(raw, key: str, what: str, v: Validator, protocol_dir: Path) -> tuple[Path, str]:
    """A user's weights file (relative to the protocol's folder) and its sha256; one line if it is not there."""
    if not isinstance(raw, str) or not raw.strip():
        v.fail(key, f"expected a path, got {show(raw)}; allowed: a path to {what}, relative to the protocol's folder")
    try:
        path = Path(raw).expanduser()
        path = (path if path.is_absolute() else protocol_dir / path).resolve()
        found = path.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # ~nobody, a NUL byte, a loop of links
        v.fail(key, f"{show(raw)} is not a usable path ({exc})")
    if not found:
        v.fail(key, f"{show(raw)}: no such file ({path}); allowed: a path to {what}, relative to the protocol's "
                    "folder")
    try:
        return path, file_sha256(path)
    except OSError as exc:
        v.fail(key, f"{show(raw)}: cannot read {path} ({exc.strerror or exc})")


def _dataset(value: dict, v: Validator, _protocol_dir: Path) -> Pretrain:
    v.mapping(value, "pretrain", RECIPE_KEYS)
    name = value["dataset"]
    problem = _dataset_name_problem(name)
    if problem:
        v.fail("pretrain.dataset", problem)
    same = name == SAME
    if "holdout" in value and not same:
        v.fail("pretrain.holdout", f"not allowed with dataset {name!r} (it pretrains on that data set's whole "
                                   "training split); allowed: holdout only with dataset: same")
    d = _DEFAULTS
    recipe = DatasetRecipe(
        dataset=name,
        holdout=v.within(value.get("holdout", d.holdout), "pretrain.holdout", float, "0 < holdout < 1",
                         lambda h: 0 < h < 1) if same else None,
        epochs=_count(v, value.get("epochs", d.epochs), "pretrain.epochs", 1),
        lr=v.within(value.get("lr", d.lr), "pretrain.lr", float, "a number > 0", lambda x: x > 0),
        batch_size=_count(v, value.get("batch_size", d.batch_size), "pretrain.batch_size", 1),
        seed=_count(v, value.get("seed", d.seed), "pretrain.seed", 0, MAX_SEED))
    return Pretrain(PretrainKind.DATASET, recipe=recipe)


def _count(v: Validator, value, key: str, minimum: int, maximum: int | None = None) -> int:
    upper = f" and <= {maximum}" if maximum is not None else ""
    return v.within(value, key, int, f"an integer >= {minimum}{upper}",
                    lambda n: n >= minimum and (maximum is None or n <= maximum))


def _dataset_name_problem(name) -> str | None:
    """Why `name` cannot be a pretraining data set (`same` or a registered, non-npz name), else None."""
    allowed = f"allowed: {SAME} (a held-out part of each data set) or one of {', '.join(DATASETS)}"
    if not isinstance(name, str):
        return f"expected a data set name, got {show(name)}; {allowed}"
    if name != SAME and name not in DATASETS:
        return f"unknown dataset {name!r}; {allowed}"
    return None


def _torchvision(value: dict, v: Validator, _protocol_dir: Path) -> Pretrain:
    v.mapping(value, "pretrain", TORCHVISION_KEYS)
    weights = value["torchvision"]
    if weights not in TORCHVISION_NAMES:
        v.fail("pretrain.torchvision", f"{show(weights)} is not allowed; allowed: {', '.join(TORCHVISION_NAMES)}")
    return Pretrain(PretrainKind.TORCHVISION, weights=weights)


def timm_weights_dir() -> Path:
    """cl-bench's folder of timm weights: one folder per tag, holding the file timm's download fetched."""
    return cache_dir() / "weights" / "timm"


def timm_weights_file(tag: str) -> Path:
    """The weights file of timm `tag` in the weights folder (the first of TIMM_FILES there; else where
    --download puts it)."""
    folder = timm_weights_dir() / tag
    return next((folder / n for n in TIMM_FILES if (folder / n).is_file()), folder / TIMM_FILES[0])


def _timm(value: dict, v: Validator, protocol_dir: Path) -> Pretrain:
    v.mapping(value, "pretrain", TIMM_KEYS, required=("timm",))
    tag = value["timm"]
    if tag not in TIMM_NAMES:
        v.fail("pretrain.timm", f"{show(tag)} is not allowed; allowed: {', '.join(TIMM_NAMES)}")
    if "file" in value:
        path, digest = _user_file(value["file"], "pretrain.file", f"timm's weights file of {tag} (safetensors or "
                                  "a torch state dict)", v, protocol_dir)
        return Pretrain(PretrainKind.TIMM, weights=tag, checkpoint=str(path), sha256=digest)
    path = timm_weights_file(tag)
    try:
        digest = file_sha256(path) if path.is_file() else ""
    except OSError as exc:
        v.fail("pretrain.timm", f"{tag}: cannot read {path} ({exc.strerror or exc})")
    return Pretrain(PretrainKind.TIMM, weights=tag, sha256=digest)
