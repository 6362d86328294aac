"""Per-run time limit (`--run-timeout`): runs in worker processes that are killed when a run overstays.

A run cannot be stopped from inside its own process (a method may hang in C code), so a
timeout always means process execution, also with `--jobs 1`. Each worker serves runs one
after another over a pipe; a run past its deadline gets its worker killed, is recorded as
`timeout`, and a fresh worker takes the next run.

The clock counts the run's own time only: a worker warms its imports before it says "ready",
and loads a spec's data set before it says "started"; the deadline is set on "started".
Loading has a separate, generous limit (`setup_limit`) so that a worker stuck there cannot
hang the sweep either.
"""
from __future__ import annotations

import time
from collections import deque
from multiprocessing.connection import wait

from ...config.vocabulary import Status
from .base import Executor, init_worker_process, lost_record, run_spec, threads_per_run, worker_context, worker_setup

STARTUP_FAILURES = 3  # workers dying before they serve anything: give up instead of looping
SETUP_MIN_S = 60.0  # the least time a worker gets to load a run's data set (first load: files, decoding)


def setup_limit(timeout: float) -> float:
    """Seconds a worker may take to load a spec's data set before its run starts."""
    return max(SETUP_MIN_S, 10 * timeout)


def _serve(conn, options, setup, counter=None) -> None:
    """Worker loop: warm up and announce readiness, then load, announce and run each spec until None, EOF
    or a run that leaves the process dirty (harness.run.isolation)."""
    from ...run.isolation import process_dirty

    init_worker_process(setup, counter)
    _warm_up(options)
    conn.send(("ready", None))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if spec is None:
            return
        _load_data(spec, options)
        conn.send(("started", None))
        record = run_spec(spec, options)
        if process_dirty():  # the run left state that could not be put back: a fresh worker takes over
            conn.send(("retired", record))
            return
        conn.send(("done", record))


def _warm_up(options) -> None:
    """One-time costs of any run, paid before the first clock starts: imports, method files."""
    import avalanche.training.supervised  # noqa: F401  (imported lazily by the first run otherwise)
    import avalanche.training.templates  # noqa: F401

    from ...api.registry import get_registry
    from ...run import engine  # noqa: F401

    get_registry(tuple(options.method_files))


def _load_data(spec, options) -> None:
    """Load (and cache) the spec's data set, so the run's clock does not count it."""
    from ...run.datasets import load_dataset

    try:
        load_dataset(spec.dataset.name, options.data_dir, options.download)
    except Exception:  # the run loads it again and records the error as its own failure
        pass


class _Worker:
    """One worker process, its pipe end, and the run it holds (if any)."""

    def __init__(self, ctx, options, setup, counter=None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, options, setup, counter), daemon=True)
        self.proc.start()
        child.close()
        self.ready, self.spec, self.deadline, self.started = False, None, None, False

    def give(self, spec, setup_s: float) -> None:
        """Hand over a spec; until it has started, the deadline is that of loading its data."""
        self.conn.send(spec)
        self.spec, self.deadline, self.started = spec, time.monotonic() + setup_s, False

    def start(self, timeout: float) -> None:
        """The run itself began: its own clock starts now."""
        self.deadline, self.started = time.monotonic() + timeout, True

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
        self.setup_s = setup_limit(self.timeout)
        self.threads = threads_per_run(options, self.jobs)

    def run(self, specs):
        """Yield one record per spec as workers finish or time out."""
        ctx = worker_context()
        setup = worker_setup(self.threads, self.options.device)
        counter = ctx.Value("i", 0) if setup.gpus else None  # which GPU the next worker takes
        todo, workers, deaths, startup_deaths = deque(specs), [], {}, 0
        try:
            while todo or any(w.spec for w in workers):
                while todo and len(workers) < min(self.jobs, len(todo) + sum(bool(w.spec) for w in workers)):
                    workers.append(_Worker(ctx, self.options, setup, counter))
                for w in workers:
                    if w.ready and w.spec is None and todo:
                        w.give(todo.popleft(), self.setup_s)
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
        if message == ("started", None):
            w.start(self.timeout)
            return None, startup_deaths
        if message is not None:
            w.spec, w.deadline = None, None
            if message[0] == "retired":  # it serves no more runs: replaced when one is waiting
                w.kill()
                workers.remove(w)
            return message[1], startup_deaths
        spec, started = w.spec, w.started
        overdue = spec is not None and time.monotonic() >= w.deadline
        w.kill()
        workers.remove(w)
        if spec is None:  # died before serving anything (cannot import torch, out of memory, ...)
            if startup_deaths + 1 >= STARTUP_FAILURES:
                raise RuntimeError(f"worker processes die at start-up (exit code {w.proc.exitcode})")
            return None, startup_deaths + 1
        if overdue:
            return lost_record(spec, self._overdue_message(spec, started), status=Status.TIMEOUT), startup_deaths
        deaths[spec.run_id] = deaths.get(spec.run_id, 0) + 1
        if deaths[spec.run_id] > self.max_retries:
            return lost_record(spec, f"worker process died while running this spec "
                                       f"({deaths[spec.run_id]} times)"), startup_deaths
        todo.appendleft(spec)
        return None, startup_deaths

    def _overdue_message(self, spec, started: bool) -> str:
        if started:
            return f"timed out after {self.timeout:g} s (--run-timeout); its worker process was killed"
        return (f"timed out after {self.setup_s:g} s loading data set {spec.dataset.name!r}, before the run "
                "started (a separate limit from --run-timeout); its worker process was killed")

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
        if w.spec is None:  # idle: let it end itself; one with a run in flight (stopped early) is killed now
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
            w.proc.join(2)
        w.kill()
