"""Pretrained backbones: the `pretrain:` forms, checkpoints, dataset pretraining and its cache, and
torchvision's ResNet-18 mapped onto cl-bench blocks.

Expected values come from independent routes: hashes by hashlib, held-out counts by hand, features
from torchvision's own model, weights compared bitwise with what the test itself saved.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
from pathlib import Path

import pytest
import torch
from conftest import make_spec
from torch import nn

from harness.config.errors import PretrainError, UserError
from harness.config.pretrain import Pretrain, PretrainKind, parse_pretrain
from harness.config.specs import SCHEMA_VERSION, DatasetSpec, RunSpec

SRC = "protocols/p.yaml"
DIGITS = (1, 8, 8)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """A private cl-bench cache and torch hub folder; one thread (the machine is shared)."""
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.set_num_threads(1)


def one_line_error(call, *parts, kind=PretrainError) -> str:
    with pytest.raises(kind) as info:
        call()
    text = str(info.value)
    assert "\n" not in text, text
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    for part in parts:
        assert part in text, (part, text)
    return text


def parse(value, folder: Path | str = "."):
    return parse_pretrain(value, SRC, Path(folder))


def blocks(spec, input_shape=DIGITS):
    """The state dict of the spec's pretrained backbone (None without one)."""
    from harness.run.pretrain import pretrained_backbone

    found = pretrained_backbone(spec, input_shape)
    return None if found is None else found[0]


def key_by_hand(recipe: dict, model: str, input_shape, data: str, device: str) -> str:
    """A dataset backbone's cache key, written out: sha256 of the sorted compact JSON of what decides it."""
    from harness.run.pretrain import HOLDOUT_RULE, PRETRAIN_CODE_VERSION

    parts = {"recipe": recipe, "model": model, "input_shape": list(input_shape), "data": data,
             "holdout_rule": HOLDOUT_RULE if "holdout" in recipe else None, "code": PRETRAIN_CODE_VERSION,
             "torch": torch.__version__, "device": device}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


# -- parsing ---------------------------------------------------------------------------------------
def test_modes_keep_their_string_form_and_a_bad_string_names_the_forms():
    assert parse("first-task") == Pretrain(PretrainKind.FIRST_TASK) and parse("first-task").as_json() == "first-task"
    assert parse("none").kind is PretrainKind.NONE and parse("none").as_json() == "none"
    one_line_error(lambda: parse("frist-task"), f"{SRC}: pretrain: 'frist-task'", "allowed: first-task, none",
                   "checkpoint", "torchvision")
    one_line_error(lambda: parse(3), f"{SRC}: pretrain: expected a string or a mapping")


def test_a_mapping_names_exactly_one_source():
    one_line_error(lambda: parse({}), "pretrain: an empty mapping")
    one_line_error(lambda: parse({"checkpint": "w.pt"}), "pretrain.checkpint: unknown key",
                   "allowed: one of checkpoint, dataset, torchvision")
    one_line_error(lambda: parse({"dataset": "same", "torchvision": "IMAGENET1K_V1"}),
                   "pretrain: names 2 backbones (dataset, torchvision)")


def test_missing_checkpoint_file_is_one_line_with_the_resolved_path(tmp_path):
    text = one_line_error(lambda: parse({"checkpoint": "weights/w.pt"}, tmp_path),
                          f"{SRC}: pretrain.checkpoint: 'weights/w.pt': no such file", "allowed:")
    assert str(tmp_path / "weights" / "w.pt") in text
    (tmp_path / "d").mkdir()
    one_line_error(lambda: parse({"checkpoint": "d"}, tmp_path), "pretrain.checkpoint: 'd': no such file")
    one_line_error(lambda: parse({"checkpoint": 7}, tmp_path), "pretrain.checkpoint: expected a path")


def test_checkpoint_resolves_against_the_protocol_folder_and_carries_the_file_hash(tmp_path):
    (tmp_path / "w.pt").write_bytes(b"some bytes")
    got = parse({"checkpoint": "w.pt"}, tmp_path)
    assert got.as_json() == {"checkpoint": str((tmp_path / "w.pt").resolve()),
                             "sha256": hashlib.sha256(b"some bytes").hexdigest()}
    one_line_error(lambda: parse({"checkpoint": "w.pt", "strict": False}, tmp_path),
                   "pretrain.strict: unknown key; allowed: checkpoint")


