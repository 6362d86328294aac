"""The argument parser of `cl-bench`: commands, their flags (one shared group for sweeps), examples.

A flag's `dest` is the name of its request field (harness.service.requests) and its default
comes from `config.defaults`, the table the requests read too. Only argparse, the torch-free
vocabulary and that table are imported, so that `--help` starts fast.
"""
from __future__ import annotations

import argparse
import math

from ..config import defaults
from ..config.errors import UsageError
from ..config.metrics import ANYTIME_NAMES, METRIC_NAMES
from ..config.paths import DATA_ENV

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
  cl-bench list regimes --plugin submissions/examples/kernels.py   # with a plug-in's families and backbones
"""
LEADERBOARD_EXAMPLES = """examples:
  cl-bench leaderboard --results results/
  cl-bench leaderboard --results results/ --protocol depth-sweep-mini --out site/
  cl-bench leaderboard --results results/ --include-flagged   # rank runs with learning-check warnings too
  cl-bench leaderboard --from-mlflow http://mlflow.team:5000 --experiment depth-sweep --out site/
  cl-bench leaderboard --results results/ --rope 0.5          # practical equivalence: within 0.5 ACC points
  cl-bench leaderboard --results results/ --bundles bundles/ --contributor "Lab A"   # merge other labs' bundles
"""
REPORT_EXAMPLES = """examples:
  cl-bench report --results results/ --format markdown                  # to stdout
  cl-bench report --results results/ --protocol depth-sweep --format latex --out tables.tex
  cl-bench report --results results/ --format latex --metric aia --rope 0.5 --include-flagged
"""
FIGURES_EXAMPLES = """examples:
  cl-bench figures --results results/ --out figures/                    # PDF and PNG
  cl-bench figures --results results/ --protocol depth-sweep --out figures/ --format pdf
"""


CHECK_EXAMPLES = """examples:
  cl-bench check submissions/l2_anchor.py   # contract of a method file (exit 0 ok, 2 broken)
  cl-bench check lwf                        # the same for a registered method
"""
SUBMIT_EXAMPLES = """examples:
  cl-bench submit submissions/l2_anchor.py --protocol depth-sweep-mini
  cl-bench submit my_method.py --protocol depth-sweep-mini --regimes head,full --orders 2 --jobs 2
  cl-bench submit my_method.py --protocol depth-sweep-mini --no-baselines   # rank against the records there only
