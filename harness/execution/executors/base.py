"""What every executor shares: per-run options, running one spec in a worker, the interface.

Every executor has the same interface, `run(specs) -> iterator of RunRecord` (exactly one
record per spec); the sweep driver consumes the iterator and is the only writer of results.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator

from ...config.specs import RunRecord, RunSpec, failed_record


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
    timeout: float | None = None  # --run-timeout seconds: implies worker processes (timeouts.py)


def run_spec(spec: RunSpec, options: RunOptions) -> RunRecord:
    """Run one spec in this process (what every worker does)."""
    from ...run.engine import run_one

    return run_one(spec, data_dir=options.data_dir, download=options.download,
                   device=options.device, method_files=options.method_files,
                   submission=options.submission)


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


def lost_record(spec: RunSpec, error: str, status: str = "failed") -> RunRecord:
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


