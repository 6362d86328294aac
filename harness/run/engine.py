"""run_one(RunSpec) -> RunRecord: train task after task, measure every method alike."""
from __future__ import annotations

import dataclasses
import hashlib
import random
import time
import traceback
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import harness.compat  # noqa: F401

import numpy as np
import torch

from ..api import contract
from ..api.contract import MethodContext, make_optimizer
from ..api.heads import SeenClassesLoss
from ..api.one_row import note_row_extents
from ..api.plugins import used_plugins
from ..api.registry import get_registry
from ..config.errors import DriverInterrupt
from ..config.metrics import all_metrics, step_forgetting
from ..config.specs import RunRecord, RunSpec, failed_record
from ..config.vocabulary import Scenario, Status, regime_depth
from . import compute
from .checks import CHECKS_VERSION, head_outputs, loss_windows, run_warnings
from .compute import ComputeMeter
from .datasets import dataset_fingerprint, load_dataset
from .evaluation import ContinualEvaluator, evaluate_class_il, task_accuracy
from .fastdata import skip_lone_batches
from .isolation import capture, restore
from .models import build_model, shared_effective_weights, trainable_block_names
from .norms import check_shapes, snapshot, update_norms
from .plugins import DivergedError, HarnessPlugin
from .precision import provenance as precision_provenance, set_precision
from .probe import probe_accuracy
from .provenance import method_provenance, provenance
from .regimes import (
    apply_regime,
    changed_frozen,
    frozen_state,
    inject_adapters,
    method_parameter_counts,
    parameter_counts,
    trainable_blocks,
    trained_effective,
)
from .speedups import eval_function, install_speedups
from .streams import on_device, split_tasks, to_avalanche


class Breach(StrEnum):
    """The rule of the adapter contract an adapter broke (the id of `cl-bench check`'s finding)."""

    STRATEGY = "strategy"  # build() returned no Avalanche strategy
    PLUGINS = "plugins"  # the strategy never called the harness plugins
    FROZEN = "frozen"  # frozen parameters or buffers changed
    TEST_DATA = "test-data"  # the test data the harness evaluates on changed
    PROCESS = "process-state"  # the run changed the harness's code or left state that cannot be put back


class AdapterError(RuntimeError):
    """The adapter broke the harness contract; `breach` says which rule (the message says how)."""

    def __init__(self, message: str, breach: Breach):
        super().__init__(message)
        self.breach = breach

    def __reduce__(self):  # picklable with its breach (the default would call AdapterError(message))
        return type(self), (str(self), self.breach)


class IdentityError(RuntimeError):
    """The method or the data is not the one the spec was planned with (changed since)."""


