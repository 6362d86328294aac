"""Implementations of the CLI commands (each a short composition of library calls)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path


def _load(args):
    from .protocol import load_protocol, select
    from .registry import get_registry

    registry = get_registry(tuple(args.method))
    protocol = load_protocol(args.protocol, registry)
    return select(protocol, datasets=args.datasets, methods=args.methods, regimes=args.regimes,
                  orders=args.orders)


def run_command(args) -> int:
    """Plan, optionally print the grid, run what is left, print the summary, build the site."""
    from .engine import resolve_device
    from .executors import RunOptions
    from .sweep import make_plan

    protocol = _load(args)
    plan = make_plan(protocol, args.results, retry_failed=args.retry_failed, only=tuple(args.only or ()))
    print(format_plan(protocol, plan, args.results))
    if args.dry_run:
        return 0
    try:
        resolve_device(args.device)
    except ValueError as exc:
        raise _usage(str(exc))
    options = RunOptions(data_dir=args.data_dir, download=args.download, device=args.device,
                         method_files=tuple(args.method), timeout=getattr(args, "run_timeout", None),
                         threads=args.threads)
    _preload_data(protocol, options)
    result = _run_tracked(plan, protocol, args, options)
    print(f"\n{len(result.written)} runs finished in {result.wall_s:.1f} s "
          f"({_statuses(result.statuses)}); records in {Path(args.results) / protocol.name / 'runs'}")
    print_summary(args.results, protocol.name)
    if not args.no_leaderboard:
        build_leaderboard(args.results, protocol.name)
    return 130 if result.interrupted else 0


def _run_tracked(plan, protocol, args, options):
    """run_sweep with the executor the flags ask for, mirrored into MLflow unless --no-mlflow."""
    from .sweep import run_sweep
    from .tracking import make_tracker

    executor = _executor(args, protocol, options)
    tracker = make_tracker(args, protocol, plan)
    if tracker:
        print(f"mlflow: experiment {tracker.experiment!r} at {tracker.uri} "
              f"(browse: mlflow ui --backend-store-uri {shlex.quote(tracker.uri)})")
    try:
        result = run_sweep(plan, protocol, args.results, options, jobs=args.jobs, executor=executor,
                           progress=not args.no_progress, on_record=(tracker.log_record,) if tracker else ())
    except BaseException:
        if tracker:
            tracker.abort()
        raise
    if tracker:
        tracker.finish(interrupted=result.interrupted)
    return result


def _executor(args, protocol, options):
    """The executor of `--executor` with its retries and, for Ray, address and resources."""
    from .executors import make_executor

    retries = getattr(args, "max_retries", 1)
    ray_flags = {"--ray-address": getattr(args, "ray_address", None),
                 "--num-cpus": getattr(args, "num_cpus", None), "--num-gpus": getattr(args, "num_gpus", None)}
    if args.executor == "ray" and options.timeout:
        raise _usage("--run-timeout: not supported with --executor ray; use --executor process")
    if args.executor != "ray":
        given = [flag for flag, value in ray_flags.items() if value is not None]
        if given:
            raise _usage(f"{given[0]}: only applies to --executor ray (got --executor {args.executor})")
        return make_executor(args.executor, options, args.jobs, max_retries=retries)
    from .ray_executor import RayOptions

    res = protocol.resources or {}
    pick = lambda flag, key, default: next(  # noqa: E731
        v for v in (ray_flags[flag], res.get(key), default) if v is not None)
    ray_options = RayOptions(address=ray_flags["--ray-address"], num_cpus=float(pick("--num-cpus", "num_cpus", 1.0)),
                             num_gpus=float(pick("--num-gpus", "num_gpus", 0.0)), max_retries=retries)
    return make_executor("ray", options, args.jobs, max_retries=retries, ray_options=ray_options)


def _usage(message: str):
    from .sweep import SweepError

    return SweepError(message)


def _preload_data(protocol, options) -> None:
    """Load every dataset once up front, so a missing one fails before any run starts."""
    from .datasets import load_dataset

    for d in protocol.datasets:
        load_dataset(d.name, options.data_dir, options.download)


def _statuses(statuses: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(statuses.items())) or "nothing to do"


def format_plan(protocol, plan, results) -> str:
    """The grid: counts per axis, total runs, runs already done."""
    c = plan.counts()
    lines = [f"protocol {protocol.name} v{protocol.version} ({protocol.source})",
             f"grid: {c['datasets']} datasets x {c['regimes']} regimes x {c['methods']} methods x "
             f"{c['orders']} task orders x {c['seeds']} seeds = {c['total']} runs",
             f"done: {c['done']}   to run: {c['todo']}   results: {Path(results) / protocol.name}"]
    if plan.invalid:
        lines.append(f"invalid record files (will be redone): {len(plan.invalid)}")
    return "\n".join(lines)


def print_summary(results, protocol_name: str) -> None:
    """Method x regime summary (mean ACC / forgetting) of every valid record of the protocol."""
    from .analysis.frame import format_summary, records_to_frame
    from .records import current_records, load_records

    records = current_records(load_records(results, protocol_name))
    if records:
        print()
        print(format_summary(records_to_frame(records)))


def build_leaderboard(results, protocol_name: str, out: str | None = None) -> Path | None:
    """Build the static site for one protocol's records; prints and returns index.html's path."""
    from .records import current_records, load_records, protocol_dir

    try:
        from .site import build_site
    except ImportError:
        print("leaderboard: harness.site is not available in this build", file=sys.stderr)
        return None
    records = current_records(load_records(results, protocol_name))
    if not records:
        print(f"leaderboard: no records under {protocol_dir(results, protocol_name)}")
        return None
    target = Path(out) if out else protocol_dir(results, protocol_name) / "site"
    index = build_site(records, target, results_dir=str(results))
    print(f"leaderboard: {Path(index).resolve()}")
    return Path(index)


def leaderboard_command(args) -> int:
    """`cl-bench leaderboard`: one site per protocol found under --results."""
    from .records import discover_protocol_dirs
    from .sweep import SweepError

    if getattr(args, "from_mlflow", None):
        return leaderboard_from_mlflow(args)

    names = [args.protocol] if args.protocol else [p.name for p in discover_protocol_dirs(args.results)]
    if not names:
        raise SweepError(f"--results: no records found under {args.results} "
                         "(expected <results>/<protocol>/runs/*.json)")
    if args.out and len(names) > 1:
        raise SweepError(f"--out: {len(names)} protocols found ({', '.join(names)}); add --protocol NAME")
    from .records import runs_dir

    if args.protocol and not runs_dir(args.results, args.protocol).is_dir():
        raise SweepError(f"--protocol: no records of protocol {args.protocol!r} under {args.results} "
                         f"(expected {runs_dir(args.results, args.protocol)}/*.json)")
    built = [build_leaderboard(args.results, n, args.out) for n in names]
    return 0 if all(built) else 1


def leaderboard_from_mlflow(args) -> int:
    """`cl-bench leaderboard --from-mlflow URI --experiment NAME`: the site of an MLflow experiment."""
    from .export import records_from_mlflow
    from .site import build_site
    from .sweep import SweepError

    experiment = args.experiment or args.protocol
    if not experiment:
        raise SweepError("--from-mlflow: name the MLflow experiment with --experiment NAME")
    records = records_from_mlflow(args.from_mlflow, experiment)
    if not records:
        raise SweepError(f"--from-mlflow: experiment {experiment!r} at {args.from_mlflow} "
                         "holds no cl-bench records")
    target = Path(args.out) if args.out else Path(args.results) / f"mlflow-{experiment}" / "site"
    index = build_site(records, target)
    print(f"leaderboard: {len(records)} records from MLflow experiment {experiment!r}: {Path(index).resolve()}")
    return 0


def export_command(args) -> int:
    """`cl-bench export`: the tidy table (one row per record) as CSV or Parquet."""
    from .export import export_table
    from .records import load_records
    from .sweep import SweepError

    records = load_records(args.results, args.protocol)
    if not records:
        where = Path(args.results) / (args.protocol or "<protocol>") / "runs"
        raise SweepError(f"--results: no records found under {where}")
    folder = Path(args.results) / args.protocol if args.protocol else Path(args.results)
    out = Path(args.out) if args.out else folder / f"records.{args.format}"
    path = export_table(records, args.format, out)
    print(f"export: {len(records)} records -> {path}")
    return 0


def list_command(args) -> int:
    """`cl-bench list [what]`."""
    what = args.what
    sections = ("protocols", "datasets", "methods", "regimes") if what == "all" else (what,)
    for section in sections:
        print(f"{section}:")
        for line in LISTERS[section](args):
            print(f"  {line}")
    return 0


def _list_protocols(args):
    import yaml

    from .protocol import available_protocols, resolve_protocol_path

    for name in available_protocols():
        try:
            raw = yaml.safe_load(resolve_protocol_path(name).read_text()) or {}
        except Exception:  # listing must not die on one broken file
            raw = {}
        desc = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
        yield f"{name:<20} v{raw.get('version', '?'):<5} {desc}"


def _list_datasets(args):
    from .datasets import DATASET_INFO, EMBEDDED

    for name, (n_classes, model) in DATASET_INFO.items():
        where = "embedded" if name in EMBEDDED else "torchvision (--data-dir, --download)"
        yield f"{name:<14} {n_classes:>3} classes  default model {model:<17} {where}"
    yield "npz:PATH       your own arrays x_train, y_train, x_test, y_test"


def _list_methods(args):
    # metadata by content hash: importing every adapter (torch, Avalanche) takes seconds
    from .method_index import method_infos

    for m in sorted(method_infos(tuple(args.method)), key=lambda m: m["name"]):
        hp = ", ".join(f"{k}={v}" for k, v in m["defaults"].items()) or "-"
        yield f"{m['name']:<16} {m['description'][:60]:<60} [{hp}]  ({m['source']})"


def _list_regimes(args):
    yield "head       train the task heads only"
    yield "last-k     train the last k blocks + heads (k = 1, 2, 3, ... up to the model's depth)"
    yield "full       train every block + heads"
    yield "models: mlp (4 blocks), small-cnn (4 blocks), resnet18-reduced (5 blocks)"


LISTERS = {"protocols": _list_protocols, "datasets": _list_datasets, "methods": _list_methods,
           "regimes": _list_regimes}


def reproduce_command(protocol: str, run_id: str, results: str | None = None) -> str:
    """The exact command that reruns one record."""
    cmd = ["cl-bench", "run", "--protocol", protocol, "--only", run_id]
    if results:
        cmd += ["--results", results]
    return shlex.join(cmd)


def check_command(args) -> int:
    """`cl-bench check FILE`: the adapter contract; 0 when it holds, 2 otherwise."""
    from .contract import check

    result = check(args.file, device=args.device)
    if result.ok:
        print("\n".join(result.passed))
        print(f"{args.file}: the adapter contract holds ({len(result.passed)} checks passed)")
        return 0
    for finding in result.findings:
        print(finding.format(), file=sys.stderr)
    print(f"{args.file}: the adapter contract is broken ({len(result.findings)} problem(s)); "
          "see submissions/README.md", file=sys.stderr)
    return 2


def submit_command(args) -> int:
    """`cl-bench submit FILE --protocol NAME`: check, run the method's grid, rebuild the leaderboard."""
    from .executors import RunOptions
    from .submit import prepare

    if check_command(args) != 0:
        return 2
    sub = prepare(args.file, args.protocol, args.results, datasets=args.datasets, regimes=args.regimes,
                  orders=args.orders, retry_failed=args.retry_failed)
    print(f"\nsubmission {sub.method!r} from {sub.file} (sha256 {sub.info['sha256'][:16]}...)")
    print(format_plan(sub.protocol, sub.plan, args.results))
    if args.dry_run:
        return 0
    options = RunOptions(data_dir=args.data_dir, download=args.download, device=args.run_device,
                         method_files=(args.file,), submission=sub.info)
    _preload_data(sub.protocol, options)
    result = _run_tracked(sub.plan, sub.protocol, args, options)
    print(f"\n{len(result.written)} runs of {sub.method!r} finished in {result.wall_s:.1f} s "
          f"({_statuses(result.statuses)})")
    print_summary(args.results, sub.protocol.name)
    if not args.no_leaderboard:
        build_leaderboard(args.results, sub.protocol.name)
    return 130 if result.interrupted else 0
