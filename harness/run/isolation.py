"""A run cannot reach past itself: what a method may change process-wide is captured before the run
and put back after it (harness.run.engine calls both around every run, in every executor).

- settings (`SETTINGS`): default dtype and device, current CUDA device, grad and anomaly modes,
  threads, deterministic algorithms, cuDNN/TF32 flags, working directory, environment, import path,
  signal handlers;
- code (`CODE_MODULES`): the functions and classes of torch's namespaces, its nn modules, optimizers
  and Tensor, Avalanche's training classes, the seeding functions and the harness's own modules. A
  change to the harness's code fails the run (it could change how the run is measured); any other is
  put back, so that a method patching `nn.ReLU.forward` patches its own run only;
- what cannot be put back (inference mode left on, a torch mode left pushed, a different interop
  thread count, a working directory that cannot be re-entered) marks the process dirty: the run's
  record fails and the executors give the runs after it a fresh worker (`process_dirty`).

The global random generators need no restoring: every run seeds them first (engine.seed_everything).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

HARNESS = "harness"
# Modules (and every module under them already imported) whose functions and classes runs share.
CODE_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.modules", "torch.optim",
                "torch.autograd", "torch.linalg", "torch.fft", "torch.special", "avalanche.training",
                "avalanche.core", "avalanche.models", "random", "numpy.random", HARNESS)
# ... of which only these are walked into their submodules (the rest: the module itself).
WALKED = ("torch.nn.modules", "torch.optim", "avalanche.training", "avalanche.models", HARNESS)
CODE_CLASSES = (torch.Tensor, torch._C.TensorBase, torch.nn.Parameter)
_MISSING = object()
_DIRTY: list[str] = []  # why this process cannot host another run ([] while it can)


@dataclass(frozen=True)
class Setting:
    """One process-wide setting: how to read it and how to set it back."""

    name: str
    get: Callable[[], object]
    set: Callable[[object], None]


def _default_device():
    # torch keeps `set_default_device` in a module global (no public getter tells "none set" from "cpu")
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def _set_default_device(context) -> None:
    torch.set_default_device(None if context is None else context.device)


def _set_environ(saved: dict) -> None:
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)


def _signal_handlers():
    if threading.current_thread() is not threading.main_thread():
        return None  # handlers belong to the main thread; a run elsewhere cannot set them either
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _set_signal_handlers(saved) -> None:
    for sig, handler in (saved or {}).items():
        signal.signal(sig, handler)


def _cuda_device():
    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


def _set_cuda_device(index) -> None:
    if index is not None:
        torch.cuda.set_device(index)


SETTINGS = (
    # the default device first: leaving it pushes a torch function mode the mode check below counts
    Setting("default device (torch.set_default_device)", _default_device, _set_default_device),
    Setting("current CUDA device (torch.cuda.set_device)", _cuda_device, _set_cuda_device),
    Setting("default dtype (torch.set_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
    Setting("grad mode (torch.set_grad_enabled)", torch.is_grad_enabled, torch.set_grad_enabled),
    Setting("anomaly detection", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.set_anomaly_enabled(*v)),
    Setting("threads (torch.set_num_threads)", torch.get_num_threads, torch.set_num_threads),
    Setting("deterministic algorithms",
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    Setting("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    Setting("cuDNN flags", lambda: tuple(getattr(torch.backends.cudnn, k) for k in
                                         ("enabled", "benchmark", "deterministic", "allow_tf32")),
            lambda v: [setattr(torch.backends.cudnn, k, x) for k, x in
                       zip(("enabled", "benchmark", "deterministic", "allow_tf32"), v)]),
    Setting("TF32 matmul flag", lambda: torch.backends.cuda.matmul.allow_tf32,
            lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    Setting("working directory (os.chdir)", os.getcwd, os.chdir),
    Setting("environment variables", lambda: dict(os.environ), _set_environ),
    Setting("import path (sys.path)", lambda: list(sys.path), lambda v: sys.path.__setitem__(slice(None), v)),
    Setting("signal handlers", _signal_handlers, _set_signal_handlers),
)
# What no setter can put back: a leftover guard or mode object the method still holds.
FIXED = (
    ("inference mode", torch.is_inference_mode_enabled),
    ("torch function modes", torch._C._len_torch_function_stack),
    ("torch dispatch modes", torch._C._len_torch_dispatch_stack),
    ("interop threads", torch.get_num_interop_threads),
)


@dataclass(frozen=True)
class Snapshot:
    """The process state before a run: settings, fixed state, and the attribute dicts of shared code."""

    settings: tuple
    fixed: tuple
    code: tuple  # (qualified name, module or class, is a module, dict copy)


@dataclass(frozen=True)
class Leaks:
    """What a run left changed (all of it put back where possible)."""

    restored: tuple[str, ...] = ()
    harness_code: tuple[str, ...] = ()  # the harness's own functions or classes, replaced or removed
    unrestorable: tuple[str, ...] = ()

    def failure(self) -> str | None:
        """The failed record's message, if the run may not keep its record; None if it may."""
        if self.harness_code:
            return (f"the method changed the harness's own code ({_listed(self.harness_code)}); a method may not "
                    "change how it is measured (put back for later runs)")
        if self.unrestorable:
            return (f"the method left process state that cannot be put back ({_listed(self.unrestorable)}); "
                    "later runs get a fresh worker process")
        return None


