"""Executors: one interface (`base.Executor`), four ways to run specs (inline, process, timeout, Ray)."""
from __future__ import annotations

from ...config.errors import SweepError
from .base import Executor, RunOptions
from .inline import InlineExecutor
from .process import ProcessExecutor

EXECUTORS = ("inline", "process", "ray")
__all__ = ["Executor", "RunOptions", "InlineExecutor", "ProcessExecutor", "make_executor", "uses_worker_processes",
           "EXECUTORS"]


def uses_worker_processes(name: str, jobs: int, timeout: float | None) -> bool:
    """Whether `make_executor(name, ...)` runs specs in local worker processes (process pool, timeouts)."""
    return name in ("inline", "process") and bool(timeout) or (name == "process" and jobs > 1)


def make_executor(name: str, options: RunOptions, jobs: int = 1, max_retries: int = 1,
                  ray_options=None):
    """The executor for `--executor` / `--jobs` (`ray_options`: a RayOptions for `ray`)."""
    if options.timeout and name in ("inline", "process"):  # a hung run can only be killed in a worker
        from .timeout import TimeoutExecutor

        return TimeoutExecutor(options, jobs, max_retries=max_retries)
    if name == "inline" or (name == "process" and jobs <= 1):
        return InlineExecutor(options)
    if name == "process":
        return ProcessExecutor(options, jobs, max_retries=max_retries)
    if name == "ray":
        from .ray import RayExecutor, RayOptions

        return RayExecutor(options, jobs, ray_options or RayOptions(max_retries=max_retries))
    raise SweepError(f"--executor: unknown executor {name!r}; allowed: {', '.join(EXECUTORS)}")
