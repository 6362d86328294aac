"""Dataset registry: every dataset becomes in-memory tensors (train and test): float32, except the image sets
for pretrained models (PIXEL_DATASETS), held as uint8 pixels (harness/run/image_sets.py)."""
from __future__ import annotations

import hashlib
import io
import pickle
import zipfile
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..api.plugins import DataSource, PluginError, lookup, register_builtins
from ..config import paths
from ..config.cache import cached
from ..config.errors import CacheError, DatasetError, DatasetMissing, UserError
from ..config.paths import cache_dir
from ..config.text import first_line
from ..config.vocabulary import DATASETS, NPZ_PREFIX, PIXEL_DATASETS

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorData:
    """A classification dataset held in memory: x float32, or uint8 pixels (N, 3, H, W) for PIXEL_DATASETS
    (models turn those into float / 255 on the device: CLNet.pixels)."""

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


DIGITS_BUILD = "v1"  # the cache file's name changes with _digits_build (its split or normalisation)


def _digits(*_) -> TensorData:
    # Cached after the first build, by scikit-learn version: a process that loads digits from the cache
    # never imports scikit-learn (with SciPy, ~1 s of a small grid's start-up).
    try:
        arrays = _cached_arrays(f"digits-{DIGITS_BUILD}-sklearn-{_version('scikit-learn')}.npz", "digits",
                                _digits_build, ARRAYS)
    except CacheError:  # the embedded data set runs without a cache, as it always has
        arrays = _digits_build()
    return _as_data("digits", *(arrays[k] for k in ARRAYS))


def _digits_build() -> dict:
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
    return dict(zip(ARRAYS, (x_tr.reshape(-1, 1, 8, 8), y_tr, x_te.reshape(-1, 1, 8, 8), y_te)))


def _mnist1d(*_) -> TensorData:
    arrays = _cached_arrays("mnist1d-default.npz", "mnist1d", _mnist1d_build, MNIST1D_KEYS)
    return _as_data("mnist1d", *(arrays[k] for k in ARRAYS))


MNIST1D_KEYS = ("x", "y", "x_test", "y_test")  # the cache file's names (mnist1d's own) for ARRAYS


def _mnist1d_build() -> dict:
    from mnist1d.data import get_dataset_args, make_dataset

    # make_dataset generates offline; mnist1d's own default would download a pickle.
    d = make_dataset(get_dataset_args())
    return dict(zip(ARRAYS, (d[k] for k in MNIST1D_KEYS)))


def _cached_arrays(filename: str, name: str, build, keys: tuple[str, ...]) -> dict:
    """The ARRAYS of a data set generated on this machine (`build()`), kept in a cache file under `keys`
    (hash-checked, read without pickles)."""
    def built() -> tuple[dict, bytes]:
        arrays = build()
        buffer = io.BytesIO()  # a file object: savez would add ".npz" to a name
        np.savez(buffer, **{key: arrays[k] for key, k in zip(keys, ARRAYS)})
        return arrays, buffer.getvalue()

    def parse(data: bytes) -> dict:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            arrays = {k: f[key] for key, k in zip(keys, ARRAYS)}
        validate_arrays(name, arrays)
        return arrays

    return cached(cache_dir() / filename, parse, built).value


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


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
        if not _not_there(exc):
            raise _damaged(name, root, cls_name, exc) from None
        if download:
            raise DatasetError(f"dataset {name!r}: download into {root} failed: {exc}") from None
        raise DatasetMissing(
            f"dataset {name!r} not found under {root} (torchvision {cls_name} layout); "
            f"pass --data-dir DIR pointing at it, or add --download to fetch it") from None
    except Exception as exc:  # torchvision's readers assert, or fail on short or junk bytes
        raise _damaged(name, root, cls_name, exc) from None
    x_tr, y_tr = _torchvision_arrays(train)
    x_te, y_te = _torchvision_arrays(test)
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if len(x) != len(y) or not len(y):
            raise _damaged(name, root, cls_name, ValueError(f"{split}: {len(x)} images, {len(y)} labels"))
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return TensorData(name, (x_tr - m) / s, y_tr, (x_te - m) / s, y_te)


def _not_there(exc: RuntimeError) -> bool:
    """torchvision's own "not found" (no files) or a failed download, not an error reading present files."""
    return "not found" in str(exc) or "download" in str(exc).lower()


def _damaged(name: str, root: Path, cls_name: str, exc: BaseException) -> DatasetError:
    return DatasetError(f"dataset {name!r}: the files under {root / cls_name} cannot be read, damaged? "
                        f"({first_line(exc)}); allowed: torchvision's {cls_name} files (remove them and pass "
                        "--download to fetch them again)")


