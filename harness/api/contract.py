"""The method contract, in one place: what an adapter is, what it is given, what it may provide.

- `MethodAdapter`: a registered method (name, defaults, build, metadata, declarations).
- `Range`: the declared range of a hyperparameter (`MethodAdapter.hparam_ranges`, a file's `HPARAM_RANGES`).
- `MethodContext` (`ctx`): everything the harness hands `build(ctx, **hparams)`.
- `StrategyHooks`: the optional hooks (documentation: the engine looks each up on the strategy and
  then on each of its plugins through its own function here).
- `STATE_BLOCKS`: the blocks method-owned state (`StateHook`) may be named under in update norms.

Adapters (built-in or submitted) depend on this module only; the engine is the host that
resolves them by name and drives them through it. See submissions/README.md.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import harness.compat  # noqa: F401  (quirks first)

import torch

from ..config.pretrain import Pretrain
from ..config.specs import TrainingSpec
from ..config.validate import Range  # adapters declare their hyperparameters' ranges with it
from ..config.vocabulary import OPTIMIZERS, Family, Scenario


@dataclass(frozen=True)
class MethodAdapter:
    """A registered method: `build(ctx, **hparams)` returns an Avalanche strategy.

    `prefix_cache`: the method's records are the same with the frozen-prefix cache as
    without it (declare it only once a test shows it: tests/test_performance_paths.py);
    `captions`: a short caption per diagnostic key, shown on the leaderboard;
    `version`: a built-in's implementation version — bump it whenever the method's results
    change, so that no old record is reused (files and entry points are identified by their
    content hash instead); `hparam_types`: the JSON types a hyperparameter accepts where its
    default's type does not say it (e.g. `{"alpha": (str, float)}`, `None` for null);
    `hparam_ranges`: the values a hyperparameter may take beyond its type, as a `Range` (numbers between
    bounds, strings among choices; e.g. `{"mem_size": Range(low=1)}`): a protocol value outside it is
    refused at load, in one line; a hyperparameter without one takes any value of its type;
    `implementation`: set by the registry, the identity that enters every run id;
    `regime_families`: the regime families the method runs faithfully on (a protocol pairing it
    with another family is refused at load), `regime_note`: why, in one clause;
    `scenarios`: the scenarios the method is defined in (a protocol of another is refused at load);
    `regimes_allowed`: a finer declaration within the families, regime by regime (e.g. `head` but not
    `last-k` in the depth family): `regimes_allowed(regime_name)` returns None where the method runs
    faithfully, else one clause saying why not and what is allowed (a protocol pairing it is refused at
    load, in one line); None: every regime of `regime_families`;
    `check_hparams`: hyperparameters `cl-bench check` sets over `defaults`, where a default fits a paper-scale
    model but not the check's small one (e.g. prompt layers 0-4 of ViT-B/16 on vit-tiny's 3 blocks); the
    check prints them. Runs never see them.
    """

    name: str
    defaults: dict
    build: Callable[..., Any]
    description: str = ""
    reference: str = ""
    source: str = "built-in"
    family: str = ""
    prefix_cache: bool = False
    captions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    version: str = "1"
    hparam_types: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))
    hparam_ranges: Mapping[str, Range] = field(default_factory=lambda: MappingProxyType({}))
    implementation: str = ""
    regime_families: tuple[str, ...] = tuple(Family)
    regime_note: str = ""
    scenarios: tuple[str, ...] = tuple(Scenario)
    regimes_allowed: Callable[[str], str | None] | None = None
    check_hparams: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class MethodContext:
    """Everything an adapter needs to build its strategy for one run.

    `model` is already frozen to the run's regime; `optimizer` covers its trainable
    parameters only (the harness keeps it that way at every task boundary). `plugins` are
    the harness's own Avalanche plugins: a strategy must include them. `regime_blocks`
    names the shared blocks the run's regime trains (from task 2 on under first-task
    pre-training, when task 1 trains everything), `regime_params` the effective weights it
    changes (harness.api.subspace). `accuracy(model, task)` is the harness's
    own evaluator (eval mode, the task's head) for diagnostics.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    criterion: torch.nn.Module
    train_mb_size: int
    eval_mb_size: int
    train_epochs: int
    device: torch.device
    plugins: tuple
    n_tasks: int
    regime: str
    pretrain: Pretrain  # .first_task, .is_backbone, .kind, .label (harness.config.pretrain)
    scenario: Scenario
    seed: int
    training: TrainingSpec = field(default_factory=TrainingSpec)
    # The run's tasks (Task: index, classes, x/y train/test tensors). For diagnostics only
    # (e.g. BECAME's α-sweep on seen tasks' test data); training uses the experiences. The test
    # tensors are the method's own copies: the harness evaluates on its own, and fails a run whose
    # test data changed (their content hashes are checked after every task).
    tasks: tuple = ()
    regime_blocks: tuple[str, ...] = ()
    # Plain names of the effective shared weights the regime changes (W of a LoRA layer, a bias under
    # bitfit, every parameter of regime_blocks under a depth regime): what merges act on.
    regime_params: tuple[str, ...] = ()
    accuracy: Callable[[torch.nn.Module, Any], float] | None = None

    def strategy_kwargs(self, *extra_plugins) -> dict:
        """Keyword arguments every SupervisedTemplate subclass accepts, harness plugins included."""
        return dict(model=self.model, optimizer=self.optimizer, criterion=self.criterion,
                    train_mb_size=self.train_mb_size, train_epochs=self.train_epochs,
                    eval_mb_size=self.eval_mb_size, device=self.device,
                    plugins=[*self.plugins, *extra_plugins], evaluator=quiet_evaluator())

    def new_optimizer(self, params=None, lr: float | None = None) -> torch.optim.Optimizer:
        """A fresh optimizer of the protocol's kind (default: over the trainable parameters)."""
        if params is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
        return make_optimizer(self.training, params, lr=lr)


def make_optimizer(training: TrainingSpec, params, lr: float | None = None) -> torch.optim.Optimizer:
    """Build the protocol's optimizer over `params`."""
    lr = training.lr if lr is None else lr
    params = list(params)
    if training.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=training.momentum,
                               weight_decay=training.weight_decay)
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=training.weight_decay)
    if training.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=training.weight_decay)
    raise ValueError(f"unknown optimizer {training.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")


