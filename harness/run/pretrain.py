"""Pretrained backbones: load a checkpoint, pretrain on a data set (cached), or take torchvision's weights.

A pretrained backbone is the state dict of a model's `blocks.*` (never its heads: their number and
size depend on the protocol). `pretrained_backbone` resolves a run's `Pretrain` value once: its
state and where its weights came from. Three sources (config.pretrain):

- `checkpoint`: a user's file, checked against the hash the protocol was loaded with (the bytes hashed
  are the bytes loaded);
- `dataset`: the blocks plus ONE temporary linear head over every class of the pretraining data,
  trained with SGD (momentum 0.9) by the recipe, seeded, on the run's device; the head is dropped.
  The result is cached under `cache_dir()/pretrained/<key>.pt`, the key a hash of everything that
  decides it (`Pretrain.cache_key` of the recipe in its `key_context`), so a sweep computes each
  backbone once (`prepare_pretrained`); the file's sha256 is stored beside it and checked on every
  read (config.cache): a replaced or damaged file is retrained, with one warning line;
- `torchvision`: ImageNet weights for model resnet18, read from torch hub's cache, fetched only
  with --download; the file's sha256 must start with the prefix in its name, as torch hub checks
  a download;
- `timm`: timm's published ViT weights, read from cl-bench's weights folder (config.pretrain.timm_weights_dir)
  or the user's `file:`, through timm's own loading code (run/vit.load_timm_file), never the network;
  `fetch_timm_weights` (--download) fetches them through timm.create_model(TAG, pretrained=True) into that
  folder. The file's sha256 must be the one the protocol was loaded (or the weights fetched) with.

`same` pretrains on a held-out, class-stratified part of the stream's own training split;
`stream_data` removes exactly those samples from the stream, so the two never share a sample.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch
from torch import nn

from ..config.cache import cached
from ..config.errors import PretrainError
from ..config.paths import cache_dir
from ..config.pretrain import TIMM_FILES, DatasetRecipe, Pretrain, PretrainKind, timm_weights_dir
from ..config.text import first_line
from .datasets import TensorData, dataset_fingerprint, load_dataset
from .models import build_model
from .resnet import torchvision_to_blocks

# Bump when the pretraining procedure changes what it computes: every cached backbone is then stale.
PRETRAIN_CODE_VERSION = "1"
# How `same` picks its held-out samples (part of the cache key and of the stream's definition).
HOLDOUT_RULE = "per-class blake2b(seed:index) rank, first floor(f*n+0.5) (at most n-1)"
MOMENTUM = 0.9
_SHOW = 3  # keys a mismatch message names before it says "and N more"
BLOCKS, HEADS = "blocks.", "heads."


@dataclass(frozen=True)
class Weights:
    """Where a backbone's weights came from: its source, cache key, file and the file's sha256."""

    source: str
    key: str
    path: str
    sha256: str

    def provenance(self) -> dict:
        """The record's provenance entry for these weights."""
        return dataclasses.asdict(self)


# -- the public entry points ----------------------------------------------------------------------
def pretrained_backbone(spec, input_shape, *, data_dir=None, download=False, device="cpu",
                        log=None) -> tuple[dict, Weights] | None:
    """The `blocks.*` state dict of the spec's pretrained backbone and where its weights came from
    (the record's provenance), or None when `spec.pretrain` is no backbone (first-task, none)."""
    pretrain = spec.pretrain
    if not pretrain.is_backbone:
        return None
    pretrain.check_fits(spec.dataset.model, spec.dataset.name, f"protocol {spec.protocol}")
    if pretrain.kind is PretrainKind.CHECKPOINT:
        return _checkpoint(pretrain)
    if pretrain.kind is PretrainKind.DATASET:
        return _dataset(spec, tuple(input_shape), data_dir, download, _device(device), log)
    if pretrain.kind is PretrainKind.TIMM:
        return _timm(pretrain, spec.dataset.model, tuple(input_shape))
    return _torchvision(pretrain, tuple(input_shape), download, log)