@dataclass
class _Progress:
    """What a run has measured so far; a failure keeps everything measured before it."""

    rows: list = field(default_factory=list)
    init_acc: list = field(default_factory=list)
    rows_task_aware: list = field(default_factory=list)  # class-IL only: argmax over the task's classes
    init_task_aware: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    per_task_s: list = field(default_factory=list)
    eval_s: float = 0.0
    diagnostics: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    n_blocks: int | None = None
    method: dict = field(default_factory=dict)  # provenance: where the method's code came from
    probe_acc: list = field(default_factory=list)
    trained_acc: list = field(default_factory=list)  # the trained model's learned accuracy where another is evaluated
    memory: list = field(default_factory=list)  # contract.memory_use(strategy) after each task (None: nothing declared)
    n_test: list = field(default_factory=list)
    plugin: HarnessPlugin | None = None  # counts the budget and keeps the losses
    continual: ContinualEvaluator | None = None  # the curve (spec.continual), measured by the plugin and here
    pretrained: dict = field(default_factory=dict)  # provenance of a pretrained backbone
    plugins: dict = field(default_factory=dict)  # provenance: the plug-ins' files (none for built-ins)
    state: object = None  # the process state before the run (isolation.Snapshot), put back after it
    compute: object = None  # compute.ComputeMeter (None: accounting off), its result in budget["compute"]
    precision: dict = field(default_factory=dict)  # provenance: the autocast that ran (none at fp32)


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when available, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available; use --device cpu or auto")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_one(spec: RunSpec, *, data_dir: str | None = None, download: bool = False,
            device: str = "auto", method_files=(), submission: dict | None = None,
            observer=None) -> RunRecord:
    """Run one spec; any exception or divergence becomes a record, never a crash.

    `submission` ({"file", "sha256"}) goes into the record's provenance (not the run id);
    `observer(event, t, strategy)` is called with "before_task"/"after_task" around each
    task's training (the contract check uses it to look at the model), and with "raised" and
    the exception in place of the strategy when the run fails (the check reads its kind).
    """
    started = time.perf_counter()
    progress = _Progress()
    status, error = Status.OK, None
    dev = resolve_device(device)
    try:
        _execute(spec, progress, data_dir, download, dev, method_files, observer)
    except DivergedError as exc:
        status, error = Status.DIVERGED, str(exc)
    except DriverInterrupt:  # the driver's Ctrl-C/SIGTERM stops the sweep (after the finally below)
        raise
    except BaseException as exc:  # a failing method is a result, not a crash of the sweep: sys.exit() too
        status, error = Status.FAILED, _failure(exc)
        progress.diagnostics["traceback"] = "".join(traceback.format_exc(limit=-6))
        if observer:
            observer("raised", len(progress.rows), exc)
    finally:  # before the record: what it is computed with must be the harness's own code
        if progress.compute is not None:
            progress.compute.close()
        leaked = restore(progress.state).failure() if progress.state is not None else None
    if leaked:
        status, error = Status.FAILED, leaked if status == Status.OK else f"{error}; and {leaked}"
        if observer:
            observer("raised", len(progress.rows), AdapterError(leaked, Breach.PROCESS))
    return _record(spec, progress, status, error, time.perf_counter() - started, dev, submission)


def _failure(exc: BaseException) -> str:
    """The error of a run that raised `exc`; an exit or interrupt raised by the method says it ends the run only."""
    if isinstance(exc, Exception):
        return f"{type(exc).__name__}: {exc}"
    return (f"{type(exc).__name__}({exc}) raised inside the run: a method may not exit or interrupt the sweep "
            "(it fails this run only)")