def quiet_evaluator():
    """An Avalanche evaluator with no metrics and no loggers: the harness measures itself."""
    from avalanche.training.plugins import EvaluationPlugin

    return EvaluationPlugin(loggers=[])


# -- the optional hooks ---------------------------------------------------------------------
# Each is looked up on the strategy, then on each of its plugins in order.

@runtime_checkable
class EvalModelHook(Protocol):
    """Provides the model the harness evaluates and measures after a task (default: strategy.model)."""

    def harness_eval_model(self) -> torch.nn.Module | None: ...


@runtime_checkable
class EvalNowHook(Protocol):
    """Provides, during a task's training, the model the method would output if training stopped now:
    what continual evaluation's mid-task points measure (default: the trained model, strategy.model).

    Called after an optimizer step that is a curve point, with the trained model as it is then; the harness
    uses the answer during that point only (a method may reuse one copy within a task). It must
    change nothing training depends on: return a copy (or a module sharing unchanged blocks), never modify
    strategy.model, its BatchNorm statistics, the optimizer or the method's own state (the harness puts the
    torch RNG state back afterwards). At a task's last step it should be the model `harness_eval_model()`
    returns once the task is over. None: the trained model.
    """

    def harness_eval_model_now(self) -> torch.nn.Module | None: ...


@runtime_checkable
class DiagnosticsHook(Protocol):
    """Provides JSON diagnostics merged into record["diagnostics"] (the full dict, every task)."""

    def harness_diagnostics(self) -> dict: ...


@runtime_checkable
class PrefixCacheDeclaration(Protocol):
    """Declares (True/False) whether this strategy may train on frozen-prefix features; None: no say."""

    harness_prefix_cache: bool | None


@runtime_checkable
class StoredTensorsHook(Protocol):
    """Lists the parameter-shaped tensors kept between tasks (memory accounting in tests)."""

    def stored_tensors(self) -> list: ...


@dataclass(frozen=True)
class MemoryUse:
    """What a method keeps between tasks, for the record's compute accounting: `samples` stored
    examples (a rehearsal buffer's rows; 0 for none) and every tensor it keeps (buffer inputs,
    labels, stored logits, class means, Fisher matrices ...), whose bytes the harness counts."""

    samples: int
    tensors: tuple = ()

    @property
    def bytes(self) -> int:
        """Bytes of the kept tensors (numel x element size; shared storage counted per tensor)."""
        return int(sum(t.numel() * t.element_size() for t in self.tensors))


@runtime_checkable
class MemoryHook(Protocol):
    """Reports what the method keeps between tasks (recorded after every task: samples and bytes)."""

    def harness_memory(self) -> MemoryUse: ...


# The blocks a `harness_state()` tensor may be named under: `<block>.<name>`.
STATE_BLOCKS = ("prompts", "prototypes")


@runtime_checkable
class StateHook(Protocol):
    """Provides the tensors the method keeps that act as model weights but are not in `model.blocks`,
    so that update norms and drift cover them (README.md's record schema; docs/update-norms.md).

    Called after every task, on the evaluated model's side of the task (after `harness_eval_model()`).
    Names are `prompts.<name>` (a prompt pool: prompts, keys, attention vectors, components; every
    parameter of the pool) or `prototypes.<name>` (class prototypes the classifier is made of); the
    part before the first dot is the block in per-block norms, and a name may not be returned by two
    providers. A tensor whose first dimension is the class (it grows as classes arrive) is compared on
    the rows both snapshots have; its other dimensions may not change. Class statistics that are not
    weights (covariances, a ridge solver's Gram matrix) and heads are not returned. Return detached
    tensors: the harness copies them to the CPU.
    """

    def harness_state(self) -> dict[str, torch.Tensor]: ...


