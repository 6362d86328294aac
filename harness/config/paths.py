"""Where cl-bench looks for things: protocols, submissions, data and its cache (torch-free)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import CacheError
from .resources import protocols_dir

SUBMISSIONS_ENV = "CL_BENCH_SUBMISSIONS"
CACHE_ENV = "CL_BENCH_CACHE"
DATA_ENV = "CL_BENCH_DATA"

# The results folder's layout (execution/store.py, outputs/tracking.py, service/records.py):
#   <results>/<protocol>/runs/<run_id>.json   the records      <results>/<protocol>/.lock   the sweep's lock
#   <results>/<protocol>/site/                the leaderboard  <results>/[<protocol>/]records.<format>  export
#   <results>/mlflow.db, <results>/mlartifacts/                MLflow's local store
RUNS = "runs"
SITE = "site"
LOCK = ".lock"
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"
EXPORT_STEM = "records"
# What the results folder reads records or state from: no output may be written there.
RECORD_AREA = (RUNS, LOCK, MLFLOW_DB, MLFLOW_ARTIFACTS)
# Names a protocol (a folder under <results>) may not take: a protocol named `runs` would make
# <results> itself look like one protocol's folder and hide every other protocol's records.
RESERVED_NAMES = (RUNS, SITE, MLFLOW_DB, MLFLOW_ARTIFACTS, f"{EXPORT_STEM}.csv", f"{EXPORT_STEM}.parquet")


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


def is_reserved_name(name: str) -> bool:
    """Whether `name` is one of the results layout's own names (case-insensitive: so are some file systems)."""
    return name.casefold() in RESERVED_NAMES


def record_area_problem(results: str | Path, dest: str | Path, site: bool = False) -> str | None:
    """Why an output at `dest` would hide or overwrite what the results folder is read from, or None.

    Refused: the results folder itself, anything inside a protocol's runs/ folder, its lock or
    MLflow's store; for a `site` (it writes a runs/ folder of pages) also a folder right under
    results, where every folder is read as a protocol's. Paths are resolved: a link is no way round.
    """
    results, dest = Path(results).resolve(), Path(dest).resolve()
    if not dest.is_relative_to(results):
        return None
    parts = dest.relative_to(results).parts
    if not parts:
        return "is the results folder itself"
    hit = next((p for p in parts if p.casefold() in RECORD_AREA), None)
    if hit is not None:
        return f"is inside the results folder's record area ({hit})"
    if site and len(parts) == 1:
        return (f"is a folder right under the results folder, where every folder is read as a protocol's "
                f"(the site's {RUNS}/ pages would be taken for records)")
    return None
