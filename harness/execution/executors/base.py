"""What every executor shares: per-run options, running one spec in a worker, the interface.

Every executor has the same interface, `run(specs) -> iterator of RunRecord` (exactly one
record per spec); the sweep driver consumes the iterator and is the only writer of results.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ...config.errors import SweepError
from ...config.specs import RunRecord, RunSpec, failed_record
from ...config.vocabulary import Status


@dataclass(frozen=True)
class RunOptions:
    """Per-run settings that are not part of the spec (they do not change the numbers)."""

    data_dir: str | None = None
    download: bool = False
    device: str = "auto"
    method_files: tuple = ()
    # Runs are small: one thread each and parallelism across runs (--jobs) beats threads
    # inside a run, and avoids oversubscribing cores (measured: see benchmarks/scaling.py).
    threads: int | None = 1
    submission: dict | None = None  # {"file", "sha256"}: recorded in provenance by `cl-bench submit`
    submission_method: str | None = None  # the submitted method: only its runs carry `submission` (None: every run)
    timeout: float | None = None  # --run-timeout seconds: implies worker processes (timeout.py)


def run_spec(spec: RunSpec, options: RunOptions) -> RunRecord:
    """Run one spec in this process (what every worker does)."""
    from ...run.engine import run_one

    return run_one(spec, data_dir=options.data_dir, download=options.download,
                   device=options.device, method_files=options.method_files,
                   submission=options.submission if options.submission_method in (None, spec.method) else None)


def run_in_worker(spec: RunSpec, options: RunOptions) -> RunRecord | None:
    """run_spec in a pool worker; None (nothing ran) once an earlier run left this process in a state
    that could not be put back (harness.run.isolation): the executor reruns the spec in a fresh worker."""
    from ...run.isolation import process_dirty

    return None if process_dirty() else run_spec(spec, options)


# Worker processes are forked from a server process that has imported the whole stack once
# (torch, Avalanche, the harness: ~7 s of imports a spawned worker would pay again, as would
# every replacement of a dead or timed-out worker). CL_BENCH_START_METHOD=spawn restores
# fresh interpreters (e.g. where forking after importing torch misbehaves).
START_METHOD_ENV = "CL_BENCH_START_METHOD"
START_METHODS = ("forkserver", "spawn")
PRELOAD = ("harness.compat", "harness.execution.executors.base", "harness.run.engine",
           "avalanche.training.supervised", "avalanche.training.templates")


def worker_context():
    """The multiprocessing context of worker processes: a preloaded fork server where the platform has one."""
    import multiprocessing

    method = os.environ.get(START_METHOD_ENV) or "forkserver"
    if method not in START_METHODS:
        raise SweepError(f"${START_METHOD_ENV}={method!r}; allowed: {', '.join(START_METHODS)}")
    if method not in multiprocessing.get_all_start_methods():
        method = "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_worker_server() -> None:
    """Start the fork server now (it imports the stack while the driver plans); no-op under spawn."""
    ctx = worker_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


@dataclass(frozen=True)
class WorkerSetup:
    """The driver's state a forked worker must adopt: a fork server forks from its own start-up
    state, not the driver's current one (environment, working directory, import path)."""

    threads: int | None
    environ: dict
    cwd: str
    sys_path: tuple
    gpus: tuple = ()  # CUDA device ids to spread workers over (more than one visible GPU)


def worker_setup(threads: int | None, device: str = "auto") -> WorkerSetup:
    """Capture the driver's state for its workers now (when the pool is created)."""
    import sys

    return WorkerSetup(threads, dict(os.environ), os.getcwd(), tuple(sys.path), visible_gpus(device))


def visible_gpus(device: str) -> tuple:
    """The CUDA device ids runs may use when there are several (`--device cuda|auto`), else ()."""
    if device not in ("auto", "cuda") and not device.startswith("cuda"):
        return ()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = tuple(d.strip() for d in listed.split(",") if d.strip())
    else:
        import torch

        ids = tuple(str(i) for i in range(torch.cuda.device_count()))  # NVML: no CUDA context here
    return ids if len(ids) > 1 else ()


def gpu_for_worker(index: int, gpus: tuple) -> str | None:
    """Worker `index`'s GPU: workers take the visible GPUs in turn (N workers per GPU for N x GPUs jobs)."""
    return gpus[index % len(gpus)] if gpus else None


def init_forked_worker(setup: WorkerSetup, counter=None) -> None:
    """Per-process set-up of a pool worker: the driver's state, its GPU, then `init_worker`."""
    import sys

    os.environ.clear()
    os.environ.update(setup.environ)
    os.chdir(setup.cwd)
    sys.path[:] = list(setup.sys_path)
    if setup.gpus and counter is not None:
        with counter.get_lock():
            index, counter.value = counter.value, counter.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for_worker(index, setup.gpus)  # before CUDA starts
    init_worker(setup.threads)


def init_worker_process(setup: WorkerSetup, counter=None) -> None:
    """What a worker process does first: leave Ctrl-C to the driver, then `init_forked_worker`."""
    import signal

    # Ctrl-C reaches the whole process group: only the driver acts on it (it stops the workers), so
    # that a KeyboardInterrupt inside a worker's run can only be the method's own (a failed record).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init_forked_worker(setup, counter)


def init_worker(threads: int | None) -> None:
    """Per-process set-up of a worker: the stack's quirks, torch thread counts."""
    import torch

    from ... import compat  # noqa: F401

    if threads:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already ran in this process
            pass


def threads_per_run(options: RunOptions, jobs: int) -> int:
    """--threads, else the machine's cores shared among `jobs` workers."""
    return options.threads or max(1, (os.cpu_count() or 1) // max(1, jobs))


def lost_record(spec: RunSpec, error: str, status: Status = Status.FAILED) -> RunRecord:
    """The record of a run whose worker produced nothing (died, timed out, lost its node)."""
    from ...run.provenance import provenance

    return failed_record(spec, error, status=status, provenance=provenance("unknown"))


class Executor:
    """The interface: `run(specs)` yields exactly one RunRecord per spec, as runs finish."""

    name = "?"

    def __init__(self, options: RunOptions, jobs: int = 1, max_retries: int = 1):
        self.options, self.jobs, self.max_retries = options, max(1, int(jobs)), max_retries

    def run(self, specs: Iterable[RunSpec]) -> Iterator[RunRecord]:
        """Yield one record per spec."""
        raise NotImplementedError