def test_unknown_dataset_key_lists_the_recipe_keys():
    one_line_error(lambda: parse({"dataset": "same", "lrr": 0.1}),
                   f"{SRC}: pretrain.lrr: unknown key; allowed: dataset, holdout, epochs, lr, batch_size, seed")
    one_line_error(lambda: parse({"dataset": "imagenet"}), "pretrain.dataset: unknown dataset 'imagenet'",
                   "allowed: same", "digits")
    one_line_error(lambda: parse({"dataset": "npz:x.npz"}), "pretrain.dataset: unknown dataset 'npz:x.npz'")


@pytest.mark.parametrize("holdout", [0, 1, 1.5, -0.1, float("nan")])
def test_holdout_out_of_range(holdout):
    one_line_error(lambda: parse({"dataset": "same", "holdout": holdout}),
                   f"{SRC}: pretrain.holdout: {holdout!r} is out of range; allowed: 0 < holdout < 1")


@pytest.mark.parametrize("key, value, part", [
    ("holdout", "0.2", "expected a number"), ("holdout", True, "expected a number"),
    ("epochs", 0, "allowed: an integer >= 1"), ("epochs", 2.0, "expected an integer"),
    ("lr", 0, "allowed: a number > 0"), ("lr", 10**400, "is out of range; allowed: a number > 0"),
    ("batch_size", -1, "allowed: an integer >= 1"),
    ("seed", 2**63, "and <= 9223372036854775807")])
def test_recipe_values_are_checked(key, value, part):
    one_line_error(lambda: parse({"dataset": "same", key: value}), f"pretrain.{key}:", part)


def test_holdout_only_with_same():
    one_line_error(lambda: parse({"dataset": "mnist", "holdout": 0.5}), "pretrain.holdout: not allowed with dataset "
                   "'mnist'", "allowed: holdout only with dataset: same")


def test_equal_settings_normalise_equally():
    full = {"dataset": "same", "holdout": 0.25, "epochs": 5, "lr": 0.05, "batch_size": 64, "seed": 0}
    assert parse({"dataset": "same"}).as_json() == full
    assert parse({"dataset": "same", "lr": 0.05, "holdout": 0.25}) == parse({"dataset": "same"})
    assert json.dumps(parse({"dataset": "same", "epochs": 5}).as_json(), sort_keys=True) == \
        json.dumps(full, sort_keys=True)
    assert json.dumps(parse({"dataset": "same", "holdout": 0.5, "lr": 1}).as_json()["lr"]) == "1.0"
    assert parse({"dataset": "mnist"}).as_json() == {"dataset": "mnist", "epochs": 5, "lr": 0.05, "batch_size": 64,
                                                     "seed": 0}
    assert parse({"torchvision": "IMAGENET1K_V1"}).as_json() == {"torchvision": "IMAGENET1K_V1"}
    one_line_error(lambda: parse({"torchvision": "DEFAULT"}), "pretrain.torchvision: 'DEFAULT' is not allowed; "
                   "allowed: IMAGENET1K_V1")


def test_torchvision_needs_resnet18_and_a_named_dataset_must_not_be_the_stream():
    tv = parse({"torchvision": "IMAGENET1K_V1"})
    one_line_error(lambda: tv.check_fits("resnet18-reduced", "cifar100", SRC),
                   f"{SRC}: pretrain.torchvision:", "'resnet18-reduced'", "allowed: model: resnet18")
    tv.check_fits("resnet18", "cifar100", SRC)
    named = parse({"dataset": "digits"})
    one_line_error(lambda: named.check_fits("mlp", "digits", SRC), "pretrain.dataset: 'digits' is "
                   "the stream's own data set", "allowed: same")
    named.check_fits("mlp", "mnist1d", SRC)
    same = parse({"dataset": "same"})
    one_line_error(lambda: same.check_fits("mlp", "digits", SRC), "pretrain.dataset: 'same' is not resolved")
    resolved = same.for_dataset("digits")
    assert resolved.as_json() == {**same.as_json(), "dataset": "digits"} and named.for_dataset("x") is named
    resolved.check_fits("mlp", "digits", SRC)
    one_line_error(lambda: resolved.check_fits("mlp", "mnist1d", SRC),
                   "pretrain.holdout: holds out part of 'digits'")


