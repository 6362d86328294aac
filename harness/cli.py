"""The `cl-bench` command line: a thin layer over library calls.

Only argparse is imported at module level so that `--help` and `list` start fast; each
command imports what it needs.
"""
from __future__ import annotations

import argparse
import math
import sys

EXIT_USAGE = 2

RUN_EXAMPLES = """examples:
  cl-bench run --protocol depth-sweep-mini                  # the embedded demo sweep
  cl-bench run --protocol depth-sweep-mini --dry-run        # grid size, runs already done
  cl-bench run --protocol depth-sweep-mini --methods naive,lwf --regimes head,full --orders 2
  cl-bench run --protocol depth-sweep --data-dir ~/data --download --jobs 4
  cl-bench run --protocol my-protocol.yaml --method my_method.py --results out/
  cl-bench run --protocol depth-sweep-mini --executor ray --jobs 4   # local Ray, 4 CPUs
  cl-bench run --protocol depth-sweep --executor ray --ray-address ray://head:10001
  cl-bench run --protocol smoke --no-mlflow                  # no MLflow logging
"""
EXPORT_EXAMPLES = """examples:
  cl-bench export --results results/ --format csv                 # results/records.csv
  cl-bench export --results results/ --protocol smoke --format parquet --out smoke.parquet
"""
LIST_EXAMPLES = """examples:
  cl-bench list                 # everything
  cl-bench list methods         # registered methods with their default hyperparameters
"""
LEADERBOARD_EXAMPLES = """examples:
  cl-bench leaderboard --results results/
  cl-bench leaderboard --results results/ --protocol depth-sweep-mini --out site/
  cl-bench leaderboard --from-mlflow http://mlflow.team:5000 --experiment depth-sweep --out site/
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
    lb.add_argument("--from-mlflow", metavar="URI",
                    help="build from the record artifacts of an MLflow experiment instead of --results")
    lb.add_argument("--experiment", help="MLflow experiment with --from-mlflow (default: --protocol)")
    _add_export(sub, fmt)
    _add_check_and_submit(sub, fmt)
    return parser


CHECK_EXAMPLES = """examples:
  cl-bench check submissions/l2_anchor.py   # contract of a method file (exit 0 ok, 2 broken)
  cl-bench check lwf                        # the same for a registered method
"""
SUBMIT_EXAMPLES = """examples:
  cl-bench submit submissions/l2_anchor.py --protocol depth-sweep-mini
  cl-bench submit my_method.py --protocol depth-sweep-mini --regimes head,full --orders 2 --jobs 2
