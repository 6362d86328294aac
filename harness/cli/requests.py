"""The typed request of a parsed command line (the request types live in harness.service.requests).

Every flag's `dest` is the name of its request field, so a request is filled field by field
from the namespace; a field without a flag keeps the request's own default.
"""
from __future__ import annotations

import argparse
from dataclasses import fields

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

REQUESTS = {"run": SweepRequest, "check": CheckRequest, "list": ListRequest, "leaderboard": LeaderboardRequest,
            "export": ExportRequest, "report": ReportRequest, "figures": FiguresRequest,
            "reproduce": ReproduceRequest, "submit": SubmitRequest,
            "bundle": BundleRequest, "verify": VerifyRequest}


def filled(request_type, args: argparse.Namespace, **given):
    """`request_type` with every field the namespace has (lists as tuples: requests are frozen), then `given`."""
    values = {f.name: getattr(args, f.name) for f in fields(request_type) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return request_type(**{**values, **given})


def request_from_args(args: argparse.Namespace):
    """The typed request of a parsed command line."""
    if args.command not in REQUESTS:
        raise ValueError(f"no request type for command {args.command!r}")
    if args.command == "submit":  # the grid part runs the submitted file's method
        return filled(SubmitRequest, args, sweep=filled(SweepRequest, args, method_files=(args.file,)))
    return filled(REQUESTS[args.command], args)
