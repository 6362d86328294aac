"""Plugin callbacks without the calls that do nothing.

Avalanche's template fires ~10 callbacks per training iteration, and each one calls every plugin
that has the method (`avalanche.training.utils.trigger_plugins`). Almost all of those are the base
class's empty methods (`BaseSGDPlugin.before_forward` is `pass`): on a small run they cost ~5 % of
the wall time and change nothing. `install_fast_callbacks` gives a strategy, per callback its class
does not override, a dispatcher that calls the same plugins in the same order with the same
arguments, leaving out only those whose method is an empty function. A plugin list changed by a
callback is followed as Avalanche's loop follows it (a plugin appended by one plugin's callback is
called in the same event), and a plugin instance carrying its own callback attribute is always called.
"""
from __future__ import annotations

import dis
import types
from functools import cache

# The events Avalanche's SGD templates fire through `self._<event>(**kwargs)` -> trigger_plugins.
EVENTS = tuple(f"{when}_{what}" for what in (
    "training", "training_exp", "training_epoch", "training_iteration", "forward", "backward", "update",
    "eval", "eval_exp", "eval_iteration", "eval_forward", "train_dataset_adaptation",
    "eval_dataset_adaptation") for when in ("before", "after"))

_EMPTY_OPS = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"}


@cache
def is_empty(code: types.CodeType) -> bool:
    """Whether a function with this code does nothing but return None (a `pass` or docstring body)."""
    for op in dis.get_instructions(code):
        if op.opname not in _EMPTY_OPS or (op.opname.startswith(("LOAD_CONST", "RETURN_CONST"))
                                           and op.argval is not None):
            return False
    return True


def does_something(plugin, event: str) -> bool:
    """Whether trigger_plugins calling `plugin.<event>` could have any effect."""
    if event in getattr(plugin, "__dict__", {}):
        return True  # set on the instance: always called, whatever it is
    method = getattr(type(plugin), event, None)
    if method is None:
        return hasattr(plugin, event)  # __getattr__ and the like: as trigger_plugins would
    function = getattr(method, "__func__", method)
    return not (isinstance(function, types.FunctionType) and is_empty(function.__code__))


def _dispatcher(strategy, event: str):
    """`strategy._<event>`: trigger_plugins over the plugins whose callback does something."""
    seen: list = [None, ()]  # a copy of the plugin list last read, and (index, plugin) of those to call

    def fire(**kwargs):
        plugins = strategy.plugins
        if plugins != seen[0]:
            seen[0] = list(plugins)
            seen[1] = tuple((i, p) for i, p in enumerate(plugins) if does_something(p, event))
        snapshot = seen[0]
        for i, plugin in seen[1]:
            getattr(plugin, event)(strategy, **kwargs)
            if plugins != snapshot:  # the call changed the list: go on as trigger_plugins' loop over it would
                _trigger_from(plugins, i + 1, strategy, event, kwargs)
                return

    return fire


def _trigger_from(plugins: list, start: int, strategy, event: str, kwargs: dict) -> None:
    """trigger_plugins' loop from position `start` of the (live) list on: a list iterator reads it by index."""
    i = start
    while i < len(plugins):
        plugin = plugins[i]
        if hasattr(plugin, event):
            getattr(plugin, event)(strategy, **kwargs)
        i += 1


def is_trigger(function, event: str) -> bool:
    """Whether `function` is Avalanche's `def _<event>(self, **kwargs): trigger_plugins(self, "<event>", **kwargs)`."""
    code = getattr(function, "__code__", None)
    return code is not None and code.co_names == ("trigger_plugins",) and event in code.co_consts


def install_fast_callbacks(strategy) -> None:
    """Give this strategy (not its class) a dispatcher for each callback it fires with plain trigger_plugins."""
    for event in EVENTS:
        name = f"_{event}"
        if name not in vars(strategy) and is_trigger(getattr(type(strategy), name, None), event):
            setattr(strategy, name, _dispatcher(strategy, event))
