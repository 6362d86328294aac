"""The run's speed-ups, switched together: fast data path, idle evaluator dropped, prefix caching.

Each leaves a record exactly as it would be without it, except the fast data path's
minibatch order (see harness.run.fastdata), which is part of what a record means.
"""
from __future__ import annotations

from .evaluation import evaluate_tasks
from .fastdata import install_fast_path
from .prefix_cache import EvalCache, cache_allowed, install_prefix_cache


def drop_idle_evaluator(strategy) -> None:
    """Remove a metric-less, logger-less evaluator from the plugin callbacks.

    With no metrics and no loggers, Avalanche's EvaluationPlugin still runs on every
    callback (it re-wraps the experience each time); skipping it changes nothing.
    `strategy.evaluator` stays, so `train()` still returns its (empty) last metrics.
    """
    evaluator = getattr(strategy, "evaluator", None)
    if evaluator is None or getattr(evaluator, "metrics", True) or getattr(evaluator, "loggers", True):
        return
    strategy.plugins = [p for p in strategy.plugins if p is not evaluator]


# Benchmarks switch these off in-process to measure the paths side by side. The fast data
# path changes the minibatch order (a seeded generator instead of Avalanche's sampler), so
# it is part of what a record means: leave it on outside benchmarks.
ENABLED = True
PREFIX_CACHE = True


def install_speedups(strategy, adapter, tasks, seed: int, eval_batch_size: int = 1024) -> None:
    """Fast data path, idle-evaluator removal and (where allowed) frozen-prefix caching."""
    if not ENABLED:
        return
    drop_idle_evaluator(strategy)
    cache = install_prefix_cache(strategy, PREFIX_CACHE and cache_allowed(strategy, adapter),
                                 eval_batch_size)
    strategy.harness_cache = cache  # the installed PrefixCache (tests read which tasks it cached)
    install_fast_path(strategy, tasks, seed, cache.transform_for)


def eval_function():
    """The harness's evaluator for one run: with test-set prefix features kept when enabled."""
    return EvalCache().evaluate if ENABLED and PREFIX_CACHE else evaluate_tasks
