"""The services over a results folder's records: the leaderboard site, the export table, the paper
report and figures, and the end-of-sweep summary.

Every one reads its records through `execution.views.view_records` (one protocol version, one
record per cell) and says on `log` what it left out.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import OutputError, SweepError
from .requests import ExportRequest, FiguresRequest, LeaderboardRequest, ReportRequest

Log = Callable[[str], None]


@dataclass(frozen=True)
class LeaderboardOutcome:
    """The index.html of each site built (None for a protocol without records)."""

    sites: tuple

    @property
    def exit_code(self) -> int:
        """0 when every site was built, else 1."""
        return 0 if all(self.sites) else 1


@dataclass(frozen=True)
class ExportOutcome:
    """The table written and how many records (rows) it holds."""

    path: Path
    records: int


@dataclass(frozen=True)
class ReportOutcome:
    """The report's text, how many records it is made of, and the file it went to (None: not written)."""

    text: str
    records: int
    path: Path | None = None


@dataclass(frozen=True)
class FiguresOutcome:
    """The figure files written, in write order (none when there is nothing to draw)."""

    written: tuple


def leaderboard(req: LeaderboardRequest, log: Log = print) -> LeaderboardOutcome:
    """One site per protocol found under `results` (or the one named), or the site of an MLflow experiment."""
    from ..execution.store import discover_protocol_dirs, runs_dir

    if req.from_mlflow:
        return LeaderboardOutcome((_leaderboard_from_mlflow(req, log),))
    if req.bundles:  # local records + other labs' bundles, each checked here (service/bundles.py)
        from .bundles import merged_leaderboard

        return LeaderboardOutcome(merged_leaderboard(req, log))
    names = [req.protocol] if req.protocol else [p.name for p in discover_protocol_dirs(req.results)]
    if not names:
        raise SweepError(f"--results: no records found under {req.results} "
                         "(expected <results>/<protocol>/runs/*.json)")
    if req.out and len(names) > 1:
        raise SweepError(f"--out: {len(names)} protocols found ({', '.join(names)}); add --protocol NAME")
    if req.protocol and not runs_dir(req.results, req.protocol).is_dir():
        raise SweepError(f"--protocol: no records of protocol {req.protocol!r} under {req.results} "
                         f"(expected {runs_dir(req.results, req.protocol)}/*.json)")
    return LeaderboardOutcome(tuple(
        build_leaderboard(req.results, n, req.out, version=req.protocol_version, log=log,
                          include_flagged=req.include_flagged, rope=req.rope, force=req.force) for n in names))


def _leaderboard_from_mlflow(req: LeaderboardRequest, log: Log) -> Path:
    """The site of an MLflow experiment's record artifacts."""
    from ..config.paths import SITE
    from ..execution.views import view_records
    from ..outputs.export import records_from_mlflow
    from ..outputs.site import build_site

    if req.out:
        refuse_record_area(req.results, req.out, "--out", site=True)
    experiment = req.experiment or req.protocol
    if not experiment:
        raise SweepError("--from-mlflow: name the MLflow experiment with --experiment NAME")
    found = records_from_mlflow(req.from_mlflow, experiment, log=log)
    if not found:
        raise SweepError(f"--from-mlflow: experiment {experiment!r} at {req.from_mlflow} "
                         "holds no cl-bench records")
    records = view_records(found, req.protocol_version, log=log)
    target = Path(req.out) if req.out else Path(req.results) / f"mlflow-{experiment}" / SITE
    index = build_site(records, target, include_flagged=req.include_flagged, rope=req.rope,
                       root=_root_of(req.results, target), force=req.force or not req.out)
    log(f"leaderboard: {len(records)} records from MLflow experiment {experiment!r}: {Path(index).resolve()}")
    return Path(index)


def export(req: ExportRequest, log: Log = print) -> ExportOutcome:
    """The tidy table (one row per record) of one protocol version, or of each protocol's newest, as CSV or Parquet."""
    from ..config.paths import EXPORT_STEM
    from ..execution.store import load_records
    from ..execution.views import view_records
    from ..outputs.export import export_table

    if req.out:
        refuse_record_area(req.results, req.out, "--out")
    records = view_records(load_records(req.results, req.protocol, log=log), req.protocol_version, log=log)
    if not records:
        where = Path(req.results) / (req.protocol or "<protocol>") / "runs"
        raise SweepError(f"--results: no records found under {where}")
    folder = Path(req.results) / req.protocol if req.protocol else Path(req.results)
    out = Path(req.out) if req.out else folder / f"{EXPORT_STEM}.{req.format}"
    return ExportOutcome(export_table(records, req.format, out, root=_root_of(req.results, out, file=True)),
                         len(records))


