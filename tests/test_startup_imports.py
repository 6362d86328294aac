"""Start-up: the heavy modules harness.compat defers stay unloaded by a run's imports, and load on use."""
import json
import os
import subprocess
import sys

import pytest

from harness import compat

# What a run imports: the engine, every built-in method, and the Avalanche strategies they build.
RUN_IMPORTS = """
import harness.run.engine
from harness.api.registry import get_registry
registry = get_registry()
from avalanche.training.supervised import Naive, GEM
from avalanche.training.plugins import AGEMPlugin, ReplayPlugin
"""
HEAVY = ["wandb", "qpsolvers", "jax"]

# Anything a user's method file may import from Avalanche must still import, and work, after the harness.
AVALANCHE_PUBLIC = """
import harness.run.engine
import avalanche.training, avalanche.training.supervised, avalanche.training.plugins
import avalanche.training.templates, avalanche.training.storage_policy, avalanche.training.regularization
import avalanche.models, avalanche.models.dynamic_modules, avalanche.core
import avalanche.evaluation.metrics, avalanche.logging, avalanche.benchmarks, avalanche.benchmarks.classic
import avalanche.benchmarks.utils, avalanche.benchmarks.scenarios, avalanche.evaluation.metrics.confusion_matrix
from avalanche.training import GEM, EWC, LwF, Naive, Replay, SynapticIntelligence
from avalanche.training.plugins import GEMPlugin, MASPlugin, EWCPlugin, LwFPlugin, EvaluationPlugin
from avalanche.models import SimpleMLP, MultiHeadClassifier, IncrementalClassifier
import numpy as np, qpsolvers, wandb, torchvision.models, torchvision.ops
# the deferred modules are whole once used: GEM's solver, wandb's API, torchvision's models and ops
x = qpsolvers.solve_qp(np.eye(2), np.array([-1.0, -1.0]), solver="quadprog")
assert abs(x[0] - 1.0) < 1e-9, x
assert callable(wandb.init) and callable(torchvision.models.resnet18) and callable(torchvision.ops.nms)
from avalanche.evaluation.metrics import confusion_matrix
assert confusion_matrix.wandb is wandb and wandb.__spec__.loader is not None
print("ok")
"""


def _python(code: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if k != "CL_BENCH_FULL_IMPORTS"} | env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _loaded_after_run_imports(**env) -> dict:
    probe = RUN_IMPORTS + f"""
import json, sys, types
print(json.dumps({{m: type(sys.modules.get(m)) is types.ModuleType for m in {HEAVY!r}}}))
"""
    return json.loads(_python(probe, **env).splitlines()[-1])


def test_heavy_modules_stay_unloaded_after_a_runs_imports():
    loaded = _loaded_after_run_imports()
    assert not any(loaded.values()), f"heavy modules came back: {[m for m, v in loaded.items() if v]}"


def test_switching_the_deferral_off_loads_them_all():
    # the same probe sees them when nothing is deferred: it can tell
    assert all(_loaded_after_run_imports(CL_BENCH_FULL_IMPORTS="1").values())


def test_avalanche_public_modules_import_and_work_after_the_harness():
    assert _python(AVALANCHE_PUBLIC).strip().endswith("ok")


def test_deferred_names_are_modules_compat_may_defer():
    assert set(compat.DEFERRED) >= {"wandb", "qpsolvers"}
    assert not any(name.startswith(("avalanche", "torch.", "harness")) for name in compat.DEFERRED)


@pytest.mark.parametrize("name", ["wandb", "qpsolvers"])
def test_a_deferred_module_loads_once_on_first_use(name):
    code = f"""
import harness.compat, sys, types, importlib
import {name} as m
assert type(m) is not types.ModuleType, "not deferred"
m.__spec__, m.__name__, m.__path__  # metadata does not load it
assert type(m) is not types.ModuleType
m.__version__
assert type(m) is types.ModuleType and sys.modules['{name}'] is m and importlib.import_module('{name}') is m
print("ok")
"""
    assert _python(code).strip().endswith("ok")
