"""How to rerun one record: the command the site shows and the CLI prints."""
from __future__ import annotations


def reproduce_command(protocol: str, run_id: str, results: str | None = None) -> str:
    """The command that reruns exactly one record of `protocol`."""
    cmd = f"cl-bench run --protocol {protocol} --only {run_id}"
    return f"{cmd} --results {results}" if results else cmd
