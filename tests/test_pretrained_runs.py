"""Runs on pretrained backbones: θ0 is the pretrained model, the stream loses its held-out samples,
a sweep pretrains once, and a bad checkpoint stops the sweep with one line."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import make_spec

from harness.api import contract
from harness.api.subspace import effective_weights
from harness.config.pretrain import parse_pretrain
from harness.config.specs import DatasetSpec, TrainingSpec
from harness.run.engine import build_run_model, run_one

pytestmark = pytest.mark.slow  # every test here trains real models (runs, sweeps)

FAST = TrainingSpec(lr=0.1, momentum=0.9, epochs=1, batch_size=32)
DIGITS = DatasetSpec("digits", 3, 2, "mlp")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))


def _checkpoint(tmp_path) -> tuple:
    """A backbone state the test makes itself, saved as a checkpoint; (its pretrain value, the state)."""
    torch.manual_seed(123)
    net = build_run_model(make_spec(dataset=DIGITS), (1, 8, 8))
    state = {k: v.clone() for k, v in net.state_dict().items() if k.startswith("blocks.")}
    torch.save(state, tmp_path / "backbone.pt")
    return parse_pretrain({"checkpoint": "backbone.pt"}, "p.yaml", tmp_path), state


def _copy(tensors: dict) -> dict:
    return {k: v.clone() for k, v in tensors.items()}  # effective_weights shares a plain parameter's storage


@pytest.mark.parametrize("regime", ["last-2", "lora-r2"])
def test_merging_measures_task_vectors_from_the_pretrained_checkpoint(tmp_path, regime):
    pretrain, state = _checkpoint(tmp_path)
    seen = []

    def observer(event, t, strategy):
        if event == "before_task" and t == 0:
            seen.append(_copy(effective_weights(strategy.model)))
        elif event == "after_task":
            seen.append((_copy(effective_weights(strategy.model)),
                         _copy(effective_weights(contract.evaluated_model(strategy)))))

    spec = make_spec(regime=regime, method="avg", pretrain=pretrain, training=FAST, dataset=DIGITS)
    record = run_one(spec, device="cpu", observer=observer)
    assert record.status == "ok", record.error
    start = seen[0]
    for name, value in state.items():  # the run starts from the checkpoint, bitwise
        assert torch.equal(start[name.replace(".base_layer.", ".")], value), name
    trained1, evaluated1 = seen[1]
    changed = [k for k in start if not torch.equal(trained1[k], start[k])]
    assert changed
    for k in changed:  # avg after task 1 = θ0 + τ_1 / 1: the trained model itself, τ_1 from the checkpoint
        torch.testing.assert_close(evaluated1[k], start[k] + (trained1[k] - start[k]), rtol=0, atol=1e-6)
    trained2, evaluated2 = seen[2]
    for k in changed:  # after task 2: θ0 + (τ_1 + τ_2) / 2
        by_hand = start[k] + ((trained1[k] - start[k]) + (trained2[k] - start[k])) / 2
        torch.testing.assert_close(evaluated2[k], by_hand, rtol=0, atol=1e-5)
    assert record.diagnostics["merge"]["n_task_vectors"] == 3
    assert record.provenance["pretrained"]["sha256"] == hashlib.sha256((tmp_path / "backbone.pt").read_bytes()).hexdigest()


def test_first_task_pretraining_still_takes_theta0_after_task_1():
    record = run_one(make_spec(regime="last-2", method="avg", pretrain="first-task", training=FAST, dataset=DIGITS),
                     device="cpu")
    assert record.status == "ok" and record.diagnostics["merge"]["n_task_vectors"] == 2


def test_the_stream_loses_the_held_out_samples_and_the_budget_shows_it():
    from harness.run.datasets import load_dataset
    from harness.run.pretrain import holdout_indices

    recipe = parse_pretrain({"dataset": "same", "holdout": 0.2, "epochs": 1}, "p.yaml", Path(".")).for_dataset("digits")
    held = set(holdout_indices(load_dataset("digits").y_train, 0.2, 0).tolist())
    y = load_dataset("digits").y_train
    stream_classes = set(range(6))  # class order 0..9: 3 tasks x 2 classes use classes 0..5
    held_in_stream = sum(1 for i in held if int(y[i]) in stream_classes)
    plain = run_one(make_spec(regime="head", pretrain="none", training=FAST, dataset=DIGITS), device="cpu")
    pre = run_one(make_spec(regime="head", pretrain=recipe, training=FAST, dataset=DIGITS), device="cpu")
    assert plain.ok and pre.ok, (plain.error, pre.error)
    assert plain.budget["samples_seen"] - pre.budget["samples_seen"] == held_in_stream > 0
    assert pre.provenance["pretrained"]["source"] == "dataset"


def _protocol(tmp_path, pretrain: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"""name: pre
version: "1"
pretrain: {pretrain}
datasets: [{{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}}]
regimes: [head, lora-r1]
methods: [naive]
training: {{epochs: 1, batch_size: 64}}
""")
    return path


def test_a_sweep_pretrains_once_and_every_record_names_the_same_weights(tmp_path, cli):
    protocol = _protocol(tmp_path, "{dataset: same, holdout: 0.2, epochs: 1}")
    code, out, err = cli("run", "--protocol", protocol, "--results", tmp_path / "r", "--no-mlflow",
                         "--no-leaderboard", "--jobs", "1")
    assert code == 0, err
    assert out.count("pretrain: training") + err.count("pretrain: training") == 1
    [cached] = list((tmp_path / "cache" / "pretrained").glob("*.pt"))
    records = [json.loads(p.read_text()) for p in (tmp_path / "r" / "pre" / "runs").glob("*.json")]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)
    shas = {r["provenance"]["pretrained"]["sha256"] for r in records}
    assert shas == {hashlib.sha256(cached.read_bytes()).hexdigest()}
    fractions = sorted(r["params"]["fraction"] for r in records)
    assert fractions[0] < fractions[1]  # head < lora-r1: adapters count as trainable


def test_a_checkpoint_that_does_not_fit_stops_the_sweep_with_one_line(tmp_path, cli):
    torch.save({"blocks.fc1.1.weight": torch.zeros(3, 3)}, tmp_path / "bad.pt")
    protocol = _protocol(tmp_path, "{checkpoint: bad.pt}")
    code, _, err = cli("run", "--protocol", protocol, "--results", tmp_path / "r", "--no-mlflow", "--no-leaderboard")
    err = err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "bad.pt" in err or "checkpoint" in err
    assert not list((tmp_path / "r").glob("pre/runs/*.json"))
