"""Files: the one content hash and the one atomic writer every wing uses.

An atomic write goes to a temp file next to the target, then `os.replace` puts it in place:
a reader (or a process killed mid-write) sees the old file or the whole new one, never a part.
The temp file's name carries TMP_MARK, so a results folder can tell a leftover from a record.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_MARK = ".tmp-"
CHUNK = 1 << 20  # checkpoints can be large: hash them in pieces


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def temp_path(path: Path) -> Path:
    """The temp file this process and thread write before renaming onto `path` (hidden, TMP_MARK)."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}.{threading.get_ident()}")


@contextmanager
def atomic_path(path: str | Path, fsync: bool = False) -> Iterator[Path]:
    """A temp path to write in the block; renamed onto `path` when the block ends cleanly, removed otherwise.

    For writers that want a path of their own (`torch.save`); `fsync` makes the file durable
    before the rename (records: a crash must not leave a renamed but empty file).
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes, fsync: bool = False) -> Path:
    """Write text (UTF-8) or bytes to `path` atomically; returns the path."""
    path = Path(path)
    with atomic_path(path, fsync=fsync) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
