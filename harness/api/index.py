"""Method metadata without importing the methods: what `cl-bench list methods` prints.

Importing an adapter module imports torch and Avalanche (seconds). Listing only needs each
adapter's name, defaults, description and source, so those are kept by content hash:

- built-in methods: `harness/api/_index.json` (shipped; regenerate with
  `python -m harness.api.index`), valid while the fingerprint of harness/methods/*.py and harness/api/*.py
  matches;
- method files (submissions/, --method): a per-user cache keyed by the file's sha256 (and
  the built-in fingerprint), filled the first time a file is imported.

Anything not covered (a changed file, entry points) is imported exactly as the registry
does, so the listing always equals `registry.get_registry()`'s, duplicates included.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..config.files import write_atomic
from ..config.paths import cache_dir, submission_files
from ..config.vocabulary import ENTRY_POINT_GROUP

_HERE = Path(__file__).resolve().parent
INDEX_PATH = _HERE / "_index.json"
METHODS_DIR = _HERE.parent / "methods"
FIELDS = ("name", "defaults", "description", "reference", "source", "family", "prefix_cache", "captions")
MAX_ENTRIES = 256


def builtin_fingerprint() -> str:
    """sha256 over the built-in method modules and the toolkit they build on (every .py of both)."""
    digest = hashlib.sha256()
    for path in sorted([*_HERE.glob("*.py"), *METHODS_DIR.glob("*.py")]):
        digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _meta(adapter) -> dict:
    return {f: dict(getattr(adapter, f)) if f == "captions" else getattr(adapter, f) for f in FIELDS}


def _imported_builtins() -> list[dict]:
    from .registry import adapters_from_module, builtin_modules

    return [{**_meta(a), "module": source} for module, source in builtin_modules()
            for a in adapters_from_module(module, source)]


def build_index() -> dict:
    """The built-in index from the live modules (imports them)."""
    return {"fingerprint": builtin_fingerprint(), "methods": _imported_builtins()}


def _builtin_metas(fingerprint: str) -> list[dict]:
    try:
        index = json.loads(INDEX_PATH.read_text())
        if index.get("fingerprint") == fingerprint:
            return index["methods"]
    except (OSError, ValueError, KeyError):
        pass
    cached = _user_cache().get(f"builtin:{fingerprint}")
    if cached is not None:
        return cached
    metas = _imported_builtins()
    _remember(f"builtin:{fingerprint}", metas)
    return metas


def _cache_path() -> Path:
    return cache_dir() / "method-metadata.json"


def _user_cache() -> dict:
    try:
        return json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _remember(key: str, metas: list[dict]) -> None:
    """Add one entry to the per-user cache; a cache that cannot be written is skipped."""
    path = _cache_path()
    try:
        cache = _user_cache()
        cache[key] = metas
        for old in list(cache)[:-MAX_ENTRIES]:  # oldest first: edited files leave stale keys
            del cache[old]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache))
    except (OSError, TypeError, ValueError):
        pass


def _file_metas(path: Path, fingerprint: str) -> list[dict]:
    from .codefile import code_bytes, code_sha256

    # code_bytes refuses what load_module_file refuses (no .py, a FIFO, a folder) without opening it
    digest = code_sha256(code_bytes(path))
    key = f"file:{digest}:{fingerprint}:{path}"
    cached = _user_cache().get(key)
    if cached is not None:
        return cached
    from .registry import adapters_from_module, load_module_file

    # expect: the code imported is the code the metadata is kept under
    metas = [_meta(a) for a in adapters_from_module(load_module_file(path, expect=digest), str(path))]
    _remember(key, metas)
    return metas


def method_infos(extra_files=()) -> list[dict]:
    """Metadata of every registered method, in the registry's discovery order."""
    from importlib.metadata import entry_points

    if list(entry_points(group=ENTRY_POINT_GROUP)):  # installed plugins: import as the registry does
        from .registry import get_registry

        return [_meta(a) for a in get_registry(tuple(extra_files)).values()]
    fingerprint = builtin_fingerprint()
    groups = [("harness.methods", _builtin_metas(fingerprint))]
    for path in _method_files(extra_files):
        groups.append((str(path), _file_metas(path, fingerprint)))
    return _without_duplicates(groups)


def builtin_infos() -> list[dict]:
    """Metadata of the built-in methods only (the shipped index; no method file or entry point is imported)."""
    return _builtin_metas(builtin_fingerprint())


def _method_files(extra_files) -> list[Path]:
    """Submission files then explicit files, each file once (as registry.discover)."""
    seen, out = set(), []
    for path in [*submission_files(), *map(Path, extra_files)]:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _without_duplicates(groups) -> list[dict]:
    origin, out = {}, []
    for source, metas in groups:
        for meta in metas:
            if meta["name"] in origin:
                from .registry import RegistryError

                source = meta.get("module", source)
                raise RegistryError(f"{source}: method name {meta['name']!r} is already defined by "
                                    f"{origin[meta['name']]}; choose another NAME")
            origin[meta["name"]] = meta.get("module", source)
            out.append(meta)
    return out


def main() -> None:
    """Regenerate harness/api/_index.json from the live built-in modules."""
    index = build_index()
    write_atomic(INDEX_PATH, json.dumps(index, indent=1) + "\n")
    print(f"{INDEX_PATH}: {len(index['methods'])} built-in methods, fingerprint {index['fingerprint'][:12]}")


if __name__ == "__main__":
    main()
