"""`cl-bench submit`: a method file's grid under a published protocol, marked as a submission.

The protocol's own method list is left alone; the submission becomes one extra method entry
(its DEFAULTS as hyperparameters). The grid is the protocol's methods (the baselines) and the
submission under the same dataset/regime/order filters: the baselines missing from the results
folder are run first (unless `baselines=False`), and the summary and the site rank the
submission against every record of the grid. Its records carry
`provenance["submission"] = {"file", "sha256"}` (the run id does not change). A record made
from another version of the file has another run id (the file's hash is part of it); one made
from this file without the submission's provenance (`run --method FILE`) is run again.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.specs import Protocol
    from .plan import Plan


@dataclass(frozen=True)
class Submission:
    """Everything `submit` runs: the protocol with the submission, the plan of the whole grid (without
    baselines only the submission's runs are to do), the specs it ranks (`grid`), and the provenance entry."""

    method: str
    protocol: Protocol
    plan: Plan
    info: dict  # {"file", "sha256"}: the records' provenance["submission"]
    file: str
    grid: dict = dataclasses.field(default_factory=dict)  # run id -> RunSpec of the whole grid (what is ranked)
    baselines: bool = True  # whether the protocol's own methods are run when missing
    done: frozenset = frozenset()  # run ids of the whole grid with a valid record before this submission
    others: frozenset = frozenset()  # run ids of other submitted files' records in the grid (ranked too)

    def own_ids(self) -> frozenset:
        """The run ids of the submitted method's runs."""
        return frozenset(rid for rid, s in self.grid.items() if s.method == self.method)

    def baseline_counts(self) -> tuple[int, int]:
        """(records there, runs in the grid) of the protocol's own methods (the baselines)."""
        theirs = {rid for rid, s in self.grid.items() if s.method != self.method} - self.others
        return len(theirs & self.done), len(theirs)


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

    protocol = with_baselines(protocol, adapter)
    return select(protocol, methods=[m.display for m in protocol.methods if m.name == adapter.name])


def with_baselines(protocol, adapter):
    """The protocol with `adapter` as an extra method (DEFAULTS) beside its own methods."""
    from ..config.specs import MethodSpec

    methods = protocol.methods
    if not any(m.name == adapter.name for m in methods):
        methods = (*methods, MethodSpec(adapter.name, dict(adapter.defaults), version=adapter.implementation))
    return dataclasses.replace(protocol, methods=methods)


def prepare(path, protocol_name: str, results, *, datasets=None, regimes=None, orders=None,
            data_dir: str | None = None, download: bool = False, dry_run: bool = False,
            retry_failed: bool = False, files=(), baselines: bool = True) -> Submission:
    """Load the file and the protocol (with the plug-in `files`, if any), and plan the grid of the protocol's
    methods and the submission against `results` (as `plan_sweep` plans any sweep: a dry run leaves out the
    data sets that are not there); without `baselines` only the submission's runs are to do."""
    from ..api.registry import get_registry
    from ..config.protocol import load_protocol, select
    from .plan import plan_sweep

    adapter = submitted_adapter(path)
    protocol = load_protocol(protocol_name, get_registry(tuple(dict.fromkeys((str(path), *map(str, files))))))
    protocol = select(with_baselines(protocol, adapter), datasets=datasets, regimes=regimes, orders=orders)
    info = submission_info(path)
    planned = plan_sweep(protocol, results, data_dir=data_dir, download=download, dry_run=dry_run,
                         retry_failed=retry_failed)
    grid = {s.run_id: s for s in planned.specs if s.data_fingerprint or not planned.missing_data}
    others = other_submissions(grid, results, protocol.name, adapter.name)
    grid.update(others)
    plan = redo_unsubmitted(planned, info["sha256"], adapter.name)
    if not baselines:
        plan = only_method(plan, adapter.name)
    return Submission(adapter.name, protocol, plan, info, str(path), grid, baselines, frozenset(planned.done),
                      frozenset(others))


def only_method(plan: Plan, method: str) -> Plan:
    """The plan with only one method's runs to do (`submit --no-baselines`); its grid and what is done stay
    whole, so the plan and its power lines describe the grid the method is ranked in."""
    return dataclasses.replace(plan, todo=tuple(s for s in plan.todo if s.method == method))


# What a method changes in a spec; the rest (data, regime, order, seed, training, ...) is the cell's setting.
METHOD_KEYS = ("method", "label", "hparams", "method_version")


def other_submissions(grid: dict, results, protocol_name: str, method: str) -> dict:
    """{run id: spec} of the records of other submitted files in the results folder whose cell setting is
    one of the grid's (same data, regime, order, seed, training, ...): earlier submissions are ranked too,
    as `leaderboard` ranks them; one made under other settings is not."""
    from .store import runs_dir, scan_runs

    settings = {_setting(s.to_dict()) for s in grid.values()}
    return {rid: rec.spec for rid, rec in scan_runs(runs_dir(results, protocol_name)).valid.items()
            if rid not in grid and rec.submission and rec.spec.method != method
            and _setting(rec.spec.to_dict()) in settings}


def _setting(spec: dict) -> str:
    return json.dumps({k: v for k, v in spec.items() if k not in METHOD_KEYS}, sort_keys=True)


def redo_unsubmitted(plan: Plan, sha256: str, method: str | None = None) -> Plan:
    """Move the done records that this file's submission did not make back to the runs to do.

    The run id carries the file's hash, so a done record was made from this very file; the
    ones without this submission's provenance (made by `run --method FILE`) are run again so
    that every record of the submission says where it came from. Only those runs are added:
    the plan's other todo (and what it left out, e.g. data sets not there in a dry run) stand.
    """
    own = {s.run_id for s in plan.specs if method is None or s.method == method}  # the baselines stand
    redo = {rid for rid, rec in plan.done.items() if rid in own and (rec.submission or {}).get("sha256") != sha256}
    if not redo:
        return plan
    done = {rid: rec for rid, rec in plan.done.items() if rid not in redo}
    todo = {s.run_id for s in plan.todo} | redo
    return dataclasses.replace(plan, done=done, todo=tuple(s for s in plan.specs if s.run_id in todo))
