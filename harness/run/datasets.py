"""Dataset registry: every dataset becomes in-memory float tensors (train and test)."""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..api.plugins import DataSource, PluginError, lookup, register_builtins
from ..config import paths
from ..config.errors import DatasetError
from ..config.files import atomic_path
from ..config.paths import cache_dir
from ..config.vocabulary import DATASETS, NPZ_PREFIX

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorData:
    """A classification dataset held in memory."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def n_classes(self) -> int:
        """Number of distinct labels (labels are 0..n-1)."""
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        return tuple(self.x_train.shape[1:])


def _as_data(name, x_train, y_train, x_test, y_test) -> TensorData:
    import torch

    # Cast in numpy: torch refuses long double and non-native byte order ('>f8' from another machine).
    def x(a):
        return torch.as_tensor(np.asarray(a, dtype=np.float32))

    def y(a):
        return torch.as_tensor(np.asarray(a, dtype=np.int64))

    return TensorData(name, x(x_train), y(y_train), x(x_test), y(y_test))


def _digits(*_) -> TensorData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = bunch.data.astype(np.float32) / 16.0
    # A fixed stratified split: the split is part of the dataset, not of the run.
    x_tr, x_te, y_tr, y_te = train_test_split(x, bunch.target, test_size=0.25, random_state=0,
                                              stratify=bunch.target)
    # Standardise with training statistics: plain [0, 1] pixels train a deep MLP slowly.
    mean, std = x_tr.mean(), x_tr.std()
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return _as_data("digits", x_tr.reshape(-1, 1, 8, 8), y_tr, x_te.reshape(-1, 1, 8, 8), y_te)


def _mnist1d(*_) -> TensorData:
    from mnist1d.data import get_dataset_args, make_dataset

    cache = cache_dir(create=True) / "mnist1d-default.npz"
    if cache.exists():
        arrays = np.load(cache)
    else:
        # make_dataset generates offline; mnist1d's own default would download a pickle.
        d = make_dataset(get_dataset_args())
        arrays = {k: d[k] for k in ("x", "y", "x_test", "y_test")}
        _atomic_savez(cache, arrays)
    return _as_data("mnist1d", arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"])


def _atomic_savez(path: Path, arrays: dict) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:  # a file object: savez would add ".npz" to a name
        np.savez(fh, **arrays)


# name -> (torchvision class name, channels, normalisation mean, std)
TORCHVISION = {
    "mnist": ("MNIST", (0.1307,), (0.3081,)),
    "fashion-mnist": ("FashionMNIST", (0.2860,), (0.3530,)),
    "kmnist": ("KMNIST", (0.1918,), (0.3483,)),
    "qmnist": ("QMNIST", (0.1307,), (0.3081,)),
    "cifar100": ("CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _torchvision(name: str, given: str | None = None, download: bool = False) -> TensorData:
    import torch
    import torchvision.datasets as tvd

    cls_name, mean, std = TORCHVISION[name]
    root = paths.data_dir(given)
    cls = getattr(tvd, cls_name)
    if name == "cifar100":
        return _cifar100(root, download, mean, std)
    try:
        train, test = cls(str(root), train=True, download=download), cls(str(root), train=False, download=download)
    except RuntimeError as exc:
        if download:
            raise DatasetError(f"dataset {name!r}: download into {root} failed: {exc}") from None
        raise DatasetError(
            f"dataset {name!r} not found under {root} (torchvision {cls_name} layout); "
            f"pass --data-dir DIR pointing at it, or add --download to fetch it") from None
    x_tr, y_tr = _torchvision_arrays(train)
    x_te, y_te = _torchvision_arrays(test)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return TensorData(name, (x_tr - m) / s, y_tr, (x_te - m) / s, y_te)


def _cifar100(root: Path, download: bool, mean, std) -> TensorData:
    """CIFAR-100 from its on-disk pickles (`cifar-100-python/{train,test}`).

    Read directly rather than through torchvision's class, whose md5 check would reject
    re-packed or partial copies; torchvision is used only to download.
    """
    import pickle

    import torch

    folder = root / "cifar-100-python"
    if not (folder / "train").is_file() and download:
        import torchvision.datasets as tvd

        try:
            tvd.CIFAR100(str(root), train=True, download=True)
        except Exception as exc:
            raise DatasetError(f"dataset 'cifar100': download into {root} failed: {exc}") from None
    arrays = []
    for split in ("train", "test"):
        path = folder / split
        if not path.is_file():
            raise DatasetError(f"dataset 'cifar100' not found: {path} is missing (torchvision CIFAR100 layout); "
                               "pass --data-dir DIR pointing at it, or add --download to fetch it")
        with open(path, "rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
        x = torch.as_tensor(np.asarray(entry["data"], dtype=np.uint8)).view(-1, 3, 32, 32).float() / 255.0
        arrays += [x, torch.as_tensor(np.asarray(entry["fine_labels"])).long()]
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return TensorData("cifar100", (arrays[0] - m) / s, arrays[1], (arrays[2] - m) / s, arrays[3])


def _torchvision_arrays(ds):
    import torch

    data = torch.as_tensor(np.asarray(ds.data))
    if data.ndim == 3:  # MNIST family: N,H,W uint8
        x = data.unsqueeze(1).float() / 255.0
    else:  # CIFAR: N,H,W,C uint8
        x = data.permute(0, 3, 1, 2).float() / 255.0
    targets = torch.as_tensor(np.asarray(ds.targets))
    if targets.ndim == 2:  # QMNIST keeps 8 columns; the first is the class
        targets = targets[:, 0]
    return x.contiguous(), targets.long()


ARRAYS = ("x_train", "y_train", "x_test", "y_test")
# How many missing classes a message lists before it says "and N more".
_SHOW = 5


def _npz(path: str) -> TensorData:
    name = f"npz:{path}"
    try:
        p = Path(path).expanduser()
        found = p.is_file()
    except (OSError, ValueError, RuntimeError) as exc:  # name too long, NUL byte, ~nobody
        raise DatasetError(f"dataset '{name}': not a usable path ({exc})") from None
    if not found:
        raise DatasetError(f"dataset '{name}': file not found")
    try:
        # allow_pickle=False: an object array would run arbitrary code from the file when read.
        f = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a folder, a pickle, junk
        raise DatasetError(f"dataset '{name}': not a readable .npz file ({exc})") from None
    if not hasattr(f, "files"):  # np.load of a .npy gives one array, not an archive
        raise DatasetError(f"dataset '{name}': not an .npz archive of named arrays")
    with f:
        missing = [k for k in ARRAYS if k not in f]
        if missing:
            raise DatasetError(f"dataset '{name}': missing arrays {missing}; "
                               "need x_train, y_train, x_test, y_test")
        arrays = {k: _read_member(name, f, k) for k in ARRAYS}
    validate_arrays(name, arrays)
    return _as_data(name, *(arrays[k] for k in ARRAYS))


def _read_member(name: str, archive, key: str) -> np.ndarray:
    try:
        return archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):  # numpy refuses object arrays when pickles are off
            raise DatasetError(f"dataset '{name}': {key} is an object array (pickled Python objects); "
                               "allowed: numeric arrays") from None
        raise DatasetError(f"dataset '{name}': {key} cannot be read ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:  # a truncated or corrupt member
        raise DatasetError(f"dataset '{name}': {key} cannot be read ({exc})") from None


def validate_arrays(name: str, arrays: dict) -> None:
    """Raise a one-line DatasetError for the first defect in x_train, y_train, x_test, y_test."""
    def fail(message: str):
        raise DatasetError(f"dataset '{name}': {message}")

    for key in ARRAYS:
        if arrays[key].dtype.hasobject:
            fail(f"{key} is an object array (pickled Python objects); allowed: numeric arrays")
    for split in ("train", "test"):
        _check_split(fail, split, arrays[f"x_{split}"], arrays[f"y_{split}"])
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        fail(f"x_train and x_test sample shapes differ ({arrays['x_train'].shape[1:]} vs "
             f"{arrays['x_test'].shape[1:]}); allowed: the same shape per sample")
    _check_labels(fail, arrays["y_train"], arrays["y_test"])


def _check_split(fail, split: str, x: np.ndarray, y: np.ndarray) -> None:
    xk, yk = f"x_{split}", f"y_{split}"
    # Labels are class indices: casting floats or strings would hide a wrong column or file.
    if y.dtype.kind not in "iu":
        fail(f"{yk} labels must be integers; got dtype {y.dtype}; "
             "allowed: an integer dtype (class indices 0..C-1)")
    if y.ndim != 1:
        fail(f"{yk} must be 1-D (one label per sample); got shape {y.shape}")
    if x.dtype.kind not in "biuf":  # complex, strings, dates: no float32 tensor means them
        fail(f"{xk} features must be numeric; got dtype {x.dtype}; allowed: bool, integer or float")
    if x.ndim < 2 or 0 in x.shape[1:]:
        fail(f"{xk} must have shape (samples, features...) with at least one feature; got shape {x.shape}")
    if len(x) != len(y):
        fail(f"{xk} has {len(x)} samples but {yk} has {len(y)} labels; allowed: one label per sample")
    if len(x) == 0:
        fail(f"{xk} has no samples; allowed: a non-empty {split} split")
    _check_finite(fail, xk, x)


def _check_finite(fail, key: str, x: np.ndarray) -> None:
    if x.dtype.kind != "f":  # bool and integer values are always finite
        return
    # A NaN or inf input makes the loss NaN, which the run would blame on the method ("diverged").
    bad = x.size - int(np.count_nonzero(np.isfinite(x)))
    if bad:
        fail(f"{key} has {bad} non-finite values (NaN or inf) of {x.size}; allowed: finite numbers")
    if x.dtype.itemsize > 4:  # loaded as float32: larger values become inf
        limit = float(np.finfo(np.float32).max)
        big = int(np.count_nonzero(np.abs(x) > limit))
        if big:
            fail(f"{key} has {big} values beyond the float32 range (|x| > {limit:.3g}); "
                 "allowed: finite float32 numbers")


def _check_labels(fail, y_train: np.ndarray, y_test: np.ndarray) -> None:
    present = {"y_train": np.unique(y_train), "y_test": np.unique(y_test)}
    for key, values in present.items():
        if values[0] < 0:  # classes are 0..C-1; a negative one would be dropped from every task
            fail(f"{key} has negative label {int(values[0])}; allowed: labels 0..C-1")
    top = max(int(v[-1]) for v in present.values())
    if top < 1:
        fail(f"only one class (label {top}) in y_train and y_test; allowed: at least 2 classes 0..C-1")
    for key, values in present.items():
        # A class absent from train is never learnt; absent from test, its accuracy is undefined.
        gaps, count = _missing(values, top + 1)
        if count:
            which = f"class {gaps} has" if count == 1 else f"classes {gaps} have"
            fail(f"{which} no samples in {key} (labels run 0..{top}); "
                 f"allowed: every class 0..{top} present in both y_train and y_test")


def _missing(present: np.ndarray, n: int) -> tuple[str, int]:
    """The first few of 0..n-1 absent from sorted unique `present` (as text), and how many are."""
    count = n - len(present)  # present lies within 0..n-1
    if not count:
        return "", 0
    shown, prev = [], -1
    for v in [*map(int, present), n]:  # walk the gaps; never builds range(n), n may be huge
        shown += range(prev + 1, min(v, prev + 1 + _SHOW - len(shown)))
        prev = v
        if len(shown) >= _SHOW:
            break
    more = f" and {count - len(shown)} more" if count > len(shown) else ""
    return ", ".join(map(str, shown)) + more, count


def _builtin(name: str, load) -> DataSource:
    """A built-in data set: its facts (classes, default backbone, origin, sample shape) are the vocabulary's."""
    facts = DATASETS[name]
    return DataSource(name, load, facts.n_classes, facts.default_model, origin=facts.source,
                      input_shape=facts.sample_shape)


