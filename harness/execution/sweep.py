"""Running a plan: take the results folder's lock, dispatch the runs, write each record as it arrives."""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..config.specs import Protocol
from ..config.vocabulary import Status
from .executors import RunOptions, make_executor
from .plan import Plan, SweepError
from .store import protocol_dir, runs_dir, write_record


@dataclass
class SweepResult:
    """What a sweep did."""

    written: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    failed_ids: list = field(default_factory=list)  # run ids whose status is not ok
    interrupted: bool = False
    signal: str | None = None  # what interrupted it: "SIGINT" (Ctrl-C) or "SIGTERM"; None if it ran out
    wall_s: float = 0.0


class ResultsLock:
    """An exclusive lock on a protocol's results folder; a stale lock is taken over.

    The file reads "PID HOST[,start=TICKS] TIME": TICKS (the holder's process start time)
    tells the holder apart from a later process that got the same pid; TIME is for people.
    Old locks ("PID HOST TIME") are still read.
    """

    _held: set = set()  # lock files this process holds: our own pid in one of them is not stale

    def __init__(self, folder: Path, log=print):
        self.path = Path(folder) / ".lock"
        self.log = log

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self._handle_existing()
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(_lock_line())
            self._held.add(self._key())
            return self
        raise SweepError(f"{self.path}: could not take the lock")

    def _handle_existing(self):
        holder = _read_lock(self.path)
        reason = None if self._key() in self._held else _stale_reason(holder)
        if reason is None:
            raise SweepError(f"{self.path.parent}: locked by another cl-bench run (pid {holder.pid}, started "
                             f"{holder.time}); wait for it to finish or stop it")
        self.log(f"note: taking over a stale lock {self.path} ({reason})")
        self.path.unlink(missing_ok=True)

    def _key(self) -> str:
        return str(self.path.resolve())

    def __exit__(self, *exc):
        self._held.discard(self._key())
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says about its holder (start is None in old lock files)."""

    pid: int
    host: str
    start: int | None
    time: str


def _lock_line() -> str:
    """The lock file's content for this process."""
    start = process_start(os.getpid())
    host = socket.gethostname() + (f",start={start}" if start is not None else "")
    return f"{os.getpid()} {host} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n"


def _read_lock(path: Path) -> LockHolder:
    """Parse a lock file, new or old format; an unreadable one has pid -1."""
    try:
        pid_s, host, stamp = (path.read_text().split() + ["?", "?", "?"])[:3]
        host, _, start_s = host.partition(",start=")
        return LockHolder(int(pid_s), host, int(start_s) if start_s else None, stamp)
    except (OSError, ValueError):
        return LockHolder(-1, "?", None, "?")


def _stale_reason(holder: LockHolder) -> str | None:
    """Why the lock's holder cannot be running any more, or None if it may be."""
    if holder.pid <= 0:
        return "it is unreadable"
    if holder.host != socket.gethostname():
        return f"it was written on host {holder.host}"  # as before: a pid says nothing about another host
    if holder.pid == os.getpid():  # e.g. the sweep is PID 1 of a container, like the one that left the lock
        return f"pid {holder.pid} is this process"
    if not _alive(holder.pid):
        return f"pid {holder.pid} is gone"
    if holder.start is not None:
        now = process_start(holder.pid)
        if now is not None and now != holder.start:
            return f"pid {holder.pid} is now another process (its start time differs)"
        return None
    if _is_cl_bench(holder.pid) is False:  # an old lock: the best guess is the command line
        return f"pid {holder.pid} is now another process (not cl-bench)"
    return None


def process_start(pid: int) -> int | None:
    """The process's start time (Linux: clock ticks after boot), or None if it cannot be read."""
    fields = _proc_fields(pid)
    if len(fields) > 19:
        return int(fields[19])  # field 22, starttime
    try:  # elsewhere: psutil if it is installed (not a dependency), as centiseconds since the epoch
        import psutil

        return int(psutil.Process(pid).create_time() * 100)
    except Exception:  # ImportError, NoSuchProcess, AccessDenied
        return None


def _is_cl_bench(pid: int) -> bool | None:
    """Whether the process's command line is cl-bench's; None if it cannot be read."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    # last path parts only: a checkout in ~/cl-bench/ must not make every python there look like one
    return any("cl-bench" in a.rsplit("/", 1)[-1] or "harness" in a.rsplit("/", 1)[-1] for a in args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_fields(pid)[:1] != ["Z"]  # a zombie (killed, not yet reaped) holds nothing


def _proc_fields(pid: int) -> list:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or [] where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # the name may hold spaces
    except OSError:
        return []


def check_writable(folder: Path) -> None:
    """Fail before any run if the results folder cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise SweepError(f"{folder}: results folder is not writable ({exc.strerror or exc})") from None


