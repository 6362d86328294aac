"""`cl-bench submit`: a method file's grid under a published protocol, marked as a submission.

The protocol's own method list is left alone; the submission becomes one extra method entry
(its DEFAULTS as hyperparameters) and the grid is restricted to it. Its records carry
`provenance["submission"] = {"file", "sha256"}` (the run id does not change), and a
record made from a different version of the file is run again rather than reused.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Submission:
    """Everything `submit` runs: the restricted protocol, its plan, and the provenance entry."""

    method: str
    protocol: object
    plan: object
    info: dict
    file: str


def submission_info(path: str | Path) -> dict:
    """The provenance entry of a submitted file: its path (as given) and full sha256."""
    from ..api.registry import file_sha256

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
            retry_failed: bool = False, plan=None, files=()) -> Submission:
    """Load the file and the protocol (with the plug-in `files`, if any), and plan the submission's grid
    against `results`.

    `plan(protocol) -> Plan` plans the restricted protocol (default: `make_plan` with the data
    sets fingerprinted from their default locations).
    """
    from ..config.protocol import load_protocol, select
    from ..api.registry import get_registry
    from .plan import make_plan

    adapter = submitted_adapter(path)
    protocol = load_protocol(protocol_name, get_registry(tuple(dict.fromkeys((str(path), *map(str, files))))))
    protocol = select(with_method(protocol, adapter), datasets=datasets, regimes=regimes, orders=orders)
    info = submission_info(path)
    planned = plan(protocol) if plan else make_plan(protocol, results, retry_failed=retry_failed)
    plan = redo_other_versions(planned, info["sha256"])
    return Submission(adapter.name, protocol, plan, info, str(path))


def redo_other_versions(plan, sha256: str):
    """Move records made from another version of the file (or none) from done to todo."""
    stale = {rid for rid, rec in plan.done.items() if (rec.submission or {}).get("sha256") != sha256}
    if not stale:
        return plan
    done = {rid: rec for rid, rec in plan.done.items() if rid not in stale}
    todo = tuple(s for s in plan.specs if s.run_id not in done)
    return dataclasses.replace(plan, done=done, todo=todo)
