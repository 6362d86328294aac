"""The one registry: methods and plug-ins from built-ins, `submissions/`, explicit files and entry points.

A file (`--method`, `--plugin`, a protocol's `plugins:`, `submissions/*.py`) may define methods
(`NAME`/`DEFAULTS`/`build` or `ADAPTERS`), plug-ins (`PLUGINS`: backbones, data sets, regime
families; harness/api/plugins.py) or both. Methods are returned as the registry; plug-ins are
registered for the whole process (the vocabulary learns their names), so every later lookup by
name (protocol, engine, worker) finds them.

What a command may import beside built-ins and entry points is its `CodeScope`: by default the
named files and the submissions folder (`run`, `list`, `check`, `submit`); `reproduce` names its
files alone, each of which must hash to code the record was made with (`code_scope`).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import pkgutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from ..config.errors import RegistryError
from ..config.paths import submission_files, submissions_dir
from ..config.vocabulary import ENTRY_POINT_GROUP, NAME_PATTERN, PLUGIN_GROUPS, Family, Scenario
from . import plugins
from .codefile import IMPLEMENTATION_DIGITS, code_bytes, code_sha256
from .contract import MethodAdapter, Range

METHODS_PACKAGE = "harness.methods"  # one module per built-in method family, nothing else
CODE_DIGEST = "__cl_bench_sha256__"  # a loaded file module's sha256: of the bytes that ran, set after they ran


@dataclasses.dataclass(frozen=True)
class CodeScope:
    """What files a registry imports beside built-ins and entry points: the named ones, the submissions
    folder's too when `submissions`; with `expect` (implementation digests), only a file that hashes to
    one of them, refused before it runs with `expected` saying what the code had to be."""

    submissions: bool = True
    expect: frozenset | None = None
    expected: str = ""


DEFAULT_SCOPE = CodeScope()  # named files and the submissions folder, as they are
_SCOPE: ContextVar[CodeScope] = ContextVar("cl_bench_code_scope", default=DEFAULT_SCOPE)


@contextmanager
def code_scope(scope: CodeScope) -> Iterator[CodeScope]:
    """Within the block (a command's whole run, engine included), every registry is built under `scope`."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def adapters_from_module(module, source: str) -> list[MethodAdapter]:
    """The adapters a module defines (`ADAPTERS`, or the `NAME`/`DEFAULTS`/`build` form)."""
    if isinstance(module, MethodAdapter):  # an entry point may name an adapter object directly
        return [validate_adapter(module, source)]
    if hasattr(module, "PLUGINS") and not any(hasattr(module, a) for a in ("ADAPTERS", "NAME")):
        return []  # a plug-in file: no method
    if hasattr(module, "ADAPTERS"):
        adapters = module.ADAPTERS
        if not isinstance(adapters, (list, tuple)) or not all(isinstance(a, MethodAdapter) for a in adapters):
            raise RegistryError(f"{source}: ADAPTERS must be a tuple of harness.api.contract.MethodAdapter")
        return [validate_adapter(a, source) for a in adapters]
    missing = [a for a in ("NAME", "DEFAULTS", "build") if not hasattr(module, a)]
    if missing:
        raise RegistryError(f"{source}: missing {', '.join(missing)}; an adapter module defines "
                            "NAME (str), DEFAULTS (dict) and build(ctx, **hparams) (a plug-in file: PLUGINS)")
    adapter = MethodAdapter(module.NAME, module.DEFAULTS, module.build, source=source,
                            description=str(getattr(module, "DESCRIPTION", "")
                                            or (module.__doc__ or "").strip().split("\n")[0]),
                            reference=str(getattr(module, "REFERENCE", "")),
                            family=str(getattr(module, "FAMILY", "submission")),
                            prefix_cache=getattr(module, "PREFIX_CACHE", False),
                            captions=getattr(module, "CAPTIONS", {}),
                            hparam_types=getattr(module, "HPARAM_TYPES", {}),
                            hparam_ranges=getattr(module, "HPARAM_RANGES", {}),
                            version=getattr(module, "VERSION", "1"),
                            regime_families=tuple(getattr(module, "REGIME_FAMILIES", Family)),
                            regime_note=str(getattr(module, "REGIME_NOTE", "")),
                            scenarios=_as_tuple(getattr(module, "SCENARIOS", tuple(Scenario))),
                            regimes_allowed=getattr(module, "REGIMES_ALLOWED", None),
                            check_hparams=getattr(module, "CHECK_HPARAMS", {}))
    adapter = validate_adapter(adapter, source)
    return [dataclasses.replace(adapter, defaults=dict(adapter.defaults), captions=dict(adapter.captions),
                                hparam_types=dict(adapter.hparam_types), hparam_ranges=dict(adapter.hparam_ranges),
                                check_hparams=dict(adapter.check_hparams))]


def _check_check_hparams(adapter: MethodAdapter, source: str) -> None:
    """CHECK_HPARAMS: a dict over hyperparameters of DEFAULTS, with plain JSON values."""
    values = adapter.check_hparams
    if not hasattr(values, "items") or not all(isinstance(k, str) for k in values):
        raise RegistryError(f"{source}: CHECK_HPARAMS of {adapter.name!r} must be a dict of hyperparameter names "
                            f"to values, got {type(values).__name__}")
    unknown = sorted(set(values) - set(adapter.defaults))
    if unknown:
        raise RegistryError(f"{source}: CHECK_HPARAMS of {adapter.name!r} names {', '.join(unknown)}, not in DEFAULTS; "
                            f"allowed: {', '.join(sorted(adapter.defaults)) or 'none (DEFAULTS is empty)'}")
    try:
        json.dumps(dict(values), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{source}: CHECK_HPARAMS of {adapter.name!r} must hold plain JSON values: {exc}") from None


def _as_tuple(value):
    """A list declared in a file as the tuple it stands for; anything else as it is (validated later)."""
    return tuple(value) if isinstance(value, list) else value


def validate_adapter(adapter: MethodAdapter, source: str) -> MethodAdapter:
    """Check NAME, DEFAULTS and build's signature; every problem names the source."""
    name, defaults, build = adapter.name, adapter.defaults, adapter.build
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise RegistryError(f"{source}: NAME must be a string of letters, digits, '.', '_', '-' "
                            f"(starting with a letter or digit), got {name!r}")
    if not isinstance(defaults, dict) or not all(isinstance(k, str) for k in defaults):
        raise RegistryError(f"{source}: DEFAULTS must be a dict with string keys, got {type(defaults).__name__}")
    try:  # hyperparameters are part of the run spec, which is hashed as JSON
        json.dumps(defaults, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{source}: DEFAULTS of {name!r} must hold plain JSON values "
                            f"(numbers, strings, booleans, None, lists, dicts): {exc}") from None
    if not callable(build):
        raise RegistryError(f"{source}: build must be a function build(ctx, **hparams), got {type(build).__name__}")
    _check_signature(build, defaults, name, source)
    if not isinstance(adapter.prefix_cache, bool):
        raise RegistryError(f"{source}: PREFIX_CACHE of {name!r} must be True or False, got {adapter.prefix_cache!r}")
    captions = adapter.captions
    plain = hasattr(captions, "items") and all(isinstance(k, str) and isinstance(v, str) for k, v in captions.items())
    if not plain:
        raise RegistryError(f"{source}: CAPTIONS of {name!r} must map diagnostic keys to strings")
    _check_hparam_types(adapter, source)
    check_hparam_ranges(adapter, source)
    families = adapter.regime_families
    if not isinstance(families, tuple) or not families or any(f not in tuple(Family) for f in families):
        raise RegistryError(f"{source}: REGIME_FAMILIES of {name!r} must be a non-empty tuple of "
                            f"{', '.join(Family)}, got {families!r}")
    scenarios = adapter.scenarios
    if not isinstance(scenarios, tuple) or not scenarios or any(s not in tuple(Scenario) for s in scenarios):
        raise RegistryError(f"{source}: the scenarios of {name!r} must be a non-empty tuple of "
                            f"{', '.join(Scenario)}, got {scenarios!r} (SCENARIOS, or MethodAdapter(scenarios=...))")
    if adapter.regimes_allowed is not None and not callable(adapter.regimes_allowed):
        raise RegistryError(f"{source}: REGIMES_ALLOWED of {name!r} must be a function regime -> None or a "
                            f"one-clause reason to refuse it, got {type(adapter.regimes_allowed).__name__}")
    _check_check_hparams(adapter, source)
    if not isinstance(adapter.version, str) or not adapter.version:
        raise RegistryError(f"{source}: the version of {name!r} must be a non-empty string, got {adapter.version!r}")
    return adapter


HPARAM_KINDS = (int, float, bool, str, list, dict, None)


def _check_hparam_types(adapter: MethodAdapter, source: str) -> None:
    types = adapter.hparam_types
    ok = hasattr(types, "items") and all(
        k in adapter.defaults and isinstance(v, tuple) and v and all(t in HPARAM_KINDS for t in v)
        for k, v in types.items())
    if not ok:
        raise RegistryError(f"{source}: HPARAM_TYPES of {adapter.name!r} must map DEFAULTS keys to non-empty "
                            "tuples of int, float, bool, str, list, dict or None")


def check_hparam_ranges(adapter: MethodAdapter, source: str) -> None:
    """HPARAM_RANGES maps DEFAULTS keys to Range values that fit the key's type and admit its default."""
    ranges = adapter.hparam_ranges
    plain = hasattr(ranges, "items") and all(k in adapter.defaults and isinstance(r, Range) for k, r in ranges.items())
    if not plain:
        raise RegistryError(f"{source}: HPARAM_RANGES of {adapter.name!r} must map DEFAULTS keys to "
                            "harness.api.contract.Range values")
    for key, allowed in ranges.items():
        kinds = _hparam_kinds(adapter, key)
        numeric = allowed.low is not None or allowed.high is not None
        if (numeric and kinds is not None and not {int, float} & set(kinds)) or \
                (allowed.choices and kinds is not None and str not in kinds):
            raise RegistryError(f"{source}: HPARAM_RANGES[{key!r}] of {adapter.name!r} bounds a value its type "
                                f"({', '.join(getattr(k, '__name__', 'None') for k in kinds)}) cannot take")
        if not allowed.admits(adapter.defaults[key]):
            raise RegistryError(f"{source}: the default {key}={adapter.defaults[key]!r} of {adapter.name!r} is "
                                f"outside its HPARAM_RANGES ({allowed.describe()})")


def _hparam_kinds(adapter: MethodAdapter, key: str) -> tuple | None:
    """The JSON kinds hyperparameter `key` takes: its HPARAM_TYPES, else its default's type (None: any)."""
    declared = tuple(adapter.hparam_types.get(key, ()))
    if declared:
        return declared
    default = adapter.defaults[key]
    return next(((k,) for k in (bool, int, float, str, list, dict) if isinstance(default, k)), None) \
        if default is not None else None


def _check_signature(build, defaults: dict, name: str, source: str) -> None:
    try:
        signature = inspect.signature(build)
    except (TypeError, ValueError):  # builtins/C callables: nothing to check
        return
    try:
        signature.bind(object(), **defaults)
    except TypeError as exc:
        raise RegistryError(f"{source}: build{signature} of {name!r} cannot be called as "
                            f"build(ctx, **DEFAULTS) ({exc}); accept ctx first and every DEFAULTS key "
                            "as a keyword") from None


def load_module_file(path: str | Path, expect=None, expected: str = ""):
    """Import a Python file as a private module: the ONE place cl-bench runs code from a file.

    Callers pass only paths the user named (a `--method`/`--plugin` flag, `check`/`submit`'s FILE,
    a protocol's `plugins:`, the submissions folder), never a path read from a record or a results
    folder. The bytes read once by `code_bytes` are the bytes hashed, checked against `expect` (a
    sha256, or several; a prefix of at least IMPLEMENTATION_DIGITS hex digits counts) and run (no
    second read, no .pyc written next to the file); their sha256 is kept on the module (CODE_DIGEST)
    as its identity. Import errors name the file.
    """
    path = Path(path)
    source = code_bytes(path)
    digest = code_sha256(source)
    if expect is not None:
        _check_expected(path, digest, (expect,) if isinstance(expect, str) else tuple(expect), expected)
    mod_name = f"cl_bench_submission_{path.stem.replace('-', '_')}_{digest[:12]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    except SyntaxError as exc:
        raise RegistryError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:  # the module's own import-time failure
        raise RegistryError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    setattr(module, CODE_DIGEST, digest)  # after the module's own code: it cannot choose its identity
    sys.modules[mod_name] = module
    return module


def _check_expected(path: Path, digest: str, expect: tuple, expected: str) -> None:
    """Refuse (before anything runs) bytes whose sha256 is none of `expect`."""
    if any(isinstance(e, str) and len(e) >= IMPLEMENTATION_DIGITS and digest.startswith(e) for e in expect):
        return
    shown = digest[:IMPLEMENTATION_DIGITS]
    wanted = expected or "the expected code (" + ", ".join(f"sha256:{e}" for e in expect) + ")"
    raise RegistryError(f"{path}: its content (sha256:{shown}) is not {wanted}")


def builtin_modules():
    """(module, source) of every built-in method family module of this package."""
    package = importlib.import_module(METHODS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{METHODS_PACKAGE}.{info.name}"), f"{METHODS_PACKAGE}.{info.name}"


def _entry_point_modules(group: str = ENTRY_POINT_GROUP):
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        try:
            yield ep.load(), f"entry point {ep.name} ({ep.value})"
        except Exception as exc:
            raise RegistryError(f"entry point {ep.name} ({ep.value}): import failed: "
                                f"{type(exc).__name__}: {exc}") from None


def _plugin_entry_points() -> list:
    """(object, source) of the installed plug-ins; each group holds declarations of its own kind."""
    out = []
    for kind, group in PLUGIN_GROUPS.items():
        for obj, source in _entry_point_modules(group):
            declared = plugins.plugins_of(obj, source)
            wrong = [p.name for p in declared if p.kind != kind]
            if wrong:
                raise RegistryError(f"{source}: group {group} holds {kind}s only; {', '.join(wrong)} "
                                    "belong(s) in the group of its kind")
            out.append((obj, source))
    return out


def discover(extra_files=(), include_submissions: bool = True, include_entry_points: bool = True,
             scope: CodeScope | None = None) -> Registry:
    """Build the registry and register the plug-ins; a name defined twice fails loudly with both sources.

    `scope` (default: the current `code_scope`) says whether the submissions folder is read (and
    `include_submissions` too) and what a file must hash to."""
    scope = _SCOPE.get() if scope is None else scope
    # A file reached twice (submissions/ and --method, or an installed entry point's own file)
    # counts once.
    seen: set = set()
    sources = [(m, s, "builtin") for m, s in _remember(list(builtin_modules()), seen)]
    if include_submissions and scope.submissions:
        sources += [(m, s, "file") for m, s in _file_modules(submission_files(), seen, scope)]
    if include_entry_points:
        sources += [(m, s, "entry point") for m, s in _remember(list(_entry_point_modules()), seen)]
        sources += [(m, s, "plug-in entry point") for m, s in _remember(_plugin_entry_points(), seen)]
    sources += [(m, s, "file") for m, s in _file_modules(extra_files, seen, scope)]
    registry = Registry(files=tuple(map(str, extra_files)))
    origin: dict[str, str] = {}
    for module, source, kind in sources:
        if kind != "builtin":
            _register_plugins(module, source, kind)
        if kind == "plug-in entry point":
            continue
        for adapter in adapters_from_module(module, source):
            if adapter.name in registry:
                raise RegistryError(f"{source}: method name {adapter.name!r} is already defined by "
                                    f"{origin[adapter.name]}; choose another NAME")
            registry[adapter.name], origin[adapter.name] = identified(adapter, module, source, kind), source
    return registry


def _register_plugins(module, source: str, kind: str) -> None:
    """Register the backbones, data sets and regime families a file or entry point declares, if any."""
    if not (kind == "plug-in entry point" or hasattr(module, "PLUGINS")):
        return
    declared = plugins.plugins_of(module, source)
    if declared:
        version = getattr(module, "VERSION", "1")
        kind = "entry point" if kind == "plug-in entry point" else kind
        plugins.register(declared, source, implementation(module, source, kind, version,
                                                          plugins.function_of(declared[0])))


class Registry(dict):
    """Method name -> adapter, and the files (methods and plug-ins) it was built with."""

    def __init__(self, *args, files: tuple = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.files = files

    def extended(self, files) -> Registry:
        """The registry with `files` loaded too (a protocol's `plugins:`)."""
        return get_registry(tuple(dict.fromkeys((*self.files, *map(str, files)))))


def identified(adapter: MethodAdapter, module, source: str, kind: str) -> MethodAdapter:
    """The adapter with its `implementation`: what enters every run id of the method."""
    found = implementation(module, source, kind, adapter.version, adapter.build)
    if kind == "builtin":
        return dataclasses.replace(adapter, implementation=found)
    return dataclasses.replace(adapter, source=source, implementation=found)


def implementation(module, source: str, kind: str, version: str = "1", function=None) -> str:
    """The identity of a method's or plug-in's code that enters every run id using it.

    Built-ins declare a version; a file is identified by the content that ran (the digest
    `load_module_file` kept), an entry point by the content of the file that defines it, so edited
    code never reuses old records.
    """
    if kind == "builtin":
        return f"v{version}"
    if kind == "file":
        digest = getattr(module, CODE_DIGEST, None)
        if not isinstance(digest, str):
            raise RegistryError(f"{source}: not loaded by load_module_file; its code has no identity")
    else:
        digest = _entry_point_digest(module, function)
    if digest is None:  # no source to hash: the declared version is all there is
        return f"v{version}"
    # a declared version still counts: it covers helper modules the hashed file imports
    declared = "" if version == "1" else f"+v{version}"
    return f"sha256:{digest[:IMPLEMENTATION_DIGITS]}{declared}"


def _entry_point_digest(module, function) -> str | None:
    """sha256 of the file defining an installed entry point (Python imported it); None without one."""
    path = getattr(module, "__file__", None) or (inspect.getsourcefile(function) if function else None)
    if not path or not Path(path).is_file():
        return None
    try:
        return code_sha256(Path(path).read_bytes())
    except OSError:
        return None


def _remember(sources: list, seen: set) -> list:
    for module, _ in sources:
        if isinstance(getattr(module, "__file__", None), str):
            seen.add(Path(module.__file__).resolve())
    return sources


def _file_modules(paths, seen: set, scope: CodeScope) -> list:
    out = []
    for path in map(Path, paths):
        if path.resolve() not in seen:
            seen.add(path.resolve())
            out.append((load_module_file(path, scope.expect, scope.expected), str(path)))
    return out


_CACHE: dict = {}


def get_registry(extra_files=()) -> Registry:
    """The registry for this process (cached per set of extra files and `code_scope`); their plug-ins are
    registered."""
    # File contents are part of the key: an edited method file is re-read, not served stale.
    scope = _SCOPE.get()
    folder = submission_files() if scope.submissions else []
    files = [*folder, *map(Path, extra_files)]
    key = (tuple(str(p) for p in extra_files), scope, str(submissions_dir().resolve()),
           tuple(_stamp(p) for p in files))
    if key not in _CACHE:
        _CACHE[key] = discover(extra_files, scope=scope)
    return _CACHE[key]


def _stamp(path: Path):
    try:
        st = path.stat()
    except OSError:
        return (str(path), None)
    return (str(path), st.st_mtime_ns, st.st_size)
