"""Where a record came from: package versions, git SHA, device, host."""
from __future__ import annotations

import inspect
import json
import platform
import re
import socket
import subprocess
from functools import lru_cache

from ..api.codefile import code_bytes, code_sha256
from ..config.errors import RegistryError
from ..config.resources import source_tree


@lru_cache(maxsize=1)
def package_versions() -> dict:
    """Versions of the packages that decide a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "torchvision", "avalanche-lib", "peft", "numpy", "cl-bench"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    """SHA of the checkout the harness runs from (with '+dirty' if modified), else None (installed)."""
    root = source_tree()
    if root is None:  # an installed package: git would report whatever repository holds site-packages
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("+dirty" if dirty else "")) or None


def provenance(device: str) -> dict:
    """Provenance block of a record."""
    return {"versions": package_versions(), "git_sha": git_sha(), "device": device,
            "hostname": socket.gethostname(), "platform": platform.platform()}


# Bounds of the method metadata a record carries (provenance["method"]): it is shown on boards built
# from other labs' records, so it is kept short; the store refuses a record beyond them.
METHOD_TEXT_LIMIT = {"description": 2000, "reference": 500, "name": 200, "family": 200, "kind": 20,
                     "implementation": 200, "source": 1000, "sha256": 64}
CAPTION_LIMIT = 500
MAX_CAPTIONS = 64
MAX_HPARAMS = 64
METHOD_KINDS = ("built-in", "file", "entry point")
_JSON_KIND = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", None: "null"}


def method_provenance(adapter, hparams: dict, source: str) -> dict:
    """What the site shows of a method, recorded at run time so that no page imports its code.

    `source` is the engine's hint for `reproduce` (built-in, the file's absolute path, the entry point);
    `hparams` the run's effective values. Text is cut to METHOD_TEXT_LIMIT.
    """
    kind = method_kind(adapter.source)
    entry = {"source": source, "implementation": adapter.implementation, "kind": kind, "name": adapter.name,
             "family": adapter.family, "description": adapter.description, "reference": adapter.reference}
    entry = {k: _cut(str(v), METHOD_TEXT_LIMIT[k]) for k, v in entry.items()}
    digest = _code_sha256(adapter, kind)
    if digest:
        entry["sha256"] = digest
    entry["captions"] = {_cut(str(k), 200): _cut(str(v), CAPTION_LIMIT)
                         for k, v in list(adapter.captions.items())[:MAX_CAPTIONS]}
    entry["hparams"] = {k: {"value": v, "type": hparam_type(adapter, k)}
                        for k, v in list(hparams.items())[:MAX_HPARAMS]}
    return entry


def method_kind(source: str) -> str:
    """"built-in", "entry point" or "file", from an adapter's source (the registry sets it so)."""
    if source == "built-in":
        return "built-in"
    return "entry point" if source.startswith("entry point ") else "file"


def hparam_type(adapter, key: str) -> list[str]:
    """The JSON kinds hyperparameter `key` takes (its HPARAM_TYPES, else its default's type); [] any."""
    declared = tuple(adapter.hparam_types.get(key, ()))
    if declared:
        return [_JSON_KIND[k] for k in declared if k in _JSON_KIND]  # the registry allows only these
    default = adapter.defaults.get(key)
    found = next((k for k in (bool, int, float, str, list, dict) if isinstance(default, k)), None)
    return [_JSON_KIND[found]] if found is not None else []


def _code_sha256(adapter, kind: str) -> str | None:
    """The full sha256 of a file's or entry point's code: the digest the registry kept on the file module
    that ran, else of the named file (a file) or of the file defining `build` (an entry point); None for a
    built-in or where there is no file."""
    if kind == "built-in":
        return None
    from ..api.registry import CODE_DIGEST  # here: the registry imports torch, this module's other users need not

    kept = getattr(adapter.build, "__globals__", {}).get(CODE_DIGEST)
    if kind == "file" and isinstance(kept, str):
        return kept
    try:
        path = adapter.source if kind == "file" else inspect.getsourcefile(adapter.build)
        return code_sha256(code_bytes(path)) if path else None
    except (TypeError, OSError, RegistryError):
        return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def method_problem(entry: dict) -> str | None:
    """What is wrong with a record's provenance["method"] (read back: untrusted), or None; an older record's
    {"implementation", "source"} passes, every key present must have its type and bound."""
    for key, limit in METHOD_TEXT_LIMIT.items():
        if key in entry and not (isinstance(entry[key], str) and len(entry[key]) <= limit):
            return f"its provenance.method.{key} is not a string of at most {limit} characters"
    if "kind" in entry and entry["kind"] not in METHOD_KINDS:
        return f"its provenance.method.kind is not one of {', '.join(METHOD_KINDS)}"
    if "sha256" in entry and not _HEX64.fullmatch(entry["sha256"]):
        return "its provenance.method.sha256 is not 64 lowercase hex digits"
    found = _identity_problem(entry)
    if found:
        return found
    captions = entry.get("captions", {})
    if not (isinstance(captions, dict) and len(captions) <= MAX_CAPTIONS and all(
            isinstance(k, str) and len(k) <= 200 and isinstance(v, str) and len(v) <= CAPTION_LIMIT
            for k, v in captions.items())):
        return f"its provenance.method.captions are not at most {MAX_CAPTIONS} short strings by key"
    hparams = entry.get("hparams", {})
    if not (isinstance(hparams, dict) and len(hparams) <= MAX_HPARAMS and all(
            isinstance(k, str) and len(k) <= 200 and _hparam_entry(v) for k, v in hparams.items())):
        return (f"its provenance.method.hparams are not at most {MAX_HPARAMS} {{value, type}} entries "
                f"(type: a list of {', '.join(_JSON_KIND.values())}; a value of at most {HPARAM_VALUE_LIMIT} "
                "characters as JSON)")
    return None


HPARAM_VALUE_LIMIT = 10_000  # a value's JSON; the run's own values are in its spec, this copy is for the page


def _hparam_entry(v) -> bool:
    """{"value": a JSON value of bounded size, "type": a short list of JSON kind names}."""
    if not (isinstance(v, dict) and set(v) == {"value", "type"} and isinstance(v["type"], list)
            and len(v["type"]) <= len(_JSON_KIND) and all(t in _JSON_KIND.values() for t in v["type"])):
        return False
    try:
        return len(json.dumps(v["value"])) <= HPARAM_VALUE_LIMIT
    except (TypeError, ValueError):
        return False


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _identity_problem(entry: dict) -> str | None:
    """A method entry that contradicts itself: a built-in with a code hash, a hash its implementation does
    not start with (what a board's "built-in" / "submitted file" label and sha256 rest on)."""
    implementation, digest = entry.get("implementation", ""), entry.get("sha256")
    if entry.get("kind") == "built-in" and (digest or entry.get("source", "built-in") != "built-in"):
        return "its provenance.method says built-in but names a source file or sha256"
    if digest and implementation.startswith("sha256:") and not digest.startswith(implementation[7:].split("+")[0]):
        return "its provenance.method.sha256 is not the code its implementation names"
    return None
