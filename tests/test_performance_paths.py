"""The fast data path and frozen-prefix caching give the records of the plain paths.

No timings here (benchmarks/ prints those): these tests check numbers, against a
hand-written PyTorch loop and against the uncached path.
"""
import sys
from pathlib import Path

import pytest
import torch

from harness.config.pretrain import Pretrain
from harness.config.specs import DatasetSpec, RunSpec, TrainingSpec
from harness.run import speedups
from harness.run.engine import run_one
from harness.run.fastdata import TensorBatches, batch_generator
from harness.run.models import build_model
from harness.run.prefix_cache import frozen_prefix, prefix_features
from harness.run.regimes import apply_regime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402  (the benchmarks' plain PyTorch loop)


def make_spec(method="naive", regime="last-1", model="mlp", pretrain="first-task", epochs=1,
              hparams=None, seed=0, batch_size=32):
    return RunSpec(protocol="t", protocol_version="1", dataset=DatasetSpec("digits", 5, 2, model),
                   regime=regime, method=method, label="", hparams=hparams or {}, order=0,
                   class_order=tuple(range(10)), seed=seed, scenario="task-il", pretrain=Pretrain(pretrain),
                   training=TrainingSpec(lr=0.05, momentum=0.9, epochs=epochs, batch_size=batch_size),
                   eval_batch_size=512)


def run(spec, cache=True, method_files=()):
    """(record, tasks that trained on cached features)."""
    seen = []

    def observer(event, t, strategy):
        if event == "after_task" and t == spec.dataset.n_tasks - 1:
            seen.extend(strategy.harness_cache.tasks_cached)

    # One torch thread, as every harness worker runs (--threads 1): with several, BLAS may
    # split the cached and the uncached products differently and round them apart.
    old, threads = speedups.PREFIX_CACHE, torch.get_num_threads()
    speedups.PREFIX_CACHE = cache
    torch.set_num_threads(1)
    try:
        record = run_one(spec, device="cpu", observer=observer, method_files=method_files)
    finally:
        speedups.PREFIX_CACHE = old
        torch.set_num_threads(threads)
    assert record.status == "ok", record.error
    return record, seen


def same_numbers(a, b):
    return (a.acc_matrix == b.acc_matrix and a.init_acc == b.init_acc and a.metrics == b.metrics
            and a.update_norms == b.update_norms and a.diagnostics == b.diagnostics)


def test_batches_cover_every_sample_once_per_epoch_in_a_seeded_order():
    x, y = torch.arange(10.0).unsqueeze(1), torch.arange(10)
    batches = TensorBatches(x, y, task=3, batch_size=4, generator=batch_generator(0), device="cpu")
    epochs = [list(batches) for _ in range(2)]
    assert len(batches) == 3 and [len(b[1]) for b in epochs[0]] == [4, 4, 2]
    for epoch in epochs:
        seen = torch.cat([b[1] for b in epoch])
        assert sorted(seen.tolist()) == list(range(10))
        assert all(torch.equal(b[0].squeeze(1), b[1].float()) and (b[2] == 3).all() for b in epoch)
    assert [b[1].tolist() for b in epochs[0]] != [b[1].tolist() for b in epochs[1]]
    again = TensorBatches(x, y, 3, 4, batch_generator(0), "cpu")
    assert [b[1].tolist() for b in again] == [b[1].tolist() for b in epochs[0]]


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["full", "last-2", "head"])
def test_naive_run_equals_a_hand_written_pytorch_loop(regime):
    spec = make_spec(regime=regime, epochs=2)
    record, _ = run(spec)
    rows = _common.plain_run(spec)
    assert record.init_acc == rows[0]
    assert record.acc_matrix == rows[1:]


@pytest.mark.slow
@pytest.mark.parametrize("method,regime,pretrain", [
    ("naive", "last-1", "first-task"), ("naive", "head", "none"), ("ewc-online", "last-2", "first-task"),
    ("gem", "head", "first-task"), ("magmax", "last-1", "first-task"), ("si", "last-1", "none")])
def test_cached_prefix_gives_the_uncached_record(method, regime, pretrain):
    spec = make_spec(method, regime, pretrain=pretrain)
    cached, tasks = run(spec, cache=True)
    plain, none = run(spec, cache=False)
    assert tasks == ([0, 1, 2, 3, 4] if pretrain == "none" else [1, 2, 3, 4]) and none == []
    assert same_numbers(cached, plain)