"""


ROPE_HELP = ("region of practical equivalence of the Bayesian method comparison, in ACC points "
             "(a finite number > 0; default %(default)s)")
RESULTS_HELP = "results folder (default: %(default)s/)"
REPORT_FORMATS = ("latex", "markdown")
FIGURE_FORMATS = ("pdf", "png")
INCLUDE_FLAGGED_HELP = ("rank flagged runs too (records with learning-check warnings; "
                        "default: left out of rankings)")


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


def _sample_size(value: str) -> int:
    """`--sample`: a non-negative integer, or `all` (-1: every finished record)."""
    return -1 if value == "all" else _non_negative(int)(value)


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


def _rope(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    # 0 is refused: without a ROPE, two tied methods are split by float rounding (baycomp too)
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0 of ACC points, got {value!r}")
    return number


def _figure_formats(value: str) -> tuple:
    items = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [v for v in items if v not in FIGURE_FORMATS]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(FIGURE_FORMATS)}, "
                                         f"got {value!r}")
    return items


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for tests and docs)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="cl-bench", formatter_class=fmt,
                     description="Continual-learning benchmarks under controlled fine-tuning regimes "
                                 "(depth, bitfit, norm, LoRA, prompts).",
                     epilog="run `cl-bench COMMAND --help` for a command's options and examples")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run(sub, fmt)
    _add_list(sub, fmt)
    _add_leaderboard(sub, fmt)
    _add_export(sub, fmt)
    _add_report(sub, fmt)
    _add_figures(sub, fmt)
    _add_check(sub, fmt)
    _add_submit(sub, fmt)
    _add_reproduce(sub, fmt)
    _add_bundle(sub, fmt)
    _add_verify(sub, fmt)
    return parser


def add_sweep_flags(cmd) -> None:
    """The flags every command that runs a protocol's grid shares (`run`, `submit`)."""
    cmd.add_argument("--protocol", required=True, help="protocol name (see `cl-bench list protocols`) or a YAML path")
    cmd.add_argument("--results", default=defaults.RESULTS, help=RESULTS_HELP)
    cmd.add_argument("--datasets", type=_csv, help="only these datasets (comma-separated)")
    cmd.add_argument("--regimes", type=_csv, help="only these regimes (comma-separated)")
    cmd.add_argument("--orders", type=_positive_int, help="only the first N task orders")
    cmd.add_argument("--jobs", type=_positive_int, default=defaults.JOBS,
                     help="worker processes (default %(default)s)")
    cmd.add_argument("--threads", type=_positive_int, default=defaults.THREADS,
                     help="torch threads per run (default %(default)s: parallelise across runs with --jobs)")
    cmd.add_argument("--executor", choices=("inline", "process", "ray"), default=defaults.EXECUTOR,
                     help="how runs are dispatched (default: %(default)s; --jobs 1 runs inline; "
                          "ray needs the [ray] extra)")
    cmd.add_argument("--data-dir", help=f"folder holding torchvision data sets (default: ${DATA_ENV}, else ./data)")
    cmd.add_argument("--download", action="store_true", help="download missing torchvision data sets")
    cmd.add_argument("--device", choices=("auto", "cpu", "cuda"), default=defaults.DEVICE,
                     help="device of the runs (default: %(default)s)")
    cmd.add_argument("--plugin", dest="plugin_files", action="append", default=[], metavar="FILE",
                     help="register the backbones, data sets and regime families of FILE (repeatable; "
                          "see submissions/README.md)")
    cmd.add_argument("--retry-failed", action="store_true", help="rerun runs recorded as failed/diverged/timeout")
    cmd.add_argument("--dry-run", action="store_true", help="print the grid and what is already done; run nothing")
    cmd.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    cmd.add_argument("--no-leaderboard", dest="leaderboard", action="store_false",
                     help="do not rebuild the leaderboard at the end")
    cmd.add_argument("--ray-address", metavar="ADDR",
                     help="with --executor ray: join this Ray cluster (default: start a local Ray with --jobs CPUs)")
    cmd.add_argument("--num-cpus", type=_non_negative(float),
                     help="with --executor ray: CPUs per run (default: protocol resources, else 1)")
    cmd.add_argument("--num-gpus", type=_non_negative(float),
                     help="with --executor ray: GPUs per run (default: protocol resources, else 0)")
    cmd.add_argument("--max-retries", type=_non_negative(int), default=defaults.MAX_RETRIES,
                     help="reruns of a run whose worker process died (process, ray; default %(default)s)")
    cmd.add_argument("--tracking-uri", metavar="URI",
                     help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<results>/mlflow.db)")
    cmd.add_argument("--experiment", help="MLflow experiment name (default: the protocol name)")
    cmd.add_argument("--no-mlflow", dest="mlflow", action="store_false", help="do not log to MLflow")
    cmd.add_argument("--run-timeout", type=_non_negative(float, positive=True), metavar="SECONDS",
                     help="stop a run after SECONDS and record it as status timeout; the sweep goes on "
                          "(runs then execute in worker processes, also with --jobs 1)")


def _add_run(sub, fmt) -> None:
    run = sub.add_parser("run", help="run a protocol's grid (resumable)", epilog=RUN_EXAMPLES,
                         formatter_class=fmt,
                         description="Run every dataset x regime x method x task order x seed of a "
                                     "protocol. Finished runs are skipped; interrupted sweeps resume.")
    add_sweep_flags(run)
    run.add_argument("--methods", type=_csv, help="only these methods (names or labels, comma-separated)")
    run.add_argument("--only", type=_csv, default=(), metavar="RUN_IDS",
                     help="only these run ids (reproduce single runs)")
    run.add_argument("--method", dest="method_files", action="append", default=[], metavar="FILE",
                     help="register the adapter in FILE for this run (repeatable)")
    run.add_argument("--include-flagged", action="store_true", help=INCLUDE_FLAGGED_HELP)
    run.add_argument("--rope", type=_rope, default=defaults.ROPE, metavar="POINTS", help=ROPE_HELP)


def _add_list(sub, fmt) -> None:
    lst = sub.add_parser("list", help="list protocols, datasets, methods or regimes",
                         epilog=LIST_EXAMPLES, formatter_class=fmt)
    lst.add_argument("what", nargs="?", default=defaults.LIST_WHAT,
                     choices=(defaults.LIST_WHAT, *defaults.LIST_SECTIONS))
    lst.add_argument("--method", dest="method_files", action="append", default=[], metavar="FILE",
                     help="also register the adapter in FILE")
    lst.add_argument("--plugin", dest="plugin_files", action="append", default=[], metavar="FILE",
                     help="also list the backbones, data sets and regime families of FILE (repeatable)")


