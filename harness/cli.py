"""The `cl-bench` command line: a thin layer over library calls.

Only argparse is imported at module level so that `--help` and `list` start fast; each
command imports what it needs.
"""
from __future__ import annotations

import argparse
import sys

EXIT_USAGE = 2

RUN_EXAMPLES = """examples:
  cl-bench run --protocol depth-sweep-mini                  # the embedded demo sweep
  cl-bench run --protocol depth-sweep-mini --dry-run        # grid size, runs already done
  cl-bench run --protocol depth-sweep-mini --methods naive,lwf --regimes head,full --orders 2
  cl-bench run --protocol depth-sweep --data-dir ~/data --download --jobs 4
  cl-bench run --protocol my-protocol.yaml --method my_method.py --results out/
"""
LIST_EXAMPLES = """examples:
  cl-bench list                 # everything
  cl-bench list methods         # registered methods with their default hyperparameters
"""
LEADERBOARD_EXAMPLES = """examples:
  cl-bench leaderboard --results results/
  cl-bench leaderboard --results results/ --protocol depth-sweep-mini --out site/
"""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of usage dumps."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _csv(value: str) -> tuple:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
    return items


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for tests and docs)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="cl-bench", formatter_class=fmt,
                     description="Continual-learning benchmarks under controlled fine-tuning depth regimes.",
                     epilog="run `cl-bench COMMAND --help` for a command's options and examples")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run(sub, fmt)
    lst = sub.add_parser("list", help="list protocols, datasets, methods or regimes",
                         epilog=LIST_EXAMPLES, formatter_class=fmt)
    lst.add_argument("what", nargs="?", default="all",
                     choices=("all", "protocols", "datasets", "methods", "regimes"))
    lst.add_argument("--method", action="append", default=[], metavar="FILE",
                     help="also register the adapter in FILE")
    lb = sub.add_parser("leaderboard", help="build the static HTML leaderboard from records",
                        epilog=LEADERBOARD_EXAMPLES, formatter_class=fmt)
    lb.add_argument("--results", default="results", help="results folder (default: results/)")
    lb.add_argument("--protocol", help="protocol name inside the results folder (default: each one found)")
    lb.add_argument("--out", help="output folder (default: <results>/<protocol>/site/)")
    return parser


def _add_run(sub, fmt) -> None:
    run = sub.add_parser("run", help="run a protocol's grid (resumable)", epilog=RUN_EXAMPLES,
                         formatter_class=fmt,
                         description="Run every dataset x regime x method x task order x seed of a "
                                     "protocol. Finished runs are skipped; interrupted sweeps resume.")
    run.add_argument("--protocol", required=True, help="protocol name (see `cl-bench list protocols`) or a YAML path")
    run.add_argument("--results", default="results", help="results folder (default: results/)")
    run.add_argument("--datasets", type=_csv, help="only these datasets (comma-separated)")
    run.add_argument("--methods", type=_csv, help="only these methods (names or labels, comma-separated)")
    run.add_argument("--regimes", type=_csv, help="only these regimes (comma-separated)")
    run.add_argument("--orders", type=_positive_int, help="only the first N task orders")
    run.add_argument("--only", type=_csv, metavar="RUN_IDS", help="only these run ids (reproduce single runs)")
    run.add_argument("--jobs", type=_positive_int, default=1, help="worker processes (default 1)")
    run.add_argument("--executor", choices=("inline", "process"), default="process",
                     help="how runs are dispatched (default: process; --jobs 1 runs inline)")
    run.add_argument("--data-dir", help="folder holding torchvision data sets (default: ./data or $CL_BENCH_DATA)")
    run.add_argument("--download", action="store_true", help="download missing torchvision data sets")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto")
    run.add_argument("--method", action="append", default=[], metavar="FILE",
                     help="register the adapter in FILE for this run (repeatable)")
    run.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed/diverged/timeout")
    run.add_argument("--dry-run", action="store_true", help="print the grid and what is already done; run nothing")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-leaderboard", action="store_true", help="do not rebuild the leaderboard at the end")


def main(argv=None) -> int:
    """Entry point of the `cl-bench` console script."""
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 0
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        message = _user_error_message(exc)
        if message is None:
            raise
        print(f"cl-bench: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def _user_error_message(exc: Exception) -> str | None:
    """One-line message for errors caused by the user's input; None for bugs."""
    from .datasets import DatasetError
    from .protocol import ProtocolError
    from .registry import RegistryError
    from .sweep import SweepError

    if isinstance(exc, (ProtocolError, DatasetError, RegistryError, SweepError)):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def cmd_run(args) -> int:
    """`cl-bench run`."""
    from .commands import run_command

    return run_command(args)


def cmd_list(args) -> int:
    """`cl-bench list`."""
    from .commands import list_command

    return list_command(args)


def cmd_leaderboard(args) -> int:
    """`cl-bench leaderboard`."""
    from .commands import leaderboard_command

    return leaderboard_command(args)


COMMANDS = {"run": cmd_run, "list": cmd_list, "leaderboard": cmd_leaderboard}

if __name__ == "__main__":
    sys.exit(main())