def _cifar100(root: Path, download: bool, mean, std) -> TensorData:
    """CIFAR-100 from its on-disk pickles (`cifar-100-python/{train,test}`), read by `read_cifar_pickle`.

    Read directly rather than through torchvision's class, whose md5 check would reject
    re-packed or partial copies and whose plain pickle.load would run code from a poisoned file;
    torchvision is used only to download (its archive's md5 is checked).
    """
    import torch

    pixels = cifar100_pixels(root, download)
    arrays = []
    for split in ("train", "test"):
        x = torch.as_tensor(pixels[f"x_{split}"]).float() / 255.0
        arrays += [x, torch.as_tensor(pixels[f"y_{split}"]).long()]
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return TensorData("cifar100", (arrays[0] - m) / s, arrays[1], (arrays[2] - m) / s, arrays[3])


def cifar100_pixels(root: Path, download: bool = False) -> dict:
    """CIFAR-100's ARRAYS from `root/cifar-100-python/{train,test}` (fetched first with `download`): pixels as
    uint8 (n, 3, 32, 32), fine labels as int64; read without running code from the files (`read_cifar_pickle`)."""
    folder = root / "cifar-100-python"
    if not (folder / "train").is_file() and download:
        _download_cifar100(root)
    arrays = {}
    for split in ("train", "test"):
        path = folder / split
        if not path.is_file():
            raise DatasetMissing(f"dataset 'cifar100' not found: {path} is missing (torchvision CIFAR100 layout); "
                               "pass --data-dir DIR pointing at it, or add --download to fetch it")
        pixels, labels = _cifar_arrays(path, read_cifar_pickle(path))
        arrays[f"x_{split}"], arrays[f"y_{split}"] = pixels.reshape(-1, 3, 32, 32), labels
    return arrays


def _download_cifar100(root: Path) -> None:
    from torchvision.datasets import CIFAR100
    from torchvision.datasets.utils import download_and_extract_archive

    try:  # only the archive (md5-checked) and its extraction: nothing here unpickles
        download_and_extract_archive(CIFAR100.url, str(root), filename=CIFAR100.filename, md5=CIFAR100.tgz_md5)
    except Exception as exc:
        raise DatasetError(f"dataset 'cifar100': download into {root} failed: {exc}") from None


class _Forbidden(Exception):
    """A global a CIFAR-100 pickle never references (the message names it)."""


def _empty_array(reconstruct):
    def empty_array(cls, shape, typecode):
        # numpy pickles every array as _reconstruct(ndarray, (0,), 'b') and then its state;
        # any other shape would allocate memory before the state is checked.
        if cls is not np.ndarray or tuple(shape) != (0,):
            raise _Forbidden(f"numpy _reconstruct({getattr(cls, '__name__', cls)!s:.40}, {shape!s:.40})")
        return reconstruct(cls, shape, typecode)
    return empty_array


def _latin1(text, encoding="utf-8", errors="strict"):
    # Python 3 pickles bytes under protocol <= 2 as _codecs.encode(text, 'latin1').
    if encoding not in ("latin1", "latin-1") or errors != "strict" or not isinstance(text, str):
        raise _Forbidden(f"_codecs.encode with encoding {encoding!r:.40}")
    return text.encode("latin1")


