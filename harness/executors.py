"""Executors: run RunSpecs inline or in worker processes and yield records as they finish.

Every executor has the same interface, `run(specs) -> iterator of RunRecord`; the sweep
driver consumes the iterator and is the only writer of results.
"""
from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context


@dataclass(frozen=True)
class RunOptions:
    """Per-run settings that are not part of the spec (they do not change the numbers)."""

    data_dir: str | None = None
    download: bool = False
    device: str = "auto"
    method_files: tuple = ()
    threads: int | None = None
    submission: dict | None = None  # {"file", "sha256"}: recorded in provenance by `cl-bench submit`


def _run(spec, options: RunOptions):
    from .engine import run_one

    return run_one(spec, data_dir=options.data_dir, download=options.download,
                   device=options.device, method_files=options.method_files,
                   submission=options.submission)


def _worker_init(threads: int | None) -> None:
    import torch

    from . import compat  # noqa: F401

    if threads:
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)


class InlineExecutor:
    """Runs specs one after another in this process."""

    name = "inline"

    def __init__(self, options: RunOptions):
        self.options = options

    def run(self, specs):
        """Yield one record per spec, in order."""
        _worker_init(self.options.threads)
        for spec in specs:
            yield _run(spec, self.options)


class ProcessExecutor:
    """Runs specs in `jobs` spawned worker processes, at most `jobs` in flight."""

    name = "process"

    def __init__(self, options: RunOptions, jobs: int):
        self.options = options
        self.jobs = jobs

    def run(self, specs):
        """Yield records as workers finish them; a dead worker's specs become failed records."""
        threads = self.options.threads or max(1, (os.cpu_count() or 1) // self.jobs)
        pool = ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn"),
                                   initializer=_worker_init, initargs=(threads,))
        pending, todo = {}, list(specs)[::-1]
        try:
            while todo or pending:
                while todo and len(pending) < self.jobs:
                    spec = todo.pop()
                    pending[pool.submit(_run, spec, self.options)] = spec
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    spec = pending.pop(future)
                    yield _result_or_failure(future, spec)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _result_or_failure(future, spec):
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool as exc:
        return failed_record(spec, f"worker process died: {exc}")
    except Exception as exc:  # the run itself never raises; this is the transport failing
        return failed_record(spec, f"{type(exc).__name__}: {exc}")


def failed_record(spec, error: str, status: str = "failed"):
    """A record for a run that produced nothing (its worker died or it timed out)."""
    from .provenance import provenance
    from .specs import RunRecord

    return RunRecord(run_id=spec.run_id, status=status, error=error, spec=spec.to_dict(),
                     acc_matrix=[], init_acc=[], metrics={}, update_norms={}, diagnostics={},
                     params={}, regime_depth=None, n_blocks=None, timings={}, provenance=provenance("unknown"))


def make_executor(name: str, options: RunOptions, jobs: int = 1):
    """The executor for `--executor` / `--jobs`."""
    if name == "inline" or (name == "process" and jobs <= 1):
        return InlineExecutor(options)
    if name == "process":
        return ProcessExecutor(options, jobs)
    raise ValueError(f"--executor: unknown executor {name!r}; allowed: inline, process")