def _add_leaderboard(sub, fmt) -> None:
    lb = sub.add_parser("leaderboard", help="build the static HTML leaderboard from records",
                        epilog=LEADERBOARD_EXAMPLES, formatter_class=fmt)
    lb.add_argument("--results", default=defaults.RESULTS, help=RESULTS_HELP)
    lb.add_argument("--protocol", help="protocol name inside the results folder (default: each one found)")
    lb.add_argument("--out", help="output folder (default: <results>/<protocol>/site/); a non-empty folder "
                                  "must hold a site cl-bench built, unless --force")
    lb.add_argument("--force", action="store_true",
                    help="write the site into a non-empty --out folder that holds no site (its index.html, "
                         "data/ and runs/ files are overwritten)")
    lb.add_argument("--from-mlflow", metavar="URI",
                    help="build from the record artifacts of an MLflow experiment instead of --results")
    lb.add_argument("--experiment", help="MLflow experiment with --from-mlflow (default: --protocol)")
    lb.add_argument("--protocol-version", metavar="VERSION",
                    help="the protocol version to show (default: the newest with records); a board shows one")
    lb.add_argument("--include-flagged", action="store_true", help=INCLUDE_FLAGGED_HELP)
    lb.add_argument("--rope", type=_rope, default=defaults.ROPE, metavar="POINTS", help=ROPE_HELP)
    lb.add_argument("--bundles", metavar="DIR",
                    help="also merge the bundles (*.zip) in DIR: each is checked here (manifest, schema, metrics, "
                         "protocol equal to the local one of its name and version); its verification status comes "
                         "only from a <bundle>.zip.verification.json under --verdicts made for that very bundle")
    lb.add_argument("--verdicts", metavar="DIR",
                    help="with --bundles: the folder of verdicts the board trusts (a results repository: verdicts/, "
                         "written by its board workflow only; default: the bundles folder, for your own verify runs)")
    lb.add_argument("--include-unverified", action="store_true",
                    help="with --bundles: rank the records of bundles whose rerun differs too (marked); by default "
                         "they are listed but left out of rankings. Self-reported bundles are ranked, labelled")
    lb.add_argument("--contributor", metavar="NAME", help="the name the board shows for the local records "
                                                          "(default: local results)")


def _add_export(sub, fmt) -> None:
    exp = sub.add_parser("export", help="write the tidy table of all records (CSV or Parquet)",
                         epilog=EXPORT_EXAMPLES, formatter_class=fmt)
    exp.add_argument("--results", default=defaults.RESULTS, help=RESULTS_HELP)
    exp.add_argument("--protocol", help="only this protocol's records (default: every protocol found)")
    exp.add_argument("--format", choices=("csv", "parquet"), default=defaults.EXPORT_FORMAT,
                     help="default: %(default)s")
    exp.add_argument("--out", help="output file (default: <results>/records.<format>)")
    exp.add_argument("--protocol-version", metavar="VERSION",
                     help="the protocol version to export (default: the newest with records, per protocol)")


def _add_records_source(cmd) -> None:
    """--results, --protocol and --protocol-version: which records a paper output is made of."""
    cmd.add_argument("--results", default=defaults.RESULTS, help=RESULTS_HELP)
    cmd.add_argument("--protocol", help="protocol name inside the results folder (needed when it holds several)")
    cmd.add_argument("--protocol-version", metavar="VERSION",
                     help="the protocol version to use (default: the newest with records)")
    cmd.add_argument("--include-flagged", action="store_true", help=INCLUDE_FLAGGED_HELP)


def _add_report(sub, fmt) -> None:
    rep = sub.add_parser("report", help="paper tables (LaTeX or Markdown): mean ± 95%% CI per method x regime",
                         epilog=REPORT_EXAMPLES, formatter_class=fmt,
                         description="Per dataset, a method x regime table of the metric (mean ± half-width of "
                                     "the 95% bootstrap CI over task orders, in %), then one of forgetting (and, when "
                                     "runs carry continual-evaluation curves, of min-ACC and stability-gap depth); "
                                     "best mean per regime in bold, flagged cells and credible wins marked.")
    _add_records_source(rep)
    rep.add_argument("--format", required=True, choices=REPORT_FORMATS, help="latex (booktabs) or markdown (GitHub)")
    rep.add_argument("--out", metavar="FILE", help="write the report to FILE (default: standard output)")
    rep.add_argument("--metric", choices=(*METRIC_NAMES, *ANYTIME_NAMES), default=defaults.METRIC,
                     help="metric of the first table (default: %(default)s); the any-time ones (min_acc ... "
                          "gap_unrecovered) need runs with a continual-evaluation curve")
    rep.add_argument("--rope", type=_rope, default=defaults.ROPE, metavar="POINTS", help=ROPE_HELP)


