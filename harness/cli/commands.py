"""The commands: each takes its typed request (cli.requests) and composes library calls."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..config.vocabulary import Status
from .requests import (CheckRequest, ExportRequest, FiguresRequest, LeaderboardRequest, ListRequest,
                       ReportRequest, ReproduceRequest, SubmitRequest, SweepRequest)


def _load(req: SweepRequest):
    from ..config.protocol import load_protocol, select
    from ..api.registry import get_registry

    protocol = load_protocol(req.protocol, get_registry(req.method_files))
    return select(protocol, datasets=req.datasets, methods=req.methods, regimes=req.regimes,
                  orders=req.orders)


def _options(req: SweepRequest, protocol, submission: dict | None = None):
    """The per-run options of a sweep request (after checking its device exists); the workers register
    the protocol's plug-in files with the request's method and plug-in files."""
    from ..execution.executors import RunOptions
    from ..execution.plan import SweepError
    from ..run.engine import resolve_device

    try:
        resolve_device(req.device)
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    return RunOptions(data_dir=req.data_dir, download=req.download, device=req.device,
                      method_files=(*req.method_files, *protocol.plugin_files), timeout=req.run_timeout,
                      threads=req.threads,
                      submission=submission)


def plan_sweep(req: SweepRequest, protocol, retry_failed: bool | None = None):
    """The plan of a sweep request: data fingerprinted first (downloaded if asked, except in a dry run,
    which plans without the data sets that are not there)."""
    from ..execution.plan import data_fingerprints, make_plan

    fingerprints = data_fingerprints(protocol, req.data_dir, req.download and not req.dry_run,
                                     allow_missing=req.dry_run)
    retry = req.retry_failed if retry_failed is None else retry_failed
    return make_plan(protocol, req.results, retry_failed=retry, only=req.only, fingerprints=fingerprints)


def _start_workers_early(req: SweepRequest) -> None:
    """A sweep that runs in worker processes starts their fork server first: it imports the stack
    while this process loads the registry and plans."""
    from ..execution.executors import uses_worker_processes

    if not req.dry_run and uses_worker_processes(req.executor, req.jobs, req.run_timeout):
        from ..execution.executors.base import start_worker_server

        start_worker_server()


def run_command(req: SweepRequest) -> int:
    """Plan, optionally print the grid, run what is left, print the summary, build the site."""
    _start_workers_early(req)
    protocol = _load(req)
    plan = plan_sweep(req, protocol)
    print(format_plan(protocol, plan, req.results, req.rope))
    if req.dry_run:
        return 0
    return _exit_code(_sweep_and_report(req, protocol, plan, _options(req, protocol)))


def _sweep_and_report(req: SweepRequest, protocol, plan, options, of: str = ""):
    """Run the plan, then the end-of-sweep report, summary table and leaderboard."""
    result = _run_tracked(plan, protocol, req, options)
    print(f"\n{len(result.written)} runs{of} finished in {result.wall_s:.1f} s "
          f"({_statuses(result.statuses)}); records in {Path(req.results) / protocol.name / 'runs'}")
    _print_rerun_hint(result, req.results)
    grid = {s.run_id for s in plan.specs}
    print_summary(req.results, protocol.name, protocol.version, grid, include_flagged=req.include_flagged,
                  rope=req.rope)
    if req.leaderboard:
        # the summary above has said what the view leaves out
        build_leaderboard(req.results, protocol.name, version=protocol.version, grid=grid, log=lambda _: None,
                          include_flagged=req.include_flagged, rope=req.rope)
    return result


def _print_rerun_hint(result, results) -> None:
    """For a sweep with failures: how to retry them, and how to rerun one alone."""
    from ..execution.reproduce import reproduce_command

    if result.failed_ids:
        print(f"{len(result.failed_ids)} runs did not finish ok: the same command with --retry-failed reruns "
              f"them; one alone, compared with its record: {reproduce_command(result.failed_ids[0], str(results))}")


def _run_tracked(plan, protocol, req: SweepRequest, options):
    """run_sweep with the executor the request asks for, mirrored into MLflow unless --no-mlflow."""
    from ..execution.sweep import run_sweep
    from ..outputs.tracking import make_tracker

    executor = _executor(req, protocol, options)
    tracker = make_tracker(req.results, protocol, plan, req.tracking_uri, req.experiment) if req.mlflow else None
    if tracker:
        print(f"mlflow: experiment {tracker.experiment!r} at {tracker.uri} "
              f"(browse: mlflow ui --backend-store-uri {shlex.quote(tracker.uri)})")
    try:
        result = run_sweep(plan, protocol, req.results, options, jobs=req.jobs, executor=executor,
                           progress=req.progress, on_record=(tracker.log_record,) if tracker else ())
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
    from ..execution.plan import SweepError

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
    counts = [(m.display, len(set(m.regimes) & set(protocol.regimes))) for m in protocol.methods if m.regimes is not None]
    out = [f"{name} on {n} of {len(protocol.regimes)}" for name, n in counts if n < len(protocol.regimes)]
    return f" (methods restricted to some regimes: {', '.join(out)})" if out else ""


def format_plan(protocol, plan, results, rope: float = 1.0) -> str:
    """The grid: counts per axis, total runs, runs already done, every file not counted, and
    the tests this design cannot decide (design power)."""
    from ..analysis.power import plan_power_lines
    from ..config.text import terminal_safe

    c = plan.counts()
    lines = [terminal_safe(f"protocol {protocol.name} v{protocol.version} ({protocol.source})"),
             f"grid: {c['datasets']} datasets x {c['regimes']} regimes x {c['methods']} methods x "
             f"{c['orders']} task orders x {c['seeds']} seeds = {c['total']} runs{_restricted(protocol)}",
             terminal_safe(f"done: {c['done']}   to run: {c['todo']}   results: {Path(results) / protocol.name}")]
    if plan.missing_data:
        n = sum(1 for s in plan.specs if s.dataset.name in plan.missing_data)
        lines.append(terminal_safe(f"not planned: {n} runs of {', '.join(plan.missing_data)}, whose files are not "
                                   "there (run ids include the data's fingerprint; --data-dir, --download)"))
    lines += [terminal_safe(f"note: {path} is invalid ({reason}); its run will be redone") for path, reason in plan.invalid]
    lines += [terminal_safe(f"note: {path} is foreign ({reason}); it is not counted") for path, reason in plan.foreign]
    if plan.invalid:
        lines.append(f"invalid record files (will be redone): {len(plan.invalid)}")
    if plan.foreign:
        lines.append(f"foreign record files (never counted): {len(plan.foreign)}")
    # seeds are averaged within an order, so the paired blocks of every test are the orders
    lines += plan_power_lines(c["orders"], c["methods"], c["regimes"], rope / 100.0)
    return "\n".join(lines)


def print_summary(results, protocol_name: str, version: str | None = None, grid=None,
                  include_flagged: bool = False, rope: float = 1.0) -> None:
    """Method x regime summary (mean ACC / forgetting, flagged runs marked) of one protocol version's
    records, and the tests its blocks cannot decide."""
    from ..analysis.frame import format_summary, records_to_frame
    from ..analysis.tables import power_summary
    from ..execution.store import load_records
    from ..execution.views import view_records

    print()
    records = view_records(load_records(results, protocol_name), version, grid)
    if records:
        frame = records_to_frame(records, include_flagged)
        print(format_summary(frame))
        print("\n".join(["", *power_summary(frame, rope)]))


def build_leaderboard(results, protocol_name: str, out: str | None = None, version: str | None = None,
                      grid=None, log=print, include_flagged: bool = False, rope: float = 1.0) -> Path | None:
    """Build the static site for one protocol version's records; prints and returns index.html's path."""
    from ..execution.store import load_records, protocol_dir
    from ..execution.views import view_records
    from ..outputs.site import build_site

    records = view_records(load_records(results, protocol_name, log=log if grid is None else None),
                           version, grid, log=log)
    if not records:
        print(f"leaderboard: no records under {protocol_dir(results, protocol_name)}")
        return None
    target = Path(out) if out else protocol_dir(results, protocol_name) / "site"
    index = build_site(records, target, results_dir=str(results), include_flagged=include_flagged, rope=rope)
    print(f"leaderboard: {Path(index).resolve()}")
    return Path(index)


def leaderboard_command(req: LeaderboardRequest) -> int:
    """`cl-bench leaderboard`: one site per protocol found under --results."""
    from ..execution.plan import SweepError
    from ..execution.store import discover_protocol_dirs, runs_dir

    if req.from_mlflow:
        return leaderboard_from_mlflow(req)
    names = [req.protocol] if req.protocol else [p.name for p in discover_protocol_dirs(req.results)]
    if not names:
        raise SweepError(f"--results: no records found under {req.results} "
                         "(expected <results>/<protocol>/runs/*.json)")
    if req.out and len(names) > 1:
        raise SweepError(f"--out: {len(names)} protocols found ({', '.join(names)}); add --protocol NAME")
    if req.protocol and not runs_dir(req.results, req.protocol).is_dir():
        raise SweepError(f"--protocol: no records of protocol {req.protocol!r} under {req.results} "
                         f"(expected {runs_dir(req.results, req.protocol)}/*.json)")
    built = [build_leaderboard(req.results, n, req.out, version=req.protocol_version,
                               include_flagged=req.include_flagged, rope=req.rope) for n in names]
    return 0 if all(built) else 1


def leaderboard_from_mlflow(req: LeaderboardRequest) -> int:
    """`cl-bench leaderboard --from-mlflow URI --experiment NAME`: the site of an MLflow experiment."""
    from ..execution.plan import SweepError
    from ..outputs.export import records_from_mlflow
    from ..outputs.site import build_site

    experiment = req.experiment or req.protocol
    if not experiment:
        raise SweepError("--from-mlflow: name the MLflow experiment with --experiment NAME")
    from ..execution.views import view_records

    found = records_from_mlflow(req.from_mlflow, experiment)
    if not found:
        raise SweepError(f"--from-mlflow: experiment {experiment!r} at {req.from_mlflow} "
                         "holds no cl-bench records")
    records = view_records(found, req.protocol_version)
    target = Path(req.out) if req.out else Path(req.results) / f"mlflow-{experiment}" / "site"
    index = build_site(records, target, include_flagged=req.include_flagged, rope=req.rope)
    print(f"leaderboard: {len(records)} records from MLflow experiment {experiment!r}: {Path(index).resolve()}")
    return 0


def export_command(req: ExportRequest) -> int:
    """`cl-bench export`: the tidy table (one row per record) as CSV or Parquet."""
    from ..execution.plan import SweepError
    from ..execution.store import load_records
    from ..execution.views import view_records
    from ..outputs.export import export_table

    records = view_records(load_records(req.results, req.protocol, log=print), req.protocol_version)
    if not records:
        where = Path(req.results) / (req.protocol or "<protocol>") / "runs"
        raise SweepError(f"--results: no records found under {where}")
    folder = Path(req.results) / req.protocol if req.protocol else Path(req.results)
    out = Path(req.out) if req.out else folder / f"records.{req.format}"
    path = export_table(records, req.format, out)
    print(f"export: {len(records)} records -> {path}")
    return 0


def paper_records(results, protocol: str | None, version: str | None, log=print) -> list:
    """The records of one protocol version under --results, checked as `export` checks them."""
    from ..execution.plan import SweepError
    from ..execution.store import load_records
    from ..execution.views import view_records

    records = load_records(results, protocol, log=log)
    if not records:
        where = Path(results) / (protocol or "<protocol>") / "runs"
        raise SweepError(f"--results: no records found under {where}")
    names = sorted({r.spec.protocol for r in records})
    if len(names) > 1:  # a paper table compares cells of one protocol, never two protocols' settings
        raise SweepError(f"--protocol: {len(names)} protocols found under {results} ({', '.join(names)}); "
                         "add --protocol NAME")
    return view_records(records, version, log=log)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def report_command(req: ReportRequest) -> int:
    """`cl-bench report`: the paper tables (LaTeX or Markdown) of one protocol version, to --out or stdout."""
    from ..analysis.tables import analyse
    from ..config.text import terminal_safe
    from ..outputs.report import report_latex, report_markdown

    # With the report on stdout, notes go to stderr: `cl-bench report ... > t.md` keeps the table clean.
    records = paper_records(req.results, req.protocol, req.protocol_version, log=print if req.out else _to_stderr)
    tables = analyse(records, include_flagged=req.include_flagged, rope=req.rope)
    text = (report_latex if req.format == "latex" else report_markdown)(tables, metric=req.metric)
    if not req.out:
        sys.stdout.write(text)
        return 0
    out = Path(req.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(terminal_safe(f"report: {len(records)} records -> {out}"))
    return 0


def figures_command(req: FiguresRequest) -> int:
    """`cl-bench figures`: the paper figures (PDF/PNG per dataset) of one protocol version; one line per file."""
    from ..analysis.tables import analyse
    from ..config.text import terminal_safe
    from ..outputs.figures import write_figures

    records = paper_records(req.results, req.protocol, req.protocol_version)
    tables = analyse(records, include_flagged=req.include_flagged)
    written = write_figures(tables, req.out, req.formats, log=lambda path: print(terminal_safe(f"figures: {path}")))
    if not written:
        print("figures: nothing to draw (no ok runs)")
    return 0


def list_command(req: ListRequest) -> int:
    """`cl-bench list [what]`."""
    sections = ("protocols", "datasets", "methods", "regimes") if req.what == "all" else (req.what,)
    for section in sections:
        print(f"{section}:")
        for line in LISTERS[section](req):
            print(f"  {line}")
    return 0


def _list_protocols(req: ListRequest):
    import yaml

    from ..config.protocol import available_protocols, resolve_protocol_path

    for name in available_protocols():
        try:
            raw = yaml.safe_load(resolve_protocol_path(name).read_text()) or {}
        except Exception:  # listing must not die on one broken file
            raw = {}
        desc = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
        yield f"{name:<20} v{raw.get('version', '?'):<5} {desc}"


def _list_datasets(req: ListRequest):
    from ..config.vocabulary import DATASETS

    for name, facts in DATASETS.items():
        where = "embedded" if facts.source == "embedded" else "torchvision (--data-dir, --download)"
        yield f"{name:<14} {facts.n_classes:>3} classes  default model {facts.default_model:<17} {where}"
    yield "npz:PATH       your own arrays x_train, y_train, x_test, y_test"


def _list_methods(req: ListRequest):
    # metadata by content hash: importing every adapter (torch, Avalanche) takes seconds
    from ..api.index import method_infos

    for m in sorted(method_infos(req.method_files), key=lambda m: m["name"]):
        hp = ", ".join(f"{k}={v}" for k, v in m["defaults"].items()) or "-"
        yield f"{m['name']:<16} {m['description'][:60]:<60} [{hp}]  ({m['source']})"


def _list_regimes(req: ListRequest):
    from ..config.vocabulary import FAMILY_DESCRIPTIONS, MODELS

    yield "head       train the task heads only"
    yield "last-k     train the last k blocks + heads (k = 1, 2, 3, ... up to the model's depth)"
    yield "full       train every block + heads"
    yield "bitfit     train the biases of every block + heads (last-k:bitfit: of the last k blocks)"
    yield "norm       train the normalisation layers' scale and shift + heads (last-k:norm)"
    yield "lora-rR    train rank-R LoRA adapters on every Linear/Conv, base frozen + heads (last-k:lora-rR)"
    yield "families: " + "; ".join(f"{f}: {d}" for f, d in FAMILY_DESCRIPTIONS.items())
    yield "models: " + ", ".join(f"{name} ({facts.n_blocks} blocks)" for name, facts in MODELS.items())


LISTERS = {"protocols": _list_protocols, "datasets": _list_datasets, "methods": _list_methods,
           "regimes": _list_regimes}


def check_command(req: CheckRequest) -> int:
    """`cl-bench check FILE`: the adapter contract; 0 when it holds, 2 otherwise."""
    from ..execution.check import check

    result = check(req.file, device=req.device)
    if result.ok:
        print("\n".join(result.passed))
        print(f"{req.file}: the {result.contract} contract holds ({len(result.passed)} checks passed)")
        return 0
    for finding in result.findings:
        print(finding.format(), file=sys.stderr)
    print(f"{req.file}: the {result.contract} contract is broken ({len(result.findings)} problem(s)); "
          "see submissions/README.md", file=sys.stderr)
    return 2


def submit_command(req: SubmitRequest) -> int:
    """`cl-bench submit FILE --protocol NAME`: check, run the method's grid, rebuild the leaderboard."""
    from ..execution.submission import prepare

    _start_workers_early(req.sweep)
    if check_command(CheckRequest(req.file, req.check_device)) != 0:
        return 2
    s = req.sweep
    sub = prepare(req.file, s.protocol, s.results, datasets=s.datasets, regimes=s.regimes,
                  orders=s.orders, plan=lambda protocol: plan_sweep(s, protocol), files=s.method_files)
    print(f"\nsubmission {sub.method!r} from {sub.file} (sha256 {sub.info['sha256'][:16]}...)")
    print(format_plan(sub.protocol, sub.plan, s.results, s.rope))
    if s.dry_run:
        return 0
    result = _sweep_and_report(s, sub.protocol, sub.plan, _options(s, sub.protocol, submission=sub.info), of=f" of {sub.method!r}")
    if result.written and not result.statuses.get(Status.OK):
        errors = _distinct_errors(s.results, sub.protocol.name, result.failed_ids)
        print(f"submit: no run of {sub.method!r} finished ok; {len(errors)} distinct error(s):", file=sys.stderr)
        for error, count in errors:
            print(f"  {count} x {error}", file=sys.stderr)
        return max(_exit_code(result), 1)
    return _exit_code(result)


