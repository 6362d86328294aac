"""Start-up: the heavy modules harness.compat defers or splits off stay unloaded by a run's imports
(and by `cl-bench check`), load on use, and a split package ends up exactly as it is unsplit."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import compat

pytestmark = pytest.mark.long  # make test-long: process lifecycle, minutes (Makefile)

# What a run imports: the CLI's command path, the engine, every built-in method, and the Avalanche
# strategies they build.
RUN_IMPORTS = """
import harness.cli.commands, harness.execution.check, harness.execution.sweep
import harness.run.engine
from harness.api.registry import get_registry
registry = get_registry()
from avalanche.training.supervised import Naive, GEM
from avalanche.training.plugins import AGEMPlugin, ReplayPlugin
"""
HEAVY = ["wandb", "qpsolvers", "jax",
         # split off avalanche.evaluation.metrics (topk_acc) and avalanche.benchmarks (classic)
         "torchmetrics", "transformers", "avalanche.benchmarks.classic", "gdown"]

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


# Whether a module of each name in HEAVY, or under it, has run its body (a deferred one has not).
LOADED = f"""
import json, sys, types
def _loaded(name):
    return any(type(m) is types.ModuleType and (k == name or k.startswith(name + "."))
               for k, m in list(sys.modules.items()))
print(json.dumps({{name: _loaded(name) for name in {HEAVY!r}}}))
"""


def _loaded_after_run_imports(**env) -> dict:
    return json.loads(_python(RUN_IMPORTS + LOADED, **env).splitlines()[-1])


def test_heavy_modules_stay_unloaded_after_a_runs_imports():
    loaded = _loaded_after_run_imports()
    assert not any(loaded.values()), f"heavy modules came back: {[m for m, v in loaded.items() if v]}"


NOT_IMPORTED = """
import sys
print(sorted(m for m in ("sklearn", "scipy") if m in sys.modules))
"""


def test_a_runs_imports_leave_scikit_learn_and_scipy_out():
    # the learning checks' probe is NumPy (checks version 2); the logistic probe of version 1 imported both
    assert _python(RUN_IMPORTS + NOT_IMPORTED).strip().splitlines()[-1] == "[]"


def test_digits_from_the_cache_imports_neither(tmp_path):
    load = "from harness.run.datasets import load_dataset, fingerprint\nprint(fingerprint(load_dataset('digits')))\n"
    built = _python(load, CL_BENCH_CACHE=str(tmp_path)).strip().splitlines()[-1]
    assert list(tmp_path.glob("digits-*.npz"))
    lines = _python(load + NOT_IMPORTED, CL_BENCH_CACHE=str(tmp_path)).strip().splitlines()
    assert lines[-2] == built and lines[-1] == "[]"  # the same arrays as built


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


@pytest.mark.slow
def test_cl_bench_check_does_not_load_the_heavy_modules():
    # the real command, in one process: a method's check builds, trains and evaluates
    code = f"""