def run_sweep(plan: Plan, protocol: Protocol, results: str | Path, options: RunOptions,
              jobs: int = 1, executor: str = "process", progress: bool = True, on_record=(),
              log=print) -> SweepResult:
    """Run every spec of the plan that is not done; the driver writes each record as it arrives.

    Ctrl-C (SIGINT) and SIGTERM stop it alike: finished records are kept, the lock is released
    and the result says `interrupted` and which `signal`.
    """
    folder = protocol_dir(results, protocol.name)
    check_writable(folder)
    result = SweepResult()
    started = time.perf_counter()
    with _signals_interrupt() as stop:
        try:
            with ResultsLock(folder, log=log):
                _dispatch(plan, protocol, results, options, jobs, executor, progress, on_record, log, result)
        except KeyboardInterrupt:
            result.interrupted, result.signal = True, stop.signal or "SIGINT"
            log(f"\ninterrupted ({result.signal}): {len(result.written)} finished runs are saved; "
                "run the same command to resume")
    result.wall_s = time.perf_counter() - started
    return result


def _dispatch(plan, protocol, results, options, jobs, executor, progress, on_record, log, result) -> None:
    """Clean the folder, run the plan's specs, write each record as it arrives (the lock is held)."""
    # only the lock holder may touch files: a concurrent sweep's temp files are not stray
    # (the files that are not counted were reported with the plan: cli.commands.format_plan)
    for path in plan.stray:
        path.unlink(missing_ok=True)
    _prepare_pretrained(plan.todo, options, log)
    bar = _progress_bar(len(plan.todo), progress)
    # `executor`: a name, or an executor object (e.g. a configured RayExecutor)
    runner = executor if hasattr(executor, "run") else make_executor(executor, options, jobs)
    records = runner.run(plan.todo)
    try:
        for record in records:
            path = _write(runs_dir(results, protocol.name), record, len(result.written))
            result.written.append(path)
            result.statuses[record.status] = result.statuses.get(record.status, 0) + 1
            if not record.ok:
                result.failed_ids.append(record.run_id)
            for callback in on_record:
                callback(record)
            bar.set_postfix_str(_postfix(result.statuses), refresh=False)
            bar.update(1)
    finally:
        getattr(records, "close", lambda: None)()  # stop the workers now, before the lock goes
        bar.close()


def _prepare_pretrained(specs, options: RunOptions, log) -> None:
    """Compute each pretrained backbone the runs need once, here, before workers start (cached by content)."""
    backbones = [s for s in specs if s.pretrain.is_backbone]
    if not backbones:
        return
    from ..run.engine import resolve_device
    from ..run.pretrain import prepare_pretrained

    prepare_pretrained(backbones, data_dir=options.data_dir,
                       download=options.download, device=str(resolve_device(options.device)), log=log)


class _Stop:
    """Which signal stopped the sweep (None: none, or a KeyboardInterrupt not raised by our handler)."""

    signal: str | None = None


@contextmanager
def _signals_interrupt():
    """While the sweep runs, SIGTERM raises KeyboardInterrupt like Ctrl-C does (main thread only)."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be set from the main thread
        return

    def handler(signum, frame):
        if stop.signal is None:  # once: a second signal must not break the clean-up after the first
            stop.signal = signal.Signals(signum).name
            raise KeyboardInterrupt

    caught = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # leave a caller's own handler be
        caught.append(signal.SIGINT)
    previous = {sig: signal.signal(sig, handler) for sig in caught}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _write(folder: Path, record, n_saved: int) -> Path:
    """write_record, with a failed write (disk full, folder gone read-only) a one-line SweepError."""
    try:
        return write_record(folder, record)
    except OSError as exc:
        raise SweepError(f"{folder}: cannot write the record of run {record.run_id} "
                         f"({exc.strerror or exc}); {n_saved} finished runs are saved, "
                         "no partial record was left; fix it and rerun to resume") from None


def _postfix(statuses: dict) -> str:
    bad = {k: v for k, v in statuses.items() if k != Status.OK}
    return ", ".join(f"{k} {v}" for k, v in bad.items())


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="run", disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                smoothing=0.1, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}] {postfix}")