SHA = "ab" * 32
HEX32 = re.compile("[0-9a-f]{32}")
# (JSON form, kind, is_backbone, first_task, holdout, label, cache key): what code used to ask the raw form
ANSWERS = [
    ("first-task", PretrainKind.FIRST_TASK, False, True, None, "first-task", None),
    ("none", PretrainKind.NONE, False, False, None, "none", None),
    ({"checkpoint": "/abs/p.pt", "sha256": SHA}, PretrainKind.CHECKPOINT, True, False, None,
     "checkpoint abababababab", f"checkpoint:{SHA}"),
    ({"dataset": "digits", "holdout": 0.25, "epochs": 5, "lr": 0.05, "batch_size": 64, "seed": 0},
     PretrainKind.DATASET, True, False, 0.25, "dataset digits (batch_size 64, epochs 5, holdout 0.25, lr 0.05, seed 0)",
     HEX32),
    ({"dataset": "mnist", "epochs": 1, "lr": 0.1, "batch_size": 8, "seed": 3},
     PretrainKind.DATASET, True, False, None, "dataset mnist (batch_size 8, epochs 1, lr 0.1, seed 3)", HEX32),
    ({"torchvision": "IMAGENET1K_V1"}, PretrainKind.TORCHVISION, True, False, None, "torchvision IMAGENET1K_V1",
     "torchvision:resnet18:IMAGENET1K_V1"),
]


@pytest.mark.parametrize("form, kind, backbone, first_task, holdout, label, key", ANSWERS,
                         ids=[f"{a[1].value}-{a[4]}" for a in ANSWERS])
def test_the_value_answers_what_code_asks(form, kind, backbone, first_task, holdout, label, key):
    value = Pretrain.from_json(form)
    assert (value.kind, value.is_backbone, value.first_task, value.holdout, value.label) == \
        (kind, backbone, first_task, holdout, label)
    assert value.as_json() == form and json.dumps(value.as_json()) == json.dumps(form)
    assert (value.recipe is not None) == (kind is PretrainKind.DATASET)
    found = value.cache_key(model="mlp")
    assert bool(key.fullmatch(found)) if isinstance(key, re.Pattern) else found == key


def test_a_spec_hashes_and_serialises_its_pretrain_as_before():
    """The run id is sha256 of the spec's sorted compact JSON with the value's old form (a string or
    the normalised mapping) in it, so records and run ids stay what they were."""
    literal = {"dataset": "digits", "holdout": 0.15, "epochs": 2, "lr": 0.05, "batch_size": 64, "seed": 0}
    spec = make_spec(pretrain=parse({"dataset": "same", "holdout": 0.15, "epochs": 2}).for_dataset("digits"))
    as_json = spec.to_dict()
    assert as_json["pretrain"] == literal and list(as_json["pretrain"]) == list(literal)
    canon = json.dumps({**as_json, "schema_version": SCHEMA_VERSION}, sort_keys=True, separators=(",", ":"))
    assert spec.run_id == hashlib.sha256(canon.encode()).hexdigest()[:12]
    assert RunSpec.from_dict(json.loads(json.dumps(as_json))) == spec
    assert make_spec().to_dict()["pretrain"] == "first-task"
    assert make_spec(pretrain="none").to_dict()["pretrain"] == "none"


@pytest.mark.parametrize("form", [
    "imagenet", "dataset", 3, None, {}, {"dataset": "digits"},  # a partial recipe is not canonical
    {"dataset": "same", "epochs": 5, "lr": 0.05, "batch_size": 64, "seed": 0},  # `same` lost its holdout
    {"dataset": "digits", "holdout": 0.25, "epochs": 5, "lr": 0.05, "batch_size": 64, "seed": 0, "x": 1},
    {"checkpoint": "/abs/p.pt"}, {"checkpoint": "/abs/p.pt", "sha256": 7}, {"torchvision": "X", "dataset": "same"}])
def test_a_non_canonical_form_is_refused(form):
    with pytest.raises(ValueError, match="not a canonical pretrain value"):
        Pretrain.from_json(form)


def test_the_config_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, harness.config.pretrain; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# -- checkpoints -----------------------------------------------------------------------------------
def random_model(input_shape=DIGITS, model="mlp-bn", n_heads=5, seed=1):
    """A built model whose every parameter and BatchNorm buffer is random (nothing at its init value)."""
    from harness.run.models import build_model

    torch.manual_seed(seed)
    net = build_model(model, input_shape, n_heads=n_heads, head_classes=2)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.5 if "running_var" in name else torch.randn_like(t))
            else:
                t.fill_(7)
    return net