def _execute(spec, progress, data_dir, download, device, method_files, observer=None) -> None:
    get_registry(method_files)  # a worker registers the run's method and plug-in files before it needs them
    progress.state = capture()  # after registering: importing a method file is not part of any run
    progress.plugins = _check_plugins(spec)
    seed_everything(spec.seed)
    data = load_dataset(spec.dataset.name, data_dir, download)
    _check_data(spec, data_dir, download)
    if spec.pretrain.holdout is not None:  # the backbone pretrains on part of this stream: those samples leave it
        from .pretrain import stream_data
        data = stream_data(data, spec.pretrain)
    host_tasks = split_tasks(data, spec.class_order, spec.dataset.n_tasks, spec.dataset.classes_per_task,
                             spec.scenario)
    tasks = on_device(host_tasks, device)
    fingerprints = fingerprint_test_data(tasks)  # before any code of the method runs (its build() too)
    model = _run_model(spec, data.input_shape, data_dir, download, device, progress)
    progress.n_blocks = len(trainable_block_names(model))
    progress.params = parameter_counts(model, spec.regime)
    first_regime = "full" if spec.pretrain.first_task else spec.regime
    apply_regime(model, first_regime)
    if spec.continual is not None:  # its own evaluator (and prefix cache): the subsamples are other tensors
        progress.continual = ContinualEvaluator(tasks, spec.continual.every, spec.continual.subsample, spec.seed,
                                                _evaluator(spec), spec.eval_batch_size, device)
    harness_plugin = progress.plugin = HarnessPlugin(progress.continual)
    progress.n_test = [len(t.y_test) for t in tasks]
    criterion = run_criterion(spec)
    # before build(): copies of the model a method makes (a teacher, a merge) carry the meter's hooks
    meter = progress.compute = ComputeMeter(model, data.input_shape, device) if compute.ENABLED else None
    strategy = _build_strategy(spec, model, harness_plugin, device, method_files, tasks, progress, criterion)
    _attach_meter(strategy, harness_plugin, meter, model)
    progress.params = method_parameter_counts(progress.params, model, strategy.model, spec.regime)
    _check_test_data(tasks, fingerprints, None)
    evaluate = _evaluator(spec)
    # Class-IL's initial row: the head as task 1 starts (its classes' units only), as every later row is
    # evaluated over the classes seen so far; a task's classes cannot be answered before their task.
    # The model the method trains and evaluates: the run's, or the method's own around it (a prompt pool's).
    seen = _see_classes(criterion, spec, 0)
    progress.init_acc, progress.init_task_aware = _timed_eval(strategy.model, tasks, spec, device, progress,
                                                              evaluate, seen)
    curve = progress.continual
    if curve:
        curve.start_task(0, seen)
        curve.point(strategy.model, 0)
    for t, experience in enumerate(to_avalanche(host_tasks, resident=tasks).train_stream):
        t0 = time.perf_counter()
        apply_regime(strategy.model, first_regime if t == 0 else spec.regime)
        seen = _see_classes(criterion, spec, t)
        before = frozen_state(strategy.model)
        if observer:
            observer("before_task", t, strategy)
        curve_s = curve.seconds if curve else 0.0
        if curve:
            curve.start_task(t, seen)
        if meter:
            meter.start_task(model)
        with meter.stage_of(compute.TRAIN) if meter else nullcontext():
            strategy.train(experience)
        _check_frozen(strategy.model, before, spec.regime)
        if harness_plugin.iterations == 0:
            raise AdapterError("the strategy never called the harness plugins: build the strategy "
                               "with **ctx.strategy_kwargs() or pass plugins=list(ctx.plugins)", Breach.PLUGINS)
        evaluated = _evaluated_model(strategy, meter)
        # training time without the curve's points (timings.curve_s has them)
        progress.per_task_s.append(time.perf_counter() - t0 - ((curve.seconds - curve_s) if curve else 0.0))
        if curve:  # the task's end point: the evaluated model, as the matrix's row
            curve.point(evaluated, sum(harness_plugin.steps_per_task), end=True)
        row, row_task_aware = _timed_eval(evaluated, tasks, spec, device, progress, evaluate, seen)
        progress.rows.append(row)
        progress.rows_task_aware.append(row_task_aware)
        # Learning checks examine training: a method that evaluates another model (a merge) is checked
        # on the model it trained, whose head and features belong together.
        trained = strategy.model
        progress.probe_acc.append(_timed_probe(trained, tasks[t], spec, device, progress))
        progress.trained_acc.append(_trained_accuracy(trained, evaluated, tasks[t], spec, device, progress))
        progress.snapshots.append(_snapshot(evaluated, strategy, progress.snapshots))
        progress.diagnostics.update(contract.collect_diagnostics(strategy))
        progress.memory.append(_memory_use(strategy))
        _check_test_data(tasks, fingerprints, t)
        if observer:
            observer("after_task", t, strategy)


def _snapshot(evaluated, strategy, earlier: list) -> dict:
    """CPU copies of the evaluated model's shared effective weights and of the method's own state
    (`harness_state()`: prompts, prototypes); ValueError (the run fails) for state the norms cannot compare."""
    taken = snapshot({**shared_effective_weights(evaluated), **contract.method_state(strategy)})
    if earlier:
        check_shapes(earlier[-1], taken)
    return taken


def _attach_meter(strategy, harness_plugin, meter, model=None) -> None:
    """The meter pauses during the harness's curve points and counts the prefix cache's own passes; it counts the
    passes of the method's own model where that is not the run's (a wrapper around it)."""
    harness_plugin.compute = meter
    if meter is not None and model is not None and strategy.model is not model:
        meter.watch(strategy.model)
    cache = getattr(strategy, "harness_cache", None)
    if cache is not None:
        cache.meter = meter


