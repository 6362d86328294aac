"""The protocol file a sweep loaded, kept in its results folder by content hash, and the sweep's provenance.

`run` and `submit` write a byte copy of the loaded protocol file to
`<results>/<protocol>/protocol-files/<first 16 hex of its sha256>.yaml` (atomic, idempotent: the
name is the content), and each record of the sweep carries `provenance["sweep"]`: the command,
that copy and the filters given. The commands a page shows name the copy, so they work from any
directory and after the original file moved or changed. The protocol's name comes from a file
and makes a folder name: it is checked (a name of the name rule, no path) before anything is written.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath

from ..config.errors import OutputError
from ..config.files import safe_target, write_atomic
from ..config.vocabulary import is_valid_name

PROTOCOL_FILES = "protocol-files"  # under <results>/<protocol>/
HASH_CHARS = 16
COPY_PATTERN = re.compile(rf"^{PROTOCOL_FILES}/[0-9a-f]{{{HASH_CHARS}}}\.yaml$")


def copy_relpath(data: bytes) -> str:
    """Where the copy of a protocol file with these bytes lives, relative to `<results>/<protocol>/`."""
    return f"{PROTOCOL_FILES}/{hashlib.sha256(data).hexdigest()[:HASH_CHARS]}.yaml"


def protocol_copy(protocol) -> tuple[str, str, bytes]:
    """(path of its copy relative to `<results>/<protocol>/`, full sha256, bytes) of the protocol's loaded file."""
    if not is_valid_name(protocol.name):  # never a path: `..`, `/` or an absolute name would leave the folder
        raise OutputError(f"{protocol.source}: name {protocol.name!r} cannot name a folder; allowed: a valid name")
    try:
        data = Path(protocol.source).read_bytes()
    except OSError as exc:
        raise OutputError(f"{protocol.source}: cannot read the protocol file to keep a copy ({exc.strerror})") from None
    return copy_relpath(data), hashlib.sha256(data).hexdigest(), data


def save_protocol_file(results: str | Path, protocol, sha256: str | None = None) -> Path:
    """Copy the protocol's loaded file to `<results>/<protocol>/protocol-files/<sha256[:16]>.yaml` (atomic;
    nothing is written when a copy of the same bytes is there); returns the copy's path. With `sha256` (the
    hash the sweep's records carry), a file edited since then is refused."""
    rel, digest, data = protocol_copy(protocol)
    if sha256 is not None and digest != sha256:
        raise OutputError(f"{protocol.source}: changed since the sweep loaded it (sha256 {digest[:16]}, was "
                          f"{sha256[:16]}); run the command again")
    target = safe_target(results, PurePosixPath(protocol.name, rel))  # no link, no `..` below the results folder
    if not (target.is_file() and not target.is_symlink() and target.read_bytes() == data):
        write_atomic(target, data)
    return target


def relative_references(data: bytes) -> list[str]:
    """The paths a protocol file names relative to its own folder (plug-in files, a checkpoint, npz data
    sets): a copy elsewhere does not resolve them."""
    import yaml

    try:
        raw = yaml.safe_load(data)
    except yaml.YAMLError:
        return []
    if not isinstance(raw, dict):
        return []
    named = [p for p in raw.get("plugins") or [] if isinstance(p, str)]
    pretrain = raw.get("pretrain")
    if isinstance(pretrain, dict) and isinstance(pretrain.get("checkpoint"), str):
        named.append(pretrain["checkpoint"])
    for d in raw.get("datasets") or []:
        name = d.get("name") if isinstance(d, dict) else d
        if isinstance(name, str) and name.startswith("npz:"):
            named.append(name[len("npz:"):])
    return [p for p in named if not Path(p).expanduser().is_absolute()]


def sweep_provenance(command: str, protocol_copy: str, sha256: str, *, datasets=None, regimes=None,
                     methods=None, orders=None, only=None, method_file: str | None = None,
                     baselines: bool = True) -> dict:
    """The `provenance["sweep"]` entry of a sweep's records: the command (`run`, `submit`), the protocol
    copy, and the filters given (absent ones are left out)."""
    entry = {"command": command, "protocol_file": protocol_copy, "protocol_sha256": sha256}
    given = {"datasets": datasets, "regimes": regimes, "methods": methods, "orders": orders, "only": only}
    entry.update({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in given.items() if v})
    if method_file:
        entry["method_file"] = str(method_file)
    if not baselines:
        entry["baselines"] = False
    return entry
