"""The grid of a protocol (`expand`) and what a results folder already holds of it (`make_plan`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.errors import UserError
from ..config.specs import DatasetSpec, Protocol, RunSpec
from ..config.vocabulary import DATASETS
from .store import runs_dir, scan_runs


class SweepError(UserError, RuntimeError):
    """The sweep cannot start or continue (locked or unwritable results folder, unknown run id, …)."""


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


def expand(protocol: Protocol) -> tuple[RunSpec, ...]:
    """The grid: dataset x regime x method x task order x seed, each a RunSpec."""
    specs = []
    for d in protocol.datasets:
        n_classes = _n_classes(d)
        orders = [o if o is not None else class_order(n_classes, i, protocol.order_seed)
                  for i, o in enumerate(protocol.task_orders)]
        for regime in protocol.regimes:
            for m in protocol.methods:
                for i, order in enumerate(orders):
                    for seed in protocol.seeds:
                        specs.append(RunSpec(
                            protocol=protocol.name, protocol_version=protocol.version, dataset=d,
                            regime=regime, method=m.name, label=m.label, hparams=dict(m.hparams),
                            order=i, class_order=tuple(order), seed=seed, scenario=protocol.scenario,
                            pretrain=protocol.pretrain, training=protocol.training,
                            eval_batch_size=protocol.eval_batch_size))
    return tuple(specs)


@dataclass(frozen=True)
class Plan:
    """The grid of a protocol against what its results folder already holds."""

    specs: tuple
    done: dict
    todo: tuple
    invalid: tuple
    stray: tuple

    def counts(self) -> dict:
        """Number of distinct values per axis, and run totals."""
        axis = lambda f: len({f(s) for s in self.specs})  # noqa: E731
        return {"datasets": axis(lambda s: s.dataset.name), "regimes": axis(lambda s: s.regime),
                "methods": axis(lambda s: s.display), "orders": axis(lambda s: s.order),
                "seeds": axis(lambda s: s.seed), "total": len(self.specs),
                "done": len(self.done), "todo": len(self.todo)}


def make_plan(protocol: Protocol, results: str | Path, retry_failed: bool = False,
              only: tuple = ()) -> Plan:
    """Expand the protocol and split it into finished runs and runs to do."""
    specs = expand(protocol)
    if only:
        unknown = set(only) - {s.run_id for s in specs}
        if unknown:
            raise SweepError(f"--only: run id(s) {', '.join(sorted(unknown))} are not in protocol "
                             f"{protocol.name!r} (see --dry-run --list)")
        specs = tuple(s for s in specs if s.run_id in only)
    scan = scan_runs(runs_dir(results, protocol.name))
    ids = {s.run_id for s in specs}
    done = {k: v for k, v in scan.valid.items() if k in ids and not (retry_failed and not v.ok)}
    todo = tuple(s for s in specs if s.run_id not in done)
    return Plan(specs, done, todo, tuple(scan.invalid), tuple(scan.stray))