def _evaluated_model(strategy, meter):
    """contract.evaluated_model, its cost counted as the merge's where it is another model than the trained one."""
    if meter is None:
        return contract.evaluated_model(strategy)
    evaluated = meter.evaluated_model(lambda: contract.evaluated_model(strategy), strategy.model)
    meter.merge_ops = compute.merge_element_ops(strategy)
    return evaluated


def _check_frozen(model, before: dict, regime: str) -> None:
    changed = changed_frozen(model, before)
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise AdapterError(f"frozen parameters/buffers changed under regime {regime!r}: {shown}; a method "
                           "must leave frozen blocks alone (no requires_grad changes, no in-place updates)",
                           Breach.FROZEN)


def fingerprint_test_data(tasks) -> tuple:
    """A content hash of every task's test tensors (what the harness evaluates on)."""
    return tuple((_digest(t.x_test), _digest(t.y_test)) for t in tasks)


def _digest(tensor: torch.Tensor) -> str:
    flat = tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()
    return f"{tuple(tensor.shape)}{tensor.dtype}{hashlib.blake2b(flat, digest_size=16).hexdigest()}"


def _check_test_data(tasks, fingerprints: tuple, t: int | None) -> None:
    """The test data must be what it was when it reached the device (`t`: the task just trained, None: build)."""
    changed = [f"task {i + 1}" for i, (now, then) in enumerate(zip(fingerprint_test_data(tasks), fingerprints))
               if now != then]
    if changed:
        when = "in the method's build()" if t is None else f"during task {t + 1}"
        raise AdapterError(f"the test data of {', '.join(changed)} changed {when}: a method may not "
                           "write to what the harness evaluates on (ctx.tasks holds copies of the test tensors)",
                           Breach.TEST_DATA)


def method_tasks(tasks) -> tuple:
    """The tasks as ctx.tasks gives them to a method: test tensors of its own, which nothing evaluated shares."""
    return tuple(dataclasses.replace(t, x_test=t.x_test.clone(), y_test=t.y_test.clone()) for t in tasks)


def _run_model(spec: RunSpec, input_shape, data_dir, download, device, progress):
    """The run's backbone: built, pretrained weights loaded (if any), LoRA adapters injected (if any)."""
    model = build_run_model(spec, input_shape)
    if spec.pretrain.is_backbone:
        _load_pretrained(model, spec, input_shape, data_dir, download, device, progress)
    model = inject_adapters(model, spec.regime).to(device)
    set_precision(model, spec.training.precision)  # after pretraining: a pretrained backbone is the fp32 one
    progress.precision = precision_provenance(model, device)
    # which BatchNorm layers one row gives one value per channel: a last batch of one is skipped only there
    note_row_extents(model, lambda: model.features(torch.zeros((1, *input_shape), device=device)))
    return model


def _load_pretrained(model, spec, input_shape, data_dir, download, device, progress) -> None:
    from .pretrain import load_backbone, pretrained_backbone

    state, weights = pretrained_backbone(spec, input_shape, data_dir=data_dir, download=download, device=str(device))
    load_backbone(model, state, spec.pretrain.label)
    progress.pretrained = weights.provenance()


def build_run_model(spec: RunSpec, input_shape):
    """The spec's backbone with its heads (one per task in task-IL, one in class-IL)."""
    task_il = spec.scenario == Scenario.TASK_IL
    n_tasks, cpt = spec.dataset.n_tasks, spec.dataset.classes_per_task
    return build_model(spec.dataset.model, input_shape, n_heads=n_tasks if task_il else 1,
                       head_classes=cpt if task_il else n_tasks * cpt)


def _check_data(spec: RunSpec, data_dir, download) -> None:
    """The data must be the data the spec was planned with (its content fingerprint)."""
    if not spec.data_fingerprint:
        return
    found = dataset_fingerprint(spec.dataset.name, data_dir, download)
    if found != spec.data_fingerprint:
        raise IdentityError(f"the data of {spec.dataset.name!r} changed since this run was planned (content "
                            f"{found}, planned {spec.data_fingerprint}); plan the sweep again")