def _add_figures(sub, fmt) -> None:
    fig = sub.add_parser("figures", help="paper figures (PDF/PNG) per dataset: ranks, tau, norms, curves, ACC",
                         epilog=FIGURES_EXAMPLES, formatter_class=fmt,
                         description="Per dataset: mean rank per regime, Kendall tau between regimes, update norm "
                                     "vs forgetting, accuracy curves (when the analysis has them) and ACC / "
                                     "forgetting with CIs; the same records give byte-identical files.")
    _add_records_source(fig)
    fig.add_argument("--out", required=True, metavar="DIR", help="folder for the figure files")
    fig.add_argument("--format", dest="formats", type=_figure_formats, default=defaults.FIGURE_FORMATS,
                     metavar="FORMATS",
                     help=f"comma-separated: pdf, png (default: {','.join(defaults.FIGURE_FORMATS)})")


def _add_check(sub, fmt) -> None:
    chk = sub.add_parser("check", help="check a method file against the adapter contract",
                         epilog=CHECK_EXAMPLES, formatter_class=fmt,
                         description="Train the method on a tiny synthetic two-task stream under the head and "
                                     "full regimes and check the adapter contract (see submissions/README.md).")
    chk.add_argument("file", metavar="FILE", help="adapter file (.py), or the name of a registered method")
    chk.add_argument("--device", choices=("cpu", "cuda"), default=defaults.CHECK_DEVICE,
                     help="device of the check runs (default: %(default)s, where runs are bitwise reproducible)")


REPRODUCE_EXAMPLES = """examples:
  cl-bench reproduce 3f2a9c1b7d04                     # a record under results/
  cl-bench reproduce 3f2a9c1b7d04 --results out/ --out rerun/
  cl-bench reproduce 3f2a9c1b7d04 --method mine.py    # a record made with a method file
exit code: 0 when the rerun equals the record (bitwise, or its metrics within 1e-6), 1 when it differs,
2 when it cannot be rerun here (e.g. the --method/--plugin file it was made with is not given)
"""


def _add_reproduce(sub, fmt) -> None:
    rep = sub.add_parser("reproduce", help="rerun one record in a temporary folder and compare it with the record",
                         epilog=REPRODUCE_EXAMPLES, formatter_class=fmt,
                         description="Find the record RUN_ID under --results, rerun its spec with the same method "
                                     "code and data (checked by their fingerprints) and report whether the new "
                                     "record is bitwise equal, equal in its metrics, or different. Method and "
                                     "plug-in code comes from built-ins, installed entry points and the files "
                                     "given with --method/--plugin, never from a path written in the record.")
    rep.add_argument("run_id", metavar="RUN_ID", help="the record's run id (12 hex digits; the record's file name)")
    rep.add_argument("--results", default=defaults.RESULTS,
                     help="results folder holding the record (default: %(default)s/)")
    rep.add_argument("--data-dir", help=f"folder holding torchvision data sets (default: ${DATA_ENV}, else ./data)")
    rep.add_argument("--device", choices=("auto", "cpu", "cuda"),
                     help="device of the rerun (default: the record's own device)")
    rep.add_argument("--out", help="keep the rerun's record in this folder (default: a temporary folder, removed)")
    rep.add_argument("--method", dest="method_files", action="append", default=[], metavar="FILE",
                     help="the method file the record was made with (repeatable); it must hash to the record's "
                          "implementation. A path written in the record is never imported")
    rep.add_argument("--plugin", dest="plugin_files", action="append", default=[], metavar="FILE",
                     help="a plug-in file (backbone, data set, regime family) the record was made with (repeatable)")


def _add_submit(sub, fmt) -> None:
    smt = sub.add_parser("submit", help="check a method file, run a protocol's grid for it, rebuild the leaderboard",
                         epilog=SUBMIT_EXAMPLES, formatter_class=fmt,
                         description="Run `check` (on the CPU), then the protocol's grid with this method added "
                                     "(its DEFAULTS as hyperparameters): the protocol's own methods (the baselines) "
                                     "missing from --results run first, under the same --datasets/--regimes/--orders; "
                                     "the summary and the leaderboard rank the method against every record of that "
                                     "grid. Its records carry the file's sha256.")
    smt.add_argument("file", metavar="FILE", help="adapter file (.py)")
    add_sweep_flags(smt)
    smt.add_argument("--no-baselines", dest="baselines", action="store_false",
                     help="run only this method's runs; rank it against the baseline records already in --results")


