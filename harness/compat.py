"""Quirks of the stack, handled once: import this before torch-side libraries.

- MLflow telemetry and Ray usage stats are switched off (nothing may call out).
- `import avalanche` writes ~/.avalanche/config.json; when HOME is not writable we point
  Avalanche at a private temporary HOME instead of crashing.
- Known, harmless warnings of the stack are silenced by the start of their exact message (and
  their category), so that `-W error` runs (and users' logs) only show warnings that matter.
  SI's NumPy `__array_wrap__` DeprecationWarning becomes a TypeError under `-W error`: silenced here.
- Start-up: `import avalanche` imports all of its packages, and with them libraries no run uses
  (wandb; qpsolvers, which imports jax). Those modules are *deferred*: importing one creates its
  module object (name, spec, path) but runs its body only on the first access to anything else
  (or the import of a submodule), so the code that uses them still works and pays for it then.
  The Avalanche packages in SPLIT run their __init__ without the imports of the submodules no run
  uses (the classic benchmarks; topk_acc, which imports torchmetrics -> scipy.signal and
  transformers); those run on the first access to a name the package lacks.
  `CL_BENCH_FULL_IMPORTS=1` switches both off.
"""
from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import os
import sys
import tempfile
import threading
import types
import warnings

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

# (category, the start of the message: a regex, matched case-insensitively from the start)
_QUIET = (
    (DeprecationWarning, r"__array_wrap__ must accept context and return_scalar arguments"),  # NumPy 2, SI
    (DeprecationWarning, r"JAXopt is no longer maintained"),  # on importing qpsolvers (Avalanche's GEM)
    (DeprecationWarning, r"Call to deprecated (function|class) "),  # Avalanche's own @deprecated
    (DeprecationWarning, r"The ``noload`` loader strategy is deprecated"),  # SQLAlchemy in MLflow's SQL store
    (UserWarning, r"No loggers specified, metrics will not be logged"),  # Avalanche, every strategy
    (UserWarning, r"TypedStorage is deprecated"),  # torch
)


def silence_known_warnings() -> None:
    """Install the warning filters for the stack's known, harmless warnings."""
    for category, message in _QUIET:
        warnings.filterwarnings("ignore", message=message, category=category)


# Heavy modules that `import avalanche` pulls in but no run calls; each is deferred (see above).
# Only modules that their importers bind whole (`import x`, `from pkg import x`) gain anything:
# `from x import name` and importing a submodule `x.y` run x's body at once.
DEFERRED = (
    "wandb",  # avalanche.evaluation.metrics.confusion_matrix: `import wandb`
    "qpsolvers",  # avalanche.training.plugins.gem: `import qpsolvers` (pulls jax); used by GEM's solve
)
# Not deferrable this way (measured): torchmetrics (topk_acc does `from torchmetrics.functional import
# accuracy`, whose package imports transformers), torchvision.models/ops and torch._dynamo
# (avalanche.benchmarks.classic.ex_model imports torchvision.models by name): Avalanche's packages
# star-import every submodule, which touches every name. SPLIT (below) keeps torchmetrics out instead.


class _DeferredModule(types.ModuleType):
    """A module whose body runs on the first access to an attribute it does not have yet."""

    def __getattr__(self, name: str):
        _load(self)
        return getattr(self, name)


def _load(module: types.ModuleType, loader: importlib.abc.Loader | None = None) -> None:
    """Run an installed library's module with its real loader (a deferred module, or a package run whole)."""
    loader = loader or module.__spec__.loader.real
    module.__class__ = types.ModuleType  # from now on an ordinary module
    module.__spec__.loader = module.__loader__ = loader
    loader.exec_module(module)


def _run_installed(code: types.CodeType, module: types.ModuleType) -> None:
    """Run part of an installed package's own __init__ (its source as the import system found it, never a
    file a user named) in the package's namespace."""
    exec(code, module.__dict__)


class _DeferringLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__class__ = _DeferredModule


class _LoadedLoader(importlib.abc.Loader):
    """Hands back a module that loading its deferred parent has already imported."""

    def __init__(self, module: types.ModuleType):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# Avalanche packages that import, in their __init__, modules no run uses. Each is *split*: its body
# runs without its `from .<name> import ...` statements for the names listed, which run on the first
# access to a name the package does not have (an attribute, `from pkg import name`, `import *`).
# Importing a submodule (`import avalanche.benchmarks.utils`) does not run them. Every name bound
# before the split part runs is the same object after it (tests/test_startup_imports.py checks).
SPLIT = {
    # avalanche.evaluation.metrics.topk_acc: `from torchmetrics.functional import accuracy`, and
    # torchmetrics' __init__ imports scipy.signal and its text metrics, which import transformers
    "avalanche.evaluation.metrics": ("topk_acc",),
    # the classic benchmarks and their datasets: gdown, requests, bs4, lxml
    "avalanche.benchmarks": ("classic",),
}
# Imported where the split statements stood, so that Avalanche's circular imports resolve in the
# order they do unsplit (classic.ex_model imports the evaluation metrics, which import the training
# templates, before avalanche/__init__ gets to `from avalanche import training`).
SPLIT_KEEPS = {"avalanche.benchmarks": ("avalanche.evaluation.metrics",)}
# Not split (measured, no gain): torchvision.models/ops and torch._dynamo, because
# avalanche.training.supervised.strategy_wrappers (Naive...) imports avalanche.models.expert_gate,
# which imports torchvision.models, and torch.optim imports torch._dynamo on the first optimizer;
# matplotlib, because avalanche.evaluation.metric_results imports matplotlib.figure.
_SPLIT_STATE = "_cl_bench_split"
_SPLIT_LOCK = threading.RLock()