def _exit_code(result) -> int:
    """0 for a sweep that ran out; 128 + the signal number for one stopped by SIGINT/SIGTERM."""
    return {"SIGINT": 130, "SIGTERM": 143}.get(result.signal, 130) if result.interrupted else 0


def _distinct_errors(results, protocol_name: str, run_ids) -> list[tuple[str, int]]:
    """(one-line error, how many runs) of the given records, most frequent first."""
    from collections import Counter

    from ..config.text import terminal_safe
    from ..execution.store import read_record, runs_dir

    errors = Counter()
    for run_id in run_ids:
        record, _ = read_record(runs_dir(results, protocol_name) / f"{run_id}.json", protocol_name)
        errors[terminal_safe(record.error or record.status) if record else "(record unreadable)"] += 1
    return errors.most_common()


def reproduce_run(req: ReproduceRequest) -> int:
    """`cl-bench reproduce RUN_ID`: rerun one record and compare; 0 when reproduced, 1 when not."""
    from ..config.text import terminal_safe
    from ..execution.reproduce import describe, reproduce

    rep = reproduce(req.run_id, req.results, data_dir=req.data_dir, device=req.device, out=req.out)
    for line in describe(rep):
        print(terminal_safe(line))
    return 0 if rep.verdict in ("bitwise", "metrics") else 1


COMMANDS = {"run": run_command, "list": list_command, "leaderboard": leaderboard_command,
            "export": export_command, "check": check_command, "submit": submit_command,
            "reproduce": reproduce_run, "report": report_command, "figures": figures_command}
