"""The class-IL protocols and the rehearsal baseline in the task-IL ones (issue 25)."""
from __future__ import annotations

import pytest
from test_datasets import write_cifar100

from harness.api.registry import get_registry
from harness.config.protocol import load_protocol, select
from harness.config.vocabulary import Scenario, regime_family
from harness.execution.plan import expand

REHEARSAL = ("replay", "der", "derpp", "er-ace", "icarl", "bic", "gdumb")


def _memories(protocol) -> dict:
    return {m.name: m.hparams["mem_size"] for m in protocol.methods if m.name in REHEARSAL}


def test_classil_sweep_mini_runs_every_family_with_the_rehearsal_baselines():
    p = load_protocol("classil-sweep-mini", get_registry())
    assert p.scenario == Scenario.CLASS_IL and p.pretrain.is_backbone
    assert {regime_family(r) for r in p.regimes} == {"depth", "bitfit", "norm", "lora"}
    names = {m.name for m in p.methods}
    assert {"naive", "lwf", "ewc-online", "gpm", "became", "magmax", "ncm", *REHEARSAL} <= names
    assert set(_memories(p).values()) == {200} and set(_memories(p)) == set(REHEARSAL)
    for m in p.methods:  # projection is defined on weight matrices: depth regimes only
        if m.name in ("gpm", "became"):
            assert {regime_family(r) for r in p.regimes if m.runs_under(r)} == {"depth"}
    assert len(p.task_orders) >= 5
    specs = expand(p, {d.name: f"sha256:{d.name}" for d in p.datasets})
    assert all(s.scenario == Scenario.CLASS_IL for s in specs) and len(specs) == 780


def test_classil_sweep_is_the_literatures_cifar100_setting_and_plans_on_real_files(tmp_path, cli):
    p = load_protocol("classil-sweep", get_registry())
    (d,) = p.datasets
    assert (d.name, d.n_tasks, d.classes_per_task, d.model) == ("cifar100", 10, 10, "resnet18-reduced")
    assert p.scenario == Scenario.CLASS_IL and set(_memories(p).values()) == {2000}
    write_cifar100(tmp_path / "data")  # the real on-disk format (python pickles), random pixels
    code, out, err = cli("run", "--protocol", "classil-sweep", "--dry-run", "--data-dir", tmp_path / "data",
                         "--results", tmp_path / "res")
    assert code == 0, err
    assert "to run: 1012" in out and "not planned" not in out


@pytest.mark.parametrize("name", ["depth-sweep-mini", "subspace-sweep-mini"])
def test_the_task_il_mini_protocols_rank_against_experience_replay(name):
    p = load_protocol(name, get_registry())
    (replay,) = [m for m in p.methods if m.name == "replay"]
    assert replay.hparams["mem_size"] == 200
    # under head in task-IL nothing can be forgotten: replay runs everywhere else
    assert [r for r in p.regimes if not replay.runs_under(r)] == ["head"]
    assert {m.name for m in select(p, methods=("replay",)).methods} == {"replay"}  # --methods replay works
