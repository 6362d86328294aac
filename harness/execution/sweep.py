"""Running a plan: take the results folder's lock, dispatch the runs, write each record as it arrives."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config.errors import DriverInterrupt, SweepError
from ..config.files import check_links, ensure_dir
from ..config.paths import RUNS
from ..config.specs import Protocol
from ..config.vocabulary import Status
from .executors import RunOptions, make_executor
from .interrupts import signals_interrupt
from .lock import ResultsLock
from .plan import Plan
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

    @property
    def exit_code(self) -> int:
        """0 for a sweep that ran out; 128 + the signal number for one stopped by SIGINT/SIGTERM."""
        return {"SIGINT": 130, "SIGTERM": 143}.get(self.signal, 130) if self.interrupted else 0


def check_writable(results: str | Path, protocol_name: str) -> Path:
    """Fail before any run if the protocol's results folder cannot be written, or holds a link to write through."""
    folder = Path(results) / protocol_name
    try:
        folder = ensure_dir(results, protocol_name)
        check_links(results, f"{protocol_name}/{RUNS}")
        probe = folder / f".write-probe-{os.getpid()}"
        probe.unlink(missing_ok=True)  # a link planted under the probe's name is removed, not written through
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise SweepError(f"{folder}: results folder is not writable ({exc.strerror or exc})") from None
    return folder


def run_sweep(plan: Plan, protocol: Protocol, results: str | Path, options: RunOptions,
              jobs: int = 1, executor: str = "process", progress: bool = True, on_record=(),
              log=print, provenance: dict | None = None, before_first=None) -> SweepResult:
    """Run every spec of the plan that is not done; the driver writes each record as it arrives (with
    `provenance`, e.g. the sweep's command and protocol copy, added to its own; `before_first()` is called
    once, before the first record is written: e.g. the protocol copy the records name; a path it returns is
    removed again if that record cannot be written).

    Ctrl-C (SIGINT) and SIGTERM stop it alike: finished records are kept, the lock is released
    and the result says `interrupted` and which `signal`. A KeyboardInterrupt or SystemExit that a
    method raises is that run's failed record (harness.run.engine), not a stop.
    """
    results = Path(results).absolute()  # now: a run that changes the working directory moves no record
    target = protocol_dir(results, protocol.name)
    created = [p for p in (target / RUNS, target, *target.parents) if not p.exists()]  # innermost first
    result = SweepResult()
    started = time.perf_counter()
    with signals_interrupt() as stop:
        try:
            folder = check_writable(results, protocol.name)
            with ResultsLock(folder, log=log):
                _dispatch(plan, protocol, results, options, jobs, executor, progress, on_record, log, result,
                          stop, provenance or {}, before_first)
        except KeyboardInterrupt:
            result.interrupted, result.signal = True, stop.signal or "SIGINT"
            log(f"\ninterrupted ({result.signal}): {len(result.written)} finished runs are saved; "
                "run the same command to resume")
            _remove_empty(created)  # stopped before the first record: no empty folders either
        except BaseException:  # failed before or while running (a bad checkpoint): leave no empty folders
            _remove_empty(created)
            raise
    result.wall_s = time.perf_counter() - started
    return result


def _remove_empty(folders) -> None:
    """Remove the folders this sweep created that are still empty, innermost first."""
    for path in folders:
        try:
            path.rmdir()
        except FileNotFoundError:  # never made (runs/ before a record)
            continue
        except OSError:  # not empty (a record, another process's file): keep it and what holds it
            return


def _dispatch(plan, protocol, results, options, jobs, executor, progress, on_record, log, result,
              stop=None, provenance: dict | None = None, before_first=None) -> None:
    """Clean the folder, run the plan's specs, write each record as it arrives (the lock is held)."""
    # only the lock holder may touch files: a concurrent sweep's temp files are not stray
    # (the files that are not counted were reported with the plan: service.sweeps.format_plan)
    for path in plan.stray:
        path.unlink(missing_ok=True)
    _prepare_pretrained(plan.todo, options, log)
    bar = _progress_bar(len(plan.todo), progress)
    # `executor`: a name, or an executor object (e.g. a configured RayExecutor)
    runner = executor if hasattr(executor, "run") else make_executor(executor, options, jobs)
    records = runner.run(plan.todo)
    try:
        for record in records:
            if stop is not None and stop.signal:  # a run swallowed the interrupt: its record may be its victim
                raise DriverInterrupt(stop.signal)
            if provenance:  # not in the run id: where the record came from, not what it is
                record = replace(record, provenance={**(record.provenance or {}), **provenance})
            made = before_first() if before_first is not None and not result.written else None
            try:
                path = _write(results, runs_dir(results, protocol.name), record, len(result.written))
            except BaseException:  # e.g. a full disk: no file is left that names or serves no record
                if made is not None:
                    Path(made).unlink(missing_ok=True)
                    _remove_empty([Path(made).parent])
                raise
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


def _write(results, folder: Path, record, n_saved: int) -> Path:
    """write_record, with a failed write (disk full, folder gone read-only) a one-line SweepError."""
    try:
        return write_record(folder, record, root=results)
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
                smoothing=0.1,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}] {postfix}")