def _check_plugins(spec: RunSpec) -> dict:
    """Provenance of the plug-ins the run uses, which must be the implementations it was planned with."""
    used = used_plugins(spec.dataset.model, spec.dataset.name, spec.regime)
    found = {key: r.implementation for key, r in used.items()}
    if spec.plugins and found != spec.plugins:
        missing = [f"{k} ({v})" for k, v in spec.plugins.items() if found.get(k) != v]
        raise IdentityError(f"plug-in {', '.join(missing)} of this run is not registered here in that version "
                            f"(found: {found or 'none'}): give its file with --plugin FILE.py or the protocol's "
                            "plugins:, unchanged since the run was planned")
    return {key: {"source": r.source, "implementation": r.implementation} for key, r in used.items()}


def _resolve_adapter(spec: RunSpec, method_files, progress: _Progress):
    """The registered adapter of the spec, which must be the implementation it was planned with."""
    adapter = get_registry(method_files)[spec.method]
    source = adapter.source
    if source != "built-in" and Path(source).is_file():
        source = str(Path(source).resolve())
    progress.method = method_provenance(adapter, {**adapter.defaults, **spec.hparams}, source)
    if spec.method_version and adapter.implementation != spec.method_version:
        raise IdentityError(f"method {spec.method!r} is implementation {adapter.implementation} ({adapter.source}), "
                            f"but this run was planned with {spec.method_version}: the method changed since; "
                            "plan the sweep again")
    return adapter


def run_criterion(spec: RunSpec) -> torch.nn.Module:
    """The run's training loss: cross-entropy; in class-IL over the seen classes only (a growing head)."""
    return SeenClassesLoss() if spec.scenario == Scenario.CLASS_IL else torch.nn.CrossEntropyLoss()


def _see_classes(criterion, spec: RunSpec, t: int) -> int | None:
    """Before task t (0-based): the classes seen once it trains, which the class-IL loss and argmax cover."""
    if spec.scenario != Scenario.CLASS_IL:
        return None
    seen = (t + 1) * spec.dataset.classes_per_task
    if isinstance(criterion, SeenClassesLoss):
        criterion.seen = seen
    return seen


def _build_strategy(spec, model, harness_plugin, device, method_files, tasks=(), progress=None, criterion=None):
    from avalanche.training.templates import BaseTemplate

    adapter = _resolve_adapter(spec, method_files, progress or _Progress())
    ctx = MethodContext(
        model=model, optimizer=make_optimizer(spec.training, (p for p in model.parameters() if p.requires_grad)),
        criterion=run_criterion(spec) if criterion is None else criterion, train_mb_size=spec.training.batch_size,
        eval_mb_size=spec.eval_batch_size, train_epochs=spec.training.epochs, device=device,
        plugins=(harness_plugin,), n_tasks=spec.dataset.n_tasks, regime=spec.regime,
        pretrain=spec.pretrain, scenario=spec.scenario, seed=spec.seed, training=spec.training,
        tasks=method_tasks(tasks), regime_blocks=tuple(trainable_blocks(model, spec.regime)),
        regime_params=tuple(trained_effective(model, spec.regime)),
        accuracy=_accuracy_function(device, spec.eval_batch_size))
    strategy = adapter.build(ctx, **{**adapter.defaults, **spec.hparams})
    if not isinstance(strategy, BaseTemplate):
        raise AdapterError(f"build() of {spec.method!r} returned {type(strategy).__name__}, "
                           "not an Avalanche strategy (a SupervisedTemplate subclass)", Breach.STRATEGY)
    keep_optimizer_on_trainable(strategy)
    install_speedups(strategy, adapter, tasks, spec.seed, spec.eval_batch_size)
    skip_lone_batches(strategy)
    return strategy


