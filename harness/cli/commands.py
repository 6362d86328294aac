"""The commands: each takes its typed request, calls one service (harness.service) and prints the outcome.

The services say what they are doing as they go (the plan, the sweep, the summary); a command
prints what only the outcome knows and turns it into the exit code.
"""
from __future__ import annotations

import sys

from .. import service
from ..service.requests import (
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


def run_command(req: SweepRequest) -> int:
    """`cl-bench run`: plan, print the grid, run what is left, print the summary, build the site."""
    return service.run(req).exit_code


def submit_command(req: SubmitRequest) -> int:
    """`cl-bench submit FILE --protocol NAME`: check, run the method's grid, rebuild the leaderboard."""
    outcome = service.submit(req)
    if not outcome.check.ok:
        _print_broken(outcome.check)
    elif outcome.errors:
        print(f"submit: no run of {outcome.method!r} finished ok; {len(outcome.errors)} distinct error(s):",
              file=sys.stderr)
        for error, count in outcome.errors:
            print(f"  {count} x {error}", file=sys.stderr)
    return outcome.exit_code


def check_command(req: CheckRequest) -> int:
    """`cl-bench check FILE`: the adapter contract; 0 when it holds, 2 otherwise."""
    result = service.check(req)
    if not result.ok:
        _print_broken(result)
        return 2
    print("\n".join(result.passed))
    print(result.verdict())
    return 0


def _print_broken(result) -> None:
    for finding in result.findings:
        print(finding.format(), file=sys.stderr)
    print(result.verdict(), file=sys.stderr)


def leaderboard_command(req: LeaderboardRequest) -> int:
    """`cl-bench leaderboard`: one site per protocol found under --results (each prints its path)."""
    return service.leaderboard(req).exit_code


def export_command(req: ExportRequest) -> int:
    """`cl-bench export`: the tidy table (one row per record) as CSV or Parquet."""
    outcome = service.export(req)
    print(f"export: {outcome.records} records -> {outcome.path}")
    return 0


def report_command(req: ReportRequest) -> int:
    """`cl-bench report`: the paper tables (LaTeX or Markdown) of one protocol version, to --out or stdout."""
    from ..config.text import terminal_safe

    # With the report on stdout, notes go to stderr: `cl-bench report ... > t.md` keeps the table clean.
    outcome = service.report(req, log=print if req.out else _to_stderr)
    if outcome.path is None:
        sys.stdout.write(outcome.text)
    else:
        print(terminal_safe(f"report: {outcome.records} records -> {outcome.path}"))
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def figures_command(req: FiguresRequest) -> int:
    """`cl-bench figures`: the paper figures (PDF/PNG per dataset) of one protocol version; one line per file."""
    if not service.figures(req).written:
        print("figures: nothing to draw (no ok runs)")
    return 0


def list_command(req: ListRequest) -> int:
    """`cl-bench list [what]`."""
    for section in service.list(req):
        print(f"{section.name}:")
        for line in section.lines:
            print(f"  {line}")
    return 0


def reproduce_command(req: ReproduceRequest) -> int:
    """`cl-bench reproduce RUN_ID`: rerun one record and compare; 0 when reproduced, 1 when not."""
    from ..config.text import terminal_safe
    from ..execution.reproduce import describe

    rep = service.reproduce(req)
    for line in describe(rep):
        print(terminal_safe(line))
    return 0 if rep.reproduced else 1


def bundle_command(req: BundleRequest) -> int:
    """`cl-bench bundle`: write the bundle; one line with its sha256."""
    from ..config.text import terminal_safe

    packed = service.bundle(req)
    for line in packed.left_out:
        print(terminal_safe(f"bundle: left out {line}"))
    print(terminal_safe(f"bundle: {packed.records} records, {packed.method_files} method file(s) -> {packed.path} "
                        f"(sha256 {packed.sha256})"))
    return 0


def verify_command(req: VerifyRequest) -> int:
    """`cl-bench verify FILE`: the verdict (verified, self-reported, rerun differs) and its file; 2 when refused."""
    from ..config.text import terminal_safe
    from ..execution.bundle_verify import CODE_NOTE, verdict_path

    result = service.verify(req)
    for line in result.checks:
        print(terminal_safe(f"  ok  {line}"))
    for r in result.reruns:
        print(terminal_safe(f"  rerun {r.run_id}: {r.verdict} (largest difference {r.max_delta:.3g})"))
    print(f"note: {CODE_NOTE}" if result.ran_bundled_code else "note: no bundled code ran")
    print(terminal_safe(f"verify: {result.status}: {result.reason} (contributor {result.contributor!r}, "
                        f"{result.records} records) -> {verdict_path(req.file, req.out)}"))
    return result.exit_code


COMMANDS = {"run": run_command, "list": list_command, "leaderboard": leaderboard_command,
            "export": export_command, "check": check_command, "submit": submit_command,
            "reproduce": reproduce_command, "report": report_command, "figures": figures_command,
            "bundle": bundle_command, "verify": verify_command}