def checkpoint_spec(path: Path, folder: Path, model="mlp-bn"):
    return make_spec(pretrain=parse({"checkpoint": str(path)}, folder),
                     dataset=DatasetSpec("digits", 5, 2, model))


def test_a_checkpoint_loads_into_a_fresh_model_bitwise(tmp_path):
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone

    source = random_model()
    torch.save(source.state_dict(), tmp_path / "w.pt")  # heads included: they are ignored
    spec = checkpoint_spec(Path("w.pt"), tmp_path)
    state = blocks(spec)
    assert state and all(k.startswith("blocks.") for k in state)
    fresh = build_model("mlp-bn", DIGITS, n_heads=5, head_classes=2)
    heads_before = {k: v.clone() for k, v in fresh.state_dict().items() if k.startswith("heads.")}
    load_backbone(fresh, state, "test")
    for key, tensor in source.state_dict().items():
        if key.startswith("blocks."):
            assert torch.equal(fresh.state_dict()[key], tensor), key
    for key, tensor in heads_before.items():
        assert torch.equal(fresh.state_dict()[key], tensor), key


def test_a_checkpoint_of_another_shape_fails_naming_the_key(tmp_path):
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone

    torch.save(random_model((1, 4, 4)).state_dict(), tmp_path / "small.pt")
    state = blocks(checkpoint_spec(Path("small.pt"), tmp_path))
    fresh = build_model("mlp-bn", DIGITS, n_heads=5, head_classes=2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    one_line_error(lambda: load_backbone(fresh, state, "checkpoint abc"), "pretrained backbone (checkpoint abc)",
                   "shape mismatch blocks.fc1.1.weight (file [100, 16], model [100, 64])")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in before.items())  # nothing half-loaded


def test_missing_and_foreign_keys_fail_naming_the_first_few(tmp_path):
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone

    state = {k: v for k, v in random_model().state_dict().items() if not k.startswith("blocks.fc4")}
    state["blocks.fc9.weight"] = torch.zeros(3)
    fresh = build_model("mlp-bn", DIGITS, n_heads=5, head_classes=2)
    one_line_error(lambda: load_backbone(fresh, state, "w"), "unexpected keys blocks.fc9.weight",
                   "missing keys blocks.fc4.0.weight, blocks.fc4.0.bias, blocks.fc4.1.weight and 4 more")
    torch.save({**state, "optimizer.lr": torch.tensor(1.0)}, tmp_path / "extra.pt")
    one_line_error(lambda: blocks(checkpoint_spec(Path("extra.pt"), tmp_path)),
                   "unexpected keys optimizer.lr", "allowed: blocks.* keys")


class NotAStateDict:
    """A pickled custom object: weights_only loading refuses it (with a many-line message)."""


@pytest.mark.parametrize("content, part", [
    (b"not a torch file", "cannot read"), (NotAStateDict(), "cannot read"),
    ([torch.zeros(2)], "holds a list, not a state dict")])
def test_an_unreadable_checkpoint_is_one_line(tmp_path, content, part):
    path = tmp_path / "bad.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    one_line_error(lambda: blocks(checkpoint_spec(path, tmp_path)),
                   f"pretrain.checkpoint {path}", part)


def test_a_checkpoint_changed_since_parsing_is_refused(tmp_path):
    torch.save(random_model().state_dict(), tmp_path / "w.pt")
    spec = checkpoint_spec(Path("w.pt"), tmp_path)
    torch.save(random_model(seed=2).state_dict(), tmp_path / "w.pt")
    one_line_error(lambda: blocks(spec), "the file changed since the protocol was loaded")


def test_modes_have_no_pretrained_backbone():
    from harness.run.pretrain import pretrained_backbone

    assert pretrained_backbone(make_spec(pretrain="first-task"), DIGITS) is None
    assert pretrained_backbone(make_spec(pretrain="none"), DIGITS) is None


