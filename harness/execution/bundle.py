"""Bundles: one lab's records of a protocol version, the method files they name, the protocol file and an
environment lock, with a sha256 manifest, in one zip (`cl-bench bundle`); and reading one back.

A bundle is untrusted data. Reading it (`read_bundle`) refuses, in one line, any member whose name is not
one of the allowed patterns (no folders of its own, no `..`, no absolute path, no backslash, no link),
more than MAX_MEMBERS members, a member over its cap or a total over MAX_TOTAL_BYTES (counted on the
bytes actually inflated, not the sizes the zip declares), and any member missing from, extra to or
differing from the manifest. Nothing in a bundle is imported or unpickled here: records are JSON, the
protocol is YAML read by the safe loader, the environment is JSON. Only `verify`'s reruns run the
bundled method files (bundle_verify.py), and only files whose sha256 a record's run id covers.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import UserError
from ..config.specs import RunRecord
from .store import MAX_RECORD_BYTES, parse_record

FORMAT = 1  # the bundle format version: manifest.json's "format"
MANIFEST = "manifest.json"
ENVIRONMENT = "environment.json"
MAX_MEMBERS = 20_000
MAX_TOTAL_BYTES = 512 * 2**20  # inflated, all members together
MAX_BUNDLE_BYTES = 512 * 2**20  # the zip file itself
CODE_CAP = 2 * 2**20  # a method file
SMALL_CAP = 2**20  # manifest, environment, protocol file
# A record member: records are small (a few hundred KiB); the JSON parser takes several times a member's size in
# memory, so a tighter cap than the store's per-file limit keeps one bundle from running the board out of memory.
RECORD_CAP = min(MAX_RECORD_BYTES, 8 * 2**20)
# cells per method a bundled protocol's grid may plan: the check expands the grid, and a protocol file (1 MiB) can
# list ~10^5 seeds; the shipped protocols plan at most a few hundred
MAX_GRID_CELLS = 10_000
DIGITS = 16  # of a sha256 in a method or protocol member's name (a file method's implementation digits)
# Every member name a bundle may hold: a fixed layout, flat folders, names made of hex digits.
MEMBER = re.compile(r"(records/[0-9a-f]{12}\.json|methods/[0-9a-f]{16}\.py|protocol/[0-9a-f]{16}\.yaml"
                    r"|environment\.json|manifest\.json)")
PROTOCOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CONTRIBUTOR = re.compile(r"[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]{1,80}")
SHA256 = re.compile(r"[0-9a-f]{64}")


class BundleError(UserError, ValueError):
    """A damaged, unsafe or inconsistent bundle (or bad `bundle` input): one line, exit 2."""


@dataclass(frozen=True)
class Bundle:
    """A bundle read back: its file's sha256, the manifest's fields, and the members' bytes (all checked)."""

    path: Path
    sha256: str
    protocol: str
    version: str
    contributor: str
    members: dict  # name -> bytes, every one hashed against the manifest

    def names(self, folder: str) -> list[str]:
        """The member names under `folder/`, sorted."""
        return sorted(n for n in self.members if n.startswith(folder + "/"))