# The optional hooks, all of them: the list a method author reads (submissions/README.md's hook table,
# which tests/test_method_contract.py checks against it). The engine calls each through its own
# function below (evaluated_model, collect_diagnostics, ...), never through this tuple.
StrategyHooks = (EvalModelHook, EvalNowHook, DiagnosticsHook, PrefixCacheDeclaration, StoredTensorsHook, MemoryHook,
                 StateHook)
# Set by the harness on a strategy with the fast data path: the minibatch-order generator,
# which a method training in stages may save and restore (see methods/became.py).
BATCH_GENERATOR_ATTRIBUTE = "harness_batch_generator"
# Read by the harness on a strategy that trains each task in stages (BECAME): the current stage,
# so that the record's budget counts epochs per stage.
TRAINING_STAGE_ATTRIBUTE = "harness_stage"
# Set by the harness on each experience's training dataset (and by a method on a dataset it builds
# from them, e.g. joint training's concatenation): `(x, y, task_labels)` tensors of the dataset,
# row for row, so that methods and the fast data path index tensors instead of collating samples.
TENSORS_ATTRIBUTE = "harness_tensors"


def dataset_tensors(dataset):
    """`(x, y, task_labels)` of a dataset the harness (or a method) tagged with its tensors, else None.

    Avalanche copies a dataset's attributes into what it derives from it (`.train()`, subsets,
    new transforms): the tag names the dataset it was made for, so a derived one never passes.
    """
    tag = getattr(dataset, TENSORS_ATTRIBUTE, None)
    if tag is None or tag[0]() is not dataset:
        return None
    return tag[1:]


def tag_tensors(dataset, x: torch.Tensor, y: torch.Tensor, task_labels: torch.Tensor):
    """Attach `(x, y, task_labels)` to `dataset` (its rows, in order); returns the dataset."""
    if not len(x) == len(y) == len(task_labels) == len(dataset):
        raise ValueError(f"tag_tensors: {len(x)}/{len(y)}/{len(task_labels)} rows for a dataset of {len(dataset)}")
    setattr(dataset, TENSORS_ATTRIBUTE, (weakref.ref(dataset), x, y, task_labels))
    return dataset


def _providers(strategy, hook) -> list:
    return [obj for obj in (strategy, *getattr(strategy, "plugins", ())) if isinstance(obj, hook)]


def evaluated_model(strategy) -> torch.nn.Module:
    """What the first `harness_eval_model()` returns, else (no provider, or None) the strategy's model."""
    providers = _providers(strategy, EvalModelHook)
    model = providers[0].harness_eval_model() if providers else None
    return strategy.model if model is None else model


def evaluated_model_now(strategy) -> torch.nn.Module:
    """Mid-task: what the first `harness_eval_model_now()` returns, else (no provider, or None) the
    strategy's (trained) model."""
    providers = _providers(strategy, EvalNowHook)
    model = providers[0].harness_eval_model_now() if providers else None
    return strategy.model if model is None else model


def collect_diagnostics(strategy) -> dict:
    """Every `harness_diagnostics()` of the strategy and its plugins, merged in order."""
    merged: dict = {}
    for obj in _providers(strategy, DiagnosticsHook):
        merged.update(obj.harness_diagnostics() or {})
    return merged


def declared_prefix_cache(strategy) -> bool | None:
    """The first non-None `harness_prefix_cache` declaration, else None."""
    for obj in _providers(strategy, PrefixCacheDeclaration):
        if obj.harness_prefix_cache is not None:
            return bool(obj.harness_prefix_cache)
    return None


def stored_tensors(strategy) -> list:
    """Every tensor the strategy's `stored_tensors()` providers keep between tasks."""
    return [t for obj in _providers(strategy, StoredTensorsHook) for t in obj.stored_tensors()]


def memory_use(strategy) -> MemoryUse | None:
    """The sum of every `harness_memory()` of the strategy and its plugins; None when none declares it."""
    uses = [obj.harness_memory() for obj in _providers(strategy, MemoryHook)]
    if not uses:
        return None
    return MemoryUse(samples=sum(int(u.samples) for u in uses), tensors=tuple(t for u in uses for t in u.tensors))


def method_state(strategy) -> dict[str, torch.Tensor]:
    """Every `harness_state()` of the strategy and its plugins, merged in order; ValueError (one line)
    for a name outside `STATE_BLOCKS`, a name two providers return, or a value that is no tensor."""
    merged: dict[str, torch.Tensor] = {}
    for obj in _providers(strategy, StateHook):
        for name, value in (obj.harness_state() or {}).items():
            block, _, rest = str(name).partition(".")
            if block not in STATE_BLOCKS or not rest:
                raise ValueError(f"harness_state() of {type(obj).__name__} returned {name!r}: a name must be "
                                 f"<block>.<name> with block one of {', '.join(STATE_BLOCKS)}")
            if name in merged:
                raise ValueError(f"harness_state() of {type(obj).__name__} returned {name!r}, which another "
                                 "provider returned already: names must be unique")
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"harness_state() of {type(obj).__name__} returned a {type(value).__name__} "
                                 f"for {name!r}: values must be tensors")
            merged[name] = value
    return merged