# -- held-out samples ------------------------------------------------------------------------------
def test_holdout_indices_are_stratified_and_deterministic():
    from harness.run.pretrain import holdout_indices

    shuffle = torch.randperm(22, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0] * 10 + [1] * 7 + [2] * 1 + [3] * 4)[shuffle]
    held = holdout_indices(y, 0.25, seed=0)
    # floor(0.25 n + 0.5), at most n - 1: 10 -> 3, 7 -> 2, 1 -> 0, 4 -> 1
    assert torch.bincount(y[held], minlength=4).tolist() == [3, 2, 0, 1]
    assert held.tolist() == sorted(set(held.tolist()))
    assert torch.equal(held, holdout_indices(y.numpy(), 0.25, seed=0))
    big = torch.arange(200) % 2
    assert not torch.equal(holdout_indices(big, 0.25, 0), holdout_indices(big, 0.25, 1))


def test_the_stream_loses_exactly_the_held_out_samples():
    from harness.run.datasets import TensorData
    from harness.run.pretrain import holdout_indices, stream_data

    n = 40
    y = torch.arange(n) % 4
    x = torch.arange(n, dtype=torch.float32).view(n, 1)  # each sample carries its own index
    data = TensorData("toy", x, y, x[:8].clone(), y[:8].clone())
    pretrain = parse({"dataset": "same", "holdout": 0.3, "seed": 5}).for_dataset("toy")
    stream = stream_data(data, pretrain)
    held = set(holdout_indices(y, 0.3, 5).tolist())
    kept = set(stream.x_train.view(-1).long().tolist())
    assert len(held) == 4 * 3 and not held & kept and held | kept == set(range(n))
    assert torch.equal(stream.y_train, y[sorted(kept)]) and stream.x_test is data.x_test
    assert stream_data(data, parse({"dataset": "mnist"})) is data
    assert stream_data(data, Pretrain(PretrainKind.FIRST_TASK)) is data


# -- dataset pretraining and its cache -------------------------------------------------------------
def digits_spec(**recipe):
    pretrain = parse({"dataset": "same", "epochs": 2, "batch_size": 32, **recipe})
    return make_spec(pretrain=pretrain.for_dataset("digits"), dataset=DatasetSpec("digits", 5, 2, "mlp-bn"))


def cached_files(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / "pretrained").glob("*.pt"))


def test_dataset_pretraining_is_cached_by_its_key_and_not_retrained(tmp_path, monkeypatch):
    from harness.run import pretrain as pt
    from harness.run.datasets import dataset_fingerprint

    spec = digits_spec()
    first = blocks(spec)
    key = key_by_hand(spec.pretrain.as_json(), "mlp-bn", DIGITS, dataset_fingerprint("digits"), "cpu")
    path = tmp_path / "cache" / "pretrained" / f"{key}.pt"
    assert cached_files(tmp_path) == [path]
    mtime = path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("retrained although the backbone is cached")

    monkeypatch.setattr(pt, "train_backbone", no_training)
    second, weights = pt.pretrained_backbone(spec, DIGITS)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert path.stat().st_mtime_ns == mtime
    prov = weights.provenance()
    assert prov == {"source": "dataset", "key": key, "path": str(path),
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_the_cache_key_follows_every_setting():
    from dataclasses import replace

    from harness.run.pretrain import key_context

    pretrain = parse({"dataset": "same"}).for_dataset("digits")

    def key(value=pretrain, model="mlp-bn", shape=DIGITS, data="sha256:aa", device="cpu"):
        return value.cache_key(**key_context(value, model, shape, data, device))

    def recipe(**change):
        return replace(pretrain, recipe=replace(pretrain.recipe, **change))

    base = key()
    assert base == key_by_hand(pretrain.as_json(), "mlp-bn", DIGITS, "sha256:aa", "cpu")
    variants = [key(recipe(epochs=6)), key(recipe(holdout=0.5)), key(recipe(seed=1)), key(recipe(lr=0.1)),
                key(model="mlp"), key(shape=(1, 4, 16)), key(data="sha256:bb"), key(device="cuda")]
    assert len({base, *variants}) == 1 + len(variants)
    named = parse({"dataset": "mnist"})
    assert key(named) == key_by_hand(named.as_json(), "mlp-bn", DIGITS, "sha256:aa", "cpu")


def test_a_changed_recipe_trains_a_new_backbone(tmp_path):
    a = blocks(digits_spec())
    b = blocks(digits_spec(epochs=1))
    assert len(cached_files(tmp_path)) == 2
    assert not torch.equal(a["blocks.fc1.1.weight"], b["blocks.fc1.1.weight"])


def test_pretraining_is_deterministic_and_leaves_the_runs_random_state_alone(tmp_path, monkeypatch):
    torch.manual_seed(123)
    rng = torch.random.get_rng_state()
    a = blocks(digits_spec())
    assert torch.equal(torch.random.get_rng_state(), rng)
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "other"))
    b = blocks(digits_spec())
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_pretrained_backbone_separates_the_stream_better_than_a_random_one():
    from sklearn.linear_model import LogisticRegression

    from harness.run.datasets import load_dataset
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone, stream_data

    spec = digits_spec(epochs=3)
    data = stream_data(load_dataset("digits"), spec.pretrain)

    def probe(state) -> float:
        torch.manual_seed(0)
        net = build_model("mlp-bn", DIGITS, n_heads=1, head_classes=10)
        if state is not None:
            load_backbone(net, state, "test")
        net.eval()
        with torch.no_grad():
            f_train, f_test = net.features(data.x_train).numpy(), net.features(data.x_test).numpy()
        y = data.y_train.numpy()
        few = [i for c in range(10) for i in (y == c).nonzero()[0][:3]]  # 3 stream samples per class
        return LogisticRegression(max_iter=2000).fit(f_train[few], y[few]).score(f_test, data.y_test.numpy())

    pretrained, random = probe(blocks(spec)), probe(None)
    assert pretrained > random + 0.15, (pretrained, random)