class _SplitModule(types.ModuleType):
    """A package whose split import statements run on the first access to a name it lacks."""

    def __getattr__(self, name: str):
        state = self.__dict__.get(_SPLIT_STATE)
        if state is not None and state["running"]:  # its own body is running: as for any module
            raise AttributeError(f"partially initialized module {self.__name__!r} has no attribute {name!r}")
        _finish(self)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def _finish(module: types.ModuleType) -> None:
    """Run a split package's remaining import statements (once); it becomes an ordinary module."""
    with _SPLIT_LOCK:
        state = module.__dict__.pop(_SPLIT_STATE, None)
        if state is None:
            return
        module.__class__ = types.ModuleType
        _run_installed(state["rest"], module)


def _split_body(tree: ast.Module, names: tuple[str, ...], keeps: tuple[str, ...] = ()):
    """(the body without its `from .<name> import ...` statements, those statements), or None when
    the body does not have each of them. `keeps` are imported, binding no name, where the first stood."""
    eager, rest = [], []
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in names):
            eager.append(node)
            continue
        if not rest:
            for name in keeps:
                call = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant(name)], [])
                eager.append(ast.copy_location(ast.Expr(call), node))
        rest.append(node)
    if sorted(node.module for node in rest) != sorted(names):  # not the version this was written for
        return None
    return ast.fix_missing_locations(ast.Module(eager, [])), ast.Module(rest, [])


class _SplittingLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader, names: tuple[str, ...]):
        self.real = real
        self.names = names

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self.real
        origin = module.__spec__.origin
        try:
            source = self.real.get_source(module.__name__)
            parts = _split_body(ast.parse(source, origin), self.names, SPLIT_KEEPS.get(module.__name__, ()))
        except (OSError, SyntaxError, ImportError):
            parts = None
        if parts is None:  # run it whole
            _load(module, self.real)
            return
        eager, rest = (compile(part, origin, "exec") for part in parts)
        state = {"rest": rest, "running": True}
        module.__dict__[_SPLIT_STATE] = state
        module.__class__ = _SplitModule
        try:
            _run_installed(eager, module)
        except BaseException:
            module.__class__ = types.ModuleType
            module.__dict__.pop(_SPLIT_STATE, None)
            raise
        state["running"] = False


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Defers the modules in DEFERRED and splits the packages in SPLIT;
    runs a deferred package's body before any submodule's."""

    def __init__(self, names: tuple[str, ...], split: dict[str, tuple[str, ...]]):
        self.names = frozenset(names)
        self.split = split

    def find_spec(self, fullname, path, target=None):
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if isinstance(parent, _DeferredModule):
            _load(parent)  # a submodule may rely on its package's body, as without deferral
            if fullname in sys.modules:  # the package's body imported it
                module = sys.modules[fullname]
                return importlib.util.spec_from_loader(fullname, _LoadedLoader(module))
            return None
        if fullname in self.split:
            spec = self._real_spec(fullname, path, target)
            if spec is not None and hasattr(spec.loader, "get_source") and spec.submodule_search_locations:
                spec.loader = _SplittingLoader(spec.loader, self.split[fullname])
            return spec
        if fullname not in self.names:
            return None
        spec = self._real_spec(fullname, path, target)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _DeferringLoader(spec.loader)
        return spec

    def _real_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None


def install_deferral() -> None:
    """Defer the modules in DEFERRED and split the packages in SPLIT (once; not when CL_BENCH_FULL_IMPORTS=1)."""
    if os.environ.get("CL_BENCH_FULL_IMPORTS", "") in ("", "0") and not any(
            isinstance(f, _DeferringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder(DEFERRED, SPLIT))


def _ensure_avalanche_home() -> None:
    root = os.path.expanduser("~/.avalanche")
    try:
        os.makedirs(root, exist_ok=True)
        if os.access(root, os.W_OK):
            return
    except OSError:
        pass
    os.environ["HOME"] = tempfile.mkdtemp(prefix="cl-bench-home-")


def _tame_avalanche_deprecations() -> None:
    # Avalanche's @deprecated calls warnings.simplefilter("once") on every call, which
    # overrides any filter we install; give that module a warnings shim without it.
    import avalanche._annotations as annotations

    annotations.warnings = types.SimpleNamespace(
        simplefilter=lambda *a, **k: None, warn=warnings.warn, catch_warnings=warnings.catch_warnings)


silence_known_warnings()
install_deferral()
_ensure_avalanche_home()
_tame_avalanche_deprecations()
