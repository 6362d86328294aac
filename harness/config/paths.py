"""Where cl-bench looks for things: protocols, submissions, data and its cache (torch-free)."""
from __future__ import annotations

import os
from pathlib import Path

from .resources import protocols_dir

SUBMISSIONS_ENV = "CL_BENCH_SUBMISSIONS"
CACHE_ENV = "CL_BENCH_CACHE"
DATA_ENV = "CL_BENCH_DATA"


def protocol_dirs() -> list[Path]:
    """Where protocol names are looked up: ./protocols, then the built-in protocols."""
    return [Path("protocols"), protocols_dir()]


def submissions_dir() -> Path:
    """Folder scanned for submitted adapters: $CL_BENCH_SUBMISSIONS, else ./submissions."""
    return Path(os.environ.get(SUBMISSIONS_ENV, "submissions"))


def submission_files() -> list[Path]:
    """The adapter files of the submissions folder (`*.py` not starting with `_`), sorted."""
    folder = submissions_dir()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def cache_dir(create: bool = False) -> Path:
    """The per-user cache: $CL_BENCH_CACHE, else ~/.cache/cl-bench."""
    path = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "cl-bench"))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir(given: str | None = None) -> Path:
    """Folder of the torchvision data sets: --data-dir, else $CL_BENCH_DATA, else ./data."""
    return Path(given or os.environ.get(DATA_ENV, "data")).expanduser()