# The built-in data sets, declared as a plug-in file declares its own (harness/api/plugins.py).
PLUGINS = register_builtins(_builtin("digits", _digits), _builtin("mnist1d", _mnist1d),
                            *(_builtin(name, partial(_torchvision, name)) for name in TORCHVISION))
# Every built-in data set of the vocabulary has a loader here (checked once, at import).
assert {p.name for p in PLUGINS} == {name for name, facts in DATASETS.items() if facts.source != "plug-in"}


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str | None = None, download: bool = False) -> TensorData:
    """Load a dataset by registered name (built-in or plug-in; `npz:PATH` for a user's own arrays)."""
    if name.startswith(NPZ_PREFIX):
        return _npz(name[len(NPZ_PREFIX):])
    try:
        found = lookup("dataset", name)
    except PluginError:
        raise DatasetError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}, npz:PATH") from None
    loaded = found.plugin.load(paths.data_dir(data_dir), download)
    if isinstance(loaded, TensorData):  # a built-in's own tensors
        return loaded
    return _plugin_data(found, loaded)


def _plugin_data(found, loaded) -> TensorData:
    """A plug-in's arrays, checked as a user's npz file is, as tensors with the declared classes."""
    source = found.plugin
    where = f"{found.source}: dataset {source.name!r}"
    if isinstance(loaded, dict) and set(ARRAYS) <= set(loaded):
        loaded = tuple(loaded[k] for k in ARRAYS)
    if not isinstance(loaded, (tuple, list)) or len(loaded) != len(ARRAYS):
        raise DatasetError(f"{where}: load returned {type(loaded).__name__}; allowed: x_train, y_train, x_test, "
                           "y_test as a 4-tuple or a mapping of those names")
    arrays = {k: np.asarray(a) for k, a in zip(ARRAYS, loaded)}
    validate_arrays(source.name, arrays)
    data = _as_data(source.name, *(arrays[k] for k in ARRAYS))
    if data.n_classes != source.n_classes:
        raise DatasetError(f"{where}: declares n_classes={source.n_classes}, "
                           f"but its labels run 0..{data.n_classes - 1}; "
                           f"allowed: n_classes={data.n_classes}, or data with {source.n_classes} classes")
    return data


def fingerprint(data: TensorData) -> str:
    """'sha256:' + 16 hex digits over the dtype, shape and bytes of the four tensors."""
    h = hashlib.sha256()
    for key in ARRAYS:
        tensor = getattr(data, key).detach().cpu().contiguous()
        h.update(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        # A flat uint8 view of the tensor's own memory: hashed without a copy.
        h.update(tensor.numpy().reshape(-1).view(np.uint8))
    return "sha256:" + h.hexdigest()[:16]


# (name, data_dir) -> fingerprint: each data set is hashed once per process.
_FINGERPRINTS: dict[tuple[str, str | None], str] = {}


def dataset_fingerprint(name: str, data_dir: str | None = None, download: bool = False) -> str:
    """The content fingerprint of a data set by name, computed once per process."""
    key = (name, data_dir)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = fingerprint(load_dataset(name, data_dir, download))
    return _FINGERPRINTS[key]
