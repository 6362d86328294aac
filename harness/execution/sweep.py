"""Running a plan: take the results folder's lock, dispatch the runs, write each record as it arrives."""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config.specs import Protocol
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
    wall_s: float = 0.0


class ResultsLock:
    """An exclusive lock on a protocol's results folder; a stale lock (dead pid) is taken over."""

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
                fh.write(f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            return self
        raise SweepError(f"{self.path}: could not take the lock")

    def _handle_existing(self):
        try:
            pid_s, host, started = (self.path.read_text().split() + ["?", "?", "?"])[:3]
            pid = int(pid_s)
        except (OSError, ValueError):
            pid, host, started = -1, "?", "?"
        if host == socket.gethostname() and pid > 0 and _alive(pid):
            raise SweepError(f"{self.path.parent}: locked by another cl-bench run (pid {pid}, started "
                             f"{started}); wait for it to finish or stop it")
        self.log(f"note: taking over a stale lock {self.path} (pid {pid} is gone)")
        self.path.unlink(missing_ok=True)

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    """Run every spec of the plan that is not done; the driver writes each record as it arrives."""
    folder = protocol_dir(results, protocol.name)
    check_writable(folder)
    result = SweepResult()
    started = time.perf_counter()
    with ResultsLock(folder, log=log):
        # only the lock holder may touch files: a concurrent sweep's temp files are not stray
        for path, reason in plan.invalid:
            log(f"note: {path} is invalid ({reason}); its run will be redone")
        for path in plan.stray:
            path.unlink(missing_ok=True)
        bar = _progress_bar(len(plan.todo), progress)
        try:
            # `executor`: a name, or an executor object (e.g. a configured RayExecutor)
            runner = executor if hasattr(executor, "run") else make_executor(executor, options, jobs)
            for record in runner.run(plan.todo):
                path = _write(runs_dir(results, protocol.name), record, len(result.written))
                result.written.append(path)
                result.statuses[record.status] = result.statuses.get(record.status, 0) + 1
                if not record.ok:
                    result.failed_ids.append(record.run_id)
                for callback in on_record:
                    callback(record)
                bar.set_postfix_str(_postfix(result.statuses), refresh=False)
                bar.update(1)
        except KeyboardInterrupt:
            result.interrupted = True
            log(f"\ninterrupted: {len(result.written)} finished runs are saved; run the same command to resume")
        finally:
            bar.close()
    result.wall_s = time.perf_counter() - started
    return result


def _write(folder: Path, record, n_saved: int) -> Path:
    """write_record, with a failed write (disk full, folder gone read-only) a one-line SweepError."""
    try:
        return write_record(folder, record)
    except OSError as exc:
        raise SweepError(f"{folder}: cannot write the record of run {record.run_id} "
                         f"({exc.strerror or exc}); {n_saved} finished runs are saved, "
                         "no partial record was left; fix it and rerun to resume") from None


def _postfix(statuses: dict) -> str:
    bad = {k: v for k, v in statuses.items() if k != "ok"}
    return ", ".join(f"{k} {v}" for k, v in bad.items())


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="run", disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                smoothing=0.1, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}] {postfix}")