def prepare_pretrained(specs, *, data_dir=None, download=False, device="cpu", log=print) -> dict:
    """Compute (or find) every distinct backbone the specs need and check it fits their model, before
    any run starts; returns {cache key: {"source", "sha256", "path"}} (Pretrain.cache_key)."""
    out, seen = {}, set()
    for spec in specs:
        ident = (spec.pretrain, spec.dataset.model, spec.dataset.name)
        if not spec.pretrain.is_backbone or ident in seen:
            continue
        seen.add(ident)
        input_shape = load_dataset(spec.dataset.name, data_dir, download).input_shape
        state, weights = pretrained_backbone(spec, input_shape, data_dir=data_dir, download=download, device=device,
                                             log=log)
        # A checkpoint of another model fails here, once, rather than in every run.
        load_backbone(build_model(spec.dataset.model, input_shape, n_heads=1, head_classes=2), state,
                      spec.pretrain.label)
        out[weights.key] = {"source": weights.source, "sha256": weights.sha256, "path": weights.path}
    return out


def _device(device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# -- loading into a model ---------------------------------------------------------------------------
def load_backbone(model, state: dict, where: str) -> None:
    """Load `state`'s `blocks.*` into `model` strictly (heads.* ignored); any misfit is one PretrainError line."""
    expected = {k: v for k, v in model.state_dict().items() if k.startswith(BLOCKS)}
    problems = fit_problems(state, expected)
    if problems:
        raise PretrainError(f"pretrained backbone ({where}) does not fit the model: {problems}; allowed: a state "
                            "dict of exactly this model's blocks.* keys and shapes (heads.* keys are ignored)")
    with torch.no_grad():
        model.blocks.load_state_dict({k[len(BLOCKS):]: v for k, v in state.items() if k.startswith(BLOCKS)})


def fit_problems(state: dict, expected: dict) -> str:
    """What keeps `state` from loading into blocks shaped as `expected` ('' when it fits)."""
    given = {k: v for k, v in state.items() if not str(k).startswith(HEADS)}
    foreign = [str(k) for k in given if str(k) not in expected]
    missing = [k for k in expected if k not in given]
    not_tensors = [k for k in expected if k in given and not isinstance(given[k], torch.Tensor)]
    shapes = [f"{k} (file {list(given[k].shape)}, model {list(expected[k].shape)})" for k in expected
              if isinstance(given.get(k), torch.Tensor) and given[k].shape != expected[k].shape]
    parts = [(foreign, "unexpected keys"), (missing, "missing keys"), (not_tensors, "not tensors"),
             (shapes, "shape mismatch")]
    return "; ".join(f"{what} {_few(items)}" for items, what in parts if items)


def _few(items: list) -> str:
    more = f" and {len(items) - _SHOW} more" if len(items) > _SHOW else ""
    return ", ".join(items[:_SHOW]) + more


def _read_bytes(path: Path, where: str) -> bytes:
    # Read once, then hash and load these same bytes: the file cannot change between the check and the load.
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PretrainError(f"{where}: cannot read {path} ({exc.strerror or exc})") from None


def state_from_bytes(data: bytes, path: Path, where: str) -> dict:
    """The state dict a torch.save file's bytes hold (torch.load(weights_only=True)); one PretrainError line
    for anything else."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip, EOF errors: one line whatever the cause
        raise PretrainError(f"{where}: cannot read {path} as a torch state dict ({_load_problem(exc)}); "
                            "allowed: a file written by torch.save(model.state_dict(), PATH)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise PretrainError(f"{where}: {path} holds a {type(state).__name__}, not a state dict; allowed: a mapping "
                            "of parameter names to tensors (torch.save(model.state_dict(), PATH))")
    return state


def _load_problem(exc: Exception) -> str:
    """The telling line of a torch.load error: for a weights-only refusal, what was refused (torch's first
    line there only suggests weights_only=False, which would run the file's code)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        told = [line.removeprefix("Please file an issue with the following so that we can make `weights_only=True` "
                                  "compatible with your use case: ").removeprefix("WeightsUnpickler error:").strip()
                for line in lines[1:] if not line.startswith("Check the documentation")]
        return "weights-only load refused: " + (" ".join(t for t in told if t) or "not tensors")[:200]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _blocks_only(state: dict, where: str) -> dict:
    """The `blocks.*` entries; `heads.*` are dropped, any other key is an error."""
    foreign = [k for k in state if not k.startswith((BLOCKS, HEADS))]
    if foreign:
        raise PretrainError(f"{where}: unexpected keys {_few(foreign)}; allowed: blocks.* keys of the protocol's "
                            "model (heads.* are ignored)")
    return {k: v for k, v in state.items() if k.startswith(BLOCKS)}


