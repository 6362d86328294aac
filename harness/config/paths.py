"""Where cl-bench looks for things: protocols, submissions, data and its cache (torch-free)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import CacheError
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
    """The per-user cache: $CL_BENCH_CACHE, else ~/.cache/cl-bench (`create`: made, or one CacheError line)."""
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cl-bench").expanduser()
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(cache_unwritable(path, exc)) from None
    return path


def cache_unwritable(path: Path, exc: OSError) -> str:
    """The one line for a cache path that cannot be written: it names CL_BENCH_CACHE, its value and `path`."""
    value = os.environ.get(CACHE_ENV)
    where = f"{CACHE_ENV}={value}" if value else f"the default cache {cache_dir()} ({CACHE_ENV} is not set)"
    return (f"cache folder {where}: cannot write {path} ({exc.strerror or exc}); "
            f"allowed: {CACHE_ENV} set to a folder this user can write")


def data_dir(given: str | None = None) -> Path:
    """Folder of the torchvision data sets: --data-dir, else $CL_BENCH_DATA, else ./data."""
    return Path(given or os.environ.get(DATA_ENV, "data")).expanduser()