def _cifar_globals() -> dict:
    """(module, name) -> object: every global a CIFAR-100 pickle may reference, and nothing else.

    The genuine files (python 2, numpy 1, protocol 2) reference numpy.core.multiarray._reconstruct,
    numpy.ndarray and numpy.dtype; copies re-pickled by numpy 2 (numpy._core), Python 3 (_codecs.encode
    for bytes under protocol 2) or protocol 5 (_frombuffer, numpy scalars) reference the rest. Each
    object is taken from numpy's own pickling, so no module is imported by name from the file.
    """
    reconstruct = np.zeros(0).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    scalar = np.int64(0).__reduce__()[0]
    found = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _latin1}
    for package in ("numpy.core", "numpy._core"):  # numpy 1 and numpy 2 names of the same functions
        found[(f"{package}.multiarray", "_reconstruct")] = _empty_array(reconstruct)
        found[(f"{package}.multiarray", "scalar")] = scalar
        found[(f"{package}.numeric", "_frombuffer")] = frombuffer
    return found


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only dicts, lists, tuples, strings, numbers and numpy arrays."""

    ALLOWED = _cifar_globals()

    def find_class(self, module, name):
        """The allowed object for (module, name); _Forbidden for anything else (nothing is imported)."""
        found = self.ALLOWED.get((module, name))
        if found is None:
            raise _Forbidden(f"{module}.{name}"[:120])
        return found

    def persistent_load(self, pid):
        """Persistent ids are never in a CIFAR-100 file."""
        raise _Forbidden("a persistent id")


def read_cifar_pickle(path: Path):
    """The object in a CIFAR pickle file, unpickled without running code from it; one DatasetError line
    for a file that references anything but builtin containers and numpy arrays, or cannot be read."""
    try:
        with open(path, "rb") as fh:
            return _CifarUnpickler(fh, encoding="latin1").load()
    except _Forbidden as exc:
        raise DatasetError(f"dataset 'cifar100': {path} refused: the pickle references {exc}, which no "
                           "CIFAR-100 file does; allowed: dicts, lists, strings, numbers and numpy arrays "
                           "(nothing from the file was run)") from None
    except Exception as exc:  # truncated, random bytes, a folder: whatever the pickle module raises
        raise DatasetError(f"dataset 'cifar100': {path} is damaged ({first_line(exc)}); allowed: the python-version "
                           "CIFAR-100 pickle (remove it and pass --download to fetch it again)") from None


CIFAR_PIXELS = 3 * 32 * 32


def _cifar_arrays(path: Path, entry) -> tuple[np.ndarray, np.ndarray]:
    """(pixels as uint8 (n, 3072), fine labels as int64 (n,)) of one split's dict; one DatasetError line
    naming the file and the key for anything else."""
    def fail(message: str):
        raise DatasetError(f"dataset 'cifar100': {path}: {message}")

    if not isinstance(entry, dict):
        fail(f"holds a {type(entry).__name__}; allowed: the CIFAR-100 dict with 'data' and 'fine_labels'")
    missing = [k for k in ("data", "fine_labels") if k not in entry]
    if missing:
        fail(f"missing keys {missing}; allowed: the CIFAR-100 dict with 'data' and 'fine_labels'")
    data, labels = _numeric(fail, entry, "data"), _numeric(fail, entry, "fine_labels")
    n = len(labels) if labels.ndim == 1 else -1
    if labels.ndim != 1 or n == 0:
        fail(f"'fine_labels' has shape {labels.shape}; allowed: one label per sample (a non-empty list)")
    if data.ndim < 2 or data.size != n * CIFAR_PIXELS:
        fail(f"'data' has shape {data.shape} for {n} labels; allowed: ({n}, {CIFAR_PIXELS}) pixel values")
    if data.dtype != np.uint8 and (data.min() < 0 or data.max() > 255):
        fail(f"'data' has values outside 0..255 ({data.min()}..{data.max()}); allowed: 8-bit pixel values")
    if labels.min() < 0 or labels.max() >= DATASETS["cifar100"].n_classes:
        fail(f"'fine_labels' runs {labels.min()}..{labels.max()}; "
             f"allowed: class indices 0..{DATASETS['cifar100'].n_classes - 1}")
    return np.asarray(data, dtype=np.uint8), np.asarray(labels, dtype=np.int64)


def _numeric(fail, entry: dict, key: str) -> np.ndarray:
    """entry[key] as an integer array; `fail` for a ragged list, strings, floats or objects."""
    try:
        array = np.asarray(entry[key])
    except (ValueError, TypeError) as exc:
        fail(f"{key!r} is not an array ({first_line(exc)}); allowed: integers")
    if array.dtype.kind not in "iu":
        fail(f"{key!r} holds {array.dtype} values; allowed: integers (uint8 pixels, int labels)")
    return array


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


def _image_set(name: str, given: str | None = None, download: bool = False) -> TensorData:
    """A data set of PIXEL_DATASETS as uint8 pixel tensors (N, 3, H, W), validated as an npz file's arrays."""
    import torch

    root = paths.data_dir(given)
    if name == "cifar100-pixels":
        arrays = cifar100_pixels(root, download)
    else:
        from .image_sets import load_image_arrays  # imported when used: PIL and the archive code serve these only

        arrays = load_image_arrays(name, root, download)
    validate_arrays(name, arrays)
    return TensorData(name, *(torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in ARRAYS))


# The built-in data sets, declared as a plug-in file declares its own (harness/api/plugins.py).
PLUGINS = register_builtins(_builtin("digits", _digits), _builtin("mnist1d", _mnist1d),
                            *(_builtin(name, partial(_torchvision, name)) for name in TORCHVISION),
                            *(_builtin(name, partial(_image_set, name)) for name in PIXEL_DATASETS))
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
    try:
        loaded = found.plugin.load(paths.data_dir(data_dir), download)
    except UserError:  # DatasetMissing (a dry run plans without), a cache's or the loader's own line
        raise
    except Exception as exc:  # a plug-in's own failure: one line naming it, not a traceback
        raise DatasetError(f"{found.source}: dataset {name!r}: load failed: {type(exc).__name__}: {exc}") from None
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