import runpy, sys
sys.argv = ["cl-bench", "check", {str(Path(__file__).resolve().parents[1] / "submissions" / "l2_anchor.py")!r}]
try:
    runpy.run_module("harness.cli", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
""" + LOADED
    loaded = json.loads(_python(code).splitlines()[-1])
    assert not any(loaded.values()), f"heavy modules came back: {[m for m, v in loaded.items() if v]}"


# Every name of a split package, described (modules by name, classes and functions by qualified name).
SNAPSHOT = """
import json, sys, types
from harness import compat
import harness.run.engine
from harness.api.registry import get_registry
get_registry()
import avalanche.training, avalanche.models, avalanche.logging

def describe(v):
    if isinstance(v, types.ModuleType):
        return "module " + v.__name__
    qualname, module = getattr(v, "__qualname__", None), getattr(v, "__module__", None)
    if isinstance(qualname, str) and isinstance(module, str):
        return f"{type(v).__name__} {module}.{qualname}"
    return repr(v) if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__

def names(pkg):
    return {k: v for k, v in vars(sys.modules[pkg]).items() if k not in ("__builtins__", "_cl_bench_split")}

before = {pkg: names(pkg) for pkg in compat.SPLIT}
split = {pkg: type(sys.modules[pkg]).__name__ == "_SplitModule" for pkg in compat.SPLIT}
for pkg in compat.SPLIT:
    getattr(sys.modules[pkg], "__all__", None)  # a name none of them has: runs the split part
after = {pkg: names(pkg) for pkg in compat.SPLIT}
changed = {pkg: sorted(k for k, v in before[pkg].items() if after[pkg].get(k) is not v) for pkg in compat.SPLIT}
print(json.dumps({"split": split, "changed": changed,
                  "after": {pkg: {k: describe(v) for k, v in after[pkg].items()} for pkg in compat.SPLIT}}))
"""


def test_a_split_package_ends_up_exactly_as_unsplit():
    split = json.loads(_python(SNAPSHOT).splitlines()[-1])
    whole = json.loads(_python(SNAPSHOT, CL_BENCH_FULL_IMPORTS="1").splitlines()[-1])
    assert all(split["split"].values()) and not any(whole["split"].values())  # the probe can tell
    # nothing bound before the split part ran is rebound by it
    assert not any(split["changed"].values()), split["changed"]
    # and then every name is the same object as without the split
    for pkg in compat.SPLIT:
        a, b = split["after"][pkg], whole["after"][pkg]
        assert a.keys() == b.keys(), (pkg, sorted(a.keys() ^ b.keys()))
        assert a == b, (pkg, {k: (a[k], b[k]) for k in a if a[k] != b[k]})


def test_split_statements_are_found_in_the_installed_packages():
    # each SPLIT entry matches the installed Avalanche (else the package would silently run whole)
    import ast
    import importlib.util

    for pkg, names in compat.SPLIT.items():
        spec = importlib.util.find_spec(pkg)
        tree = ast.parse(spec.loader.get_source(pkg))
        assert compat._split_body(tree, names) is not None, pkg


def test_a_split_package_binds_its_split_names_on_first_use():
    code = """
import harness.compat, sys, types
import avalanche.training  # the stack a run imports
metrics = sys.modules["avalanche.evaluation.metrics"]
assert type(metrics).__name__ == "_SplitModule" and "torchmetrics" not in sys.modules
from avalanche.evaluation.metrics import TopkAccuracy, accuracy_metrics
assert type(metrics) is types.ModuleType and "torchmetrics" in sys.modules
from avalanche.evaluation.metrics import topk_acc
assert TopkAccuracy is topk_acc.TopkAccuracy
import avalanche.benchmarks as b
from avalanche.benchmarks.classic import SplitMNIST
assert b.SplitMNIST is SplitMNIST and type(b) is types.ModuleType
print("ok")
"""
    assert _python(code).strip().endswith("ok")


@pytest.mark.slow
def test_a_runs_record_is_the_same_with_and_without_the_split(tmp_path):
    # 4 naive runs of depth-sweep-mini (digits, order 0, every regime), each way, in fresh processes

    def records(name: str, **env) -> dict:
        results = tmp_path / name
        code = f"""
import sys
from harness.cli import main
sys.exit(main(["run", "--protocol", "depth-sweep-mini", "--datasets", "digits", "--methods", "naive",
               "--orders", "1", "--jobs", "1", "--no-mlflow", "--no-leaderboard", "--no-progress",
               "--results", {str(results)!r}]))
"""
        _python(code, **env)
        out = {}
        for path in sorted(results.rglob("runs/*.json")):
            record = json.loads(path.read_text())
            record.pop("timings"), record.pop("provenance")
            out[path.name] = record
        return out

    split, whole = records("split"), records("whole", CL_BENCH_FULL_IMPORTS="1")
    assert len(split) == 4 and split == whole


def test_the_cli_leaves_the_last_collection_to_the_os_once(tmp_path):
    marker = tmp_path / "ran"
    code = f"""
import atexit, gc, pathlib
atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text(str(gc.get_freeze_count() > 0)))
from harness import cli
assert cli.main(["list", "protocols"]) == 0 and cli.main(["list", "protocols"]) == 0
assert len(cli._FREEZE_AT_EXIT) == 1
"""
    _python(code)
    # exit handlers registered before the command's still run, after the freeze
    assert marker.read_text() == "True"
