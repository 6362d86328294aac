"""The image data sets pretrained-model CL publishes on, read from their own published files, held as uint8.

- `imagenet-r`: the official tar's layout `imagenet-r/<wnid>/<image>`, 200 class folders; labels are the
  sorted wnids' positions (ImageFolder's rule). No official split exists: per class, the images ranked by
  blake2b("<wnid>/<file name>") give the first floor(0.2 n + 0.5) (at least 1, at most n - 1) to test, the
  rest to train (SPLIT_RULE): a rule of the file names alone, the same on every machine and file system.
- `cub200`: CUB-200-2011's own files, `CUB_200_2011/images.txt`, `image_class_labels.txt` (classes 1..200),
  `train_test_split.txt` (1 = train) and `images/<class>/<file>.jpg`; its official split.
- `cifar100-pixels`: the CIFAR-100 files of `cifar100` (harness/run/datasets.py reads them, without running
  code from them), as uint8 (N, 3, 32, 32).

ImageNet-R and CUB images are decoded once with PIL, converted to RGB, resized by RESIZE_RULE (the published
test transform: shorter side 256, centre crop 224) and cached as uint8 arrays in the cache folder, keyed
by the source files (names, sizes, modification times, index files' content), so a second load reads one
file. harness/run/datasets.py validates the arrays and holds them as uint8 tensors; models turn them into
float / 255 on the device (CLNet.pixels; a ViT's input stage normalises them).

Everything read is untrusted: an image is read as bytes without following links, its pixel count checked
from its header before it is decoded (MAX_PIXELS); a path from an index file stays inside `images/`; an
archive is extracted member by member after every member was checked (no absolute path, no `..`, no links,
devices or FIFOs), and nothing from it is executed.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from ..config.cache import cached
from ..config.errors import CacheError, DatasetError, DatasetMissing
from ..config.files import NotRegularFile, read_regular
from ..config.paths import cache_dir
from ..config.text import first_line
from ..config.vocabulary import DATASETS

ARRAYS = ("x_train", "y_train", "x_test", "y_test")  # harness/run/datasets.py's names, which validates them
# Bump when decoding or resizing changes what a cached array holds (the cache files' names carry it).
IMAGE_BUILD = "v1"
RESIZE, CROP = 256, 224
RESIZE_RULE = (f"RGB; shorter side to {RESIZE} (longer side int({RESIZE} * long / short)), PIL bilinear "
               f"(antialiased); centre crop {CROP}x{CROP} (offsets int(round((side - {CROP}) / 2)))")
TEST_FRACTION = 0.2
SPLIT_RULE = ("per class, images ranked by blake2b('<wnid>/<file name>'), the first floor(0.2 n + 0.5) "
              "(at least 1, at most n - 1) to test")
# PIL's own decompression-bomb limit: an image whose header claims more pixels is refused before decoding.
MAX_PIXELS = 89_478_485
MAX_INDEX_BYTES = 64 << 20  # a CUB index file larger than this is not CUB's (the real ones are < 1 MB)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
# The formats PIL may read them as (its JPEG reader also takes a camera's multi-picture JPEG). Never PIL's other
# formats: EPS, for one, is decoded by running Ghostscript on the file.
MAX_IMAGE_BYTES = 64 << 20  # one image file of these data sets is a few hundred KB; a bigger one is refused unread
FORMATS = ("JPEG", "PNG")
CHUNK = 1 << 20
AGAIN = "remove the data set's folder and pass --download to fetch it again"  # --download skips a present folder


@dataclass(frozen=True)
class Source:
    """Where a data set's archive comes from (`--download`), its md5, and the folder it holds."""

    url: str
    filename: str
    md5: str
    folder: str
    layout: str  # the folder layout, as error messages name it


SOURCES = {
    "imagenet-r": Source("https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar", "imagenet-r.tar",
                         "a61312130a589d0ca1a8fca1f2bd3337", "imagenet-r",
                         "imagenet-r/<wnid>/<image>.jpg, 200 class folders, as in the official imagenet-r.tar"),
    "cub200": Source("https://data.caltech.edu/records/65de6-vzh79/files/CUB_200_2011.tgz", "CUB_200_2011.tgz",
                     "97eceeb196236b17998738112f37df78", "CUB_200_2011",
                     "CUB_200_2011/{images.txt, image_class_labels.txt, train_test_split.txt, "
                     "images/<class>/<image>.jpg}, as in the official CUB_200_2011.tgz"),
}


