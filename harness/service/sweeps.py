"""The services that run the engine over a grid: `run` a protocol, `submit` a method file, `reproduce` a record.

Progress goes to `log` as it happens (the plan before the sweep, the summary after it); what
was done comes back as a typed outcome. Heavy modules are imported inside the functions, so
importing the service (and the CLI on top of it) stays fast and torch-free.
"""
from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.errors import SweepError
from .records import build_leaderboard, print_summary, refuse_record_area
from .requests import ReproduceRequest, SubmitRequest, SweepRequest

if TYPE_CHECKING:
    from ..config.specs import Protocol
    from ..execution.check import CheckResult
    from ..execution.plan import Plan
    from ..execution.reproduce import Reproduction
    from ..execution.sweep import SweepResult

Log = Callable[[str], None]


@dataclass(frozen=True)
class SweepOutcome:
    """What `run` did: the protocol and its plan; the sweep and the site it built (None in a dry run)."""

    protocol: Protocol
    plan: Plan
    result: SweepResult | None = None
    site: Path | None = None

    @property
    def exit_code(self) -> int:
        """0 unless a signal stopped the sweep (then 128 + its number)."""
        return self.result.exit_code if self.result else 0


@dataclass(frozen=True)
class SubmitOutcome:
    """What `submit` did: the contract check and, when it held, the method's sweep."""

    check: CheckResult
    method: str | None = None
    sweep: SweepOutcome | None = None
    errors: tuple = ()  # when no run finished ok: (one-line error, how many runs), most frequent first

    @property
    def exit_code(self) -> int:
        """2 for a broken contract, at least 1 when no run finished ok, else the sweep's."""
        if not self.check.ok:
            return 2
        return max(self.sweep.exit_code, 1) if self.errors else self.sweep.exit_code


def run(req: SweepRequest, log: Log = print) -> SweepOutcome:
    """Plan a protocol's grid and say what it holds; unless a dry run, run what is left, then the
    summary and the leaderboard."""
    from ..execution.plan import plan_sweep

    req = absolute_paths(req)
    _start_workers_early(req)
    protocol = _load(req)
    plan = plan_sweep(protocol, req.results, data_dir=req.data_dir, download=req.download, dry_run=req.dry_run,
                      retry_failed=req.retry_failed, only=req.only)
    log(format_plan(protocol, plan, req.results, req.rope))
    if req.dry_run:
        return SweepOutcome(protocol, plan)
    return _sweep_and_report(req, protocol, plan, _options(req, protocol), log,
                             provenance=_sweep_entry(req, protocol, "run"))


def submit(req: SubmitRequest, log: Log = print) -> SubmitOutcome:
    """Check a method file; if the contract holds, run the protocol's grid with it added (the baselines first
    where missing, unless `baselines` is off; its records marked with the file's sha256), then the whole
    grid's summary and leaderboard."""
    from ..execution.check import check
    from ..execution.submission import prepare

    s = absolute_paths(req.sweep)
    _start_workers_early(s)
    checked = check(req.file, device=req.check_device)
    if not checked.ok:
        return SubmitOutcome(checked)
    log("\n".join(checked.passed))
    log(checked.verdict())
    sub = prepare(req.file, s.protocol, s.results, datasets=s.datasets, regimes=s.regimes, orders=s.orders,
                  data_dir=s.data_dir, download=s.download, dry_run=s.dry_run, retry_failed=s.retry_failed,
                  files=s.plugin_files, baselines=req.baselines)
    log(f"\nsubmission {sub.method!r} from {sub.file} (sha256 {sub.info['sha256'][:16]}...)")
    log(format_plan(sub.protocol, sub.plan, s.results, s.rope))
    log(_baselines_line(sub))
    if s.dry_run:
        return SubmitOutcome(checked, sub.method, SweepOutcome(sub.protocol, sub.plan))
    options = replace(_options(s, sub.protocol, submission=sub.info), submission_method=sub.method)
    entry = _sweep_entry(s, sub.protocol, "submit", method_file=req.file, baselines=req.baselines)
    outcome = _sweep_and_report(s, sub.protocol, sub.plan, options, log, grid=sub.grid, of=sub.method,
                                provenance=entry)
    result = outcome.result
    own = [Path(path).stem for path in result.written if Path(path).stem in sub.own_ids()]
    ok = [rid for rid in own if rid not in set(result.failed_ids)]
    errors = () if not own or ok else _distinct_errors(s.results, sub.protocol.name, own)
    return SubmitOutcome(checked, sub.method, outcome, errors)