# -- checkpoint ------------------------------------------------------------------------------------
def _checkpoint(pretrain: Pretrain) -> tuple[dict, Weights]:
    path = Path(pretrain.checkpoint)
    where = f"pretrain.checkpoint {path}"
    if not path.is_file():
        raise PretrainError(f"{where}: no such file; allowed: the file the protocol was loaded with")
    data = _read_bytes(path, where)
    found = hashlib.sha256(data).hexdigest()
    if found != pretrain.sha256:
        raise PretrainError(f"{where}: the file changed since the protocol was loaded (sha256 {found[:12]}, planned "
                            f"{pretrain.sha256[:12]}); load the protocol and plan the sweep again")
    weights = Weights(pretrain.kind.value, pretrain.cache_key(), str(path), found)
    return _blocks_only(state_from_bytes(data, path, where), where), weights


# -- torchvision -----------------------------------------------------------------------------------
def torchvision_weights_file(name: str) -> Path:
    """Where torch hub keeps the resnet18 weights `name`: <hub dir>/checkpoints/<file name of the URL>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(_tv_weights(name).url).path)


def _tv_weights(name: str):
    from torchvision.models import ResNet18_Weights

    return ResNet18_Weights[name]


def _torchvision(pretrain: Pretrain, input_shape: tuple, download: bool, log) -> tuple[dict, Weights]:
    name = pretrain.weights
    where = f"pretrain.torchvision {name}"
    path = torchvision_weights_file(name)
    if not path.is_file():
        if not download:
            raise PretrainError(f"{where}: weights file {path} not found; allowed: pass --download to fetch it "
                                f"({_tv_weights(name).url}), or put the file there")
        if log:
            log(f"pretrain: downloading torchvision resnet18 {name} weights to {path}")
        try:
            _tv_weights(name).get_state_dict(progress=False, check_hash=True)
        except Exception as exc:  # network, hash, disk: the user can act on the one line
            raise PretrainError(f"{where}: download failed ({first_line(exc)})") from None
    data = _read_bytes(path, where)
    digest = hashlib.sha256(data).hexdigest()
    check_hub_hash(path, digest, where)
    weights = Weights(pretrain.kind.value, pretrain.cache_key(), str(path), digest)
    return torchvision_to_blocks(state_from_bytes(data, path, where), int(input_shape[0])), weights


def check_hub_hash(path: Path, digest: str, where: str) -> None:
    """PretrainError unless the sha256 `digest` of `path`'s bytes starts with the prefix its file name
    carries (resnet18-f37072fd.pth), the check torch hub makes on a download (torch.hub.HASH_REGEX):
    a file put in the hub's cache by hand, or replaced there, is checked as a download is."""
    found = torch.hub.HASH_REGEX.search(path.name)
    prefix = found.group(1) if found else ""
    if not digest.startswith(prefix):
        raise PretrainError(f"{where}: {path} is not the file its name says (sha256 {digest[:len(prefix)]}, "
                            f"the name's {prefix}); allowed: torchvision's own file (remove it and pass "
                            "--download to fetch it again)")


# -- timm -----------------------------------------------------------------------------------------
def missing_timm_line(pretrain: Pretrain) -> str:
    """The one line saying timm weights are not there and how to get them."""
    return (f"pretrain.timm {pretrain.weights}: weights file {pretrain.weights_file} not found; allowed: pass "
            f"--download to fetch them through timm (timm.create_model({pretrain.weights!r}, pretrained=True)) "
            f"into {timm_weights_dir()}, or give pretrain: {{timm: {pretrain.weights}, file: PATH}}")


def with_timm_weights(pretrain: Pretrain, download: bool, log=None) -> Pretrain:
    """`pretrain` with its timm weights' sha256 once they are there, fetched first when `download` (others:
    itself); a value still missing them is returned as it is (a dry run plans without them)."""
    if pretrain.kind is not PretrainKind.TIMM:
        return pretrain
    if not pretrain.weights_file.is_file() and download and not pretrain.checkpoint:
        fetch_timm_weights(pretrain.weights, log)
    return pretrain.with_weights_hash()


