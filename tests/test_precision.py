"""`training.precision`: bf16 autocast around the model's forwards; fp32 specs, ids and outputs as before."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import make_spec

from harness.api.registry import get_registry
from harness.config.protocol import ProtocolError, parse_protocol
from harness.config.specs import SCHEMA_VERSION, RunSpec, TrainingSpec, check_spec_json, spec_hash
from harness.execution.plan import expand
from harness.execution.store import canonical_problem
from harness.run.engine import build_run_model, run_one
from harness.run.precision import set_precision
from harness.run.prefix_cache import EvalCache

PROTOCOL = {
    "name": "p", "version": "1", "datasets": [{"name": "digits", "n_tasks": 5, "classes_per_task": 2}],
    "regimes": ["head"], "methods": ["naive"], "task_orders": {"count": 1, "seed": 7}, "seeds": [0],
    "training": {"epochs": 1, "lr": 0.1},
}


def _bf16(spec: RunSpec) -> RunSpec:
    return dataclasses.replace(spec, training=dataclasses.replace(spec.training, precision="bf16"))


def test_default_precision_stays_out_of_the_spec_and_its_run_id():
    spec = make_spec()
    data = spec.to_dict()
    assert "precision" not in data["training"]
    # the id as it was computed before the setting existed: the same JSON, no precision key anywhere
    legacy = {**data, "training": {k: v for k, v in dataclasses.asdict(spec.training).items() if k != "precision"}}
    assert spec.run_id == spec_hash({**legacy, "schema_version": SCHEMA_VERSION})
    assert RunSpec.from_dict(data) == spec and canonical_problem(data) is None
    bf16 = _bf16(spec)
    assert bf16.to_dict()["training"]["precision"] == "bf16" and bf16.run_id != spec.run_id
    assert RunSpec.from_dict(bf16.to_dict()) == bf16 and canonical_problem(bf16.to_dict()) is None


def test_fp32_written_out_is_another_spelling_and_rejected():
    data = make_spec().to_dict()
    data["training"]["precision"] = "fp32"  # the default written out would hash to a second id of one cell
    with pytest.raises(ValueError, match="training.precision"):
        check_spec_json(data)


def test_protocol_reads_precision_strictly():
    reg = get_registry()
    proto = parse_protocol(copy.deepcopy(PROTOCOL), "p.yaml", reg)
    assert proto.training.precision == "fp32"
    raw = copy.deepcopy(PROTOCOL)
    raw["training"]["precision"] = "bf16"
    proto = parse_protocol(raw, "p.yaml", reg)
    assert {s.training.precision for s in expand(proto)} == {"bf16"}
    raw["training"]["precision"] = "fp16"
    with pytest.raises(ProtocolError) as err:
        parse_protocol(raw, "p.yaml", reg)
    message = str(err.value)
    assert "\n" not in message and "training.precision" in message and "fp32, bf16" in message


def test_bf16_changes_the_forward_but_not_by_much():
    torch.manual_seed(0)
    model = build_run_model(make_spec(), (1, 8, 8)).eval()
    x = torch.randn(64, 1, 8, 8)
    with torch.no_grad():
        manual = x
        for block in model.blocks.values():
            manual = block(manual)
        manual = model.heads[0](manual)
        fp32 = model(x, 0)
        set_precision(model, "bf16")
        bf16, feats = model(x, 0), model.features(x)
        copied = copy.deepcopy(model)(x, 0)  # a method's copy of the model runs at the run's precision too
    assert torch.equal(fp32, manual)  # fp32: exactly the plain block-by-block computation
    assert bf16.dtype == feats.dtype == torch.float32
    assert not torch.equal(bf16, fp32)
    assert torch.allclose(bf16, fp32, atol=0.05, rtol=0.05)
    assert torch.equal(copied, bf16)


@pytest.mark.parametrize("backbone", ["mlp", "vit-tiny"])
def test_eval_cache_computes_what_the_uncached_bf16_forward_does(backbone):
    from harness.config.specs import DatasetSpec
    from harness.run.evaluation import evaluate_tasks
    from harness.run.regimes import apply_regime

    torch.manual_seed(0)
    spec = make_spec(regime="head", dataset=DatasetSpec("digits", 5, 2, backbone))
    model = build_run_model(spec, (1, 8, 8))
    apply_regime(model, "head")
    set_precision(model, "bf16")
    task = type("T", (), {})()
    task.x_test, task.y_test, task.index = torch.randn(300, 1, 8, 8), torch.randint(0, 2, (300,)), 0
    with torch.no_grad():
        fp32 = copy.deepcopy(model)
        set_precision(fp32, "fp32")
        assert not torch.equal(model(task.x_test, 0), fp32(task.x_test, 0))  # bf16 reaches this backbone
    cache = EvalCache()
    cached = cache.evaluate(model, [task], 64, "cpu")
    assert cache.features  # the cached path ran
    assert cached == evaluate_tasks(model, [task], 64, "cpu")


def test_bf16_run_records_what_ran_and_learns_as_fp32_does():
    spec = make_spec(training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))
    fp32, bf16 = run_one(spec, device="cpu"), run_one(_bf16(spec), device="cpu")
    assert fp32.status == bf16.status == "ok", (fp32.error, bf16.error)
    assert "precision" not in fp32.provenance and "autocast" not in fp32.provenance
    assert bf16.provenance["precision"] == "bf16" and bf16.provenance["autocast"] == "torch.bfloat16 on cpu"
    assert bf16.spec.training.precision == "bf16"
    assert fp32.update_norms != bf16.update_norms  # another computation ...
    final32, final16 = fp32.acc_matrix[-1], bf16.acc_matrix[-1]
    assert max(abs(a - b) for a, b in zip(final32, final16)) < 0.1  # ... of the same learning


def test_prefix_cache_trains_bf16_runs_to_the_uncached_numbers(monkeypatch):
    from harness.run import speedups

    spec = _bf16(make_spec(regime="last-1", training=TrainingSpec(lr=0.05, momentum=0.9, epochs=2, batch_size=32)))
    cached_tasks = []

    def observer(event, t, strategy):
        if event == "after_task" and t == spec.dataset.n_tasks - 1:
            cached_tasks.extend(strategy.harness_cache.tasks_cached)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every worker runs: BLAS splits products alike with and without the cache
    try:
        monkeypatch.setattr(speedups, "PREFIX_CACHE", True)
        cached = run_one(spec, device="cpu", observer=observer)
        monkeypatch.setattr(speedups, "PREFIX_CACHE", False)
        plain = run_one(spec, device="cpu")
    finally:
        torch.set_num_threads(threads)
    assert cached_tasks  # the cache was used
    assert cached.acc_matrix == plain.acc_matrix and cached.update_norms == plain.update_norms


def test_bf16_mixed_task_batches_give_each_row_its_own_heads_answer():
    """Task-IL replay batches mix tasks: each row's logits come from its task's head, float32 out."""
    from harness.run.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 3, 2)
    set_precision(model, "bf16")
    x, tasks = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 0, 2, 2, 1])
    out = model(x, tasks)
    assert out.dtype == torch.float32 and out.shape == (6, 2)
    for t in range(3):  # each head alone, on the same rows, under the same autocast
        rows = tasks == t
        assert torch.equal(out[rows], model(x[rows], t))


def test_a_bf16_task_il_replay_run_ends_ok():
    spec = make_spec(method="replay", hparams={"mem_size": 20},
                     training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32))
    record = run_one(_bf16(spec), device="cpu")
    assert record.status == "ok", record.error