def _baselines_line(sub) -> str:
    """What the submission is ranked against: the baseline records there, and whether the missing ones run."""
    there, total = sub.baseline_counts()
    if not total:
        return "baselines: the protocol has no other method under these filters" + (
            f"; {len(sub.others)} records of other submitted files are ranked" if sub.others else "")
    missing = total - there
    then = ("" if not missing else "; the missing ones run first" if sub.baselines
            else "; the missing ones are not run (--no-baselines): the ranking uses the records there")
    others = f"; {len(sub.others)} records of other submitted files are ranked too" if sub.others else ""
    return f"baselines: {there} of {total} runs of the protocol's own methods are recorded{then}{others}"


def reproduce(req: ReproduceRequest) -> Reproduction:
    """Rerun one record (its own spec and data; method code from the files the request names) and compare."""
    from ..execution.reproduce import reproduce as rerun

    if req.out:  # the rerun's record would replace the very record it is compared with
        refuse_record_area(req.results, req.out, "--out")
    return rerun(req.run_id, req.results, data_dir=req.data_dir, device=req.device, out=req.out,
                 method_files=req.method_files, plugin_files=req.plugin_files)


def absolute_paths(req: SweepRequest) -> SweepRequest:
    """The request with the paths it reads made absolute now, so that nothing later depends on the working
    directory (the results folder is shown as given; the sweep writes to its absolute path)."""
    def absolute(path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def existing(path: str) -> str:  # names (a protocol's, a missing file's) stay as given for the error
        return absolute(path) if os.path.exists(os.path.expanduser(path)) else path

    return replace(req, protocol=existing(req.protocol),
                   data_dir=req.data_dir and absolute(req.data_dir),
                   method_files=tuple(existing(f) for f in req.method_files),
                   plugin_files=tuple(existing(f) for f in req.plugin_files))


def _load(req: SweepRequest):
    from ..api.registry import get_registry
    from ..config.protocol import load_protocol, select

    protocol = load_protocol(req.protocol, get_registry((*req.method_files, *req.plugin_files)))
    return select(protocol, datasets=req.datasets, methods=req.methods, regimes=req.regimes,
                  orders=req.orders)


def _options(req: SweepRequest, protocol, submission: dict | None = None):
    """The per-run options of a sweep request (after checking its device exists); the workers register
    the request's method and plug-in files and the protocol's plug-in files."""
    from ..execution.executors import RunOptions
    from ..run.engine import resolve_device

    try:
        resolve_device(req.device)
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    return RunOptions(data_dir=req.data_dir, download=req.download, device=req.device,
                      method_files=(*req.method_files, *req.plugin_files, *protocol.plugin_files),
                      timeout=req.run_timeout, threads=req.threads,
                      submission=submission)


def _start_workers_early(req: SweepRequest) -> None:
    """A sweep that runs in worker processes starts their fork server first: it imports the stack
    while this process loads the registry and plans."""
    from ..execution.executors import uses_worker_processes

    if not req.dry_run and uses_worker_processes(req.executor, req.jobs, req.run_timeout):
        from ..execution.executors.base import start_worker_server

        start_worker_server()


def _sweep_entry(req: SweepRequest, protocol, command: str, method_file: str | None = None,
                 baselines: bool = True) -> dict:
    """The records' `provenance["sweep"]`: the command, the filters, the copy of the protocol file (written
    before the sweep's first record: `_sweep_and_report`)."""
    from ..execution.protocol_files import protocol_copy, sweep_provenance

    copy, sha256, _ = protocol_copy(protocol)
    return {"sweep": sweep_provenance(command, copy, sha256, datasets=req.datasets, regimes=req.regimes,
                                      methods=req.methods if command == "run" else None, orders=req.orders,
                                      only=req.only if command == "run" else None, method_file=method_file,
                                      baselines=baselines)}


def _sweep_and_report(req: SweepRequest, protocol, plan, options, log: Log, grid: dict | None = None,
                      of: str = "", provenance: dict | None = None) -> SweepOutcome:
    """Run the plan (its records carry `provenance`), then the end-of-sweep report, summary table and
    leaderboard of `grid` (run id -> RunSpec; default the plan's)."""
    from ..config.text import terminal_safe
    from ..execution.protocol_files import relative_references, save_protocol_file

    def keep_protocol_file():
        # the driver calls this before it writes the first record: no record names a copy that a crash left
        # unwritten, and the copy holds the bytes whose hash the records carry (an edit since loading is refused);
        # it gets back the copy only where this call made it, to take it back if that first record fails
        made = not (Path(req.results) / protocol.name / provenance["sweep"]["protocol_file"]).is_file()
        copy = save_protocol_file(req.results, protocol, provenance["sweep"]["protocol_sha256"])
        relative = relative_references(copy.read_bytes())
        if relative:
            log(terminal_safe(f"note: {protocol.source} names {', '.join(relative)} relative to its folder; the "
                              f"copy {copy} resolves them relative to its own: put them beside it to rerun from it"))
        return copy if made else None

    result = _run_tracked(plan, protocol, req, options, log, provenance,
                          before_first=keep_protocol_file if provenance else None)
    grid = grid if grid is not None else {s.run_id: s for s in plan.specs}
    mine = f" ({sum(1 for path in result.written if grid[Path(path).stem].method == of)} of {of!r})" if of else ""
    log(f"\n{len(result.written)} runs{mine} finished in {result.wall_s:.1f} s "
        f"({_statuses(result.statuses)}); records in {Path(req.results) / protocol.name / 'runs'}")
    _rerun_hint(result, req.results, log)
    print_summary(req.results, protocol.name, protocol.version, grid, include_flagged=req.include_flagged,
                  rope=req.rope)
    site = None
    if req.leaderboard:
        # the summary above has said what the view leaves out
        site = build_leaderboard(req.results, protocol.name, version=protocol.version, grid=grid, log=lambda _: None,
                                 include_flagged=req.include_flagged, rope=req.rope)
    return SweepOutcome(protocol, plan, result, site)


def _rerun_hint(result, results, log: Log) -> None:
    """For a sweep with failures: how to retry them, and how to rerun one alone."""
    from ..config.errors import UserError
    from ..execution.reproduce import find_record, reproduce_command

    if result.failed_ids:
        run_id = result.failed_ids[0]
        try:
            record = find_record(run_id, results)[0]
        except UserError:  # the hint then names no --method/--plugin files
            record = None
        log(f"{len(result.failed_ids)} runs did not finish ok: the same command with --retry-failed reruns "
            f"them; one alone, compared with its record: {reproduce_command(run_id, str(results), record)}")


def _run_tracked(plan, protocol, req: SweepRequest, options, log: Log, provenance: dict | None = None,
                 before_first=None):
    """run_sweep with the executor the request asks for, mirrored into MLflow unless `mlflow` is off."""
    from ..execution.sweep import run_sweep
    from ..outputs.tracking import make_tracker

    executor = _executor(req, protocol, options)
    tracker = make_tracker(req.results, protocol, plan, req.tracking_uri, req.experiment) if req.mlflow else None
    if tracker:
        log(f"mlflow: experiment {tracker.experiment!r} at {tracker.uri} "
            f"(browse: mlflow ui --backend-store-uri {shlex.quote(tracker.uri)})")
    try:
        result = run_sweep(plan, protocol, req.results, options, jobs=req.jobs, executor=executor,
                           progress=req.progress, on_record=(tracker.log_record,) if tracker else (),
                           provenance=provenance, before_first=before_first)
    except BaseException:
        if tracker:
            tracker.abort()
        raise
    if tracker:
        tracker.finish(interrupted=result.interrupted)
    return result


def _executor(req: SweepRequest, protocol, options):
    """The executor of `--executor` with its retries and, for Ray, address and resources."""
    from ..execution.executors import make_executor

    ray_flags = {"--ray-address": req.ray_address, "--num-cpus": req.num_cpus, "--num-gpus": req.num_gpus}
    if req.executor == "ray" and options.timeout:
        raise SweepError("--run-timeout: not supported with --executor ray; use --executor process")
    if req.executor != "ray":
        given = [flag for flag, value in ray_flags.items() if value is not None]
        if given:
            raise SweepError(f"{given[0]}: only applies to --executor ray (got --executor {req.executor})")
        return make_executor(req.executor, options, req.jobs, max_retries=req.max_retries)
    from ..execution.executors.ray import RayOptions

    res = protocol.resources or {}
    pick = lambda flag, key, default: next(  # noqa: E731
        v for v in (ray_flags[flag], res.get(key), default) if v is not None)
    ray_options = RayOptions(address=req.ray_address, num_cpus=float(pick("--num-cpus", "num_cpus", 1.0)),
                             num_gpus=float(pick("--num-gpus", "num_gpus", 0.0)), max_retries=req.max_retries)
    return make_executor("ray", options, req.jobs, max_retries=req.max_retries, ray_options=ray_options)


def _statuses(statuses: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(statuses.items())) or "nothing to do"


def _restricted(protocol) -> str:
    """How many method x regime pairs the protocol leaves out (a method's `regimes:`), if any."""
    counts = [(m.display, len(set(m.regimes) & set(protocol.regimes)))
              for m in protocol.methods if m.regimes is not None]
    out = [f"{name} on {n} of {len(protocol.regimes)}" for name, n in counts if n < len(protocol.regimes)]
    return f" (methods restricted to some regimes: {', '.join(out)})" if out else ""


def format_plan(protocol, plan, results, rope: float = 1.0) -> str:
    """The grid: counts per axis, total runs, runs already done, every file not counted, and
    the tests this design cannot decide (design power)."""
    from ..analysis.power import plan_power_lines
    from ..config.text import terminal_safe

    c = plan.counts()
    lines = [terminal_safe(f"protocol {protocol.name} v{protocol.version} ({protocol.source})"),
             *(terminal_safe(f"warning: {note}") for note in protocol.notes),
             f"grid: {c['datasets']} datasets x {c['regimes']} regimes x {c['methods']} methods x "
             f"{c['orders']} task orders x {c['seeds']} seeds = {c['total']} runs{_restricted(protocol)}",
             terminal_safe(f"done: {c['done']}   to run: {c['todo']}   results: {Path(results) / protocol.name}")]
    if plan.missing_data:
        n = sum(1 for s in plan.specs if s.dataset.name in plan.missing_data)
        lines.append(terminal_safe(f"not planned: {n} runs of {', '.join(plan.missing_data)}, whose files are not "
                                   "there (run ids include the data's fingerprint; --data-dir, --download)"))
    if plan.missing_weights:
        lines.append(terminal_safe(f"weights missing: {plan.missing_weights}; run ids shown are without their sha256"))
    lines += [terminal_safe(f"note: {path} is invalid ({reason}); its run will be redone")
              for path, reason in plan.invalid]
    lines += [terminal_safe(f"note: {path} is foreign ({reason}); it is not counted") for path, reason in plan.foreign]
    if plan.invalid:
        lines.append(f"invalid record files (will be redone): {len(plan.invalid)}")
    if plan.foreign:
        lines.append(f"foreign record files (never counted): {len(plan.foreign)}")
    # seeds are averaged within an order, so the paired blocks of every test are the orders
    lines += plan_power_lines(c["orders"], c["methods"], c["regimes"], rope / 100.0)
    return "\n".join(lines)


def _distinct_errors(results, protocol_name: str, run_ids) -> tuple[tuple[str, int], ...]:
    """(one-line error, how many runs) of the given records, most frequent first."""
    from ..config.text import terminal_safe
    from ..execution.store import read_record, runs_dir

    errors = Counter()
    for run_id in run_ids:
        record, _ = read_record(runs_dir(results, protocol_name) / f"{run_id}.json", protocol_name)
        errors[terminal_safe(record.error or record.status) if record else "(record unreadable)"] += 1
    return tuple(errors.most_common())
