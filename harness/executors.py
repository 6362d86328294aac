"""Executors: run RunSpecs inline or in worker processes and yield records as they finish.

Every executor has the same interface, `run(specs) -> iterator of RunRecord`; the sweep
driver consumes the iterator and is the only writer of results.
"""
from __future__ import annotations

import os
from collections import deque
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
    # Runs are small: one thread each and parallelism across runs (--jobs) beats threads
    # inside a run, and avoids oversubscribing cores (measured: see benchmarks/scaling.py).
    threads: int | None = 1
    submission: dict | None = None  # {"file", "sha256"}: recorded in provenance by `cl-bench submit`
    timeout: float | None = None  # --run-timeout seconds: implies worker processes (timeouts.py)


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
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already ran in this process
            pass


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
    worker = staticmethod(_run)              # what a worker process runs (a test seam)
    initializer = staticmethod(_worker_init)

    def __init__(self, options: RunOptions, jobs: int, max_retries: int = 1):
        self.options = options
        self.jobs = jobs
        self.max_retries = max_retries

    def run(self, specs):
        """Yield one record per spec as workers finish.

        A worker that dies breaks the whole pool (every pending future fails): the pool is
        rebuilt and the runs it took down are rerun one at a time, which tells the run that
        kills its worker apart from bystanders; that run becomes a failed record once it has
        died alone `max_retries` + 1 times.
        """
        threads = self.options.threads or max(1, (os.cpu_count() or 1) // self.jobs)
        todo, suspects, deaths, pending = deque(specs), deque(), {}, {}
        pool = self._pool(threads)
        try:
            while todo or suspects or pending:
                queue, limit = (suspects, 1) if suspects else (todo, self.jobs)
                while queue and len(pending) < limit:
                    spec = queue.popleft()
                    pending[pool.submit(self.worker, spec, self.options)] = spec
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                if not any(_broken(f) for f in done):
                    for future in done:
                        yield _result_or_failure(future, pending.pop(future))
                    continue
                wait(pending)  # a broken pool fails all its futures at once
                casualties = []
                for future in list(pending):
                    spec = pending.pop(future)
                    if _broken(future):
                        casualties.append(spec)
                    else:
                        yield _result_or_failure(future, spec)
                pool.shutdown(wait=False, cancel_futures=True)
                pool = self._pool(threads)
                yield from self._triage(casualties, suspects, deaths)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _pool(self, threads: int):
        return ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn"),
                                   initializer=self.initializer, initargs=(threads,))

    def _triage(self, casualties: list, suspects: deque, deaths: dict):
        """Queue the runs a broken pool took down; fail the one that keeps killing its worker."""
        if len(casualties) > 1:  # any of them may be the culprit: rerun each alone
            suspects.extend(casualties)
            return
        spec = casualties[0]
        deaths[spec.run_id] = deaths.get(spec.run_id, 0) + 1
        if deaths[spec.run_id] > self.max_retries:
            yield failed_record(spec, f"worker process died while running this spec "
                                      f"({deaths[spec.run_id]} times, alone in its pool)")
        else:
            suspects.appendleft(spec)


def _broken(future) -> bool:
    from concurrent.futures.process import BrokenProcessPool

    return future.done() and isinstance(future.exception(), BrokenProcessPool)


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


def make_executor(name: str, options: RunOptions, jobs: int = 1, max_retries: int = 1,
                  ray_options=None):
    """The executor for `--executor` / `--jobs` (`ray_options`: a RayOptions for `ray`)."""
    if options.timeout and name in ("inline", "process"):  # a hung run can only be killed in a worker
        from .timeouts import TimeoutExecutor

        return TimeoutExecutor(options, jobs, max_retries=max_retries)
    if name == "inline" or (name == "process" and jobs <= 1):
        return InlineExecutor(options)
    if name == "process":
        return ProcessExecutor(options, jobs, max_retries=max_retries)
    if name == "ray":
        from .ray_executor import RayExecutor, RayOptions

        return RayExecutor(options, jobs, ray_options or RayOptions(max_retries=max_retries))
    raise ValueError(f"--executor: unknown executor {name!r}; allowed: inline, process, ray")
