"""harness.run.callbacks: a strategy's callbacks call the plugins Avalanche's trigger_plugins would, in
its order with its arguments, leaving out only empty methods; records are the same with and without."""
import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive
from avalanche.training.templates import SupervisedTemplate
from avalanche.training.utils import trigger_plugins

from harness.config.pretrain import Pretrain
from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
from harness.run import callbacks, speedups
from harness.run.callbacks import EVENTS, does_something, install_fast_callbacks, is_empty, is_trigger
from harness.run.engine import run_one
from harness.run.streams import Task, to_avalanche


def _pass(self, strategy, **kwargs):
    pass


def _doc(self, strategy, **kwargs):
    """Only a docstring."""


def _none(self, strategy, **kwargs):
    return None


def _one(self, strategy, **kwargs):
    return 1


def _store(self, strategy, **kwargs):
    self.x = 1


@pytest.mark.parametrize("function, empty", [(_pass, True), (_doc, True), (_none, True), (_one, False),
                                             (_store, False), (print, False)])
def test_only_bodies_that_return_none_are_empty(function, empty):
    assert (isinstance(getattr(function, "__code__", None), type(_pass.__code__))
            and is_empty(function.__code__)) is empty


class Log(SupervisedPlugin):
    """Overrides every callback: logs (plugin, event, kwargs)."""

    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log


for _event in EVENTS:
    setattr(Log, _event, lambda self, strategy, _e=_event, **kw: self.log.append((self.name, _e, tuple(kw))))


class OnlyUpdates(SupervisedPlugin):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def after_update(self, strategy, **kwargs):
        self.log.append(("updates", "after_update", tuple(kwargs)))


class Adds(SupervisedPlugin):
    """Adds a logging plugin to the strategy at the second epoch (a plugin list that changes mid-run)."""

    def __init__(self, log):
        super().__init__()
        self.log, self.epochs = log, 0

    def before_training_epoch(self, strategy, **kwargs):
        self.epochs += 1
        if self.epochs == 2:
            strategy.plugins.append(Log("late", self.log))


class Leaves(SupervisedPlugin):
    """Removes itself from the strategy's plugins after its first epoch (the list shrinks mid-event)."""

    def after_training_epoch(self, strategy, **kwargs):
        strategy.plugins.remove(self)


class Duck:
    """Not an Avalanche plugin: trigger_plugins calls what it has."""

    def __init__(self, log):
        self.log = log

    def before_forward(self, strategy, **kwargs):
        self.log.append(("duck", "before_forward", tuple(kwargs)))


def test_what_does_something():
    log = []
    assert does_something(OnlyUpdates(log), "after_update")
    assert not does_something(OnlyUpdates(log), "before_forward")  # SupervisedPlugin's `pass`
    assert does_something(Duck(log), "before_forward") and not does_something(Duck(log), "after_update")
    plugin = OnlyUpdates(log)
    plugin.before_forward = lambda strategy, **kw: None  # set on the instance: always called
    assert does_something(plugin, "before_forward")


def _train_log(fast: bool, eval_too: bool = True) -> list:
    torch.manual_seed(0)
    log = []
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    plugins = [Log("a", log), OnlyUpdates(log), Adds(log), Leaves(), Duck(log), Log("b", log)]
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     train_mb_size=4, train_epochs=3, eval_mb_size=8, plugins=plugins, device="cpu")
    if fast:
        install_fast_callbacks(strategy)
    exp = _experience(torch.randn(10, 4), torch.arange(10) % 3)
    strategy.train(exp)
    if eval_too:
        strategy.eval([exp])
    return log, strategy, model


def _experience(x, y):
    """One experience of Avalanche's tensor datasets, as the harness builds them."""
    task = Task(index=0, classes=(0, 1, 2), x_train=x, y_train=y, x_test=x, y_test=y)
    return to_avalanche([task]).train_stream[0]


def test_the_same_calls_in_the_same_order_with_the_same_arguments():
    slow, _, slow_model = _train_log(fast=False)
    fast, strategy, fast_model = _train_log(fast=True)
    assert fast == slow and len(fast) > 100
    assert any(name == "late" for name, _, _ in fast)  # the plugin added at epoch 2 is called from then on
    # Leaves removed itself in its first after_training_epoch: the same later calls as Avalanche's loop (above)
    assert ("b", "after_training_epoch", ()) in fast
    assert {event for _, event, _ in fast} >= {"before_forward", "after_update", "after_eval_forward"}
    assert all(torch.equal(a, b) for a, b in zip(slow_model.parameters(), fast_model.parameters()))
    assert "_before_forward" in vars(strategy)  # installed on the instance...
    assert "_before_forward" not in vars(Naive) and "_before_forward" not in vars(SupervisedTemplate)  # ...only


def test_a_template_method_that_does_more_than_trigger_is_kept():
    from avalanche.training.templates.base_sgd import BaseSGDTemplate

    assert is_trigger(BaseSGDTemplate._before_forward, "before_forward")
    assert not is_trigger(BaseSGDTemplate._before_training_exp, "before_training_exp")  # adapts data, model

    class Own(Naive):
        def _after_forward(self, **kwargs):
            self.own = True
            trigger_plugins(self, "after_forward", **kwargs)

    model = torch.nn.Linear(4, 3)
    strategy = Own(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device="cpu")
    install_fast_callbacks(strategy)
    assert "_after_forward" not in vars(strategy) and "_before_training_exp" not in vars(strategy)
    assert "_before_forward" in vars(strategy)


def test_every_event_avalanche_fires_is_covered():
    import inspect

    from avalanche.training.templates import base, base_sgd

    fired = set()
    for module in (base, base_sgd):
        source = inspect.getsource(module)
        fired |= {part.split('"')[1] for part in source.split("trigger_plugins(self, ")[1:]}
    assert fired == set(EVENTS)


def _spec(method, regime="full"):
    return RunSpec(protocol="t", protocol_version="1", dataset=DatasetSpec("digits", 5, 2, "mlp"),
                   regime=regime, method=method, label="", hparams={}, order=1,
                   class_order=(3, 1, 4, 0, 5, 9, 2, 6, 8, 7), seed=1, scenario="task-il",
                   pretrain=Pretrain("first-task"), training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1,
                                                                          batch_size=32),
                   eval_batch_size=512)


@pytest.mark.parametrize("method", ["naive", "ewc-online", "lwf", "replay", "der", "magmax"])
def test_records_are_the_same_without_the_fast_callbacks(method, monkeypatch):
    fast = run_one(_spec(method), device="cpu")
    monkeypatch.setattr(speedups, "install_fast_callbacks", lambda strategy: None)
    slow = run_one(_spec(method), device="cpu")
    assert fast.status == slow.status == "ok"
    assert fast.acc_matrix == slow.acc_matrix and fast.metrics == slow.metrics
    assert fast.diagnostics == slow.diagnostics and fast.checks == slow.checks
    assert callbacks.is_empty.cache_info().currsize > 0
