"""Typed requests: what a command was asked to do, built once from argparse's namespace.

Commands take these frozen objects, never the namespace, so every flag a command reads is
named here, typed, and checked in one place (`request_from_args`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class SweepRequest:
    """Run (part of) a protocol's grid: `run`, and the grid part of `submit`."""

    protocol: str
    results: str = "results"
    datasets: tuple | None = None
    methods: tuple | None = None
    regimes: tuple | None = None
    orders: int | None = None
    only: tuple = ()
    method_files: tuple = ()  # --method and --plugin files (one file may define both)
    jobs: int = 1
    threads: int = 1
    executor: str = "process"
    data_dir: str | None = None
    download: bool = False
    device: str = "auto"
    retry_failed: bool = False
    dry_run: bool = False
    progress: bool = True
    leaderboard: bool = True
    mlflow: bool = True
    tracking_uri: str | None = None
    experiment: str | None = None
    ray_address: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    max_retries: int = 1
    run_timeout: float | None = None
    include_flagged: bool = False  # rank flagged runs in the summary and the leaderboard
    rope: float = 1.0  # ROPE of the leaderboard's Bayesian comparison, in ACC points


@dataclass(frozen=True)
class SubmitRequest:
    """Check a method file, then run its grid under a protocol."""

    file: str
    sweep: SweepRequest
    check_device: str = "cpu"  # the contract check runs where runs are bitwise reproducible


@dataclass(frozen=True)
class CheckRequest:
    """Check the adapter contract of a method file or a registered method."""

    file: str
    device: str = "cpu"


@dataclass(frozen=True)
class ListRequest:
    """List protocols, datasets, methods or regimes."""

    what: str = "all"
    method_files: tuple = ()


@dataclass(frozen=True)
class LeaderboardRequest:
    """Build the static site from a results folder or an MLflow experiment."""

    results: str = "results"
    protocol: str | None = None
    out: str | None = None
    from_mlflow: str | None = None
    experiment: str | None = None
    protocol_version: str | None = None
    include_flagged: bool = False
    rope: float = 1.0  # ACC points


@dataclass(frozen=True)
class ExportRequest:
    """Write the tidy table of records."""

    results: str = "results"
    protocol: str | None = None
    format: str = "csv"
    out: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class ReportRequest:
    """Write the paper tables (LaTeX or Markdown) of a results folder."""

    results: str = "results"
    format: str = "markdown"
    out: str | None = None  # None: standard output
    metric: str = "acc"
    rope: float = 1.0  # ACC points
    include_flagged: bool = False
    protocol: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class FiguresRequest:
    """Write the paper figures (PDF/PNG) of a results folder."""

    results: str = "results"
    out: str = "figures"
    formats: tuple = ("pdf", "png")
    include_flagged: bool = False
    protocol: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class ReproduceRequest:
    """Rerun one record and compare the rerun with it."""

    run_id: str
    results: str = "results"
    data_dir: str | None = None
    device: str | None = None
    out: str | None = None


def _sweep(args: argparse.Namespace, method_files: tuple, methods=None, only=(),
           include_flagged: bool = False, rope: float = 1.0) -> SweepRequest:
    return SweepRequest(
        protocol=args.protocol, results=args.results, datasets=args.datasets, methods=methods,
        regimes=args.regimes, orders=args.orders, only=tuple(only or ()),
        method_files=(*method_files, *args.plugin), jobs=args.jobs,
        threads=args.threads, executor=args.executor, data_dir=args.data_dir, download=args.download,
        device=args.device, retry_failed=args.retry_failed, dry_run=args.dry_run,
        progress=not args.no_progress, leaderboard=not args.no_leaderboard, mlflow=not args.no_mlflow,
        tracking_uri=args.tracking_uri, experiment=args.experiment, ray_address=args.ray_address,
        num_cpus=args.num_cpus, num_gpus=args.num_gpus, max_retries=args.max_retries,
        run_timeout=args.run_timeout, include_flagged=include_flagged, rope=rope)


def request_from_args(args: argparse.Namespace):
    """The typed request of a parsed command line."""
    if args.command == "run":
        return _sweep(args, tuple(args.method), methods=args.methods, only=args.only,
                      include_flagged=args.include_flagged, rope=args.rope)
    if args.command == "submit":
        return SubmitRequest(file=args.file, sweep=_sweep(args, (args.file,)))
    if args.command == "check":
        return CheckRequest(file=args.file, device=args.device)
    if args.command == "list":
        return ListRequest(what=args.what, method_files=tuple(args.method))
    if args.command == "leaderboard":
        return LeaderboardRequest(results=args.results, protocol=args.protocol, out=args.out,
                                  from_mlflow=args.from_mlflow, experiment=args.experiment,
                                  protocol_version=args.protocol_version,
                                  include_flagged=args.include_flagged, rope=args.rope)
    if args.command == "export":
        return ExportRequest(results=args.results, protocol=args.protocol, format=args.format, out=args.out,
                             protocol_version=args.protocol_version)
    if args.command == "report":
        return ReportRequest(results=args.results, format=args.format, out=args.out, metric=args.metric,
                             rope=args.rope, include_flagged=args.include_flagged, protocol=args.protocol,
                             protocol_version=args.protocol_version)
    if args.command == "figures":
        return FiguresRequest(results=args.results, out=args.out, formats=tuple(args.format),
                              include_flagged=args.include_flagged, protocol=args.protocol,
                              protocol_version=args.protocol_version)
    if args.command == "reproduce":
        return ReproduceRequest(run_id=args.run_id, results=args.results, data_dir=args.data_dir,
                                device=args.device, out=args.out)
    raise ValueError(f"no request type for command {args.command!r}")