def _listed(names) -> str:
    names = sorted(names)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def capture() -> Snapshot:
    """The process state now (before a run)."""
    return Snapshot(settings=tuple(s.get() for s in SETTINGS), fixed=tuple(get() for _, get in FIXED),
                    code=tuple((name, owner, is_module, dict(vars(owner)))
                               for name, owner, is_module in _code(len(sys.modules))))


def restore(snapshot: Snapshot) -> Leaks:
    """Put back what changed since `snapshot`; say what was, and what could not be (the process is then dirty)."""
    restored, unrestorable = [], []
    for setting, saved in zip(SETTINGS, snapshot.settings):
        try:
            if _differs(setting.get(), saved):
                restored.append(setting.name)
                setting.set(saved)
        except Exception as exc:  # e.g. a working directory that was deleted
            unrestorable.append(f"{setting.name}: {type(exc).__name__}: {exc}")
    unrestorable += [name for (name, get), saved in zip(FIXED, snapshot.fixed) if get() != saved]
    patched = []
    for name, owner, is_module, saved in snapshot.code:
        for key in _changed(owner, is_module, saved):
            patched.append(f"{name}.{key}")
            try:
                _put_back(owner, key, saved.get(key, _MISSING))
            except (AttributeError, TypeError) as exc:
                unrestorable.append(f"{name}.{key}: {exc}")
    if unrestorable:
        _DIRTY.extend(unrestorable)
    harness = tuple(p for p in patched if p == HARNESS or p.startswith(HARNESS + "."))
    return Leaks(tuple(restored) + tuple(p for p in patched if p not in harness), harness, tuple(unrestorable))


def process_dirty() -> str | None:
    """Why this process may not host another run (a run left state that could not be put back), else None."""
    return _listed(_DIRTY) if _DIRTY else None


def _differs(now, saved) -> bool:
    return now is not saved and now != saved


@lru_cache(maxsize=1)
def _code(n_modules: int) -> tuple:
    """(qualified name, owner, is a module) of every module and class in scope (once per set of loaded
    modules: walking them all costs more than the rest of a snapshot)."""
    walked = tuple(root + "." for root in WALKED)
    modules = [(name, module) for name, module in list(sys.modules.items())
               if isinstance(module, types.ModuleType) and (name in CODE_MODULES or name.startswith(walked))]
    owners, seen = [], set()
    for name, module in modules:
        owners.append((name, module, True))
        for key, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name and id(value) not in seen:
                seen.add(id(value))
                owners.append((f"{name}.{key}", value, False))
    owners += [(f"{c.__module__}.{c.__qualname__}", c, False) for c in CODE_CLASSES if id(c) not in seen]
    return tuple(owners)


def _is_code(value) -> bool:
    """Functions, methods, descriptors, classes: what a patch replaces (not counters, caches or annotations)."""
    return callable(value) or isinstance(value, (staticmethod, classmethod, property, types.MemberDescriptorType,
                                                 types.GetSetDescriptorType))


def _changed(owner, is_module: bool, saved: dict) -> list[str]:
    """Names of code `owner` holds now that it did not (a class), or holds otherwise than in `saved`."""
    now = vars(owner)
    changed = [k for k, v in saved.items() if now.get(k, _MISSING) is not v and _is_code(v)]
    if not is_module and len(now) != len(saved):  # a module gains names by lazy imports; a class by patches
        changed += [k for k in now.keys() - saved.keys() if _is_code(now[k])]
    return changed


def _put_back(owner, key: str, value) -> None:
    if value is _MISSING:
        delattr(owner, key)
    else:
        setattr(owner, key, value)