def fetch_timm_weights(tag: str, log=None) -> Path:
    """Fetch timm's weights `tag` through timm's own loading (timm.create_model(tag, pretrained=True), its
    Hugging Face hub or URL source) into the weights folder; returns the file. One PretrainError line on failure."""
    import timm

    folder = timm_weights_dir() / tag
    if log:
        log(f"pretrain: downloading timm {tag} weights to {folder}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".download-") as tmp:
            timm.create_model(tag, pretrained=True, cache_dir=tmp)
            found = [p for name in TIMM_FILES for p in Path(tmp).rglob(name)]  # safetensors first
            if not found:
                raise OSError(f"timm left none of {', '.join(TIMM_FILES)} in its download folder")
            folder.mkdir(exist_ok=True)
            partial = folder / f".{found[0].name}.part"
            shutil.copyfile(found[0].resolve(), partial)
            os.replace(partial, folder / found[0].name)  # complete or absent: never a half-written file
    except Exception as exc:  # network, hub, disk: the user can act on the one line
        raise PretrainError(f"pretrain.timm {tag}: download failed ({first_line(exc)})") from None
    return folder / found[0].name


def _timm(pretrain: Pretrain, model: str, input_shape: tuple) -> tuple[dict, Weights]:
    from .vit import load_timm_file

    path, where = pretrain.weights_file, f"pretrain.timm {pretrain.weights}"
    if not path.is_file():
        raise PretrainError(missing_timm_line(pretrain))
    digest = hashlib.sha256(_read_bytes(path, where)).hexdigest()
    if pretrain.sha256 and digest != pretrain.sha256:
        raise PretrainError(f"{where}: {path} changed since the protocol was loaded (sha256 {digest[:12]}, planned "
                            f"{pretrain.sha256[:12]}); load the protocol and plan the sweep again")
    if not pretrain.sha256:
        raise PretrainError(f"{where}: the weights were missing when the protocol was loaded (run ids need their "
                            "sha256); load the protocol and plan the sweep again")
    try:
        state = load_timm_file(model, input_shape, path, pretrain.weights)
    except Exception as exc:  # safetensors, pickle, shape errors: one line whatever the cause
        raise PretrainError(f"{where}: timm cannot load {path} ({first_line(exc)[:300]}); allowed: timm's weights "
                            f"file of {pretrain.weights} (remove it and pass --download to fetch it again)") from None
    return state, Weights(pretrain.kind.value, pretrain.cache_key(), str(path), digest)


# -- dataset: held-out samples ---------------------------------------------------------------------
def holdout_indices(y_train, fraction: float, seed: int) -> torch.Tensor:
    """Sorted indices of a class-stratified fraction of `y_train` (deterministic in `seed`).

    Per class of n samples, the floor(fraction * n + 0.5) (at most n - 1: every class keeps a stream
    sample) whose blake2b(seed:index) ranks lowest: a rule of the data alone, the same in every
    version of numpy and torch, so a stream is the same wherever it is cut.
    """
    y = np.asarray(y_train.cpu() if isinstance(y_train, torch.Tensor) else y_train)
    chosen = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c).tolist()
        k = min(math.floor(fraction * len(members) + 0.5), len(members) - 1)
        chosen += sorted(members, key=lambda i: _rank(seed, i))[:k]
    return torch.as_tensor(sorted(chosen), dtype=torch.long)


def _rank(seed: int, index: int) -> bytes:
    return hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()


def stream_data(data: TensorData, pretrain: Pretrain) -> TensorData:
    """The CL stream's data: without the held-out samples when `pretrain` uses them, else `data` itself."""
    if pretrain.holdout is None:
        return data
    keep = torch.ones(len(data.y_train), dtype=torch.bool)
    keep[holdout_indices(data.y_train, pretrain.holdout, pretrain.recipe.seed)] = False
    return dataclasses.replace(data, x_train=data.x_train[keep], y_train=data.y_train[keep])


def _pretrain_data(recipe: DatasetRecipe, stream: str, input_shape: tuple, data_dir, download):
    """(x, y, n_classes, content fingerprint) of what the backbone pretrains on."""
    data = load_dataset(recipe.dataset, data_dir, download)
    if recipe.holdout is not None:
        held = holdout_indices(data.y_train, recipe.holdout, recipe.seed)
        x, y = data.x_train[held], data.y_train[held]
    else:
        x, y = data.x_train, data.y_train
    if tuple(data.input_shape) != tuple(input_shape):
        raise PretrainError(f"pretrain.dataset: {recipe.dataset!r} has samples of shape {tuple(data.input_shape)}, "
                            f"but the stream {stream!r} has {tuple(input_shape)}; allowed: a data set with the "
                            "stream's input shape, or same")
    held = load_dataset(stream, data_dir, download).x_train.dtype
    if data.x_train.dtype != held:  # uint8 pixels (image sets) are not normalised float features: another input
        raise PretrainError(f"pretrain.dataset: {recipe.dataset!r} holds {_held_as(data.x_train.dtype)}, but the "
                            f"stream {stream!r} holds {_held_as(held)}; allowed: a data set held the same way "
                            "(cifar100-pixels for an image set's stream, cifar100 for a float one), or same")
    return x, y, data.n_classes, dataset_fingerprint(recipe.dataset, data_dir, download)


