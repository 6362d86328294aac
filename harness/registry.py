"""The one method registry: built-ins, `submissions/`, explicit files and entry points."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path

from .adapter import MethodAdapter

ENTRY_POINT_GROUP = "cl_bench.methods"


class RegistryError(ValueError):
    """A method module is unusable; the message names the file and the reason."""


def submissions_dir() -> Path:
    """Folder scanned for submitted adapters: $CL_BENCH_SUBMISSIONS, else ./submissions."""
    return Path(os.environ.get("CL_BENCH_SUBMISSIONS", "submissions"))


def adapters_from_module(module, source: str) -> list[MethodAdapter]:
    """The adapters a module defines (`ADAPTERS`, or the `NAME`/`DEFAULTS`/`build` form)."""
    if hasattr(module, "ADAPTERS"):
        return list(module.ADAPTERS)
    missing = [a for a in ("NAME", "DEFAULTS", "build") if not hasattr(module, a)]
    if missing:
        raise RegistryError(f"{source}: missing {', '.join(missing)}; an adapter module defines "
                            "NAME (str), DEFAULTS (dict) and build(ctx, **hparams)")
    name, defaults, build = module.NAME, module.DEFAULTS, module.build
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise RegistryError(f"{source}: NAME must be a non-empty string without surrounding spaces, got {name!r}")
    if not isinstance(defaults, dict) or not all(isinstance(k, str) for k in defaults):
        raise RegistryError(f"{source}: DEFAULTS must be a dict with string keys, got {type(defaults).__name__}")
    if not callable(build):
        raise RegistryError(f"{source}: build must be a function build(ctx, **hparams)")
    return [MethodAdapter(name, dict(defaults), build,
                          description=str(getattr(module, "DESCRIPTION", "") or (module.__doc__ or "").strip().split("\n")[0]),
                          reference=str(getattr(module, "REFERENCE", "")), source=source,
                          family=str(getattr(module, "FAMILY", "submission")))]


def load_module_file(path: str | Path):
    """Import a Python file as a private module; import errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"{path}: no such method file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    mod_name = f"cl_bench_submission_{path.stem.replace('-', '_')}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise RegistryError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:  # the module's own import-time failure
        raise RegistryError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    sys.modules[mod_name] = module
    return module


def file_sha256(path: str | Path) -> str:
    """Full sha256 of a file (recorded as a submission's provenance)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _builtin_modules():
    from . import methods

    for info in pkgutil.iter_modules(methods.__path__):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{methods.__name__}.{info.name}"), f"harness.methods.{info.name}"


def _submission_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def _entry_point_modules():
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            yield ep.load(), f"entry point {ep.name} ({ep.value})"
        except Exception as exc:
            raise RegistryError(f"entry point {ep.name} ({ep.value}): import failed: "
                                f"{type(exc).__name__}: {exc}") from None


def discover(extra_files=(), include_submissions: bool = True, include_entry_points: bool = True) -> dict[str, MethodAdapter]:
    """Build the registry; a name defined twice fails loudly with both sources."""
    sources = list(_builtin_modules())
    if include_submissions:
        sources += [(load_module_file(p), str(p)) for p in _submission_files(submissions_dir())]
    if include_entry_points:
        sources += list(_entry_point_modules())
    sources += [(load_module_file(p), str(p)) for p in extra_files]
    registry: dict[str, MethodAdapter] = {}
    for module, source in sources:
        for adapter in adapters_from_module(module, source):
            if adapter.name in registry and registry[adapter.name].source != adapter.source:
                raise RegistryError(f"{source}: method name {adapter.name!r} is already defined by "
                                    f"{registry[adapter.name].source}; choose another NAME")
            registry[adapter.name] = adapter
    return registry


_CACHE: dict = {}


def get_registry(extra_files=()) -> dict[str, MethodAdapter]:
    """The registry for this process (cached per set of extra files)."""
    key = (tuple(str(p) for p in extra_files), str(submissions_dir().resolve()))
    if key not in _CACHE:
        _CACHE[key] = discover(extra_files)
    return _CACHE[key]