BUNDLE_EXAMPLES = """examples:
  cl-bench bundle --results results/ --protocol depth-sweep-mini -o lab-a.zip --contributor "Lab A"
  cl-bench bundle --results out/ --protocol my-protocol.yaml -o mine.zip --method my_method.py
"""
VERIFY_EXAMPLES = """examples:
  cl-bench verify lab-a.zip                    # checks + 1 sampled rerun; verdict in lab-a.zip.verification.json
  cl-bench verify lab-a.zip --sample 0         # checks only: runs no bundled code (self-reported)
  cl-bench verify lab-a.zip --sample 3 --data-dir ~/data -o verdict.json
  cl-bench verify lab-a.zip --sample all --seed "$GITHUB_SHA"   # every record; the draw repeatable by its seed
  cl-bench verify new.zip --markdown comment.md --board bundles/   # the CI comment: cells beside the board's
exit code: 0 verified or self-reported, 1 a rerun differs, 2 a damaged, unsafe or inconsistent bundle (refused)
"""


def _add_bundle(sub, fmt) -> None:
    bnd = sub.add_parser("bundle", help="pack a protocol's records, method files, protocol file and environment "
                                        "lock into a zip with a sha256 manifest", epilog=BUNDLE_EXAMPLES,
                         formatter_class=fmt,
                         description="Pack the valid records of one protocol version (the protocol file's), the "
                                     "method files they name, the protocol file and an environment lock (package "
                                     "versions, devices, platform) into a zip whose manifest.json lists every "
                                     "member with its sha256 and size (format 1).")
    bnd.add_argument("--results", default=defaults.RESULTS, help=RESULTS_HELP)
    bnd.add_argument("--protocol", required=True,
                     help="protocol name (its copy in <results>/<name>/protocol-files/, else the protocol "
                          "`cl-bench run --protocol NAME` loads) or a YAML path")
    bnd.add_argument("-o", "--out", required=True, metavar="FILE", help="the bundle to write (.zip)")
    bnd.add_argument("--contributor", default="anonymous", metavar="NAME",
                     help="who made the records (shown on merged boards; default: %(default)s)")
    bnd.add_argument("--method", dest="method_files", action="append", default=[], metavar="FILE",
                     help="a method file the records were made with, where the path they name moved (repeatable)")


def _add_verify(sub, fmt) -> None:
    ver = sub.add_parser("verify", help="check a bundle and rerun a sample of its records", epilog=VERIFY_EXAMPLES,
                         formatter_class=fmt,
                         description="Check a bundle: manifest (every member hashed, nothing missing or extra), "
                                     "every record's schema, fingerprints against the bundled protocol, every metric "
                                     "recomputed from its accuracy matrix, every record a cell of the protocol's grid. "
                                     "Then rerun K records (drawn with the verifier's randomness, or --seed; the "
                                     "verdict records the seed) with `reproduce`: verified when every rerun agrees "
                                     "(bitwise or within 1e-6), rerun differs otherwise, self-reported without "
                                     "reruns. WARNING: reruns EXECUTE THE BUNDLED METHOD FILES (the contributor's "
                                     "Python code; each must hash to the implementation its record names); run "
                                     "them in a sandbox. The checks and --sample 0 run no bundled code.")
    ver.add_argument("file", metavar="FILE", help="the bundle (.zip)")
    ver.add_argument("--sample", type=_sample_size, default=1, metavar="K|all",
                     help="records to rerun (default %(default)s; all: every finished record; 0: checks only, no "
                          "bundled code runs)")
    ver.add_argument("--seed", metavar="S",
                     help="draw the sample with S (e.g. a CI run id or merge commit sha) to make the verification "
                          "repeatable; default: fresh randomness the contributor cannot predict. Either way the "
                          "verdict records it")
    ver.add_argument("--download", action="store_true",
                     help="download a torchvision data set a rerun needs and --data-dir lacks")
    ver.add_argument("--data-dir", help=f"folder holding torchvision data sets (default: ${DATA_ENV}, else ./data)")
    ver.add_argument("-o", "--out", metavar="FILE",
                     help="the verdict JSON (default: FILE.verification.json next to the bundle)")
    ver.add_argument("--markdown", metavar="FILE",
                     help="also write a Markdown comment (verdict, and per cell this bundle's ACC beside the board's; "
                          "every bundle string escaped) for a results repository's pull request")
    ver.add_argument("--board", metavar="DIR",
                     help="with --markdown: the folder of bundles already on the board (each checked here)")