def _held_as(dtype) -> str:
    return "uint8 pixels" if dtype == torch.uint8 else f"{str(dtype).removeprefix('torch.')} features"


# -- dataset: the cache ----------------------------------------------------------------------------
def key_context(pretrain: Pretrain, model: str, input_shape, fingerprint: str, device_type: str) -> dict:
    """What decides a dataset-pretrained backbone's weights besides its recipe (Pretrain.cache_key's context)."""
    return {"model": model, "input_shape": list(input_shape), "data": fingerprint,
            "holdout_rule": HOLDOUT_RULE if pretrain.holdout is not None else None,
            "code": PRETRAIN_CODE_VERSION, "torch": torch.__version__, "device": device_type}


def pretrained_dir() -> Path:
    """Folder of the cached pretrained backbones."""
    return cache_dir() / "pretrained"


def _dataset(spec, input_shape: tuple, data_dir, download, device: torch.device, log) -> tuple[dict, Weights]:
    pretrain = spec.pretrain
    x, y, n_classes, fingerprint = _pretrain_data(pretrain.recipe, spec.dataset.name, input_shape, data_dir, download)
    key = pretrain.cache_key(**key_context(pretrain, spec.dataset.model, input_shape, fingerprint, device.type))
    path = pretrained_dir() / f"{key}.pt"

    def build() -> tuple[dict, bytes]:
        if log:
            log(f"pretrain: training {spec.dataset.model} on {pretrain.label} ({len(y)} samples) -> {path}")
        state = train_backbone(spec.dataset.model, x, y, n_classes, pretrain.recipe, device)
        buffer = io.BytesIO()  # not the temp file's path: torch.save names the archive inside after it
        torch.save(state, buffer)
        return state, buffer.getvalue()

    # Verified against the sha256 stored beside it on every read: a replaced or damaged file is rebuilt.
    entry = cached(path, lambda data: state_from_bytes(data, path, "pretrain cache"), build, warn=log)
    if log and not entry.built:
        log(f"pretrain: cached backbone {path}")
    return entry.value, Weights(pretrain.kind.value, key, str(path), entry.sha256)


# -- dataset: training -----------------------------------------------------------------------------
def train_backbone(model_name: str, x: torch.Tensor, y: torch.Tensor, n_classes: int, recipe: DatasetRecipe,
                   device: torch.device) -> dict:
    """Train the model's blocks and one temporary head over `n_classes` on (x, y); returns the blocks' state."""
    with _seeded(recipe.seed, device), _deterministic(device):
        model = build_model(model_name, tuple(x.shape[1:]), n_heads=1, head_classes=n_classes).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=MOMENTUM)
        order_rng = torch.Generator().manual_seed(recipe.seed)
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        for epoch in range(recipe.epochs):
            order = torch.randperm(len(y), generator=order_rng)
            for start in range(0, len(order), recipe.batch_size):
                batch = order[start:start + recipe.batch_size]
                # Any batch of one is skipped here, on every backbone, unlike a run's training, which skips it
                # only where a forward of one row fails (harness.api.one_row): the cached backbones were
                # trained under this rule and are keyed by their recipe, so it stays.
                if len(batch) < 2 < len(order):
                    continue
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model.heads[0](model.features(x[batch].to(device))), y[batch].to(device))
                if not torch.isfinite(loss):
                    raise PretrainError(f"pretrain: training diverged (loss {loss.item()} in epoch {epoch + 1}); "
                                        f"allowed: a smaller pretrain.lr than {recipe.lr}")
                loss.backward()
                optimizer.step()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k.startswith(BLOCKS)}


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    # The run's own random streams must not depend on whether its backbone came from the cache.
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _deterministic(device: torch.device):
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved
