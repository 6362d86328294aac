"""Per-run time limit (`--run-timeout`): runs in worker processes that are killed when a run overstays.

A run cannot be stopped from inside its own process (a method may hang in C code), so a
timeout always means process execution, also with `--jobs 1`. Each worker serves runs one
after another over a pipe; a run past its deadline gets its worker killed, is recorded as
`timeout`, and a fresh worker takes the next run.
"""
from __future__ import annotations

import time
from collections import deque
from multiprocessing import get_context
from multiprocessing.connection import wait

from .base import Executor, init_worker, lost_record, run_spec, threads_per_run

STARTUP_FAILURES = 3  # workers dying before they serve anything: give up instead of looping


def _serve(conn, options, threads) -> None:
    """Worker loop: announce readiness, then run each spec received until None or EOF."""
    init_worker(threads)
    from ...methods.registry import get_registry
    from ...run import engine  # noqa: F401  (imports and method files load before the clock starts)

    get_registry(tuple(options.method_files))
    conn.send(("ready", None))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if spec is None:
            return
        conn.send(("done", run_spec(spec, options)))


class _Worker:
    """One worker process, its pipe end, and the run it holds (if any)."""

    def __init__(self, ctx, options, threads):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, options, threads), daemon=True)
        self.proc.start()
        child.close()
        self.ready, self.spec, self.deadline = False, None, None

    def give(self, spec, timeout: float) -> None:
        self.conn.send(spec)
        self.spec, self.deadline = spec, time.monotonic() + timeout

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class TimeoutExecutor(Executor):
    """Runs specs in `jobs` worker processes; a run past `options.timeout` seconds becomes a timeout record."""

    name = "process"

    def __init__(self, options, jobs: int = 1, max_retries: int = 1):
        super().__init__(options, jobs, max_retries)
        self.timeout = float(options.timeout)
        self.threads = threads_per_run(options, self.jobs)

    def run(self, specs):
        """Yield one record per spec as workers finish or time out."""
        ctx = get_context("spawn")
        todo, workers, deaths, startup_deaths = deque(specs), [], {}, 0
        try:
            while todo or any(w.spec for w in workers):
                while todo and len(workers) < min(self.jobs, len(todo) + sum(bool(w.spec) for w in workers)):
                    workers.append(_Worker(ctx, self.options, self.threads))
                for w in workers:
                    if w.ready and w.spec is None and todo:
                        w.give(todo.popleft(), self.timeout)
                for w in self._events(workers):
                    record, startup_deaths = self._handle(w, workers, todo, deaths, startup_deaths)
                    if record is not None:
                        yield record
        finally:
            for w in workers:
                self._stop(w)

    def _events(self, workers):
        """Workers with a message, a death or a passed deadline (waits until there is one)."""
        deadlines = [w.deadline for w in workers if w.spec is not None]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = set(wait([w.conn for w in workers] + [w.proc.sentinel for w in workers], wait_s))
        now = time.monotonic()
        return [w for w in workers if w.conn in ready or w.proc.sentinel in ready
                or (w.spec is not None and now >= w.deadline)]

    def _handle(self, w, workers, todo, deaths, startup_deaths):
        """(record or None, startup deaths) for one worker event; replaces dead or killed workers."""
        message = self._receive(w)
        if message == ("ready", None):
            w.ready = True
            return None, 0
        if message is not None:
            w.spec, w.deadline = None, None
            return message[1], startup_deaths
        spec = w.spec
        overdue = spec is not None and time.monotonic() >= w.deadline
        w.kill()
        workers.remove(w)
        if spec is None:  # died before serving anything (cannot import torch, out of memory, ...)
            if startup_deaths + 1 >= STARTUP_FAILURES:
                raise RuntimeError(f"worker processes die at start-up (exit code {w.proc.exitcode})")
            return None, startup_deaths + 1
        if overdue:
            return lost_record(spec, f"timed out after {self.timeout:g} s (--run-timeout); "
                                       "its worker process was killed", status="timeout"), startup_deaths
        deaths[spec.run_id] = deaths.get(spec.run_id, 0) + 1
        if deaths[spec.run_id] > self.max_retries:
            return lost_record(spec, f"worker process died while running this spec "
                                       f"({deaths[spec.run_id]} times)"), startup_deaths
        todo.appendleft(spec)
        return None, startup_deaths

    @staticmethod
    def _receive(w):
        """The worker's next message, or None if it has none (dead or overdue)."""
        try:
            if w.conn.poll():
                return w.conn.recv()
        except (EOFError, OSError):
            pass
        return None

    @staticmethod
    def _stop(w) -> None:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
        w.proc.join(2)
        w.kill()
