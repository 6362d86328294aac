"""Typed requests: what each service is asked to do, one frozen class per command.

The defaults the CLI shares come from `config.defaults`, the table its parser reads too;
`cli.requests` fills a request from the parsed flags of the same names. A library caller
builds the same objects directly.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import defaults


@dataclass(frozen=True)
class SweepRequest:
    """Run (part of) a protocol's grid: `run`, and the grid part of `submit`."""

    protocol: str
    results: str = defaults.RESULTS
    datasets: tuple | None = None
    methods: tuple | None = None
    regimes: tuple | None = None
    orders: int | None = None
    only: tuple = ()
    method_files: tuple = ()  # --method files
    plugin_files: tuple = ()  # --plugin files: backbones, data sets, regime families
    jobs: int = defaults.JOBS
    threads: int = defaults.THREADS
    executor: str = defaults.EXECUTOR
    data_dir: str | None = None
    download: bool = False
    device: str = defaults.DEVICE
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
    max_retries: int = defaults.MAX_RETRIES
    run_timeout: float | None = None
    include_flagged: bool = False  # rank flagged runs in the summary and the leaderboard
    rope: float = defaults.ROPE  # of the leaderboard's Bayesian comparison


@dataclass(frozen=True)
class SubmitRequest:
    """Check a method file, then run its grid under a protocol."""

    file: str
    sweep: SweepRequest
    check_device: str = defaults.CHECK_DEVICE
    baselines: bool = True  # run the protocol's own methods first where their records are missing


@dataclass(frozen=True)
class CheckRequest:
    """Check the adapter contract of a method file or a registered method."""

    file: str
    device: str = defaults.CHECK_DEVICE


@dataclass(frozen=True)
class ListRequest:
    """List protocols, datasets, methods or regimes."""

    what: str = defaults.LIST_WHAT
    method_files: tuple = ()
    plugin_files: tuple = ()  # --plugin files: their backbones, data sets and regime families are listed too


@dataclass(frozen=True)
class LeaderboardRequest:
    """Build the static site from a results folder or an MLflow experiment."""

    results: str = defaults.RESULTS
    protocol: str | None = None
    out: str | None = None
    from_mlflow: str | None = None
    experiment: str | None = None
    protocol_version: str | None = None
    include_flagged: bool = False
    rope: float = defaults.ROPE
    force: bool = False  # write the site into a non-empty --out folder that holds no site
    bundles: str | None = None  # a folder of bundles (.zip) merged with the local records (service/bundles.py)
    contributor: str | None = None  # how the board names the local records' contributor
    verdicts: str | None = None  # the folder of trusted verdicts (default: the bundles folder)
    include_unverified: bool = False  # rank the records of "rerun differs" bundles too


@dataclass(frozen=True)
class ExportRequest:
    """Write the tidy table of records."""

    results: str = defaults.RESULTS
    protocol: str | None = None
    format: str = defaults.EXPORT_FORMAT
    out: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class ReportRequest:
    """Write the paper tables (LaTeX or Markdown) of a results folder."""

    results: str = defaults.RESULTS
    format: str = "markdown"
    out: str | None = None  # None: the text is only returned (the CLI writes it to standard output)
    metric: str = defaults.METRIC
    rope: float = defaults.ROPE
    include_flagged: bool = False
    protocol: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class FiguresRequest:
    """Write the paper figures (PDF/PNG) of a results folder."""

    results: str = defaults.RESULTS
    out: str = "figures"
    formats: tuple = defaults.FIGURE_FORMATS
    include_flagged: bool = False
    protocol: str | None = None
    protocol_version: str | None = None


@dataclass(frozen=True)
class ReproduceRequest:
    """Rerun one record and compare the rerun with it."""

    run_id: str
    results: str = defaults.RESULTS
    data_dir: str | None = None
    device: str | None = None  # None: the record's own device
    out: str | None = None  # None: a temporary folder, removed
    # The code of a record made with files: only these files are imported (never a path the record
    # names), and each must hash to the implementation the record states.
    method_files: tuple = ()  # --method files
    plugin_files: tuple = ()  # --plugin files


@dataclass(frozen=True)
class BundleRequest:
    """Pack one protocol version's records, method files, protocol file and environment lock into a zip."""

    protocol: str
    out: str
    results: str = defaults.RESULTS
    contributor: str = "anonymous"
    method_files: tuple = ()  # method files the records name, where their written paths moved


@dataclass(frozen=True)
class VerifyRequest:
    """Check a bundle and rerun a sample of its records (drawn by the verifier's seed, never the bundle's)."""

    file: str
    sample: int = 1  # records to rerun; -1 (bundle_verify.ALL, `--sample all`): every finished record
    seed: str | None = None  # what draws the sample (None: fresh randomness); recorded in the verdict
    download: bool = False  # fetch a missing torchvision data set before a rerun
    data_dir: str | None = None
    out: str | None = None  # the verdict JSON (default: <bundle>.verification.json)
    markdown: str | None = None  # also write the pull-request comment (verdict + cells beside the board's)
    board: str | None = None  # the folder of bundles already on the board, for the comment's comparison
