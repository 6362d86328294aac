"""The grid of a protocol (`expand`) and what a results folder already holds of it (`make_plan`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..api.plugins import implementations
from ..config.errors import PretrainError, ProtocolError, SweepError
from ..config.pretrain import PretrainKind
from ..config.specs import DatasetSpec, Protocol, RunSpec
from ..config.vocabulary import DATASETS, NPZ_PREFIX, sample_shape_problem
from .store import runs_dir, scan_runs


def class_order(n_classes: int, order_index: int, seed: int) -> tuple[int, ...]:
    """Order 0 is the natural order; order k > 0 a permutation seeded by (seed, k)."""
    if order_index == 0:
        return tuple(range(n_classes))
    rng = np.random.default_rng([int(seed), int(order_index)])
    return tuple(int(c) for c in rng.permutation(n_classes))


def _n_classes(dataset: DatasetSpec) -> int:
    if dataset.name in DATASETS:
        return DATASETS[dataset.name].n_classes
    from ..run.datasets import load_dataset  # a user's own arrays: their labels say

    return load_dataset(dataset.name).n_classes


def data_fingerprints(protocol: Protocol, data_dir: str | None = None, download: bool = False,
                      allow_missing: bool = False) -> dict:
    """The content fingerprint of each data set (None for a missing one when `allow_missing`)."""
    from ..config.errors import DatasetMissing
    from ..run.datasets import dataset_fingerprint

    out = {}
    for d in protocol.datasets:
        try:
            out[d.name] = dataset_fingerprint(d.name, data_dir, download)
        except DatasetMissing:  # absent files only: damaged or refused ones are errors even in a dry run
            if not allow_missing or d.name.startswith(NPZ_PREFIX):  # a user's own file: say what is wrong now
                raise
            out[d.name] = None
    return out


def check_shapes(protocol: Protocol, fingerprints: dict, data_dir: str | None = None, download: bool = False) -> None:
    """Refuse a data set whose samples its model cannot take (one line), for the data sets whose sample
    shape is known only once loaded (npz, plug-ins without `input_shape`; the loader checked the rest)."""
    from ..run.datasets import load_dataset

    for d in protocol.datasets:
        facts = DATASETS.get(d.name)
        if (facts is not None and facts.sample_shape) or not fingerprints.get(d.name):
            continue  # checked at load, or not present (a dry run)
        problem = sample_shape_problem(d.model, d.name, load_dataset(d.name, data_dir, download).input_shape)
        if problem:
            raise ProtocolError(f"{protocol.source}: datasets: {problem}")


def expand(protocol: Protocol, fingerprints: dict | None = None) -> tuple[RunSpec, ...]:
    """The grid: dataset x regime x method x task order x seed, each a RunSpec.

    `fingerprints` (data set name -> content fingerprint, see `data_fingerprints`) complete
    the run identity; without them every data set is fingerprinted here.
    """
    fingerprints = data_fingerprints(protocol) if fingerprints is None else fingerprints
    specs = []
    for d in protocol.datasets:
        n_classes = _n_classes(d)
        orders = [o if o is not None else class_order(n_classes, i, protocol.order_seed)
                  for i, o in enumerate(protocol.task_orders)]
        pretrain = protocol.pretrain.for_dataset(d.name)  # `dataset: same` -> this data set, once
        for regime in protocol.regimes:
            for m in (m for m in protocol.methods if m.runs_under(regime)):
                for i, order in enumerate(orders):
                    for seed in protocol.seeds:
                        specs.append(RunSpec(
                            protocol=protocol.name, protocol_version=protocol.version, dataset=d,
                            regime=regime, method=m.name, label=m.label, hparams=dict(m.hparams),
                            order=i, class_order=tuple(order), seed=seed, scenario=protocol.scenario,
                            pretrain=pretrain, training=protocol.training,
                            eval_batch_size=protocol.eval_batch_size, method_version=m.version,
                            data_fingerprint=fingerprints.get(d.name) or "",
                            plugins=implementations(d.model, d.name, regime), continual=protocol.continual))
    return tuple(specs)


@dataclass(frozen=True)
class Plan:
    """The grid of a protocol against what its results folder already holds."""

    specs: tuple
    done: dict
    todo: tuple
    invalid: tuple
    stray: tuple
    foreign: tuple = ()
    missing_data: tuple = ()  # data sets not present (dry run): their run ids are not known yet
    missing_weights: str = ""  # timm weights not present (dry run): the line saying how to get them

    def counts(self) -> dict:
        """Number of distinct values per axis, and run totals."""
        axis = lambda f: len({f(s) for s in self.specs})  # noqa: E731
        return {"datasets": axis(lambda s: s.dataset.name), "regimes": axis(lambda s: s.regime),
                "methods": axis(lambda s: s.display), "orders": axis(lambda s: s.order),
                "seeds": axis(lambda s: s.seed), "total": len(self.specs),
                "done": len(self.done), "todo": len(self.todo)}


def make_plan(protocol: Protocol, results: str | Path, retry_failed: bool = False, only: tuple = (),
              fingerprints: dict | None = None) -> Plan:
    """Expand the protocol and split it into finished runs and runs to do."""
    specs = expand(protocol, fingerprints)
    missing = tuple(sorted({s.dataset.name for s in specs if not s.data_fingerprint})) if fingerprints else ()
    if only:
        unknown = set(only) - {s.run_id for s in specs}
        if unknown:
            raise SweepError(f"--only: run id(s) {', '.join(sorted(unknown))} are not in protocol "
                             f"{protocol.name!r} version {protocol.version} (its run ids are the record file "
                             f"names under {runs_dir(results, protocol.name)}; `cl-bench reproduce RUN_ID` "
                             "reruns one record)")
        specs = tuple(s for s in specs if s.run_id in only)
    scan = scan_runs(runs_dir(results, protocol.name))
    ids = {s.run_id: s for s in specs}
    # a record without the curve its spec asks for is not done (continual evaluation is not in the run id)
    done = {k: v for k, v in scan.valid.items() if k in ids and ids[k].satisfied_by(v)
            and not (retry_failed and not v.ok)}
    todo = tuple(s for s in specs if s.run_id not in done and s.dataset.name not in missing)
    return Plan(specs, done, todo, tuple(scan.invalid), tuple(scan.stray), tuple(scan.foreign), missing)


def plan_sweep(protocol: Protocol, results: str | Path, *, data_dir: str | None = None, download: bool = False,
               dry_run: bool = False, retry_failed: bool = False, only: tuple = ()) -> Plan:
    """The plan of a sweep: the data fingerprinted first (downloaded if asked, except in a dry run,
    which plans without the data sets that are not there)."""
    fingerprints = data_fingerprints(protocol, data_dir, download and not dry_run, allow_missing=dry_run)
    check_shapes(protocol, fingerprints, data_dir, download and not dry_run)
    protocol, missing = _with_weights(protocol, download and not dry_run, dry_run)
    plan = make_plan(protocol, results, retry_failed=retry_failed, only=only, fingerprints=fingerprints)
    return replace(plan, missing_weights=missing) if missing else plan


def _with_weights(protocol: Protocol, download: bool, dry_run: bool) -> tuple[Protocol, str]:
    """The protocol with its timm weights' sha256 (fetched first if asked); while they are missing, a dry run
    plans with the value saying so (and the line how to get them), a run stops with that line."""
    if protocol.pretrain.kind is not PretrainKind.TIMM:
        return protocol, ""
    from ..run.pretrain import missing_timm_line, with_timm_weights

    pretrain = with_timm_weights(protocol.pretrain, download, log=print)
    if pretrain.missing and not dry_run:
        raise PretrainError(missing_timm_line(pretrain))
    return replace(protocol, pretrain=pretrain), missing_timm_line(pretrain) if pretrain.missing else ""
