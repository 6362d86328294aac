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
    from .sweep import make_plan, run_sweep

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
                         method_files=tuple(args.method))
    _preload_data(protocol, options)
    result = run_sweep(plan, protocol, args.results, options, jobs=args.jobs, executor=args.executor,
                       progress=not args.no_progress)
    print(f"\n{len(result.written)} runs finished in {result.wall_s:.1f} s "
          f"({_statuses(result.statuses)}); records in {Path(args.results) / protocol.name / 'runs'}")
    print_summary(args.results, protocol.name)
    if not args.no_leaderboard:
        build_leaderboard(args.results, protocol.name)
    return 130 if result.interrupted else 0


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
    from .records import load_records

    records = load_records(results, protocol_name)
    if records:
        print()
        print(format_summary(records_to_frame(records)))


def build_leaderboard(results, protocol_name: str, out: str | None = None) -> Path | None:
    """Build the static site for one protocol's records; prints and returns index.html's path."""
    from .records import load_records, protocol_dir

    try:
        from .site import build_site
    except ImportError:
        print("leaderboard: harness.site is not available in this build", file=sys.stderr)
        return None
    records = load_records(results, protocol_name)
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

    names = [args.protocol] if args.protocol else [p.name for p in discover_protocol_dirs(args.results)]
    if not names:
        raise SweepError(f"--results: no records found under {args.results} "
                         "(expected <results>/<protocol>/runs/*.json)")
    if args.out and len(names) > 1:
        raise SweepError(f"--out: {len(names)} protocols found ({', '.join(names)}); add --protocol NAME")
    built = [build_leaderboard(args.results, n, args.out) for n in names]
    return 0 if all(built) else 1


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
    from .registry import get_registry

    for name, adapter in sorted(get_registry(tuple(args.method)).items()):
        hp = ", ".join(f"{k}={v}" for k, v in adapter.defaults.items()) or "-"
        yield f"{name:<16} {adapter.description[:60]:<60} [{hp}]  ({adapter.source})"


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