def _cache_safe_methods() -> list[str]:
    from harness.api.registry import get_registry

    return sorted(name for name, adapter in get_registry().items() if adapter.prefix_cache)


def test_the_cache_safe_declarations_are_the_verified_ones():
    # a new declaration is fine once the parametrised test below covers it; this pins the list
    assert _cache_safe_methods() == sorted(["naive", "ewc-online", "si", "gem", "agem", "gpm", "became", "magmax",
                                            "avg", "task-arithmetic", "ties", "randmix"])


@pytest.mark.slow
@pytest.mark.parametrize("method", _cache_safe_methods())
def test_every_cache_safe_adapter_gives_the_uncached_record(method):
    spec = make_spec(method, "last-2", epochs=2 if method == "became" else 1)  # BECAME splits the epochs
    cached, tasks = run(spec, cache=True)
    plain, none = run(spec, cache=False)
    assert tasks == [1, 2, 3, 4] and none == []  # the cache was used, and only when enabled
    assert same_numbers(cached, plain)


@pytest.mark.slow
def test_cache_with_tiny_last_batches():
    # 53 leaves last batches of 5, 7, 5, 1 samples: BLAS may round those differently
    spec = make_spec("naive", "last-2", batch_size=53, epochs=2)
    cached, tasks = run(spec, cache=True)
    plain, _ = run(spec, cache=False)
    assert tasks == [1, 2, 3, 4] and same_numbers(cached, plain)
    assert cached.acc_matrix == _common.plain_run(spec)[1:]


@pytest.mark.slow
def test_cache_with_batchnorm_blocks_small_cnn():
    spec = make_spec("naive", "last-1", model="small-cnn")
    cached, tasks = run(spec, cache=True)
    plain, _ = run(spec, cache=False)
    assert tasks == [1, 2, 3, 4] and same_numbers(cached, plain)


@pytest.mark.slow
def test_no_cache_without_a_frozen_prefix_or_for_opted_out_methods():
    assert run(make_spec("naive", "full"))[1] == []
    assert run(make_spec("lwf", "head"))[1] == []  # LwF runs its previous model on mb_x
    assert run(make_spec("joint", "head"))[1] == []  # joint concatenates experiences: Avalanche's loader


@pytest.mark.slow
def test_a_method_declares_its_choice(tmp_path):
    src = ("from avalanche.training.supervised import Naive\nNAME = '{n}'\nDEFAULTS = {{}}\n"
           "def build(ctx):\n    s = Naive(**ctx.strategy_kwargs())\n    s.harness_prefix_cache = {v}\n"
           "    return s\n")
    (tmp_path / "yes.py").write_text(src.format(n="cache-yes", v=True))
    (tmp_path / "no.py").write_text(src.format(n="cache-no", v=False))
    (tmp_path / "silent.py").write_text(src.format(n="cache-silent", v=None))
    files = tuple(str(tmp_path / f) for f in ("yes.py", "no.py", "silent.py"))
    assert run(make_spec("cache-yes", "head"), method_files=files)[1] == [1, 2, 3, 4]
    assert run(make_spec("cache-no", "head"), method_files=files)[1] == []
    assert run(make_spec("cache-silent", "head"), method_files=files)[1] == []  # not verified


@pytest.mark.slow
def test_replay_keeps_its_own_dataloader():
    record, tasks = run(make_spec("replay", "last-1", hparams={"mem_size": 20}))
    assert tasks == [] and len(record.acc_matrix) == 5


def test_frozen_prefix_and_its_features():
    model = build_model("resnet18-reduced", (3, 8, 8), n_heads=2, head_classes=2)
    apply_regime(model, "head")
    assert frozen_prefix(model) == model.block_names  # stateless `pool` included
    apply_regime(model, "last-1")
    assert frozen_prefix(model) == ["stem", "layer1", "layer2", "layer3"]
    apply_regime(model, "full")
    assert frozen_prefix(model) == []
    mlp = build_model("mlp", (8, 8), n_heads=2, head_classes=2)
    apply_regime(mlp, "last-2")
    x = torch.randn(5, 8, 8)
    expected = mlp.blocks["fc2"](mlp.blocks["fc1"](x))
    assert torch.allclose(prefix_features(mlp, ["fc1", "fc2"], x, batch_size=2), expected, atol=1e-6)