"""


def _add_check_and_submit(sub, fmt) -> None:
    chk = sub.add_parser("check", help="check a method file against the adapter contract",
                         epilog=CHECK_EXAMPLES, formatter_class=fmt,
                         description="Train the method on a tiny synthetic two-task stream under the head and "
                                     "full regimes and check the adapter contract (see submissions/README.md).")
    chk.add_argument("file", metavar="FILE", help="adapter file (.py), or the name of a registered method")
    chk.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="device of the check runs (default: cpu, where runs are bitwise reproducible)")
    smt = sub.add_parser("submit", help="check a method file, run a protocol's grid for it, rebuild the leaderboard",
                         epilog=SUBMIT_EXAMPLES, formatter_class=fmt,
                         description="Run `check`, then the protocol's grid for this method only (its DEFAULTS "
                                     "as hyperparameters); records carry the file's sha256.")
    smt.add_argument("file", metavar="FILE", help="adapter file (.py)")
    smt.add_argument("--protocol", required=True, help="protocol name (see `cl-bench list protocols`) or a YAML path")
    smt.add_argument("--results", default="results", help="results folder (default: results/)")
    smt.add_argument("--datasets", type=_csv, help="only these datasets (comma-separated)")
    smt.add_argument("--regimes", type=_csv, help="only these regimes (comma-separated)")
    smt.add_argument("--orders", type=_positive_int, help="only the first N task orders")
    smt.add_argument("--jobs", type=_positive_int, default=1, help="worker processes (default 1)")
    smt.add_argument("--executor", choices=("inline", "process"), default="process",
                     help="how runs are dispatched (default: process; --jobs 1 runs inline)")
    smt.add_argument("--data-dir", help="folder holding torchvision data sets (default: ./data or $CL_BENCH_DATA)")
    smt.add_argument("--download", action="store_true", help="download missing torchvision data sets")
    smt.add_argument("--device", dest="run_device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="device of the protocol runs (default: auto; the check runs on the CPU)")
    smt.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed/diverged/timeout")
    smt.add_argument("--dry-run", action="store_true", help="check, print the grid; run nothing")
    smt.add_argument("--no-progress", action="store_true", help="no progress bar")
    smt.add_argument("--no-leaderboard", action="store_true", help="do not rebuild the leaderboard at the end")
    smt.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    smt.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (as for `run`)")
    smt.set_defaults(device="cpu")


def _add_export(sub, fmt) -> None:
    exp = sub.add_parser("export", help="write the tidy table of all records (CSV or Parquet)",
                         epilog=EXPORT_EXAMPLES, formatter_class=fmt)
    exp.add_argument("--results", default="results", help="results folder (default: results/)")
    exp.add_argument("--protocol", help="only this protocol's records (default: every protocol found)")
    exp.add_argument("--format", choices=("csv", "parquet"), default="csv", help="default: csv")
    exp.add_argument("--out", help="output file (default: <results>/records.<format>)")


def _non_negative(kind, positive: bool = False):
    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            number = -1
        if (isinstance(number, float) and not math.isfinite(number)) or number < 0 or (positive and number == 0):
            raise argparse.ArgumentTypeError(
                f"expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
        return number
    return parse


def _add_tracking_and_scaleout(run) -> None:
    run.add_argument("--ray-address", metavar="ADDR",
                     help="with --executor ray: join this Ray cluster (default: start a local Ray with --jobs CPUs)")
    run.add_argument("--num-cpus", type=_non_negative(float),
                     help="with --executor ray: CPUs per run (default: protocol resources, else 1)")
    run.add_argument("--num-gpus", type=_non_negative(float),
                     help="with --executor ray: GPUs per run (default: protocol resources, else 0)")
    run.add_argument("--max-retries", type=_non_negative(int), default=1,
                     help="reruns of a run whose worker process died (process, ray; default 1)")
    run.add_argument("--tracking-uri", metavar="URI",
                     help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<results>/mlflow.db)")
    run.add_argument("--experiment", help="MLflow experiment name (default: the protocol name)")
    run.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    run.add_argument("--run-timeout", type=_non_negative(float, positive=True), metavar="SECONDS",
                     help="stop a run after SECONDS and record it as status timeout; the sweep goes on "
                          "(runs then execute in worker processes, also with --jobs 1)")


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
    run.add_argument("--threads", type=_positive_int, default=1,
                     help="torch threads per run (default 1: parallelise across runs with --jobs)")
    run.add_argument("--executor", choices=("inline", "process", "ray"), default="process",
                     help="how runs are dispatched (default: process; --jobs 1 runs inline; "
                          "ray needs the [ray] extra)")
    run.add_argument("--data-dir", help="folder holding torchvision data sets (default: ./data or $CL_BENCH_DATA)")
    run.add_argument("--download", action="store_true", help="download missing torchvision data sets")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto")
    run.add_argument("--method", action="append", default=[], metavar="FILE",
                     help="register the adapter in FILE for this run (repeatable)")
    run.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed/diverged/timeout")
    run.add_argument("--dry-run", action="store_true", help="print the grid and what is already done; run nothing")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-leaderboard", action="store_true", help="do not rebuild the leaderboard at the end")
    _add_tracking_and_scaleout(run)


def main(argv=None) -> int:
    """Entry point of the `cl-bench` console script."""
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 0
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(one_line(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `cl-bench list | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        message = _user_error_message(exc)
        if message is None:
            raise
        print(f"cl-bench: error: {one_line(message)}", file=sys.stderr)
        return EXIT_USAGE


def one_line(text: str) -> str:
    """The message with control characters and line separators escaped: one terminal line, no escape codes."""
    import unicodedata

    return "".join(ch.encode("unicode_escape").decode() if unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                   else ch for ch in text)


def _user_error_message(exc: Exception) -> str | None:
    """One-line message for errors caused by the user's input; None for bugs."""
    from .datasets import DatasetError
    from .export import ExportError
    from .protocol import ProtocolError
    from .registry import RegistryError
    from .sweep import SweepError

    if isinstance(exc, (ProtocolError, DatasetError, RegistryError, SweepError, ExportError)):
        return str(exc) or type(exc).__name__  # main() escapes any line break in it
    if isinstance(exc, OSError) and exc.filename is not None:  # a path given by the user is unusable
        name = str(exc.filename)
        return f"{name if len(name) <= 120 else name[:117] + '...'}: {exc.strerror or exc}"
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


def cmd_export(args) -> int:
    """`cl-bench export`."""
    from .commands import export_command

    return export_command(args)


def cmd_check(args) -> int:
    """`cl-bench check`."""
    from .commands import check_command

    return check_command(args)


def cmd_submit(args) -> int:
    """`cl-bench submit`."""
    from .commands import submit_command

    return submit_command(args)


COMMANDS = {"run": cmd_run, "list": cmd_list, "leaderboard": cmd_leaderboard, "export": cmd_export,
            "check": cmd_check, "submit": cmd_submit}

if __name__ == "__main__":
    sys.exit(main())