def keep_optimizer_on_trainable(strategy) -> None:
    """Make the strategy's per-task optimizer reset keep only trainable parameters.

    Avalanche's default re-adds every model parameter at each task boundary; frozen
    parameters must be absent from the optimizer (weight decay or momentum would move them).
    Optimizer state (momentum) is reset at every task boundary.
    """
    def make_optimizer(**kwargs):
        trainable = [(n, p) for n, p in strategy.model.named_parameters() if p.requires_grad]
        groups = strategy.optimizer.param_groups
        groups[0]["params"] = [p for _, p in trainable]
        del groups[1:]
        strategy.optimizer.state = defaultdict(dict)
        strategy.optimized_param_id = dict(trainable)

    strategy.make_optimizer = make_optimizer


def _accuracy_function(device, batch_size: int):
    """ctx.accuracy: the harness's accuracy of a model on one task's test set (eval mode)."""
    def accuracy(model, task) -> float:
        was_training = model.training
        model.eval()
        try:
            return task_accuracy(model, task.x_test, task.y_test, task.index, batch_size, device)
        finally:
            model.train(was_training)
    return accuracy


def _evaluator(spec: RunSpec):
    """evaluate(model, tasks, batch_size, device, seen) -> (row, task-aware row; None in task-IL).

    `seen`: the classes seen so far in class-IL (the argmax runs over their columns; None: all)."""
    if spec.scenario == Scenario.TASK_IL:  # one head per task: the row already is task-aware
        plain = eval_function()
        return lambda model, tasks, batch_size, device, seen=None: (plain(model, tasks, batch_size, device), None)
    # Both class-IL rows come from the same logits; the test-set prefix cache (EvalCache) only
    # counts the unmasked argmax, so class-IL evaluates uncached rather than run the model twice.
    cpt = spec.dataset.classes_per_task
    return lambda model, tasks, batch_size, device, seen=None: evaluate_class_il(model, tasks, batch_size, device,
                                                                                 cpt, seen)


def _timed_eval(model, tasks, spec, device, progress, evaluate, seen=None) -> tuple:
    t0 = time.perf_counter()
    accs = evaluate(model, tasks, spec.eval_batch_size, device, seen)
    progress.eval_s += time.perf_counter() - t0
    return accs


def _trained_accuracy(trained, evaluated, task, spec, device, progress) -> float | None:
    """What the trained model reached on the task it just trained, when it is not the evaluated one (a merge,
    a method's own classifier): its task-IL accuracy, in class-IL its task-aware accuracy (the checks' rule)."""
    if evaluated is trained:
        return None
    t0 = time.perf_counter()
    if spec.scenario == Scenario.TASK_IL:
        acc = _accuracy_function(device, spec.eval_batch_size)(trained, task)
    else:
        acc = evaluate_class_il(trained, [task], spec.eval_batch_size, device, spec.dataset.classes_per_task)[1][0]
    progress.eval_s += time.perf_counter() - t0
    return acc


def _memory_use(strategy) -> contract.MemoryUse | None:
    """What the strategy and its plugins keep between tasks (MemoryHook), checked: a count of stored examples."""
    use = contract.memory_use(strategy)
    if use is not None and use.samples < 0:
        raise ValueError(f"harness_memory() reported {use.samples} stored samples; a count of examples is >= 0")
    return use


def _budget(progress: _Progress) -> dict:
    """The training budget (HarnessPlugin.budget) and, where the method declares what it keeps (MemoryHook),
    `memory_samples`/`memory_bytes` after each task (null after a task where nothing declared it)."""
    budget = progress.plugin.budget() if progress.plugin else {}
    if progress.compute is not None and progress.compute.as_json() is not None:
        budget["compute"] = progress.compute.as_json()
    if any(m is not None for m in progress.memory):
        budget["memory_samples"] = [None if m is None else m.samples for m in progress.memory]
        budget["memory_bytes"] = [None if m is None else m.bytes for m in progress.memory]
    return budget


def _timed_probe(model, task, spec, device, progress) -> float | None:
    t0 = time.perf_counter()
    acc = probe_accuracy(model, task, device, spec.eval_batch_size)
    progress.eval_s += time.perf_counter() - t0
    return acc


