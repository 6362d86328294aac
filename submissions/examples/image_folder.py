"""A data-set plug-in: PNG images in one sub-folder per class, read with PIL.

The folder is `<data dir>/shapes-png/{train,test}/<class>/*.png` (the data dir is --data-dir, else
$CL_BENCH_DATA, else ./data). Images are read as 8-bit greyscale, scaled to [0, 1] and
standardised with the training split's mean and standard deviation.
"""
from pathlib import Path

import numpy as np

from harness.api import DatasetMissing
from harness.api.plugins import DataSource

FOLDER = "shapes-png"
CLASSES = ("bar", "circle", "cross", "square")  # sub-folder names; label = position in this tuple


def read_split(root: Path):
    """(images N x 1 x H x W float32, labels N int64) of one split folder."""
    from PIL import Image

    images, labels = [], []
    for label, name in enumerate(CLASSES):
        for path in sorted((root / name).glob("*.png")):
            with Image.open(path) as image:
                images.append(np.asarray(image.convert("L"), dtype=np.float32) / 255.0)
            labels.append(label)
    if not images:
        # not there: a dry run plans without this data set (any other error stops it)
        raise DatasetMissing(f"dataset {FOLDER!r}: no PNG images under {root}/<class>/ for classes "
                             f"{', '.join(CLASSES)}; put them there (--data-dir, $CL_BENCH_DATA)")
    return np.stack(images)[:, None], np.asarray(labels, dtype=np.int64)


def load(data_dir: Path, download: bool):
    """x_train, y_train, x_test, y_test from the class folders (nothing to download)."""
    root = Path(data_dir) / FOLDER
    x_train, y_train = read_split(root / "train")
    x_test, y_test = read_split(root / "test")
    mean, std = x_train.mean(), x_train.std() or 1.0
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


PLUGINS = (
    DataSource("shapes-png", load, n_classes=len(CLASSES), default_model="mlp",
               description="greyscale PNGs, one folder per class"),
)
