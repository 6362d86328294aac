"""`cl-bench bundle`: pack one protocol version's valid records, the method files they name, the protocol
file and an environment lock into a zip with a sha256 manifest (format: bundle.py)."""
from __future__ import annotations

import io
import json
import platform
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..config.specs import RunRecord
from .bundle import (
    CONTRIBUTOR,
    DIGITS,
    ENVIRONMENT,
    FORMAT,
    MANIFEST,
    BundleError,
    check_bundle,
    file_digest,
    read_bundle,
    sha256_hex,
)
from .store import load_records

PROTOCOL_FILES = "protocol-files"  # <results>/<protocol>/protocol-files/<16 hex>.yaml: byte copies by content


@dataclass(frozen=True)
class Packed:
    """What `bundle` wrote: the file, its sha256, the records packed and those left out (why)."""

    path: Path
    sha256: str
    records: int
    method_files: int
    left_out: tuple[str, ...]


def protocol_file(results, name_or_path: str) -> tuple[str, bytes]:
    """(protocol name, bytes) of the protocol file to bundle: a YAML path as given; for a name, the one copy in
    `<results>/<name>/protocol-files/` (written by run/submit), else the file `load_protocol(name)` resolves."""
    from ..config.files import read_regular
    from ..config.protocol import resolve_protocol_path
    from ..config.yamlfile import read_yaml

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml") and not path.exists():
        copies = sorted((Path(results) / name_or_path / PROTOCOL_FILES).glob("*.yaml"))
        if len(copies) > 1:
            raise BundleError(f"--protocol: {len(copies)} protocol files in {copies[0].parent}; pass the one to "
                              "bundle as a path (--protocol FILE.yaml)")
        path = copies[0] if copies else resolve_protocol_path(name_or_path)
    raw = read_regular(path, 2**20 + 1)
    doc = read_yaml(raw.decode("utf-8", errors="replace"), str(path), BundleError)
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise BundleError(f"{path}: not a protocol file (no name:)")
    return doc["name"], raw


def make_bundle(results, protocol: str, out, contributor: str, method_files=(), log=print) -> Packed:
    """Write the bundle of `protocol`'s valid records under `results` (the protocol file's version) to `out`."""
    from ..config.yamlfile import read_yaml

    if Path(out).suffix != ".zip":
        raise BundleError(f"-o: {out} does not end in .zip; allowed: a .zip file name")
    if not CONTRIBUTOR.fullmatch(contributor or ""):
        raise BundleError(f"--contributor: {contributor[:40]!r} is not 1-80 printable characters")
    name, raw = protocol_file(results, protocol)
    version = str(read_yaml(raw.decode("utf-8", errors="replace"), protocol, BundleError).get("version"))
    records = load_records(results, name, log=log)
    kept = [r for r in records if r.spec.protocol_version == version]
    left = [f"{len(records) - len(kept)} records of other versions of {name}"] if len(kept) < len(records) else []
    if not kept:
        raise BundleError(f"--results: no valid records of protocol {name} version {version} under {results}")
    members = {f"records/{r.run_id}.json": _record_bytes(r) for r in kept}
    members.update(_methods(kept, method_files))
    members[f"protocol/{sha256_hex(raw)[:DIGITS]}.yaml"] = raw
    members[ENVIRONMENT] = json.dumps(environment(kept), indent=1, sort_keys=True).encode()
    path = _write_zip(Path(out), members, {"protocol": name, "version": version, "contributor": contributor})
    checked = check_bundle(read_bundle(path))  # what verify will check, before anyone else sees the file
    n_methods = sum(1 for m in members if m.startswith("methods/"))
    return Packed(path, checked.bundle.sha256, len(kept), n_methods, tuple(left))


def _record_bytes(record: RunRecord) -> bytes:
    """A record's JSON as the store writes it."""
    return json.dumps(record.to_dict(), indent=1, sort_keys=True, allow_nan=True).encode()


def _methods(records, given=()) -> dict:
    """{member: bytes} of each file method the records name: the file `--method` gives, else the path the
    record's provenance names (the bundler's own folder), each checked against the implementation digest."""
    from ..api.codefile import code_bytes

    candidates = {}
    for path in given:
        body = code_bytes(path)
        candidates[sha256_hex(body)[:DIGITS]] = body
    out = {}
    for r in records:
        digest = file_digest(r.spec.method_version)
        prov = r.provenance or {}
        source = (prov.get("method") or {}).get("source")
        if not digest or source == "built-in" or str(source).startswith("entry point "):
            continue
        if digest not in candidates:
            for where in (source, (r.submission or {}).get("file")):
                if isinstance(where, str) and where.endswith(".py") and Path(where).is_file():
                    body = code_bytes(where)
                    candidates.setdefault(sha256_hex(body)[:DIGITS], body)
        if digest not in candidates:
            raise BundleError(f"record {r.run_id}: its method file (sha256:{digest}, written as {str(source)[:80]!r}) "
                              "is not found; pass it with --method FILE")
        out[f"methods/{digest}.py"] = candidates[digest]
    return out


def environment(records) -> dict:
    """The environment lock: package versions, devices, platform and Python of the records and of this host."""
    from ..run.provenance import package_versions

    prov = [r.provenance or {} for r in records]
    return {"packages": package_versions(), "record_packages": _distinct(p.get("versions") for p in prov),
            "devices": sorted({str(p.get("device")) for p in prov}),
            "platforms": sorted({str(p.get("platform")) for p in prov}),
            "git_shas": sorted({str(p.get("git_sha")) for p in prov}),
            "platform": platform.platform(), "device": _device()}


def _distinct(items) -> list:
    """The items without repeats, in first-seen order (they may be unhashable mappings)."""
    out = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def _device() -> str:
    try:
        import torch

        return f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
    except Exception:  # no torch, or a broken driver: the lock still records the rest
        return "unknown"


def _write_zip(out: Path, members: dict, fields: dict) -> Path:
    """The zip with the manifest (every member's sha256 and size), written atomically; fixed member times and
    order, so the same records, files and environment give the same bytes (and sha256)."""
    from ..config.files import write_atomic

    listed = [{"name": n, "sha256": sha256_hex(b), "size": len(b)} for n, b in sorted(members.items())]
    manifest = {"format": FORMAT, **fields, "members": listed}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), members[name],
                        compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr(zipfile.ZipInfo(MANIFEST, date_time=(2020, 1, 1, 0, 0, 0)),
                    json.dumps(manifest, indent=1, sort_keys=True), compress_type=zipfile.ZIP_DEFLATED)
    return write_atomic(out, buf.getvalue())
