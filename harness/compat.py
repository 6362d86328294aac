"""Quirks of the stack, handled once: import this before torch-side libraries.

- MLflow telemetry and Ray usage stats are switched off (nothing may call out).
- `import avalanche` writes ~/.avalanche/config.json; when HOME is not writable we point
  Avalanche at a private temporary HOME instead of crashing.
- Known, harmless warnings of the stack are silenced by the start of their exact message (and
  their category), so that `-W error` runs (and users' logs) only show warnings that matter.
  SI's NumPy `__array_wrap__` DeprecationWarning becomes a TypeError under `-W error`: silenced here.
"""
from __future__ import annotations

import os
import tempfile
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
    import types

    import avalanche._annotations as annotations

    annotations.warnings = types.SimpleNamespace(
        simplefilter=lambda *a, **k: None, warn=warnings.warn, catch_warnings=warnings.catch_warnings)


silence_known_warnings()
_ensure_avalanche_home()
_tame_avalanche_deprecations()