def test_concurrent_workers_train_a_backbone_once(tmp_path, monkeypatch):
    from harness.run import pretrain as pt

    real, calls = pt.train_backbone, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pt, "train_backbone", counted)
    results = [None, None]

    def work(i):
        results[i] = blocks(digits_spec(epochs=1))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(torch.equal(results[0][k], results[1][k]) for k in results[0])
    assert len(cached_files(tmp_path)) == 1 and not list((tmp_path / "cache" / "pretrained").glob(".*.tmp"))


def test_another_data_set_must_have_the_streams_input_shape(monkeypatch):
    from harness.run import pretrain as pt
    from harness.run.datasets import TensorData

    real = pt.load_dataset
    fake = TensorData("mnist1d", torch.zeros(20, 40), torch.arange(20) % 10, torch.zeros(10, 40), torch.arange(10))
    monkeypatch.setattr(pt, "load_dataset", lambda name, *a: fake if name == "mnist1d" else real(name, *a))
    spec = make_spec(pretrain=parse({"dataset": "mnist1d"}), dataset=DatasetSpec("digits", 5, 2, "mlp-bn"))
    one_line_error(lambda: blocks(spec), "pretrain.dataset: 'mnist1d' has samples of shape "
                   "(40,), but the stream 'digits' has (1, 8, 8)")


def test_prepare_pretrained_computes_each_backbone_once_and_checks_checkpoints(tmp_path):
    import dataclasses

    from harness.run.pretrain import prepare_pretrained

    spec = digits_spec(epochs=1)
    specs = [spec, dataclasses.replace(spec, method="ewc"), make_spec(pretrain="first-task")]
    lines = []
    out = prepare_pretrained(specs, log=lines.append)
    [path] = cached_files(tmp_path)
    assert out == {path.stem: {"source": "dataset", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                               "path": str(path)}}
    assert len(lines) == 1 and "training mlp-bn" in lines[0]
    torch.save(random_model((1, 4, 4)).state_dict(), tmp_path / "small.pt")
    one_line_error(lambda: prepare_pretrained([checkpoint_spec(Path("small.pt"), tmp_path)], log=lines.append),
                   "shape mismatch blocks.fc1.1.weight")


# -- torchvision's resnet18 ------------------------------------------------------------------------
def torchvision_resnet18(seed=0):
    """torchvision's resnet18 with random weights and random BatchNorm statistics (a swap would show)."""
    from torchvision.models import resnet18

    torch.manual_seed(seed)
    net = resnet18(weights=None)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(), m.running_mean.normal_()
                m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def tv_features(net, x):
    net.fc = nn.Identity()  # torchvision's forward up to the classifier: the 512 pooled features
    with torch.no_grad():
        return net(x)


