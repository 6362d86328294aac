"""The library API under the CLI: one function per command, a typed request in, a typed outcome out.

    from harness.service import SweepRequest, run
    outcome = run(SweepRequest("depth-sweep-mini", mlflow=False))   # what `cl-bench run` does
    outcome.plan.counts(), outcome.result.statuses, outcome.site

A service says what it is doing on `log` (default: print), as the command does; bad input
raises a `harness.config.errors.UserError` with a one-line message. Importing this package
imports no torch: each service imports what it needs when it runs.
"""
from __future__ import annotations

from .bundles import bundle, verify
from .catalog import (
    Section,
    check,
    list_sections as list,  # noqa: A004  (the service of `cl-bench list`)
)
from .records import (
    ExportOutcome,
    FiguresOutcome,
    LeaderboardOutcome,
    ReportOutcome,
    build_leaderboard,
    export,
    figures,
    leaderboard,
    paper_records,
    print_summary,
    report,
)
from .requests import (
    BundleRequest,
    CheckRequest,
    ExportRequest,
    FiguresRequest,
    LeaderboardRequest,
    ListRequest,
    ReportRequest,
    ReproduceRequest,
    SubmitRequest,
    SweepRequest,
    VerifyRequest,
)
from .sweeps import SubmitOutcome, SweepOutcome, format_plan, reproduce, run, submit

__all__ = ["run", "submit", "leaderboard", "report", "figures", "export", "check", "reproduce", "list", "bundle",
           "verify", "SweepRequest", "SubmitRequest", "CheckRequest", "ListRequest", "LeaderboardRequest",
           "ExportRequest",
           "ReportRequest", "FiguresRequest", "ReproduceRequest", "BundleRequest", "VerifyRequest",
           "SweepOutcome", "SubmitOutcome", "LeaderboardOutcome", "ExportOutcome", "ReportOutcome", "FiguresOutcome",
           "Section", "build_leaderboard", "print_summary", "format_plan", "paper_records"]
