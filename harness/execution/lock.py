"""The results folder's lock: one sweep writes a protocol's folder at a time; a stale lock is taken over.

A lock is stale when its holder cannot be running any more: gone, a zombie, another process
that got the same pid (told apart by its start time in /proc), or written on another host.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import SweepError
from ..config.files import read_regular
from ..config.paths import LOCK


class ResultsLock:
    """An exclusive lock on a protocol's results folder; a stale lock is taken over.

    The file reads "PID HOST[,start=TICKS] TIME": TICKS (the holder's process start time)
    tells the holder apart from a later process that got the same pid; TIME is for people.
    Old locks ("PID HOST TIME") are still read.
    """

    _held: set = set()  # lock files this process holds: our own pid in one of them is not stale

    def __init__(self, folder: Path, log=print):
        self.path = Path(folder) / LOCK
        self.log = log

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                # O_EXCL: an existing file or link (even a dangling one) is never opened, let alone followed
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
            except (FileExistsError, IsADirectoryError):  # a folder in its place: EISDIR
                self._handle_existing()
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(_lock_line())
            self._held.add(self._key())
            return self
        raise SweepError(f"{self.path}: could not take the lock")

    def _handle_existing(self):
        # a link, FIFO, socket or folder is not ours: reading it could hang, removing it hides who made it
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
    """Parse a lock file, new or old format; an unreadable one has pid -1. Anything but a regular file
    (a link, FIFO, socket, folder) is NotRegularFile, one OutputError line, before a byte is read."""
    try:
        text = read_regular(path, limit=4096).decode("utf-8", errors="replace")  # a line; never a huge file
    except OSError:  # gone meanwhile, no permission (NotRegularFile is no OSError: it is raised)
        return LockHolder(-1, "?", None, "?")
    try:
        pid_s, host, stamp = (text.split() + ["?", "?", "?"])[:3]
        host, _, start_s = host.partition(",start=")
        return LockHolder(int(pid_s), host, int(start_s) if start_s else None, stamp)
    except ValueError:
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
