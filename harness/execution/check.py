"""The adapter contract (`cl-bench check`): one method file, a tiny synthetic stream, findings.

Every run goes through the engine's own `run_one`, so the checks the engine makes on every
real run (a strategy is returned, the harness plugins fire, frozen parameters and buffers
stay bitwise unchanged) are the ones checked here. On top of them the contract looks at the
model through the engine's task observer (trainable parameters move) and runs everything
twice (same seed → same accuracy matrix and bitwise the same final parameters).

The stream: 2 tasks x 2 classes of Gaussian blobs shaped as 1x8x8 images, written once per
process to a temporary `npz:` file (the harness's own user-data route, no dataset hook),
learned by `small-cnn` (its BatchNorm buffers make the frozen-buffer check real) for one
epoch, under the most frozen (`head`) and the least frozen (`full`) regime. A method that refuses one of
them (its `regime_families`, its `regimes_allowed`) is checked under the nearest regime it admits instead
(`contract_runs`: the candidates of SUBSTITUTES in order, the same family's first), on `vit-tiny` where that
regime selects nothing on small-cnn (a prompt regime needs transformer blocks; the blobs fit vit-tiny).
An adapter's `check_hparams` replace defaults that fit a paper-scale model only (ViT-B/16's prompt layers 0-4
are beyond vit-tiny's 3 blocks); the "loads" line prints them.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.vocabulary import FULL, HEAD, Scenario, Status

CONTRACT_REGIMES = (HEAD, FULL)
CONTRACT_MODEL, TOKEN_MODEL = "small-cnn", "vit-tiny"
# For a contract regime a method refuses: the regimes to check it under instead, nearest first (the same family's
# nearest depth, then the other families from the fewest trained parameters for `head`, the most for `full`).
SUBSTITUTES = {
    HEAD: ("last-1", "prompt-l4", "prompt-deep-l4", "bitfit", "norm", "lora-r2"),
    FULL: ("last-1", "lora-r2", "norm", "bitfit", "prompt-deep-l4", "prompt-l4"),
}
N_TASKS, CLASSES_PER_TASK = 2, 2
README = "submissions/README.md"


@dataclass(frozen=True)
class Finding:
    """One broken rule: what is wrong, how to fix it, and where it showed up."""

    check: str
    problem: str
    fix: str
    where: str = ""
    detail: str = ""

    def format(self) -> str:
        """Multi-line text for the terminal."""
        head = f"✗ {self.check}" + (f" [{self.where}]" if self.where else "") + f": {self.problem}"
        lines = [head, f"    fix: {self.fix}"]
        lines += [f"    | {line}" for line in self.detail.splitlines()]
        return "\n".join(lines)


@dataclass(frozen=True)
class CheckResult:
    """Findings (empty when the contract holds) and the list of checks that passed."""

    target: str
    methods: tuple = ()
    findings: tuple = ()
    passed: tuple = ()
    contract: str = "adapter"  # or "plug-in" (harness/execution/plugin_check.py)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.findings

    def verdict(self) -> str:
        """The closing line: the contract holds (checks passed) or is broken (problems found)."""
        if self.ok:
            return f"{self.target}: the {self.contract} contract holds ({len(self.passed)} checks passed)"
        return f"{self.target}: the {self.contract} contract is broken ({len(self.findings)} problem(s)); see {README}"


# How to fix each rule of the contract the engine enforces (run.engine.Breach, by its value).
BREACH_FIXES = {
    "strategy": "build() must return the strategy object, e.g. `return Naive(**ctx.strategy_kwargs())` "
                "(any avalanche SupervisedTemplate subclass)",
    "plugins": "pass the harness's plugins into the strategy: `Naive(**ctx.strategy_kwargs(*my_plugins))` "
               "or `plugins=[*ctx.plugins, *my_plugins]`",
    "frozen": "leave frozen blocks alone: never call requires_grad_(True) or .train() on them (model.train() "
              "is safe), optimise only parameters with requires_grad (ctx.optimizer / ctx.new_optimizer()), "
              "never write into frozen tensors in place",
    "test-data": "never write to the test tensors: ctx.tasks holds the method's own copies, and what the harness "
                 "evaluates on must stay as it was planned",
    "process-state": "leave process-wide state as you found it: no patches of the harness's code, and restore "
                     "what you change (use context managers such as torch.inference_mode() and `with` blocks)",
}
LOAD_FIXES = (
    ("syntax error", "fix the syntax error at that line (`python -m py_compile FILE` shows it)"),
    ("already defined by", "choose a NAME no other method uses (`cl-bench list methods` shows the taken ones)"),
    ("import failed", "make the module importable on its own: module-level code must not fail; "
                      "import optional or heavy packages inside build()"),
    ("no such method file", "give the path of an existing .py file"),
    ("not a Python file", "give the path of a .py file"),
    ("allowed: a regular .py", "give the path of a regular .py file (not a folder, FIFO or device)"),
)


def check(target: str, regimes=CONTRACT_REGIMES, device: str = "cpu") -> CheckResult:
    """Run the adapter contract on a method file (or a registered method name); a plug-in file's
    backbones, data sets and regime families are checked by plugin_check."""
    from ..api.registry import RegistryError
    from .plugin_check import check_plugin_file, declares

    plugins, methods = declares(target)
    if plugins:
        found = check_plugin_file(target)
        if not (found.ok and methods):
            return CheckResult(target, (), tuple(Finding(f.check, f.problem, f.fix) for f in found.findings),
                               found.passed, contract="plug-in")
    try:
        adapters, method_files = _resolve(target)
    except RegistryError as exc:
        return CheckResult(target, findings=(_load_finding(str(exc)),))
    findings = []
    passed = [*(found.passed if plugins else ()), f"✓ loads: {', '.join(_describe(a) for a in adapters)}"]
    for adapter in adapters:
        f, p = check_adapter(adapter, method_files, regimes, device, label=len(adapters) > 1)
        findings += f
        passed += p
    return CheckResult(target, tuple(a.name for a in adapters), tuple(findings), tuple(passed))


def _resolve(target: str):
    """(adapters to check, method files the engine must register) for a file or a name."""
    from ..api.registry import RegistryError, adapters_from_module, get_registry, load_module_file

    path = Path(target)
    if path.suffix == ".py" or path.exists():
        adapters = adapters_from_module(load_module_file(path), str(path))
        get_registry((str(path),))  # name collisions with everything else fail here
        return adapters, (str(path),)
    registry = get_registry()
    if target not in registry:
        raise RegistryError(f"{target}: no such method file, and no registered method of that name")
    return [registry[target]], ()


def _describe(adapter) -> str:
    checked = f", checked with CHECK_HPARAMS={dict(adapter.check_hparams)!r}" if adapter.check_hparams else ""
    return f"NAME={adapter.name!r}, DEFAULTS={adapter.defaults!r}{checked} ({adapter.source})"


def _load_finding(message: str) -> Finding:
    fix = next((f for key, f in LOAD_FIXES if key in message),
               f"an adapter module defines NAME (str), DEFAULTS (dict) and build(ctx, **hparams); see {README}")
    if "missing" in message:
        fix = f"define the missing attribute(s) at module level; see {README}"
    return Finding("load", message, fix)


def check_adapter(adapter, method_files=(), regimes=CONTRACT_REGIMES, device: str = "cpu",
                  label: bool = False) -> tuple[list, list]:
    """(findings, passed) for one registered adapter under each contract regime."""
    findings, passed = [], []
    for regime, model in contract_runs(adapter, regimes):
        shown = regime if model == CONTRACT_MODEL else f"{regime} on {model}"
        where = f"{adapter.name}, {shown}" if label else shown
        scenarios = tuple(getattr(adapter, "scenarios", Scenario))  # task-IL where the method is defined in it
        spec = contract_spec(adapter.name, {**adapter.defaults, **adapter.check_hparams}, regime,
                             scenario=Scenario.TASK_IL if Scenario.TASK_IL in scenarios else scenarios[0],
                             model=model)
        first, probe = _run(spec, method_files, device)
        if first.status != Status.OK:
            findings.append(failure_finding(first, where, method_files, probe.error))
            break  # later regimes would repeat the same failure
        f, p = _inspect(first, probe, spec, where, method_files, device)
        findings += f
        passed += p
    return findings, passed


def admits(adapter, regime: str) -> bool:
    """The adapter runs under `regime`: its family is declared (`regime_families`) and `regimes_allowed`, where
    the adapter has one, gives no reason against it."""
    from ..config.vocabulary import regime_family, runs_under_family

    if not runs_under_family(regime_family(regime), tuple(getattr(adapter, "regime_families", ()) or ())):
        return False
    allowed = getattr(adapter, "regimes_allowed", None)
    try:
        return allowed is None or allowed(regime) is None
    except Exception:  # noqa: BLE001  (one that raises admits it: the run shows the rest; a protocol naming
        return True    # the method reports the declaration's error in one line)


def contract_runs(adapter, regimes=CONTRACT_REGIMES) -> tuple:
    """((regime, model), ...) the adapter is checked under: each contract regime it admits on small-cnn, and for
    one it refuses the first candidate of SUBSTITUTES it admits (none: that regime is skipped), each once. A
    method admitting none of them is checked under the contract regimes (its build() refuses: the finding)."""
    runs = []
    for regime in regimes:
        chosen = regime if admits(adapter, regime) else \
            next((r for r in SUBSTITUTES.get(regime, ()) if admits(adapter, r)), None)
        if chosen is not None and (chosen, regime_model(chosen)) not in runs:
            runs.append((chosen, regime_model(chosen)))
    return tuple(runs) or tuple((r, CONTRACT_MODEL) for r in regimes)


def regime_model(regime: str) -> str:
    """small-cnn where the regime selects parameters of it, else vit-tiny (prompt regimes need token blocks)."""
    from ..run.models import build_model
    from ..run.regimes import inject_adapters, selected_parameters

    if regime not in _MODEL_OF:
        model = build_model(CONTRACT_MODEL, (1, 8, 8), n_heads=N_TASKS, head_classes=CLASSES_PER_TASK)
        try:
            selected_parameters(inject_adapters(model, regime), regime)
            _MODEL_OF[regime] = CONTRACT_MODEL
        except ValueError:  # RegimeError: it selects nothing there
            _MODEL_OF[regime] = TOKEN_MODEL
    return _MODEL_OF[regime]


_MODEL_OF: dict = {}


def _run(spec, method_files, device):
    from ..run.engine import run_one
    from .interrupts import signals_interrupt

    probe = Probe()
    with signals_interrupt():  # Ctrl-C stops the check, never turns into a finding about the method
        record = run_one(spec, device=device, method_files=tuple(method_files), observer=probe)
    return record, probe


def _inspect(record, probe, spec, where, method_files, device) -> tuple[list, list]:
    findings, passed = [], []
    passed.append(f"✓ [{where}] build returned {probe.strategy_type}; {N_TASKS} tasks trained; "
                  "harness plugins fired")
    passed.append(f"✓ [{where}] frozen parameters and buffers bitwise unchanged ({probe.frozen_count} "
                  "frozen tensors)")
    shape = (len(record.acc_matrix), {len(row) for row in record.acc_matrix})
    if shape != (N_TASKS, {N_TASKS}):
        findings.append(Finding("matrix", f"the accuracy matrix is not {N_TASKS}x{N_TASKS}: {record.acc_matrix}",
                                "the harness evaluates every task after every task; do not alter strategy.train's "
                                "return or skip experiences", where))
    else:
        passed.append(f"✓ [{where}] accuracy matrix is {N_TASKS}x{N_TASKS}")
    # A task the record says took no optimizer step (a closed-form classifier on frozen features, as SimpleCIL's
    # after task 1) changes nothing by design; a task that stepped and changed nothing is the broken wiring.
    steps = (record.budget or {}).get("steps_per_task") or [None] * len(probe.changed)
    still = [t + 1 for t, changed in enumerate(probe.changed) if not changed and steps[t] != 0]
    closed_form = [t + 1 for t, changed in enumerate(probe.changed) if not changed and steps[t] == 0]
    if still:
        findings.append(Finding("trainable", f"training task(s) {still} changed none of the trainable parameters",
                                "the strategy must step the optimizer over the trainable parameters: use "
                                "ctx.optimizer (or ctx.new_optimizer()), keep lr > 0, do not detach the loss",
                                where))
    elif closed_form:
        passed.append(f"✓ [{where}] trainable parameters changed in every task that took optimizer steps "
                      f"(task(s) {closed_form} took none, as the record's budget says)")
    else:
        passed.append(f"✓ [{where}] trainable parameters changed in every task")
    second, probe2 = _run(spec, method_files, device)
    problem = determinism_problem(record, probe, second, probe2)
    if problem:
        findings.append(Finding("determinism", f"two runs with seed {spec.seed} differ: {problem}",
                                "draw randomness only from the global torch/numpy/random generators (the harness "
                                "seeds them) or from generators seeded with ctx.seed; never random.Random() without "
                                "a seed, os.urandom, time-based seeds or set/dict-of-id orderings", where))
    else:
        passed.append(f"✓ [{where}] same seed, same accuracy matrix and bitwise-equal final parameters")
    return findings, passed


class Probe:
    """Engine observer: which trainable tensors each task moved; the final model state; the
    exception a failed run raised."""

    def __init__(self):
        self.before: dict = {}
        self.changed: list = []
        self.final: dict = {}
        self.strategy_type = "?"
        self.frozen_count = 0
        self.error: Exception | None = None

    def __call__(self, event: str, t: int, strategy) -> None:
        import torch

        from ..run.regimes import frozen_state

        if event == "raised":  # the engine hands over the exception in the strategy's place
            self.error = strategy
            return
        model = strategy.model
        if event == "before_task":
            self.strategy_type = type(strategy).__name__
            self.frozen_count = max(self.frozen_count, len(frozen_state(model)))
            self.before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            return
        current = dict(model.named_parameters())
        self.changed.append([n for n, v in self.before.items()
                             if n in current and not torch.equal(current[n].detach(), v)])
        self.final = {k: v.detach().clone() for k, v in model.state_dict().items()}


def determinism_problem(first, probe1, second, probe2) -> str:
    """'' when both runs agree exactly, else what differs."""
    import torch

    if second.status != Status.OK:
        return f"the second run failed ({second.error})"
    if first.acc_matrix != second.acc_matrix:
        return f"accuracy matrices {first.acc_matrix} vs {second.acc_matrix}"
    keys = sorted(set(probe1.final) | set(probe2.final))
    differ = [k for k in keys if k not in probe1.final or k not in probe2.final
              or not torch.equal(probe1.final[k], probe2.final[k])]
    if differ:
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        return f"final parameters/buffers {', '.join(differ[:3])}{more}"
    return ""


def failure_finding(record, where: str, method_files=(), raised: Exception | None = None) -> Finding:
    """The finding for a run that did not finish with status ok (`raised`: its exception, when known)."""
    error = record.error or record.status
    trace = (record.diagnostics or {}).get("traceback", "")
    if record.status == Status.DIVERGED:
        return Finding("diverged", error, "the loss became NaN/inf on a tiny, easy stream: check the terms "
                       "your method adds to the loss (scale, divisions by zero, log of 0)", where)
    breach = getattr(raised, "breach", None)  # a rule of the contract the engine enforces
    if breach is not None:
        return Finding(str(breach), str(raised), BREACH_FIXES[breach], where)
    at = _location(trace, method_files)
    if not record.init_acc:  # nothing was evaluated: the failure came before training
        return Finding("build", f"build() raised {error}{at}",
                       "build(ctx, **hparams) must construct and return the strategy without errors "
                       "(it is called with DEFAULTS merged with the protocol's hparams)", where, _tail(trace))
    return Finding("training", f"training raised {error}{at}",
                   "the strategy must train on the harness's experiences without errors; see the traceback",
                   where, _tail(trace))


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def _location(trace: str, method_files=()) -> str:
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return ""
    wanted = {str(Path(f).resolve()) for f in method_files}
    own = [m for m in frames if str(Path(m["file"]).resolve()) in wanted]
    m = (own or frames)[-1]
    return f" at {m['file']}:{m['line']} (in {m['func']})"


def _tail(trace: str, lines: int = 6) -> str:
    return "\n".join(trace.strip().splitlines()[-lines:])


def contract_spec(method: str, hparams: dict, regime: str, seed: int = 0, epochs: int = 2,
                  scenario: Scenario = Scenario.TASK_IL, model: str = CONTRACT_MODEL):
    """The RunSpec of one contract run: synthetic 2x2 stream, small-cnn (or `model`), 2 epochs (a method that
    trains in stages, as BECAME, splits them)."""
    from ..config.pretrain import Pretrain, PretrainKind
    from ..config.specs import DatasetSpec, RunSpec, TrainingSpec

    return RunSpec(protocol="contract", protocol_version="1",
                   dataset=DatasetSpec(synthetic_dataset(), N_TASKS, CLASSES_PER_TASK, model),
                   regime=regime, method=method, label="", hparams=dict(hparams), order=0,
                   class_order=tuple(range(N_TASKS * CLASSES_PER_TASK)), seed=seed, scenario=scenario,
                   pretrain=Pretrain(PretrainKind.FIRST_TASK),
                   training=TrainingSpec(lr=0.05, momentum=0.9, epochs=epochs, batch_size=32), eval_batch_size=256)


_DATA: dict = {}


def synthetic_dataset() -> str:
    """`npz:PATH` of the contract's stream, written once per process to a temporary folder."""
    if "name" not in _DATA:
        _DATA["dir"] = tempfile.TemporaryDirectory(prefix="cl-bench-contract-")
        path = Path(_DATA["dir"].name) / "blobs.npz"
        np.savez(path, **gaussian_blobs())
        _DATA["name"] = f"npz:{path}"
    return _DATA["name"]


def gaussian_blobs(n_classes: int = N_TASKS * CLASSES_PER_TASK, n_train: int = 48, n_test: int = 16,
                   seed: int = 0) -> dict:
    """Class c = a fixed random 1x8x8 pattern plus unit Gaussian noise (seeded, so always the same)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.5, size=(n_classes, 1, 8, 8))

    def draw(n):
        y = np.repeat(np.arange(n_classes), n)
        return (means[y] + rng.normal(size=(len(y), 1, 8, 8))).astype(np.float32), y

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
