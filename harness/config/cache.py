"""Files in the per-user cache (paths.cache_dir): ours to rebuild, and verified on every read.

Every cache file is written with its content hash beside it (`NAME.sha256`, the `sha256sum`
line of NAME: the hash and the file's own name) and is used only when its bytes match that
line. A file that was replaced (another backbone's weights copied over it, or its line with
it: the line names the file), damaged, truncated, or written by a cl-bench that kept no hash
is discarded with one warning line and rebuilt; the rebuild computes what the file's name (a
key of everything that decides it) says it holds, so no record changes. A cache that cannot
be written is one CacheError line naming the cache variable (paths.CACHE_ENV) and the path
(paths.cache_unwritable); a cache that can only be read serves the files it holds.

Writers of one file take its lock (`NAME.lock`, flock) so concurrent workers build it once.
"""
from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CacheError
from .files import ensure_dir, open_regular, read_regular, write_atomic
from .paths import cache_dir, cache_unwritable
from .text import first_line

SIDECAR = ".sha256"


@dataclass(frozen=True)
class Cached:
    """A cache file's parsed value, the sha256 of its bytes, and whether this call built it."""

    value: Any
    sha256: str
    built: bool


def cached(path: Path, parse: Callable[[bytes], Any], build: Callable[[], tuple[Any, bytes]],
           warn: Callable[[str], None] | None = None) -> Cached:
    """The value of cache file `path`: `parse` of its bytes when they match its recorded sha256;
    otherwise (absent, replaced, damaged) `build()` gives (value, bytes), which are stored with their hash."""
    value, digest, _ = _verified(path, parse)
    if digest:
        return Cached(value, digest, False)
    with locked(path):  # another worker may have built it meanwhile: look again under the lock
        value, digest, problem = _verified(path, parse)
        if digest:
            return Cached(value, digest, False)
        if problem:
            (warn or _stderr)(f"warning: cache file {path} {problem}; discarded and rebuilt")
            with writing(path):
                path.unlink(missing_ok=True)
                path.with_name(path.name + SIDECAR).unlink(missing_ok=True)
        value, data = build()
        return Cached(value, store(path, data), True)


def _verified(path: Path, parse) -> tuple[Any, str, str]:
    """(value, sha256, '') of a verified file; (None, '', why not) otherwise ('' when absent)."""
    # read_regular: a link, FIFO, socket or folder in a file's place is one line (NotRegularFile), never a hang
    try:
        data = read_regular(path)
    except FileNotFoundError:
        return None, "", ""
    except OSError as exc:  # no permission
        return None, "", f"cannot be read ({exc.strerror or exc})"
    digest = hashlib.sha256(data).hexdigest()
    try:
        recorded = read_regular(path.with_name(path.name + SIDECAR), limit=4096).decode("utf-8", errors="replace")
    except OSError:
        return None, "", f"has no recorded sha256 ({path.name}{SIDECAR})"
    if recorded != _line(digest, path):
        return None, "", f"does not match its recorded sha256 ({path.name}{SIDECAR}): replaced or damaged"
    try:
        return parse(data), digest, ""
    except Exception as exc:  # verified bytes that do not parse: damaged before they were hashed
        return None, "", f"cannot be read ({first_line(exc)})"


def store(path: Path, data: bytes) -> str:
    """Write `data` to cache file `path` and its sha256 line beside it (each atomically); returns the hash."""
    digest = hashlib.sha256(data).hexdigest()
    with writing(path):
        _folder(path)
        write_atomic(path, data)
        write_atomic(path.with_name(path.name + SIDECAR), _line(digest, path))
    return digest


def _line(digest: str, path: Path) -> str:
    return f"{digest}  {path.name}\n"


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError of writing `path` into the one CacheError line that names the cache variable."""
    try:
        yield
    except OSError as exc:
        raise CacheError(cache_unwritable(path, exc)) from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold `path`'s writer lock (NAME.lock beside it) for the block."""
    with writing(path):
        _folder(path)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): workers may both build; the atomic rename keeps the file whole
        yield
        return
    with writing(path):
        fh = open(path.with_name(path.name + ".lock"), "a+", opener=open_regular)  # noqa: SIM115 (held across the yield)
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _folder(path: Path) -> Path:
    # The cache folder the user named may be a link; nothing below it may be (config.files.ensure_dir).
    root = cache_dir()
    try:
        return ensure_dir(root, path.parent.relative_to(root))
    except ValueError:  # a cache file outside cache_dir(): its own folder is the root
        return ensure_dir(path.parent)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