def test_eval_cache_matches_the_evaluator_and_notices_a_changed_prefix():
    from harness.run.datasets import load_dataset
    from harness.run.evaluation import evaluate_tasks
    from harness.run.prefix_cache import EvalCache
    from harness.run.streams import split_tasks

    tasks = split_tasks(load_dataset("digits"), tuple(range(10)), 5, 2)
    torch.manual_seed(0)
    model = build_model("mlp", (8, 8), n_heads=5, head_classes=2)
    apply_regime(model, "last-1")
    cache = EvalCache()
    assert cache.evaluate(model, tasks, 100, "cpu") == evaluate_tasks(model, tasks, 100, "cpu")
    assert set(cache.features) == {0, 1, 2, 3, 4} and cache.prefix == ["fc1", "fc2", "fc3"]
    with torch.no_grad():
        model.blocks["fc2"][0].weight.mul_(-1.0)  # a frozen block changed behind the cache's back
        model.heads[0].weight.mul_(-1.0)
    assert cache.evaluate(model, tasks, 100, "cpu") == evaluate_tasks(model, tasks, 100, "cpu")
    model.register_forward_hook(lambda m, i, o: o * 0)
    assert cache.evaluate(model, tasks, 100, "cpu") == evaluate_tasks(model, tasks, 100, "cpu")


# --- method metadata without imports (`cl-bench list` starts fast) ---

SUBMISSION = "NAME = {name!r}\nDEFAULTS = {{'k': 1}}\nDESCRIPTION = 'demo'\ndef build(ctx, k):\n    pass\n"


@pytest.fixture
def method_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "subs"))
    (tmp_path / "subs").mkdir()
    return tmp_path


def live_metas(extra=()):
    from harness.api.index import FIELDS
    from harness.api.registry import discover

    return [{f: getattr(a, f) for f in FIELDS} for a in discover(extra).values()]


def strip(metas):
    return [{k: v for k, v in m.items() if k != "module"} for m in metas]


def test_method_infos_equal_the_registry_and_follow_file_edits(method_env):
    from harness.api import index as method_index

    sub = method_env / "subs" / "demo.py"
    sub.write_text(SUBMISSION.format(name="demo-a"))
    extra = method_env / "extra.py"
    extra.write_text(SUBMISSION.format(name="extra-a"))
    assert strip(method_index.method_infos((str(extra),))) == live_metas((str(extra),))
    assert strip(method_index.method_infos((str(extra),))) == live_metas((str(extra),))  # cached now
    sub.write_text(SUBMISSION.format(name="demo-b"))
    names = [m["name"] for m in method_index.method_infos()]
    assert "demo-b" in names and "demo-a" not in names


def test_a_stale_builtin_index_falls_back_to_importing(method_env, monkeypatch):
    from harness.api import index as method_index

    stale = method_env / "index.json"
    stale.write_text('{"fingerprint": "old", "methods": [{"name": "ghost"}]}')
    monkeypatch.setattr(method_index, "INDEX_PATH", stale)
    assert strip(method_index.method_infos()) == live_metas()


def test_duplicate_names_fail_as_in_the_registry(method_env):
    from harness.api import index as method_index
    from harness.api.registry import RegistryError

    (method_env / "subs" / "dup.py").write_text(SUBMISSION.format(name="naive"))
    with pytest.raises(RegistryError) as ours:
        method_index.method_infos()
    with pytest.raises(RegistryError) as theirs:
        live_metas()
    assert str(ours.value) == str(theirs.value)


def test_list_imports_neither_torch_nor_avalanche(method_env):
    import json
    import subprocess

    from harness.api import index as method_index

    # a user cache holding the live index, so the check holds even if _index.json is stale
    cache = method_env / "cache"
    cache.mkdir()
    index = method_index.build_index()
    (cache / "method-metadata.json").write_text(json.dumps({f"builtin:{index['fingerprint']}": index["methods"]}))
    code = ("import sys; from harness.cli import main; assert main(['list']) == 0; "
            "bad = [m for m in ('torch', 'avalanche') if m in sys.modules]; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=method_env)
    assert out.returncode == 0, out.stderr
    assert "naive" in out.stdout