def _cap(name: str) -> int:
    if name.startswith("records/"):
        return RECORD_CAP
    return CODE_CAP if name.startswith("methods/") else SMALL_CAP


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def read_bundle(path: str | Path) -> Bundle:
    """The checked members of a bundle file; BundleError (one line) for anything unsafe or damaged."""
    from ..config.files import NotRegularFile, read_regular

    path = Path(path)
    try:
        data = read_regular(path, MAX_BUNDLE_BYTES + 1)
    except NotRegularFile as exc:
        raise BundleError(f"{path}: {exc.kind}, not a regular file; a bundle is a .zip file") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{path}: over {MAX_BUNDLE_BYTES // 2**20} MiB; allowed: a bundle of at most that size")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = _members(path, zf)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError) as exc:
        raise BundleError(f"{path}: not a readable zip file ({exc})") from None
    manifest = _manifest(path, members)
    return Bundle(path, sha256_hex(data), manifest["protocol"], manifest["version"], manifest["contributor"], members)


def _members(path: Path, zf: zipfile.ZipFile) -> dict:
    """{name: bytes} of every member, names and sizes checked before and while inflating."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise BundleError(f"{path}: {len(infos)} members; allowed: at most {MAX_MEMBERS}")
    out, total = {}, 0
    for info in infos:
        name = info.filename
        if not MEMBER.fullmatch(name):
            raise BundleError(f"{path}: member {name!r} is not an allowed name (records/<run id>.json, "
                              "methods/<16 hex>.py, protocol/<16 hex>.yaml, environment.json, manifest.json)")
        if name in out:
            raise BundleError(f"{path}: member {name!r} appears twice")
        if stat.S_ISLNK(info.external_attr >> 16) or info.is_dir():
            raise BundleError(f"{path}: member {name!r} is a link or folder; allowed: regular files only")
        cap = _cap(name)
        if info.file_size > cap:
            raise BundleError(f"{path}: member {name!r} declares {info.file_size} bytes; allowed: at most {cap}")
        with zf.open(info) as fh:  # the declared size may lie: count what inflates
            body = fh.read(min(cap, MAX_TOTAL_BYTES - total) + 1)
        total += len(body)
        if len(body) > cap or total > MAX_TOTAL_BYTES:
            raise BundleError(f"{path}: member {name!r} inflates past its cap ({cap} bytes per member, "
                              f"{MAX_TOTAL_BYTES} in all): refused as a zip bomb")
        out[name] = body
    return out


def _manifest(path: Path, members: dict) -> dict:
    """The manifest, checked: format, protocol name, contributor, and every member listed with its sha256 and
    size, nothing missing, nothing extra."""
    try:
        manifest = json.loads(members[MANIFEST].decode("utf-8"))
    except KeyError:
        raise BundleError(f"{path}: no {MANIFEST}; a bundle lists its members there") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{path}: {MANIFEST} is not JSON ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"{path}: {MANIFEST} format {got!r}; allowed: {FORMAT}")
    _check_fields(path, manifest)
    listed = _listed(path, manifest.get("members"))
    present = set(members) - {MANIFEST}
    missing, extra = sorted(set(listed) - present), sorted(present - set(listed))
    if missing or extra:
        raise BundleError(f"{path}: members differ from the manifest (missing {missing[:3]}, extra {extra[:3]})")
    for name, (digest, size) in listed.items():
        if len(members[name]) != size or sha256_hex(members[name]) != digest:
            raise BundleError(f"{path}: member {name!r} does not match its sha256/size in the manifest "
                              "(damaged or edited)")
    return manifest


def _check_fields(path: Path, manifest: dict) -> None:
    """The manifest's protocol name, version and contributor: strings of the allowed shapes."""
    name, version, who = manifest.get("protocol"), manifest.get("version"), manifest.get("contributor")
    if not (isinstance(name, str) and PROTOCOL_NAME.fullmatch(name)):
        raise BundleError(f"{path}: {MANIFEST} protocol {str(name)[:40]!r} is not a protocol name; allowed: "
                          "letters, digits, '.', '_', '-' (at most 64)")
    if not (isinstance(version, str) and PROTOCOL_NAME.fullmatch(version)):
        raise BundleError(f"{path}: {MANIFEST} version {str(version)[:40]!r} is not a protocol version")
    if not (isinstance(who, str) and CONTRIBUTOR.fullmatch(who)):
        raise BundleError(f"{path}: {MANIFEST} contributor is not 1-80 printable characters")


def _listed(path: Path, entries) -> dict:
    """{name: (sha256, size)} of the manifest's member list."""
    if not isinstance(entries, list):
        raise BundleError(f"{path}: {MANIFEST} members is not a list")
    out = {}
    for e in entries:
        ok = (isinstance(e, dict) and set(e) == {"name", "sha256", "size"} and isinstance(e["name"], str)
              and MEMBER.fullmatch(e["name"]) and e["name"] != MANIFEST and isinstance(e["sha256"], str)
              and SHA256.fullmatch(e["sha256"]) and type(e["size"]) is int and e["name"] not in out)
        if not ok:
            raise BundleError(f"{path}: {MANIFEST} has a member entry that is not {{name, sha256, size}} of an "
                              "allowed, unique name")
        out[e["name"]] = (e["sha256"], e["size"])
    return out


@dataclass(frozen=True)
class Checked:
    """What the cheap checks found in a bundle: its records, protocol document and environment lock."""

    bundle: Bundle
    records: tuple[RunRecord, ...]
    protocol_yaml: bytes
    protocol_doc: dict
    environment: dict
    method_files: dict  # implementation digest (16 hex) -> member name
    lines: tuple[str, ...]  # what each check covered, for the verdict


def check_bundle(b: Bundle) -> Checked:
    """The checks that run no bundled code: protocol file, every record's schema (the store's verify-on-read,
    which recomputes every metric from its accuracy matrix), fingerprints, method files, environment."""
    doc, raw = _protocol(b)
    cells, skip = _cells(b, doc)
    records = tuple(_record(b, name) for name in b.names("records"))
    if not records:
        raise BundleError(f"{b.path}: holds no records")
    methods = _method_files(b, records)
    _fingerprints(b, records, doc)
    grid = _in_grid(b, records, cells, skip)
    env = _environment(b)
    lines = (f"manifest: {len(b.members) - 1} members, each sha256 and size as listed; nothing missing or extra",
             f"schema: {len(records)} records valid (store verify-on-read: spec hashes to run id, fields, ranges)",
             f"metrics: recomputed from every accuracy matrix; all {len(records)} records agree",
             f"fingerprints: protocol {b.protocol} v{b.version} (sha256 {sha256_hex(raw)[:16]}), "
             f"{len({r.spec.data_fingerprint for r in records})} data fingerprint(s), one per data set",
             f"methods: {len(methods)} method file(s), each hashing to the implementation its records name",
             grid)
    return Checked(b, records, raw, doc, env, methods, lines)


def _protocol(b: Bundle) -> tuple[dict, bytes]:
    """The one bundled protocol file, named by its own sha256, read by the safe YAML loader."""
    from ..config.yamlfile import read_yaml

    names = b.names("protocol")
    if len(names) != 1:
        raise BundleError(f"{b.path}: holds {len(names)} protocol files; allowed: exactly one")
    raw = b.members[names[0]]
    if sha256_hex(raw)[:DIGITS] != Path(names[0]).stem:
        raise BundleError(f"{b.path}: {names[0]} is not named by its content's sha256")
    try:
        doc = read_yaml(raw.decode("utf-8"), f"{b.path}:{names[0]}", BundleError)
    except BundleError:
        raise
    except Exception as exc:  # yaml.YAMLError, UnicodeDecodeError, RecursionError: a damaged file
        raise BundleError(f"{b.path}: {names[0]} is not a readable protocol file ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("name") != b.protocol or str(doc.get("version")) != b.version:
        raise BundleError(f"{b.path}: {names[0]} is not protocol {b.protocol} version {b.version} "
                          "(the manifest's)")
    _shape(b, names[0], doc)
    return doc, raw


def _named_list(value, strings_only: bool = False) -> bool:
    """A non-empty list of names, or (unless strings_only) of mappings with a string `name`."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(e, str) or (not strings_only and isinstance(e, dict) and isinstance(e.get("name"), str))
        for e in value)


def _shape(b: Bundle, member: str, doc: dict) -> None:
    """The bundled protocol's sections have the shapes the checks read (the validator proper runs in _grid)."""
    shapes = {"datasets": _named_list(doc.get("datasets")), "regimes": _named_list(doc.get("regimes"), True),
              "methods": _named_list(doc.get("methods")),
              "scenario": doc.get("scenario") is None or isinstance(doc.get("scenario"), str),
              "plugins": doc.get("plugins") is None or (isinstance(doc["plugins"], list)
                                                        and all(isinstance(p, str) for p in doc["plugins"]))}
    bad = [k for k, ok in shapes.items() if not ok]
    if bad:
        allowed = {"datasets": "a non-empty list of names or {name: ...} entries", "regimes": "a non-empty list of "
                   "regime names", "methods": "a non-empty list of names or {name: ...} entries",
                   "scenario": "a scenario name", "plugins": "a list of .py paths"}[bad[0]]
        raise BundleError(f"{b.path}: {member}: {bad[0]} is {str(doc.get(bad[0]))[:60]!r}; allowed: {allowed}")


class _AnyMethod:
    """The one method of the grid _grid plans: no hyperparameters, every scenario and regime family (the cells'
    settings are compared without the method's fields, so no method code is loaded)."""

    defaults: dict = {}
    implementation = ""


def _cells(b: Bundle, doc: dict) -> tuple[list, str]:
    """(the cell settings of the bundled protocol's grid, why none: ""), planned by the protocol validator
    without loading any method code; a protocol the validator refuses is a BundleError."""
    from ..config.errors import UserError
    from ..config.protocol import parse_protocol
    from .plan import expand

    skip = _unplannable(doc)
    if skip:
        return [], skip
    cell_doc = {**doc, "methods": ["any-method"]}
    try:
        protocol = parse_protocol(cell_doc, f"{b.path}:protocol", {"any-method": _AnyMethod()})
    except UserError as exc:
        raise BundleError(f"{b.path}: its protocol file is not a valid protocol: {str(exc)[:300]}") from None
    count = len(protocol.datasets) * len(protocol.regimes) * len(protocol.task_orders) * len(protocol.seeds)
    if count > MAX_GRID_CELLS:  # refuse before expanding: the count is known from the sections' lengths
        raise BundleError(f"{b.path}: its protocol's grid has {count} cells per method (datasets x regimes x "
                          f"task orders x seeds); allowed: at most {MAX_GRID_CELLS}")
    return [_setting(s.to_dict()) for s in expand(protocol, {d.name: "" for d in protocol.datasets})], ""


def _in_grid(b: Bundle, records, cells: list, skip: str) -> str:
    """Refuse a record whose settings (all but the method's fields, data fingerprint and plug-ins) are not a
    cell of the grid; the check's line for the verdict."""
    if skip:
        return f"grid: not checked ({skip}: files a bundle does not hold)"
    known = {json.dumps(c, sort_keys=True) for c in cells}
    for r in records:
        mine = _setting(r.spec.to_dict())
        if json.dumps(mine, sort_keys=True) not in known:
            keys = min((_differing(mine, c) for c in cells), key=len)
            raise BundleError(f"{b.path}: record {r.run_id} is not a cell of the bundled protocol's grid: its "
                              f"{', '.join(keys[:4])} differ from the nearest cell's (same name and version, "
                              "other settings)")
    return f"grid: all {len(records)} records are cells of the protocol's grid ({len(cells)} cells per method)"


def _unplannable(doc: dict) -> str:
    """Why the grid cannot be planned from the bundled file alone (plug-in files, npz data, a checkpoint)."""
    pretrain = doc.get("pretrain")
    if doc.get("plugins"):
        return "its protocol names plug-in files"
    if any(str(d if isinstance(d, str) else d.get("name")).startswith("npz:") for d in doc["datasets"]):
        return "its protocol names .npz data files"
    if isinstance(pretrain, dict) and "checkpoint" in pretrain:
        return "its protocol names a checkpoint file"
    if isinstance(pretrain, dict) and "file" in pretrain:
        return "its protocol names a weights file"
    return ""


def _setting(spec: dict) -> dict:
    """A spec's cell setting: every field but the method's, the data fingerprint and the plug-ins."""
    from .submission import METHOD_KEYS

    out = {k: v for k, v in spec.items() if k not in (*METHOD_KEYS, "data_fingerprint", "plugins")}
    pretrain = out.get("pretrain")
    if isinstance(pretrain, dict) and "timm" in pretrain:
        # published weights are a cell's setting by name; their content hash, like the data's fingerprint, is
        # the lab's (the verifier may not hold the file): a rerun compares it
        out["pretrain"] = {"timm": pretrain["timm"]}
    return out


def _differing(mine: dict, cell: dict) -> list[str]:
    """The keys (one level into mappings: training.epochs) where two settings differ."""
    out = []
    for k in sorted(set(mine) | set(cell)):
        a, c = mine.get(k), cell.get(k)
        if a == c:
            continue
        if isinstance(a, dict) and isinstance(c, dict):
            out += [f"{k}.{j}" for j in sorted(set(a) | set(c)) if a.get(j) != c.get(j)]
        else:
            out.append(k)
    return out


def _record(b: Bundle, name: str) -> RunRecord:
    """One record member through the store's verify-on-read (schema, run id, metrics from the matrix)."""
    try:
        data = json.loads(b.members[name].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{b.path}: {name} is not a JSON record ({type(exc).__name__})") from None
    record, problem = parse_record(data, expected_run_id=Path(name).stem, protocol=b.protocol)
    if problem:
        raise BundleError(f"{b.path}: {name} is {problem.kind} ({problem.reason})")
    if record.spec.protocol_version != b.version:
        raise BundleError(f"{b.path}: {name} is of protocol version {record.spec.protocol_version}, "
                          f"not the bundle's {b.version}")
    return record


def file_digest(implementation: str) -> str | None:
    """The 16 hex digits of a file or entry point implementation (`sha256:<16 hex>[+v..]`); None for a version."""
    if not isinstance(implementation, str) or not implementation.startswith("sha256:"):
        return None
    return implementation[len("sha256:"):].split("+", 1)[0]


def _is_file(record: RunRecord) -> bool:
    source = ((record.provenance or {}).get("method") or {}).get("source")
    return not (isinstance(source, str) and (source == "built-in" or source.startswith("entry point ")))


def _method_files(b: Bundle, records) -> dict:
    """{digest: member} of the method files; every file method's record must find its file."""
    found = {Path(n).stem: n for n in b.names("methods")}
    for digest, name in found.items():
        if sha256_hex(b.members[name])[:DIGITS] != digest:
            raise BundleError(f"{b.path}: {name} is not named by its content's sha256")
    for r in records:
        digest = file_digest(r.spec.method_version)
        if digest and _is_file(r) and digest not in found:
            raise BundleError(f"{b.path}: record {r.run_id} names method file sha256:{digest}, which the bundle "
                              "does not hold")
    return found


def _fingerprints(b: Bundle, records, doc: dict) -> None:
    """Records fit the bundled protocol (data sets, regimes, scenario) and each data set has one fingerprint."""
    datasets = {d if isinstance(d, str) else d.get("name") for d in doc["datasets"]}
    regimes = set(doc.get("regimes") or [])
    seen = {}
    for r in records:
        s = r.spec
        if s.dataset.name not in datasets and not any(str(d).endswith(".npz") for d in datasets):
            raise BundleError(f"{b.path}: record {r.run_id} is of data set {s.dataset.name!r}, not one of the "
                              "bundled protocol's")
        if s.regime not in regimes:
            raise BundleError(f"{b.path}: record {r.run_id} has regime {s.regime!r}, not one of the bundled "
                              "protocol's")
        if doc.get("scenario") is not None and str(s.scenario) != str(doc["scenario"]):
            raise BundleError(f"{b.path}: record {r.run_id} has scenario {s.scenario}, not the bundled "
                              f"protocol's {doc['scenario']}")
        if seen.setdefault(s.dataset.name, s.data_fingerprint) != s.data_fingerprint:
            raise BundleError(f"{b.path}: data set {s.dataset.name!r} has two data fingerprints among its records")


def _environment(b: Bundle) -> dict:
    """The environment lock: a JSON mapping of plain values."""
    try:
        env = json.loads(b.members[ENVIRONMENT].decode("utf-8"))
    except KeyError:
        raise BundleError(f"{b.path}: no {ENVIRONMENT}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{b.path}: {ENVIRONMENT} is not JSON ({type(exc).__name__})") from None
    if not isinstance(env, dict):
        raise BundleError(f"{b.path}: {ENVIRONMENT} is not a JSON object")
    return env


def hardware(env: dict, records=()) -> str:
    """One line for the hardware a bundle's records ran on: devices and platform (plain text, escaped on render)."""
    devices = sorted({str((r.provenance or {}).get("device") or "?") for r in records}) or \
        [str(env.get("device") or "?")]
    gpu = env.get("gpu")
    text = ", ".join(devices) + (f" ({gpu})" if isinstance(gpu, str) and gpu else "")
    plat = env.get("platform")
    return (text + (f" · {plat}" if isinstance(plat, str) else ""))[:200]
