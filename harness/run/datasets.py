"""Dataset registry: every dataset becomes in-memory float tensors (train and test)."""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..config.errors import UserError
from ..config.paths import cache_dir, data_dir
from ..config.vocabulary import DATASETS, NPZ_PREFIX


class DatasetError(UserError, ValueError):
    """A dataset cannot be loaded; the message says why and how to fix it."""


@dataclass(frozen=True)
class TensorData:
    """A classification dataset held in memory."""

    name: str
    x_train: "torch.Tensor"
    y_train: "torch.Tensor"
    x_test: "torch.Tensor"
    y_test: "torch.Tensor"

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

    return TensorData(name, torch.as_tensor(np.asarray(x_train), dtype=torch.float32),
                      torch.as_tensor(np.asarray(y_train), dtype=torch.long),
                      torch.as_tensor(np.asarray(x_test), dtype=torch.float32),
                      torch.as_tensor(np.asarray(y_test), dtype=torch.long))


def _digits(**_) -> TensorData:
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


def _mnist1d(**_) -> TensorData:
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


# name -> (torchvision class name, channels, normalisation mean, std)
TORCHVISION = {
    "mnist": ("MNIST", (0.1307,), (0.3081,)),
    "fashion-mnist": ("FashionMNIST", (0.2860,), (0.3530,)),
    "kmnist": ("KMNIST", (0.1918,), (0.3483,)),
    "qmnist": ("QMNIST", (0.1307,), (0.3081,)),
    "cifar100": ("CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _torchvision(name: str, given: str | None, download: bool) -> TensorData:
    import torch
    import torchvision.datasets as tvd

    cls_name, mean, std = TORCHVISION[name]
    root = data_dir(given)
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


def _npz(path: str) -> TensorData:
    try:
        p = Path(path).expanduser()
        found = p.is_file()
    except (OSError, ValueError, RuntimeError) as exc:  # name too long, NUL byte, ~nobody
        raise DatasetError(f"dataset 'npz:{path}': not a usable path ({exc})") from None
    if not found:
        raise DatasetError(f"dataset 'npz:{path}': file not found")
    try:
        f = np.load(p)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a folder, a pickle, junk
        raise DatasetError(f"dataset 'npz:{path}': not a readable .npz file ({exc})") from None
    if not hasattr(f, "files"):  # np.load of a .npy gives one array, not an archive
        raise DatasetError(f"dataset 'npz:{path}': not an .npz archive of named arrays")
    with f:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in f]
        if missing:
            raise DatasetError(f"dataset 'npz:{path}': missing arrays {missing}; "
                               "need x_train, y_train, x_test, y_test")
        data = _as_data(f"npz:{path}", f["x_train"], f["y_train"], f["x_test"], f["y_test"])
    if data.x_train.shape[1:] != data.x_test.shape[1:]:
        raise DatasetError(f"dataset 'npz:{path}': x_train and x_test sample shapes differ")
    return data


EMBEDDED = {"digits": _digits, "mnist1d": _mnist1d}
# Every data set of the vocabulary has a loader here (checked once, at import).
assert {n for n, f in DATASETS.items() if f.source == "embedded"} == set(EMBEDDED)
assert {n for n, f in DATASETS.items() if f.source == "torchvision"} == set(TORCHVISION)


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str | None = None, download: bool = False) -> TensorData:
    """Load a dataset by registry name (`npz:PATH` for a user's own arrays)."""
    if name in EMBEDDED:
        return EMBEDDED[name]()
    if name in TORCHVISION:
        return _torchvision(name, data_dir, download)
    if name.startswith(NPZ_PREFIX):
        return _npz(name[len(NPZ_PREFIX):])
    raise DatasetError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}, npz:PATH")