def load_image_arrays(name: str, root: Path, download: bool = False) -> dict:
    """The ARRAYS of `name` (imagenet-r or cub200) under `root` (fetched first with `download` when missing):
    uint8 pixels (N, 3, CROP, CROP), int64 labels; harness/run/datasets.py validates and holds them."""
    source = SOURCES[name]
    folder = root / source.folder
    if not folder.is_dir():
        if not download:
            raise DatasetMissing(f"dataset {name!r} not found: {folder} is missing (layout: {source.layout}); "
                                 "pass --data-dir DIR pointing at the folder that holds it, or add --download "
                                 "to fetch it")
        fetch_archive(name, source, root)
    return _cached_images(name, folder)


# -- listing the files ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Listing:
    """A data set's images (paths inside its folder), their labels and split, and the index files read."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    train: tuple[bool, ...]
    index: dict  # index file name -> its bytes (part of the cache key)


def list_imagenet_r(folder: Path) -> Listing:
    """ImageNet-R's images: class folders sorted by wnid, SPLIT_RULE's split."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    _check_classes("imagenet-r", folder, len(classes), "class folders")
    paths, labels, train = [], [], []
    for label, wnid in enumerate(classes):
        files = sorted(p.name for p in (folder / wnid).iterdir()
                       if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
        if len(files) < 2:
            raise DatasetError(f"dataset 'imagenet-r': {folder / wnid} holds {len(files)} image(s); allowed: at "
                               "least 2 per class (one to train, one to test)")
        test = set(split_test_files(wnid, files))
        for f in files:
            paths.append(f"{wnid}/{f}")
            labels.append(label)
            train.append(f not in test)
    return Listing(tuple(paths), tuple(labels), tuple(train), {})


def split_test_files(wnid: str, files: list[str]) -> list[str]:
    """The test images of one ImageNet-R class of `files` (SPLIT_RULE)."""
    k = min(max(math.floor(TEST_FRACTION * len(files) + 0.5), 1), len(files) - 1)
    return sorted(files, key=lambda f: hashlib.blake2b(f"{wnid}/{f}".encode(), digest_size=8).digest())[:k]


def _check_classes(name: str, where: Path, found: int, what: str) -> None:
    expected = DATASETS[name].n_classes
    if found != expected:
        raise DatasetError(f"dataset {name!r}: {where} has {found} {what}; allowed: {expected} "
                           f"(layout: {SOURCES[name].layout}; an incomplete copy? {AGAIN})")


CUB_INDEX = ("images.txt", "image_class_labels.txt", "train_test_split.txt")


def list_cub(folder: Path) -> Listing:
    """CUB-200-2011's images in image-id order, labels 0..199 (its classes 1..200), its official split."""
    tables = {}
    for index in CUB_INDEX:
        path = folder / index
        try:
            data = read_regular(path, limit=MAX_INDEX_BYTES + 1)
        except (OSError, NotRegularFile) as exc:
            raise DatasetError(f"dataset 'cub200': {path} cannot be read ({_why(exc)}); "
                               f"allowed: the layout {SOURCES['cub200'].layout}") from None
        if len(data) > MAX_INDEX_BYTES:
            raise DatasetError(f"dataset 'cub200': {path} is larger than {MAX_INDEX_BYTES} bytes; allowed: "
                               "CUB-200-2011's own index file")
        tables[index] = (data, _id_table(path, data))
    ids = sorted(tables["images.txt"][1])
    for index in CUB_INDEX[1:]:
        if set(tables[index][1]) != set(ids):
            extra = sorted(set(tables[index][1]) ^ set(ids))[:3]
            raise DatasetError(f"dataset 'cub200': {folder / index} does not list the image ids of images.txt "
                               f"(first differences: {extra}); allowed: one line per image of images.txt")
    labels = tuple(_int_field(folder / "image_class_labels.txt", tables["image_class_labels.txt"][1][i],
                              range(1, DATASETS["cub200"].n_classes + 1)) - 1 for i in ids)
    train = tuple(_int_field(folder / "train_test_split.txt", tables["train_test_split.txt"][1][i], (0, 1)) == 1
                  for i in ids)
    _check_classes("cub200", folder / "image_class_labels.txt", len(set(labels)), "classes")
    paths = tuple(_image_path(folder / "images.txt", tables["images.txt"][1][i]) for i in ids)
    return Listing(paths, labels, train, {k: v[0] for k, v in tables.items()})


def _why(exc: Exception) -> str:
    return f"it is {exc.kind}" if isinstance(exc, NotRegularFile) else (getattr(exc, "strerror", None)
                                                                         or first_line(exc))


def _id_table(path: Path, data: bytes) -> dict[int, str]:
    """{image id: the rest of the line} of a CUB index file ('<id> <value>' per line)."""
    table = {}
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not _is_number(parts[0]) or int(parts[0]) in table:
            raise DatasetError(f"dataset 'cub200': {path} line {n}: {line[:80]!r}; allowed: '<image id> <value>' "
                               "with a distinct integer id per line")
        table[int(parts[0])] = parts[1].strip()
    if not table:
        raise DatasetError(f"dataset 'cub200': {path} lists no images; allowed: CUB-200-2011's own index file")
    return table


def _int_field(path: Path, value: str, allowed) -> int:
    if not _is_number(value) or int(value) not in allowed:
        raise DatasetError(f"dataset 'cub200': {path}: value {value[:40]!r}; allowed: {allowed[0]}..{allowed[-1]}")
    return int(value)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone admits '²', which int() refuses


def _image_path(index: Path, value: str) -> str:
    """A path of images.txt, which must name a file below images/ (no absolute path, no '..')."""
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts or "\\" in value or not p.parts or value.startswith("~"):
        raise DatasetError(f"dataset 'cub200': {index} names {value[:80]!r}; allowed: a relative path inside "
                           "images/ (no '..', not absolute)")
    return f"images/{p.as_posix()}"


LISTERS = {"imagenet-r": list_imagenet_r, "cub200": list_cub}


# -- decoding and caching ---------------------------------------------------------------------------------
def _cached_images(name: str, folder: Path) -> dict:
    listing = LISTERS[name](folder)
    key = source_key(name, folder, listing)
    try:
        return cached(cache_dir() / "images" / f"{name}-{IMAGE_BUILD}-{key}.npz", lambda data: _parse(name, data),
                      lambda: _built(name, folder, listing)).value
    except CacheError:  # a cache that cannot be written: decoded every time, as the embedded sets are
        return decode_all(name, folder, listing)


def source_key(name: str, folder: Path, listing: Listing) -> str:
    """16 hex digits of sha256 over what decides the arrays: the rules, PIL's version, the index files' bytes,
    and each image's path, label, split, size and modification time."""
    import PIL

    h = hashlib.sha256(f"{name}|{IMAGE_BUILD}|{RESIZE_RULE}|{SPLIT_RULE}|PIL {PIL.__version__}\n".encode())
    for index, data in sorted(listing.index.items()):
        h.update(f"{index}|{hashlib.sha256(data).hexdigest()}\n".encode())
    for path, label, train in zip(listing.paths, listing.labels, listing.train):
        try:
            st = (folder / path).lstat()
        except OSError as exc:
            raise _missing_image(name, folder, path, exc) from None
        h.update(f"{path}|{label}|{int(train)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _missing_image(name: str, folder: Path, path: str, exc: OSError) -> DatasetError:
    listed = " listed in images.txt" if name == "cub200" else ""
    return DatasetError(f"dataset {name!r}: {folder / path}{listed} cannot be read ({exc.strerror or exc}); "
                        f"allowed: the layout {SOURCES[name].layout} ({AGAIN})")


def _built(name: str, folder: Path, listing: Listing) -> tuple[dict, bytes]:
    arrays = decode_all(name, folder, listing)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return arrays, buffer.getvalue()


def _parse(name: str, data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as f:
        arrays = {k: f[k] for k in ARRAYS}
    for split in ("train", "test"):  # a file of another build: rebuilt (the values are checked by the loader)
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.uint8 or x.shape[1:] != (3, CROP, CROP) or y.dtype != np.int64 or y.shape != x.shape[:1]:
            raise ValueError(f"{name}: x_{split} is {x.dtype} {x.shape}, y_{split} {y.dtype} {y.shape}")
    return arrays


def decode_all(name: str, folder: Path, listing: Listing) -> dict:
    """The ARRAYS of a listing: every image decoded and resized (RESIZE_RULE), train and test each in listing
    order; each image is written straight into its split's array (no second copy of the pixels)."""
    train = np.asarray(listing.train, dtype=bool)
    y = np.asarray(listing.labels, dtype=np.int64)
    arrays = {"x_train": np.empty((int(train.sum()), 3, CROP, CROP), np.uint8), "y_train": y[train],
              "x_test": np.empty((int((~train).sum()), 3, CROP, CROP), np.uint8), "y_test": y[~train]}
    slots = np.cumsum(train) - 1, np.cumsum(~train) - 1  # each image's row in its split

    def one(i: int) -> None:
        split = "x_train" if train[i] else "x_test"
        arrays[split][slots[0][i] if train[i] else slots[1][i]] = load_image(name, folder / listing.paths[i])

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while it decodes and resizes
        try:
            for _ in pool.map(one, range(len(train))):  # in order: the first damaged file is the one named
                pass
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the images not started yet are not decoded for nothing
            raise
    return arrays


def load_image(name: str, path: Path) -> np.ndarray:
    """One image file as uint8 (3, CROP, CROP) by RESIZE_RULE; one DatasetError line naming the file otherwise."""
    from PIL import Image

    try:
        data = read_regular(path, limit=MAX_IMAGE_BYTES + 1)  # not through a link: the data set's own file
    except NotRegularFile as exc:
        raise DatasetError(f"dataset {name!r}: {path} cannot be read (it is {exc.kind}); allowed: a regular image "
                           f"file of the layout {SOURCES[name].layout}") from None
    except OSError as exc:
        raise DatasetError(f"dataset {name!r}: {path} cannot be read ({exc.strerror or first_line(exc)}); allowed: "
                           f"a regular image file of the layout {SOURCES[name].layout}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise DatasetError(f"dataset {name!r}: {path} is larger than {MAX_IMAGE_BYTES >> 20} MiB; allowed: an image "
                           f"file of the layout {SOURCES[name].layout}")
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            w, h = img.size  # from the header: nothing is decoded yet
            if w * h > MAX_PIXELS:
                raise DatasetError(f"dataset {name!r}: {path} claims {w}x{h} pixels; allowed: at most {MAX_PIXELS} "
                                   "(a decompression bomb?)")
            return resize_crop(img.convert("RGB"))
    except DatasetError:
        raise
    except Exception as exc:  # truncated, not an image, a bomb PIL refuses itself: whatever PIL raises
        raise DatasetError(f"dataset {name!r}: {path} cannot be decoded as an image ({first_line(exc)}); allowed: "
                           f"an image in one of the formats {', '.join(FORMATS)} ({AGAIN})"
                           ) from None


def resize_crop(img) -> np.ndarray:
    """An RGB PIL image resized and centre-cropped by RESIZE_RULE, as uint8 (3, CROP, CROP)."""
    from PIL import Image

    w, h = img.size
    if w <= h:
        size = (RESIZE, int(RESIZE * h / w))
    else:
        size = (int(RESIZE * w / h), RESIZE)
    img = img.resize(size, Image.Resampling.BILINEAR)
    left, top = int(round((size[0] - CROP) / 2.0)), int(round((size[1] - CROP) / 2.0))
    img = img.crop((left, top, left + CROP, top + CROP))
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))


# -- download and safe extraction -------------------------------------------------------------------------
def fetch(url: str, path: Path) -> None:
    """Download `url` into `path` (tests replace this function: they never reach the network)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as response, open(path, "wb") as out:  # noqa: S310 (a fixed https URL)
        while chunk := response.read(CHUNK):
            out.write(chunk)


def fetch_archive(name: str, source: Source, root: Path) -> None:
    """Fetch `source`'s archive into `root` (unless a copy with its md5 is there), then extract it safely."""
    root.mkdir(parents=True, exist_ok=True)
    archive = root / source.filename
    if not (archive.is_file() and _md5(archive) == source.md5):
        partial = root / (source.filename + ".part")
        try:
            fetch(source.url, partial)
        except Exception as exc:
            partial.unlink(missing_ok=True)
            raise DatasetError(f"dataset {name!r}: download of {source.url} into {root} failed "
                               f"({first_line(exc)})") from None
        found = _md5(partial)
        if found != source.md5:
            partial.unlink(missing_ok=True)
            raise DatasetError(f"dataset {name!r}: the download of {source.url} has md5 {found}; allowed: "
                               f"{source.md5} (an incomplete or altered download; try again)")
        os.replace(partial, archive)
    safe_extract(name, archive, root)


def _md5(path: Path) -> str:
    h = hashlib.md5()  # noqa: S324 (the publishers' own checksum, compared, not relied on for secrecy)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why an archive member may not be extracted (escaping path, link, device, FIFO), else None."""
    p = PurePosixPath(member.name)
    if p.is_absolute() or member.name.startswith(("/", "\\")) or ".." in p.parts or "\\" in member.name:
        return "its path leaves the folder (absolute or with '..')"
    if member.issym() or member.islnk():
        return f"it is a link (to {member.linkname[:80]!r})"
    if not (member.isfile() or member.isdir()):
        return "it is not a regular file or folder (a device, FIFO or other special member)"
    return None


def safe_extract(name: str, archive: Path, dest: Path) -> None:
    """Extract a tar archive (any compression tarfile reads) into `dest`: every member checked first
    (`member_problem`), then only regular files and folders written, by tarfile's `data` filter."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                problem = member_problem(member)
                if problem:
                    raise DatasetError(f"dataset {name!r}: {archive} member {member.name[:120]!r} refused: {problem}; "
                                       "allowed: regular files and folders inside the archive's folder "
                                       "(nothing was extracted)")
            # every member was checked above; tarfile's own "data" filter (Python >= 3.11.4) checks again
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, **kwargs)
    except DatasetError:
        raise
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(f"dataset {name!r}: {archive} cannot be extracted ({first_line(exc)}); allowed: the "
                           "official tar archive (remove it and pass --download to fetch it again)") from None
