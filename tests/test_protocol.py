"""Protocol loading: strict validation with one-line messages, expansion into specs."""
import copy

import pytest
import yaml

from harness.api.registry import get_registry
from harness.config.protocol import ProtocolError, load_protocol, parse_protocol, select
from harness.config.vocabulary import MODELS
from harness.execution.plan import expand

GOOD = {
    "name": "p", "version": "1", "datasets": [{"name": "digits", "n_tasks": 5, "classes_per_task": 2}],
    "regimes": ["head", "full"], "methods": ["naive", {"name": "lwf", "hparams": {"alpha": 2.0}}],
    "task_orders": {"count": 3, "seed": 7}, "seeds": [0, 1],
    "training": {"epochs": 1, "lr": 0.1}, "evaluation": {"batch_size": 256},
}


def with_change(path, value):
    raw = copy.deepcopy(GOOD)
    node = raw
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


class _Delete:
    """Sentinel: remove the key (stable repr keeps test ids identical across xdist workers)."""

    def __repr__(self):
        return "DELETE"


DELETE = _Delete()

# (change, fragment of the expected message)
BAD = [
    (("colour",), "blue", "colour: unknown key; allowed: name, version"),
    (("name",), DELETE, "name: missing required key"),
    (("name",), 3, "name: expected a string"),
    (("version",), None, "version: expected a version string"),
    (("scenario",), "domain-il", "scenario: 'domain-il' is not allowed; allowed: task-il, class-il"),
    (("pretrain",), "imagenet", "pretrain: 'imagenet' is not allowed; allowed: first-task, none"),
    (("datasets",), [], "datasets: expected a non-empty list"),
    (("datasets", 0, "name"), "mnist2", "datasets[0].name: unknown dataset 'mnist2'; allowed: digits"),
    (("datasets", 0, "n_tasks"), "5", "datasets[0].n_tasks: expected an integer, got '5'"),
    (("datasets", 0, "n_tasks"), 6, "datasets[0]: 6 tasks x 2 classes = 12 classes, but digits has 10"),
    (("datasets", 0, "classes_per_task"), DELETE, None),  # valid: 10 / 5
    (("datasets", 0, "model"), "vit", "datasets[0].model: 'vit' is not allowed; allowed: mlp"),
    (("datasets", 0, "shuffle"), True, "datasets[0].shuffle: unknown key"),
    (("regimes",), ["head", "middle"], "regimes[1]: unknown regime 'middle'; allowed: head, full, last-k, bitfit, norm, lora-rR"),
    (("regimes",), ["last-7"], "regimes[0]: 'last-7' is deeper than model 'mlp' of dataset 'digits' (4 blocks)"),
    (("regimes",), ["full", "full"], "regimes: a regime is listed twice"),
    (("methods",), ["naive", "ewc"], "methods[1].name: unknown method 'ewc'; allowed: agem"),
    (("methods", 1, "hparams"), {"alpah": 1.0}, "methods[1].hparams.alpah: unknown key; allowed: alpha, temperature"),
    (("methods",), ["naive", "naive"], "methods: method 'naive' appears twice"),
    (("task_orders",), {"count": 0}, "task_orders.count: 0 is too small"),
    (("task_orders",), {"orders": [[0, 1, 2]]}, "task_orders.orders[0]: [0, 1, 2] is not a permutation of 0..9"),
    (("task_orders",), {"orders": [[0, 1, 2, 3, 4, 5, 6, 7, 8, 8]]}, "is not a permutation of 0..9"),
    (("task_orders",), {"count": 2, "orders": [list(range(10))]}, "task_orders: give either count"),
    (("seeds",), [0, -1], "seeds[1]: -1 is too small"),
    (("training", "optimizer"), "lbfgs", "training.optimizer: 'lbfgs' is not allowed; allowed: sgd, adam, adamw"),
    (("training", "lr"), "fast", "training.lr: expected a number"),
    (("training", "lr"), 10**400, "training.lr: 1" + "0" * 56 + "... is not allowed; allowed: a finite number"),
    (("pretrain",), {"dataset": "same", "lr": -10**400}, "pretrain.lr: -1" + "0" * 55 + "... is out of range"),
    (("training", "momentum"), 1.5, "training.momentum: 1.5 is out of range"),
    (("training", "epochs"), True, "training.epochs: expected an integer, got True"),
    (("evaluation", "batch_size"), 0, "evaluation.batch_size: 0 is too small"),
]