def report(req: ReportRequest, log: Log = print) -> ReportOutcome:
    """The paper tables (LaTeX or Markdown) of one protocol version; written to `out` when it is given."""
    from ..analysis.tables import analyse
    from ..config.files import inside, safe_target, write_atomic
    from ..outputs.report import report_latex, report_markdown

    if req.out:
        refuse_record_area(req.results, req.out, "--out")
    records = paper_records(req.results, req.protocol, req.protocol_version, log=log)
    tables = analyse(records, include_flagged=req.include_flagged, rope=req.rope)
    text = (report_latex if req.format == "latex" else report_markdown)(tables, metric=req.metric)
    if not req.out:
        return ReportOutcome(text, len(records))
    out = Path(req.out)
    root = _root_of(req.results, out, file=True)
    write_atomic(safe_target(root, inside(root, out)), text)
    return ReportOutcome(text, len(records), out)


def figures(req: FiguresRequest, log: Log = print) -> FiguresOutcome:
    """The paper figures (PDF/PNG per dataset) of one protocol version; one `log` line per file."""
    from ..analysis.tables import analyse
    from ..config.text import terminal_safe
    from ..outputs.figures import write_figures

    refuse_record_area(req.results, req.out, "--out")
    records = paper_records(req.results, req.protocol, req.protocol_version, log=log)
    tables = analyse(records, include_flagged=req.include_flagged)
    written = write_figures(tables, req.out, req.formats, log=lambda path: log(terminal_safe(f"figures: {path}")),
                            root=_root_of(req.results, req.out))
    return FiguresOutcome(tuple(written))


def paper_records(results, protocol: str | None, version: str | None, log=print) -> list:
    """The records of one protocol version under --results, checked as `export` checks them."""
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


def print_summary(results, protocol_name: str, version: str | None = None, grid=None,
                  include_flagged: bool = False, rope: float = 1.0) -> None:
    """Method x regime summary (mean ACC / forgetting, flagged runs marked) of one protocol version's
    records, and the tests its blocks cannot decide."""
    from ..analysis.frame import format_summary, records_to_frame
    from ..analysis.tables import power_summary, scenario_summary
    from ..execution.store import load_records
    from ..execution.views import view_records

    print()
    records = view_records(load_records(results, protocol_name), version, grid)
    if records:
        frame = records_to_frame(records, include_flagged)
        print(format_summary(frame))
        scenario = scenario_summary(frame, rope)  # class-IL records: scenario vs regime reordering
        print("\n".join(["", *scenario, *([""] if scenario else []), *power_summary(frame, rope)]))


def build_leaderboard(results, protocol_name: str, out: str | None = None, version: str | None = None,
                      grid=None, log=print, include_flagged: bool = False, rope: float = 1.0,
                      force: bool = False) -> Path | None:
    """Build the static site for one protocol version's records; prints and returns index.html's path.

    `out` (default <results>/<protocol>/site/, the layout's own) may not be in the record area,
    nor a non-empty folder holding no site unless `force`."""
    from ..config.paths import SITE
    from ..execution.store import load_records, protocol_dir
    from ..execution.views import view_records
    from ..outputs.site import build_site

    if out:  # the one check of a site's --out (before a record is read)
        refuse_record_area(results, out, "--out", site=True)
    records = view_records(load_records(results, protocol_name, log=log if grid is None else None),
                           version, grid, log=log)
    if not records:
        print(f"leaderboard: no records under {protocol_dir(results, protocol_name)}")
        return None
    target = Path(out) if out else protocol_dir(results, protocol_name) / SITE
    # absolute: the commands the pages show then work from any directory
    index = build_site(records, target, results_dir=os.path.abspath(results), include_flagged=include_flagged,
                       rope=rope, root=_root_of(results, target), force=force or not out)
    print(f"leaderboard: {Path(index).resolve()}")
    return Path(index)


def refuse_record_area(results, out, flag: str, site: bool = False) -> None:
    """OutputError when `out` is, or is inside, what the results folder reads its records from."""
    from ..config.paths import record_area_problem

    problem = record_area_problem(results, out, site=site)
    if problem:
        raise OutputError(f"{flag}: {out} {problem}, which every later command reads its records from; "
                          f"allowed: a path outside {results}, or the default")


def _root_of(results, target, file: bool = False) -> Path:
    """The folder a writer owns: --results when `target` lies inside it (as written), else the target
    folder (the file's folder for a `file`), which the user named and may itself be a link."""
    target = Path(target)
    if target.is_relative_to(Path(results)) and target != Path(results):
        return Path(results)
    return target.parent if file else target
