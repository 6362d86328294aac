"""Image data sets (harness/run/image_sets.py): a load served by the cache vs decoding every image.

python benchmarks/image_cache.py [--images 300] [--repeats 3]

Writes an ImageNet-R-like folder (`imagenet-r/<wnid>/<file>.jpg`, 3 classes, JPEGs of 500x375, the
typical ImageNet-R size) to a temporary folder and times, side by side in this process: decoding and
resizing every image (`decode_all`, what the first load does) against a load from the cache (what every
later load does: read the cache file, check its sha256, parse). The arrays of both are checked equal.
Printed: seconds per image of each and their ratio; decoding scales with the images (30,000 for
ImageNet-R, 11,788 for CUB), so the per-image figure times that is what a first load costs.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import harness.config.vocabulary as vocab  # noqa: E402
import harness.run.image_sets as image_sets  # noqa: E402

CLASSES = 3


def write_folder(root: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    folder = root / "imagenet-r"
    for i in range(n):
        wnid = f"n{i % CLASSES:08d}"
        (folder / wnid).mkdir(parents=True, exist_ok=True)
        # smooth content (a gradient plus noise) compresses like a photograph, not like pure noise
        base = np.linspace(0, 255, 500, dtype=np.float32)[None, :, None] * rng.random(3, dtype=np.float32)
        pixels = np.clip(base + rng.normal(0, 20, (375, 500, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, "RGB").save(folder / wnid / f"img_{i:05d}.jpg", quality=90)
    return folder


def main() -> None:
    """Time decoding against the cache and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vocab.DATASETS["imagenet-r"] = dataclasses.replace(vocab.DATASETS["imagenet-r"], n_classes=CLASSES)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CL_BENCH_CACHE"] = str(Path(tmp) / "cache")
        folder = write_folder(Path(tmp), args.images)
        listing = image_sets.list_imagenet_r(folder)
        decoded = image_sets.decode_all("imagenet-r", folder, listing)
        cached = image_sets._cached_images("imagenet-r", folder)  # builds the cache file
        assert all(np.array_equal(decoded[k], cached[k]) for k in image_sets.ARRAYS)
        result = C.side_by_side({
            "decode": lambda: image_sets.decode_all("imagenet-r", folder, listing),
            "cache": lambda: image_sets._cached_images("imagenet-r", folder),
        }, repeats=args.repeats)
    n = args.images
    print(f"{n} JPEGs 500x375 -> uint8 3x224x224, {os.cpu_count()} CPUs, load {C.load_avg()}")
    for name in ("decode", "cache"):
        wall, cpu, spread = result[name]
        print(f"{name:<7} {wall / n * 1e3:8.3f} ms/image wall  {cpu / n * 1e3:8.3f} ms/image cpu"
              f"  (spread {spread:.0%})")
    print(C.ratio_line("decode vs cache", result, "decode", "cache"))


if __name__ == "__main__":
    main()