@pytest.mark.parametrize("path,value,expected", BAD, ids=[".".join(map(str, b[0])) + f"={b[1]!r}"[:30] for b in BAD])
def test_bad_protocols_name_file_key_and_allowed_values(path, value, expected):
    raw = with_change(path, value)
    if expected is None:
        parse_protocol(raw, "p.yaml", get_registry())
        return
    with pytest.raises(ProtocolError) as err:
        parse_protocol(raw, "p.yaml", get_registry())
    message = str(err.value)
    assert message.startswith("p.yaml: ")
    assert expected in message
    assert "\n" not in message


def test_classes_that_do_not_divide_into_tasks():
    raw = with_change(("datasets", 0), {"name": "digits", "n_tasks": 3})
    with pytest.raises(ProtocolError, match=r"10 classes of digits do not divide into 3 tasks; allowed: one of \[1, 2, 5, 10\]"):
        parse_protocol(raw, "p.yaml", get_registry())


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nregimes: [head,\n")
    with pytest.raises(ProtocolError, match=r"broken.yaml:\d+: not valid YAML"):
        load_protocol(str(path), get_registry())


def test_unknown_protocol_name_lists_available():
    with pytest.raises(ProtocolError, match="unknown protocol 'nope'; allowed: .*depth-sweep-mini"):
        load_protocol("nope", get_registry())


def test_good_protocol_expands_to_the_full_grid():
    p = parse_protocol(copy.deepcopy(GOOD), "p.yaml", get_registry())
    specs = expand(p)
    assert len(specs) == 1 * 2 * 2 * 3 * 2
    assert len({s.run_id for s in specs}) == len(specs)
    lwf = next(s for s in specs if s.method == "lwf")
    assert lwf.hparams == {"alpha": 2.0, "temperature": 2.0}  # defaults merged in
    assert {s.order for s in specs} == {0, 1, 2}
    assert next(s for s in specs if s.order == 0).class_order == tuple(range(10))


def test_run_id_depends_on_protocol_version():
    a = expand(parse_protocol(copy.deepcopy(GOOD), "p.yaml", get_registry()))[0]
    b = expand(parse_protocol(with_change(("version",), "2"), "p.yaml", get_registry()))[0]
    assert a.run_id != b.run_id


def test_select_filters_and_rejects_unknown_values():
    p = parse_protocol(copy.deepcopy(GOOD), "p.yaml", get_registry())
    small = select(p, methods=("lwf",), regimes=("full",), orders=2)
    assert len(expand(small)) == 1 * 1 * 1 * 2 * 2
    with pytest.raises(ProtocolError, match="--regimes: 'last-2' is not in protocol 'p'; allowed: head, full"):
        select(p, regimes=("last-2",))
    with pytest.raises(ProtocolError, match="--orders: 9 is out of range; allowed: 1..3"):
        select(p, orders=9)


@pytest.mark.parametrize("name", ["depth-sweep", "depth-sweep-mini", "smoke"])
def test_shipped_protocols_load(name):
    p = load_protocol(name, get_registry())
    assert p.name == name and p.version
    # torchvision data is not on this machine: stand-in fingerprints (the grid does not need the data)
    specs = expand(p, {d.name: f"sha256:{d.name}" for d in p.datasets})
    assert len(specs) > 0 and all(s.method_version and s.data_fingerprint for s in specs)


def test_depth_sweep_design():
    p = load_protocol("depth-sweep", get_registry())
    assert [d.name for d in p.datasets] == ["mnist", "fashion-mnist", "kmnist", "qmnist", "cifar100"]
    assert p.regimes == ("head", "last-1", "last-2", "last-3", "full")
    assert len(p.task_orders) == 11
    assert {"naive", "ewc-online", "lwf", "si", "gem"} <= {m.name for m in p.methods}


def test_subspace_sweep_mini_design():
    """The issue's regimes, a pretrained backbone, GPM/BECAME on depth regimes only, and enough
    methods in every regime for the tau permutation test (>= 5 items) to decide."""
    from harness.config.vocabulary import regime_family

    p = load_protocol("subspace-sweep-mini", get_registry())
    assert {"head", "bitfit", "lora-r1", "lora-r4", "lora-r16", "last-1", "last-2", "full"} <= set(p.regimes)
    assert p.pretrain.is_backbone and p.pretrain.recipe.dataset == "same" and p.pretrain.holdout == 0.15
    everywhere = [m for m in p.methods if all(m.runs_under(r) for r in p.regimes)]
    assert len(everywhere) >= 5
    for m in p.methods:
        if m.name in ("gpm", "became"):
            assert {regime_family(r) for r in p.regimes if m.runs_under(r)} == {"depth"}
    assert len(p.task_orders) >= 5


def test_model_block_counts_match_the_models():
    from harness.run.models import build_model, trainable_block_names

    shapes = {"mlp": (1, 8, 8), "mlp-bn": (1, 8, 8), "cnn1d": (40,), "small-cnn": (1, 28, 28), "resnet18-reduced": (3, 32, 32),
              "resnet18": (3, 32, 32), "vit-tiny": (1, 8, 8), "vit-b16": (3, 32, 32), "vit-b16-clip": (3, 32, 32)}
    for name, facts in MODELS.items():
        assert trainable_block_names(build_model(name, shapes[name], 2, 2)) == list(facts.blocks)


def test_protocol_file_round_trip(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert load_protocol(str(path), get_registry()).source == str(path)


def test_one_validator_serves_the_protocol_and_its_pretrain_value():
    """The checks, `show` and MAX_SEED are defined once in config (validate.py), and the two DATASET_KEYS
    of old are two names: a protocol's dataset entry and a pretraining recipe."""
    import ast
    from pathlib import Path

    from harness.config import pretrain, protocol, validate

    defined = {}
    for path in Path(validate.__file__).parent.glob("*.py"):  # the config wing
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in names:
                defined.setdefault(name, []).append(path.name)
    for name in ("show", "_show", "MAX_SEED", "Validator", "_Validator", "_Checker", "DATASET_KEYS"):
        assert defined.get(name, []) in ([], ["validate.py"]), (name, defined.get(name))
    assert protocol.DATASET_ENTRY_KEYS == ("name", "n_tasks", "classes_per_task", "model")
    assert pretrain.RECIPE_KEYS == ("dataset", "holdout", "epochs", "lr", "batch_size", "seed")
    assert isinstance(protocol._ProtocolValidator("p.yaml", ProtocolError), validate.Validator)


@pytest.mark.parametrize("name", ["smoke", "depth-sweep-mini"])
@pytest.mark.parametrize("edit", [("seeds: [0]", "seeds: [1]"), ("lr: 0.05", "lr: 0.01")])
def test_an_override_in_protocols_must_carry_a_new_version(tmp_path, monkeypatch, name, edit):
    from harness.config.paths import protocols_dir

    monkeypatch.chdir(tmp_path)
    shipped = protocols_dir() / f"{name}.yaml"
    text = shipped.read_text()
    if edit[0] not in text:
        pytest.skip(f"{name} has no {edit[0]!r}")
    (tmp_path / "protocols").mkdir()
    override = tmp_path / "protocols" / f"{name}.yaml"
    override.write_text(text.replace(*edit))
    with pytest.raises(ProtocolError) as info:
        load_protocol(name, get_registry())
    message = str(info.value)
    assert "\n" not in message and "give it a new version" in message, message
    assert message.startswith("protocols/") and str(shipped) in message, message
    version = yaml.safe_load(text)["version"]
    override.write_text(text.replace(*edit).replace(f'version: "{version}"', 'version: "override-1"'))
    loaded = load_protocol(name, get_registry())
    assert loaded.version == "override-1" and loaded.source.startswith("protocols")
    assert len(loaded.notes) == 1 and str(shipped) in loaded.notes[0]
