"""Configuration accepted that cannot mean what it says: refused at load, in one line, exit 2.

Each class is generated in variants: duplicate YAML keys at several depths, float literals and ambiguous
numbers, out-of-range hyperparameters of every built-in method (from the declarations themselves, plus
hand-written ranges checked on their own), backbones paired with data they cannot take (every built-in
model x every built-in sample shape, the truth taken from building the model), and a second protocol
file reusing a protocol's name.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.api.registry import get_registry
from harness.config.errors import ProtocolError, RegistryError
from harness.config.protocol import load_protocol
from harness.config.validate import show
from harness.config.vocabulary import DATASETS, MODELS

BASE = """\
name: meaning
version: "1"
datasets:
  - {name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}
regimes: [head]
methods:
  - naive
  - {name: lwf, label: lwf-a, hparams: {alpha: 1.0, temperature: 2.0}}
task_orders: {count: 1, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, epochs: 1, batch_size: 32}
"""


def with_methods(*entries: str) -> str:
    """BASE with more method entries (YAML lines) after its own."""
    return BASE.replace("task_orders:", "\n".join(entries) + "\ntask_orders:")


@pytest.fixture(scope="module")
def registry():
    return get_registry()


def write(folder: Path, text: str, name: str = "meaning.yaml") -> Path:
    path = Path(folder) / name
    path.write_text(text)
    return path


def refused(path: Path, registry, *needles: str) -> str:
    """Loading `path` fails with one line that names the file and every needle."""
    with pytest.raises(ProtocolError) as info:
        load_protocol(str(path), registry)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# -- 1. duplicate keys, at every depth ----------------------------------------------------------
DUPLICATES = {  # name -> (text, line of the second key, key path)
    "top level": (BASE + "seeds: [1]\n", 12, "seeds"),
    "top level, first line": ('name: other\n' + BASE, 2, "name"),
    "a mapping": (BASE.replace("lr: 0.05,", "lr: 0.05, lr: 0.5,"), 11, "training.lr"),
    "a list item": (BASE.replace("model: mlp}", "model: mlp, model: small-cnn}"), 4, "datasets[0].model"),
    "depth 3 in a list": (BASE.replace("{alpha: 1.0,", "{alpha: 1.0, alpha: 3.0,"), 8, "methods[1].hparams.alpha"),
    "block style": (BASE.replace("task_orders: {count: 1, seed: 0}",
                                 "task_orders:\n  count: 1\n  seed: 0\n  count: 2"), 12, "task_orders.count"),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_key_written_twice_is_refused_with_its_path_and_line(tmp_path, registry, case):
    text, line, where = DUPLICATES[case]
    path = write(tmp_path, text)
    refused(path, registry, f"{path}:{line}: {where}: duplicate key", "allowed: each key once per mapping")


def test_a_merge_key_may_still_be_overridden(tmp_path, registry):
    text = with_methods("  - {name: lwf, label: lwf-b, hparams: &h {alpha: 1.0, temperature: 2.0}}",
                        "  - {name: lwf, label: lwf-c, hparams: {<<: *h, alpha: 0.5}}")
    protocol = load_protocol(str(write(tmp_path, text)), registry)
    alphas = {m.display: m.hparams.get("alpha") for m in protocol.methods}
    assert alphas == {"naive": None, "lwf-a": 1.0, "lwf-b": 1.0, "lwf-c": 0.5}


# -- 2. numbers as a researcher writes them -----------------------------------------------------
FLOATS = ["1e-3", "5E-1", ".5", "1.e-2", "2.5e-2", "1_0e-3", "+1e-1", "1E+0"]


@pytest.mark.parametrize("literal", FLOATS)
def test_float_literals_are_numbers_for_protocol_keys_and_hyperparameters(tmp_path, registry, literal):
    text = with_methods(f"  - {{name: became, hparams: {{alpha: {literal}, stages: full}}}}")
    text = text.replace("lr: 0.05", f"lr: {literal}").replace("alpha: 1.0", f"alpha: {literal}")
    protocol = load_protocol(str(write(tmp_path, text)), registry)
    value = float(literal.replace("_", ""))
    by_name = {m.display: m.hparams for m in protocol.methods}
    assert protocol.training.lr == value
    assert by_name["lwf-a"]["alpha"] == value and by_name["became"]["alpha"] == value


@pytest.mark.parametrize("where,text", [
    ("training.lr", BASE.replace("lr: 0.05", 'lr: "1e-3"')),
    ("methods[1].hparams.alpha", BASE.replace("alpha: 1.0", "alpha: '5e-1'")),
    ("methods[2].hparams.alpha", with_methods('  - {name: became, hparams: {alpha: "5e-1", stages: full}}')),
    ("methods[2].hparams.lam", with_methods("  - {name: magmax, hparams: {lam: '0.5'}}")),
])
def test_a_quoted_number_is_refused_for_a_numeric_field(tmp_path, registry, where, text):
    refused(write(tmp_path, text), registry, where, "a quoted string: write the number without quotes")


@pytest.mark.parametrize("literal,reading", [("010", "8"), ("0017", "15"), ("1:20", "80"), ("-07", "-7")])
def test_ambiguous_numbers_are_refused(tmp_path, registry, literal, reading):
    path = write(tmp_path, BASE.replace("seeds: [0]", f"seeds: [{literal}]"))
    refused(path, registry, f"{path}:10:", f"{literal!r} is an ambiguous number", f"reads it as {reading}")


# -- 3. hyperparameter ranges, from every built-in method's declarations ------------------------
BUILT_INS = ("naive", "joint", "became", "gpm", "magmax", "avg", "task-arithmetic", "ties", "randmix",
             "ewc-online", "lwf", "si", "gem", "agem", "replay")


def _kinds(adapter, key):
    declared = tuple(adapter.hparam_types.get(key, ()))
    return declared or (type(adapter.defaults[key]),)


def _outside(adapter, key, allowed) -> list:
    """Values just outside `allowed`, of a type the hyperparameter takes."""
    integer = int in _kinds(adapter, key) and float not in _kinds(adapter, key)
    step = 1 if integer else 0.5
    cast = int if integer else float
    out = []
    if allowed.low is not None:
        out.append(cast(allowed.low) if allowed.low_open else cast(allowed.low - step))
    if allowed.high is not None:
        out.append(cast(allowed.high) if allowed.high_open else cast(allowed.high + step))
    if allowed.choices:
        out.append("no-such-" + allowed.choices[0])
    return out


def _declared_cases():
    registry = get_registry()
    for name in BUILT_INS:
        adapter = registry[name]
        for key, allowed in sorted(getattr(adapter, "hparam_ranges", {}).items()):
            for value in _outside(adapter, key, allowed):
                yield pytest.param(name, key, value, id=f"{name}-{key}-{value}")


def _protocol_with(tmp_path, name, hparams: dict, label: str = "") -> Path:
    import yaml

    entry = {"name": name, "hparams": hparams, **({"label": label} if label else {})}
    raw = yaml.safe_load(BASE)
    raw["methods"] = [entry]
    raw["training"]["epochs"] = 2  # became's split stages need two epochs (a run-time check, not this one)
    return write(tmp_path, yaml.safe_dump(raw, sort_keys=False))


def test_every_built_in_method_declares_a_range_for_each_numeric_or_string_hyperparameter(registry):
    assert set(BUILT_INS) <= set(registry)
    for name in BUILT_INS:
        adapter = registry[name]
        for key in adapter.defaults:
            kinds = set(_kinds(adapter, key))
            if kinds & {int, float, str} and bool not in kinds:
                assert key in adapter.hparam_ranges, (name, key)
            if key in adapter.hparam_ranges:
                assert adapter.hparam_ranges[key].admits(adapter.defaults[key]), (name, key)


@pytest.mark.parametrize("name,key,value", list(_declared_cases()))
def test_a_value_outside_a_declared_range_is_refused(tmp_path, registry, name, key, value):
    allowed = registry[name].hparam_ranges[key]
    path = _protocol_with(tmp_path, name, {key: value}, label=f"{name}-x")
    refused(path, registry, f"methods[0].hparams.{key}: {show(value)} is out of range",
            f"'{name}-x' ({name})", allowed.describe(isinstance(value, int)).split(" or ")[-1])


@pytest.mark.parametrize("name,key,value", [
    ("replay", "mem_size", -5), ("replay", "mem_size", 0), ("became", "alpha", 2.0), ("became", "alpha", -0.1),
    ("became", "alpha", "automatic"), ("became", "stages", "splt"), ("became", "stage2_lr", 0),
    ("gpm", "eps_base", 1.5), ("gpm", "eps_base", 0), ("gpm", "eps_step", -0.01), ("lwf", "temperature", 0),
    ("si", "eps", 0), ("ewc-online", "decay_factor", 1.5), ("ewc-online", "ewc_lambda", -1),
    ("ties", "top_k", 0), ("ties", "top_k", 101), ("magmax", "lam", -0.5), ("magmax", "finetune", "parallel"),
    ("gem", "patterns_per_exp", 0), ("agem", "sample_size", 0),
])
def test_hand_written_ranges_refuse(tmp_path, registry, name, key, value):
    refused(_protocol_with(tmp_path, name, {key: value}), registry, f"hparams.{key}", "out of range",
            f"method {name!r}")


@pytest.mark.parametrize("name,key,value", [
    ("replay", "mem_size", 1), ("became", "alpha", 0.0), ("became", "alpha", 1), ("became", "alpha", "auto"),
    ("became", "stages", "full"), ("became", "stage2_lr", None), ("gpm", "eps_base", 1), ("ties", "top_k", 100),
    ("magmax", "lam", 0), ("ewc-online", "decay_factor", 1.0), ("lwf", "alpha", 0), ("si", "eps", 1e-12),
])
def test_hand_written_ranges_admit_their_ends(tmp_path, registry, name, key, value):
    protocol = load_protocol(str(_protocol_with(tmp_path, name, {key: value})), registry)
    assert protocol.methods[0].hparams[key] == value


METHOD_FILE = '''\
"""A method file with declared ranges."""
from harness.api.contract import Range

NAME = "ranged-{tag}"
DEFAULTS = {{"strength": {default}, "mode": "a"}}
HPARAM_RANGES = {{"strength": Range(low=0, high=10), "mode": Range(choices=("a", "b"))}}


def build(ctx, strength, mode):
    from avalanche.training.supervised import Naive
    return Naive(**ctx.strategy_kwargs())
'''


@pytest.mark.parametrize("hparams", [{"strength": -1.0}, {"strength": 11}, {"mode": "c"}])
def test_a_method_file_declares_ranges_the_same_way(tmp_path, hparams):
    from harness.api.contract import Range

    method = write(tmp_path, METHOD_FILE.format(tag="ok", default=1.0), "ranged_ok.py")
    registry = get_registry((str(method),))
    assert registry["ranged-ok"].hparam_ranges["strength"] == Range(low=0, high=10)
    refused(_protocol_with(tmp_path, "ranged-ok", hparams), registry, "out of range", "method 'ranged-ok'")
    assert load_protocol(str(_protocol_with(tmp_path, "ranged-ok", {"strength": 10, "mode": "b"})), registry)


@pytest.mark.parametrize("body,needle", [
    ("default=20.0", "outside its HPARAM_RANGES"),
    ("bad-type", "must map DEFAULTS keys"),
])
def test_a_declaration_that_refuses_its_own_default_is_refused(tmp_path, body, needle):
    text = METHOD_FILE.format(tag="bad", default=20.0 if body == "default=20.0" else 1.0)
    if body == "bad-type":
        text = text.replace('"mode": Range(choices=("a", "b"))', '"mode": ("a", "b")')
    method = write(tmp_path, text, "ranged_bad.py")
    with pytest.raises(RegistryError, match=needle):
        get_registry((str(method),))


# -- 4. a backbone and data it cannot take ------------------------------------------------------
def _builds(model: str, shape: tuple) -> bool:
    """The truth: the model builds for samples of `shape` and maps a batch of them to features."""
    import torch

    from harness.run.models import build_model

    try:
        net = build_model(model, shape, n_heads=1, head_classes=2).eval()
        with torch.no_grad():
            net(torch.zeros((2, *shape)), 0)
    except Exception:
        return False
    return True


# The built-in data sets' sample shapes, written out here (the loader's declarations are checked against them).
SAMPLE = {"digits": (1, 8, 8), "mnist1d": (40,), "mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28),
          "kmnist": (1, 28, 28), "qmnist": (1, 28, 28), "cifar100": (3, 32, 32)}
SHAPES = sorted(set(SAMPLE.values()), key=str)
PAIRS = [(m, d) for m in ("mlp", "mlp-bn", "small-cnn", "cnn1d", "resnet18-reduced", "resnet18") for d in SAMPLE]


@pytest.fixture(scope="module")
def truth():
    return {(m, s): _builds(m, s) for m in MODELS if m in {p[0] for p in PAIRS} for s in SHAPES}


@pytest.mark.parametrize("model,dataset", PAIRS)
def test_a_model_that_cannot_take_the_data_is_refused_at_load(tmp_path, registry, truth, model, dataset):
    shape, n = SAMPLE[dataset], DATASETS[dataset].n_classes
    path = write(tmp_path, BASE.replace("{name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}",
                                        f"{{name: {dataset}, n_tasks: 2, classes_per_task: {n // 2}, model: {model}}}"))
    if truth[(model, shape)]:
        assert load_protocol(str(path), registry).datasets[0].model == model
    else:
        refused(path, registry, "datasets[0].model", f"model {model!r} takes", f"dataset {dataset!r}",
                f"shape {shape}", "allowed: a model that takes them")


def test_the_declared_sample_shapes_are_the_loaded_ones():
    from harness.run.datasets import load_dataset

    assert {name: facts.sample_shape for name, facts in DATASETS.items() if name in SAMPLE} == SAMPLE
    for name in ("digits", "mnist1d"):  # embedded: always there
        assert load_dataset(name).input_shape == SAMPLE[name]


@pytest.mark.parametrize("model,sample", [("cnn1d", (1, 8, 8)), ("small-cnn", (40,)), ("small-cnn", (1, 4, 4)),
                                          ("cnn1d", (4,)), ("resnet18-reduced", (12,))])
def test_npz_data_a_model_cannot_take_is_refused_at_planning(tmp_path, cli, model, sample):
    rng = np.random.default_rng(0)
    arrays = {f"x_{s}": rng.normal(size=(40, *sample)).astype(np.float32) for s in ("train", "test")}
    arrays |= {f"y_{s}": np.arange(40) % 4 for s in ("train", "test")}
    np.savez(tmp_path / "data.npz", **arrays)
    path = write(tmp_path, BASE.replace("{name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}",
                                        f"{{name: 'npz:data.npz', n_tasks: 2, classes_per_task: 2, model: {model}}}"))
    code, out, err = cli("run", "--protocol", path, "--dry-run", "--no-mlflow", "--results", tmp_path / "r")
    assert code == 2 and "Traceback" not in err, (out, err)
    line = err.strip().splitlines()[-1]
    assert f"model {model!r} takes" in line and f"shape {sample}" in line and str(path) in line
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.json"))


def test_a_plug_in_backbone_declares_what_it_takes(tmp_path):
    from harness.api.plugins import Backbone, InputShapes, validate

    def build(shape):
        return []

    with pytest.raises(RegistryError, match="accepts must be"):
        validate(Backbone("odd", build, ("b",), (1, 8, 8), accepts=InputShapes((1,))), "odd.py")
    assert validate(Backbone("fine", build, ("b",), (40,), accepts=InputShapes((1,))), "fine.py")


# -- 5. a second protocol file reusing a protocol's name ----------------------------------------
SMOKE = Path(__file__).resolve().parents[2] / "protocols" / "smoke.yaml"


@pytest.mark.parametrize("edit", [("seeds: [0]", "seeds: [1]"), ("lr: 0.05", "lr: 0.1"),
                                  ("methods: [naive, lwf]", "methods: [naive, replay]")])
def test_a_file_reusing_a_name_and_version_with_other_content_is_refused(tmp_path, registry, monkeypatch, edit):
    monkeypatch.chdir(tmp_path)
    text = SMOKE.read_text()
    assert edit[0] in text, edit
    path = write(tmp_path, text.replace(*edit), "my-smoke.yaml")
    refused(path, registry, "name: protocol 'smoke' version 1 is also", "smoke.yaml", "a new version")


def test_a_file_reusing_a_name_under_another_version_loads_with_a_warning(tmp_path, registry, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = SMOKE.read_text().replace('version: "1"', 'version: "7"')
    protocol = load_protocol(str(write(tmp_path, text, "my-smoke.yaml")), registry)
    assert len(protocol.notes) == 1 and "kept apart by version" in protocol.notes[0]
    same = load_protocol(str(write(tmp_path, SMOKE.read_text(), "copy.yaml")), registry)
    assert same.notes == () and load_protocol("smoke", registry).notes == ()


def test_the_plan_shows_the_warning(tmp_path, cli):
    text = SMOKE.read_text().replace('version: "1"', 'version: "7"')
    path = write(tmp_path, textwrap.dedent(text), "my-smoke.yaml")
    code, out, err = cli("run", "--protocol", path, "--dry-run", "--no-mlflow", "--results", tmp_path / "r")
    assert code == 0 and "warning:" in out and "protocol name 'smoke' is also that of" in out
