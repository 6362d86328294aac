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
  `CL_BENCH_FULL_IMPORTS=1` switches the deferral off.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import tempfile
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
# star-import every submodule, which touches every name.


class _DeferredModule(types.ModuleType):
    """A module whose body runs on the first access to an attribute it does not have yet."""

    def __getattr__(self, name: str):
        _load(self)
        return getattr(self, name)


def _load(module: types.ModuleType) -> None:
    loader = module.__spec__.loader.real
    module.__class__ = types.ModuleType  # from now on an ordinary module
    module.__spec__.loader = module.__loader__ = loader
    loader.exec_module(module)


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


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Defers the modules in DEFERRED; runs a deferred package's body before any submodule's."""

    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path, target=None):
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if isinstance(parent, _DeferredModule):
            _load(parent)  # a submodule may rely on its package's body, as without deferral
            if fullname in sys.modules:  # the package's body imported it
                module = sys.modules[fullname]
                return importlib.util.spec_from_loader(fullname, _LoadedLoader(module))
            return None
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
    """Defer the heavy modules in DEFERRED (once; not when CL_BENCH_FULL_IMPORTS=1)."""
    if os.environ.get("CL_BENCH_FULL_IMPORTS", "") in ("", "0") and not any(
            isinstance(f, _DeferringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder(DEFERRED))


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