def _checks(spec: RunSpec, progress: _Progress) -> dict:
    """What the learning checks need (harness/run/checks.py), as measured."""
    if not progress.n_test:
        return {}
    windows = [loss_windows(losses) for losses in (progress.plugin.losses if progress.plugin else [])]
    outputs = head_outputs(spec.scenario, spec.dataset.n_tasks, spec.dataset.classes_per_task)
    checks = {"chance": 1.0 / outputs, "n_test": list(progress.n_test), "probe_acc": list(progress.probe_acc),
              "trained_acc": list(progress.trained_acc),
              "loss_first": [w[0] if w else None for w in windows],
              "loss_last": [w[1] if w else None for w in windows], "version": CHECKS_VERSION}
    if spec.scenario == Scenario.CLASS_IL:  # a task judged within its own classes (checks.py)
        checks["task_chance"] = 1.0 / spec.dataset.classes_per_task
    return checks


def _record(spec: RunSpec, progress: _Progress, status, error, total_s, device,
            submission: dict | None = None) -> RunRecord:
    T = spec.dataset.n_tasks
    rows = progress.rows
    if status == Status.OK and len(rows) != T:
        status, error = Status.FAILED, f"only {len(rows)} of {T} tasks were evaluated"
    norms = update_norms(progress.snapshots) if progress.snapshots else {}
    if rows and len(rows) == T:
        norms["step_forgetting"] = step_forgetting(np.asarray(rows))
    n_blocks = progress.n_blocks
    checks = _checks(spec, progress)
    task_aware = progress.rows_task_aware if spec.scenario == Scenario.CLASS_IL else None
    measured = dict(
        budget=_budget(progress), checks=checks,
        warnings=run_warnings(rows, checks, spec.scenario, task_aware),
        acc_matrix=rows, init_acc=progress.init_acc, update_norms=norms, diagnostics=progress.diagnostics,
        params=progress.params, n_blocks=n_blocks,
        regime_depth=regime_depth(spec.regime, n_blocks) if n_blocks is not None else None,
        timings={"total_s": total_s, "train_s": float(sum(progress.per_task_s)), "eval_s": progress.eval_s,
                 "per_task_s": progress.per_task_s})
    if progress.compute is not None:  # the merge's and the accounting's seconds (what varies stays in timings)
        measured["timings"].update(progress.compute.timings())
    if progress.continual:
        measured["timings"]["curve_s"] = progress.continual.seconds
        measured["curve"] = progress.continual.as_json(spec.scenario == Scenario.CLASS_IL)
    measured.update(_task_aware(spec, progress, status == Status.OK))
    prov = _provenance(device, submission, progress.method)
    if progress.pretrained:
        prov["pretrained"] = dict(progress.pretrained)
    if progress.plugins:
        prov["plugins"] = dict(progress.plugins)
    prov.update(progress.precision)
    if progress.compute is not None:  # peak memory differs between runs of one spec: provenance, like the host
        prov["memory"] = progress.compute.memory()
    if status != Status.OK:
        return failed_record(spec, error, status, prov, **measured)
    return RunRecord(run_id=spec.run_id, status=status, error=error, spec=spec,
                     metrics=all_metrics(rows, progress.init_acc), provenance=prov, **measured)


def _task_aware(spec: RunSpec, progress: _Progress, ok: bool) -> dict:
    """A class-IL run's task-aware matrix, initial row and metrics; None in task-IL (its matrix is one)."""
    if spec.scenario == Scenario.TASK_IL:
        return dict(acc_matrix_task_aware=None, init_acc_task_aware=None, metrics_task_aware=None)
    R, b = progress.rows_task_aware, progress.init_task_aware
    return dict(acc_matrix_task_aware=R, init_acc_task_aware=b,
                metrics_task_aware=all_metrics(R, b) if ok else {})


def _provenance(device, submission: dict | None, method: dict) -> dict:
    prov = {**provenance(str(device)), "method": dict(method)} if method else provenance(str(device))
    if submission:
        prov["submission"] = dict(submission)
    return prov
