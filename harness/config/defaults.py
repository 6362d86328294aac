"""The defaults of the commands' options, in one table: the request classes (harness.service.requests)
and the CLI parser (harness.cli.parser) both read them, so each is written once.

Plain constants on purpose: the parser imports this module before `--help` is printed, and
`--help` must start fast (no dataclasses, no service wing).
"""
from __future__ import annotations

RESULTS = "results"  # the results folder
JOBS = 1  # worker processes
THREADS = 1  # torch threads per run: parallelise across runs with --jobs
EXECUTOR = "process"
DEVICE = "auto"  # device of the runs
CHECK_DEVICE = "cpu"  # the contract check runs where runs are bitwise reproducible
MAX_RETRIES = 1  # reruns of a run whose worker process died
ROPE = 1.0  # region of practical equivalence of the Bayesian comparison, in ACC points
METRIC = "acc"  # the metric of a report's first table
EXPORT_FORMAT = "csv"
FIGURE_FORMATS = ("pdf", "png")
LIST_SECTIONS = ("protocols", "datasets", "methods", "regimes")  # `cl-bench list` shows all by default
LIST_WHAT = "all"
