"""`cl-bench submit`: a method file's grid under a published protocol, marked as a submission.

The protocol's own method list is left alone; the submission becomes one extra method entry
(its DEFAULTS as hyperparameters) and the grid is restricted to it. Its records carry
`provenance["submission"] = {"file", "sha256"}` (the run id does not change). A record made
from another version of the file has another run id (the file's hash is part of it); one made
from this file without the submission's provenance (`run --method FILE`) is run again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.specs import Protocol
    from .plan import Plan


@dataclass(frozen=True)
class Submission:
    """Everything `submit` runs: the restricted protocol, its plan, and the provenance entry."""

    method: str
    protocol: Protocol
    plan: Plan
    info: dict  # {"file", "sha256"}: the records' provenance["submission"]
    file: str


def submission_info(path: str | Path) -> dict:
    """The provenance entry of a submitted file: its path (as given) and full sha256."""
    from ..config.files import file_sha256

    return {"file": Path(path).as_posix(), "sha256": file_sha256(path)}


def submitted_adapter(path: str | Path):
    """The single adapter a submission file defines (loaded through the registry, collisions included)."""
    from ..api.registry import RegistryError, adapters_from_module, get_registry, load_module_file

    adapters = adapters_from_module(load_module_file(path), str(path))
    if len(adapters) != 1:
        raise RegistryError(f"{path}: defines {len(adapters)} methods; submit one method per file")
    return get_registry((str(path),))[adapters[0].name]


def with_method(protocol, adapter):
    """The protocol with `adapter` as an extra method (DEFAULTS), restricted to that method."""
    from ..config.protocol import select
    from ..config.specs import MethodSpec

    methods = protocol.methods
    if not any(m.name == adapter.name for m in methods):
        methods = (*methods, MethodSpec(adapter.name, dict(adapter.defaults), version=adapter.implementation))
    protocol = dataclasses.replace(protocol, methods=methods)
    return select(protocol, methods=[m.display for m in methods if m.name == adapter.name])


def prepare(path, protocol_name: str, results, *, datasets=None, regimes=None, orders=None,
            data_dir: str | None = None, download: bool = False, dry_run: bool = False,
            retry_failed: bool = False, files=()) -> Submission:
    """Load the file and the protocol (with the plug-in `files`, if any), and plan the submission's grid
    against `results` (as `plan_sweep` plans any sweep: a dry run leaves out the data sets that are not there)."""
    from ..api.registry import get_registry
    from ..config.protocol import load_protocol, select
    from .plan import plan_sweep

    adapter = submitted_adapter(path)
    protocol = load_protocol(protocol_name, get_registry(tuple(dict.fromkeys((str(path), *map(str, files))))))
    protocol = select(with_method(protocol, adapter), datasets=datasets, regimes=regimes, orders=orders)
    info = submission_info(path)
    planned = plan_sweep(protocol, results, data_dir=data_dir, download=download, dry_run=dry_run,
                         retry_failed=retry_failed)
    return Submission(adapter.name, protocol, redo_unsubmitted(planned, info["sha256"]), info, str(path))


def redo_unsubmitted(plan: Plan, sha256: str) -> Plan:
    """Move the done records that this file's submission did not make back to the runs to do.

    The run id carries the file's hash, so a done record was made from this very file; the
    ones without this submission's provenance (made by `run --method FILE`) are run again so
    that every record of the submission says where it came from. Only those runs are added:
    the plan's other todo (and what it left out, e.g. data sets not there in a dry run) stand.
    """
    redo = {rid for rid, rec in plan.done.items() if (rec.submission or {}).get("sha256") != sha256}
    if not redo:
        return plan
    done = {rid: rec for rid, rec in plan.done.items() if rid not in redo}
    todo = {s.run_id for s in plan.todo} | redo
    return dataclasses.replace(plan, done=done, todo=tuple(s for s in plan.specs if s.run_id in todo))