def test_mapped_torchvision_weights_give_torchvision_features():
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone
    from harness.run.resnet import torchvision_to_blocks

    tv = torchvision_resnet18()
    ours = build_model("resnet18", (3, 32, 32), n_heads=2, head_classes=5)
    assert [n for n in ours.blocks] == ["stem", "layer1", "layer2", "layer3", "layer4", "pool"]
    load_backbone(ours, torchvision_to_blocks(tv.state_dict(), 3), "torchvision")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = ours.eval().features(x)
    assert got.shape == (2, 512)
    assert torch.allclose(got, tv_features(tv, x), atol=1e-5, rtol=1e-5)


def test_one_channel_adaptation_equals_the_grey_image_on_three_channels():
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone
    from harness.run.resnet import torchvision_to_blocks

    tv = torchvision_resnet18(seed=2)
    ours = build_model("resnet18", (1, 28, 28), n_heads=1, head_classes=10)
    load_backbone(ours, torchvision_to_blocks(tv.state_dict(), 1), "torchvision")
    grey = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = ours.eval().features(grey)
    assert torch.allclose(got, tv_features(tv, grey.repeat(1, 3, 1, 1)), atol=1e-4, rtol=1e-4)


def test_three_channel_mapping_has_every_key_and_drops_fc():
    from harness.run.models import build_model
    from harness.run.resnet import torchvision_to_blocks

    mapped = torchvision_to_blocks(torchvision_resnet18().state_dict(), 3)
    expected = {k for k in build_model("resnet18", (3, 32, 32), 1, 2).state_dict() if k.startswith("blocks.")}
    assert set(mapped) == expected and "blocks.stem.conv1.weight" in mapped
    one_line_error(lambda: torchvision_to_blocks({"classifier.weight": torch.zeros(1)}, 3), "unexpected key")
    # torchvision's ImageNet file predates BatchNorm's num_batches_tracked: the counters start at 0
    old = {k: v for k, v in torchvision_resnet18().state_dict().items() if not k.endswith("num_batches_tracked")}
    mapped_old = torchvision_to_blocks(old, 3)
    assert set(mapped_old) == expected
    assert mapped_old["blocks.layer2.0.downsample.1.num_batches_tracked"].item() == 0


def torchvision_spec(model="resnet18"):
    return make_spec(pretrain=parse({"torchvision": "IMAGENET1K_V1"}), dataset=DatasetSpec("digits", 5, 2, model))


def test_torchvision_weights_without_download_or_file_is_one_line(tmp_path):
    expected = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    one_line_error(lambda: blocks(torchvision_spec()), f"weights file {expected} not found",
                   "pass --download", "put the file there")
    one_line_error(lambda: blocks(torchvision_spec("mlp")), "pretrain.torchvision:",
                   "allowed: model: resnet18")


def test_torchvision_weights_load_from_the_torch_hub_cache(tmp_path, monkeypatch):
    from harness.run import pretrain
    from harness.run.models import build_model
    from harness.run.pretrain import load_backbone, pretrained_backbone

    assert Path(torch.hub.get_dir()) == tmp_path / "torch" / "hub"
    assert pretrain.torchvision_weights_file("IMAGENET1K_V1").name == "resnet18-f37072fd.pth"
    tv = torchvision_resnet18(seed=4)
    data = io.BytesIO()
    torch.save(tv.state_dict(), data)
    # the hub's name carries the sha256 prefix of its bytes (checked on read): these fake weights' own
    file = tmp_path / "torch" / "hub" / "checkpoints" / f"resnet18-{hashlib.sha256(data.getvalue()).hexdigest()[:8]}.pth"
    file.parent.mkdir(parents=True)
    file.write_bytes(data.getvalue())
    monkeypatch.setattr(pretrain, "torchvision_weights_file", lambda name: file)
    state, weights = pretrained_backbone(torchvision_spec(), DIGITS)  # digits: one channel
    ours = build_model("resnet18", DIGITS, n_heads=5, head_classes=2)
    load_backbone(ours, state, "torchvision")
    got = ours.state_dict()
    assert torch.equal(got["blocks.layer3.1.bn2.running_mean"], tv.state_dict()["layer3.1.bn2.running_mean"])
    assert torch.allclose(got["blocks.stem.conv1.weight"], tv.conv1.weight.sum(dim=1, keepdim=True))
    assert weights.provenance() == {
        "source": "torchvision", "key": "torchvision:resnet18:IMAGENET1K_V1", "path": str(file),
        "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
    assert os.environ["TORCH_HOME"] == str(tmp_path / "torch")
