"""Reading a method or plug-in file's bytes: what is refused before it is opened (torch-free).

`registry.load_module_file`, the one place a file's code runs, executes exactly the bytes
`code_bytes` returns and identifies them by `code_sha256` (checked against what the caller expects
before they run); `code_sha256` of the same bytes keys a cache without importing them.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..config.errors import RegistryError
from ..config.files import NotRegularFile, check_regular

MAX_CODE_BYTES = 16 << 20  # a method or plug-in file; anything larger is not one
IMPLEMENTATION_DIGITS = 16  # of the sha256 in a file's implementation, `sha256:<16 hex>[+v<declared>]`


def code_bytes(path: str | Path) -> bytes:
    """The bytes of a method or plug-in file; a name without `.py` or a FIFO, device, folder or other
    non-regular file is refused before it is opened (opening a FIFO would hang)."""
    path = Path(path)
    if path.suffix != ".py":
        raise RegistryError(f"{path}: not a Python file; allowed: the path of a .py method or plug-in file")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RegistryError(f"{path}: no such method file") from None
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read: {exc.strerror or exc}") from None
    _refuse_irregular(path, info)
    try:  # O_NONBLOCK: a file swapped for a FIFO after the stat must not hang the open either
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            _refuse_irregular(path, os.fstat(fh.fileno()))
            return fh.read(MAX_CODE_BYTES + 1)
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read: {exc.strerror or exc}") from None


def code_sha256(code: bytes) -> str:
    """Hex sha256 of a method or plug-in file's bytes (`code_bytes`): the one hash of code cl-bench computes."""
    return hashlib.sha256(code).hexdigest()


def _refuse_irregular(path: Path, info: os.stat_result) -> None:
    try:
        check_regular(path, info)  # the one regular-file check (config.files)
    except NotRegularFile as exc:
        raise RegistryError(f"{path}: is {exc.kind}; allowed: a regular .py method or plug-in file") from None
    if info.st_size > MAX_CODE_BYTES:
        raise RegistryError(f"{path}: {info.st_size:,} bytes; allowed: a method or plug-in file of at most "
                            f"{MAX_CODE_BYTES:,} bytes")
