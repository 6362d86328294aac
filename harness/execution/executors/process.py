"""Runs specs in a pool of worker processes (forked from a preloaded server); a worker that dies is survived."""
from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from .base import (
    Executor,
    init_worker_process,
    lost_record,
    run_in_worker,
    threads_per_run,
    worker_context,
    worker_setup,
)


class ProcessExecutor(Executor):
    """Runs specs in `jobs` long-lived worker processes (one pool per sweep), at most `jobs` in flight."""

    name = "process"
    worker = staticmethod(run_in_worker)    # what a worker process runs (a test seam)
    initializer = staticmethod(init_worker_process)

    def run(self, specs):
        """Yield one record per spec as workers finish.

        A worker that dies breaks the whole pool (every pending future fails): the pool is
        rebuilt and the runs it took down are rerun one at a time, which tells the run that
        kills its worker apart from bystanders; that run becomes a failed record once it has
        died alone `max_retries` + 1 times. A worker that an earlier run left dirty (its state could
        not be put back) runs nothing more: its pool is retired (its runs in flight finish) and the
        spec goes to a fresh pool.
        """
        threads = threads_per_run(self.options, self.jobs)
        todo, suspects, deaths, pending, retired = deque(specs), deque(), {}, {}, []
        pool = self._pool(threads)
        try:
            while todo or suspects or pending:
                queue, limit = (suspects, 1) if suspects else (todo, self.jobs)
                while queue and len(pending) < limit:
                    spec = queue.popleft()
                    pending[pool.submit(self.worker, spec, self.options)] = spec, pool
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                finished = done if not any(_broken(f) for f in done) else wait(pending).done
                casualties = []
                for future in finished:
                    spec, used = pending.pop(future)
                    if _broken(future):  # a broken pool fails all its futures at once
                        casualties.append(spec)
                        continue
                    record = _result_or_failure(future, spec)
                    if record is not None:
                        yield record
                        continue
                    todo.appendleft(spec)  # its worker was dirty: it ran nothing
                    if used is pool:
                        retired.append(pool)
                        pool.shutdown(wait=False)
                        pool = self._pool(threads)
                if casualties:
                    pool.shutdown(wait=False, cancel_futures=True)
                    pool = self._pool(threads)
                    yield from self._triage(casualties, suspects, deaths)
        finally:
            for old in (*retired, pool):
                if pending:  # stopped early (Ctrl-C, SIGTERM): the runs in flight are not waited for
                    _kill_workers(old)
                old.shutdown(wait=False, cancel_futures=True)

    def _pool(self, threads: int):
        ctx = worker_context()
        setup = worker_setup(threads, self.options.device)
        counter = ctx.Value("i", 0) if setup.gpus else None  # which GPU the next worker takes
        return ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=self.initializer,
                                   initargs=(setup, counter))

    def _triage(self, casualties: list, suspects: deque, deaths: dict):
        """Queue the runs a broken pool took down; fail the one that keeps killing its worker."""
        if len(casualties) > 1:  # any of them may be the culprit: rerun each alone
            suspects.extend(casualties)
            return
        spec = casualties[0]
        deaths[spec.run_id] = deaths.get(spec.run_id, 0) + 1
        if deaths[spec.run_id] > self.max_retries:
            yield lost_record(spec, f"worker process died while running this spec "
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
        return lost_record(spec, f"worker process died: {exc}")
    except Exception as exc:  # the run itself never raises; this is the transport failing
        return lost_record(spec, f"{type(exc).__name__}: {exc}")


def _kill_workers(pool) -> None:
    """Terminate a pool's worker processes: otherwise the interpreter waits for their runs at exit."""
    # ProcessPoolExecutor exposes no public handle on its processes; `_processes` is CPython's.
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()
