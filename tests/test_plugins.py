"""Plug-ins beyond methods: backbones, data sets and regime families from files, protocols and entry
points; the built-ins declared the same way; run identity; `cl-bench check` of a plug-in file; the
worked examples of submissions/examples/ each run a small grid."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest

from harness.api import plugins, registry
from harness.api.registry import RegistryError, get_registry
from harness.config import vocabulary as v
from harness.config.protocol import ProtocolError, load_protocol

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "submissions" / "examples"

TINY = '''
import numpy as np
from torch import nn
from harness.api.plugins import Backbone, DataSource, RegimeFamily

def build(input_shape, width=16):
    n = 1
    for d in input_shape:
        n *= d
    return [nn.Sequential(nn.Flatten(), nn.Linear(n, width), nn.ReLU()),
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU())]

def load(data_dir, download):
    rng = np.random.default_rng(0)
    means = rng.normal(0, 3, (4, 6))
    def draw(n):
        y = np.repeat(np.arange(4), n)
        return means[y] + rng.normal(size=(len(y), 6)), y
    return (*draw(24), *draw(6))

def selects(module, param_name, argument):
    return isinstance(module, nn.Linear) and param_name == "weight" and module.out_features >= (argument or 0)

PLUGINS = (Backbone("tiny-net", build, ("enc", "mix"), (6,), norm_blocks=("mix",), bias_blocks=("enc", "mix")),
           DataSource("tiny-data", load, n_classes={n_classes}, default_model="tiny-net"),
           RegimeFamily("weights", selects, "Linear weights", argument="w"))
'''


@pytest.fixture(autouse=True)
def fresh_plugins():
    """Every test starts from the built-ins; what it registers is gone afterwards."""
    from harness.run import datasets, regimes  # noqa: F401  (their built-ins register on import)

    tables = [*plugins._TABLE.values(), v.MODELS, v.DATASETS, v.FAMILY_ARGUMENTS, v.FAMILY_DESCRIPTIONS]
    saved = [dict(t) for t in tables]
    registry._CACHE.clear()
    yield
    for table, old in zip(tables, saved):
        table.clear()
        table.update(old)
    registry._CACHE.clear()
    datasets.load_dataset.cache_clear()
    datasets._FINGERPRINTS.clear()


def tiny_file(folder: Path, name: str = "tiny.py", n_classes: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(TINY.format(n_classes=n_classes))
    return path


def protocol(folder: Path, body: str, name: str = "p.yaml") -> Path:
    path = folder / name
    path.write_text("name: plug\nversion: '1'\nmethods: [naive]\n" + body)
    return path


TINY_GRID = "datasets: [{name: tiny-data, n_tasks: 2, classes_per_task: 2}]\nregimes: [last-1:weights-w8, head]\n"


def test_the_built_ins_are_declared_as_plugins_with_the_vocabularys_facts():
    from harness.run.datasets import PLUGINS as DATA
    from harness.run.models import PLUGINS as BACKBONES, build_model, trainable_block_names
    from harness.run.regimes import PLUGINS as FAMILIES

    assert {b.name for b in BACKBONES} == set(v.MODELS) and {d.name for d in DATA} == set(v.DATASETS)
    assert tuple(f.name for f in FAMILIES) == v.REGIME_FAMILIES
    for b in BACKBONES:  # built at the shape each declares, the blocks are the vocabulary's
        assert plugins.lookup("backbone", b.name).source == plugins.BUILT_IN
        assert trainable_block_names(build_model(b.name, b.input_shape, 2, 2)) == list(v.MODELS[b.name].blocks)
    assert all(d.facts == v.DATASETS[d.name] for d in DATA)


def test_a_plugin_file_teaches_the_vocabulary_its_names(tmp_path):
    assert "tiny-net" not in v.MODELS and not v.is_regime_name("last-1:weights-w2")
    get_registry((str(tiny_file(tmp_path)),))
    assert v.MODELS["tiny-net"].blocks == ("enc", "mix") and v.DATASETS["tiny-data"].n_classes == 4
    assert v.parse_regime("last-1:weights-w3") == v.Regime("last-1:weights-w3", 1, "weights", 3)
    for bad in ("weights", "weights-r3", "weights-w0", "last-1:weights"):  # the family's argument letter is w
        assert not v.is_regime_name(bad)
    assert v.regime_sort_key("weights-w2") > v.regime_sort_key("lora-r2")
    assert v.FAMILY_DESCRIPTIONS["weights"] == "Linear weights"


def test_plugin_families_are_read_from_the_records_alone(tmp_path):
    """`leaderboard`, `report` and `figures` analyse records without --plugin: each record's family must
    be the one the site built at the end of `run --plugin` shows."""
    from conftest import record_from

    from harness.analysis.frame import records_to_frame

    written = {"last-2:kernels": "kernels", "kernels": "kernels", "last-1:weights-w8": "weights",
               "weights-w2": "weights", "head": "depth", "last-3": "depth", "lora-r4": "lora", "last-1:bitfit": "bitfit"}
    records = [record_from({"spec": {"regime": r}}) for r in written]
    assert "kernels" not in v.FAMILY_ARGUMENTS and "weights" not in v.FAMILY_ARGUMENTS
    unloaded = list(records_to_frame(records)["family"])
    get_registry((str(tiny_file(tmp_path)), str(EXAMPLES / "kernels.py")))
    assert unloaded == list(records_to_frame(records)["family"]) == list(written.values())
    odd = ["last-0:kernels", "first-2:kernels", "bitfit-r2", "lora", "depth", "last", "Kernels", "a:b:c", "lora-r4:x"]
    assert set(records_to_frame([record_from({"spec": {"regime": r}}) for r in odd])["family"]) == {"other"}


def test_a_backbone_without_a_feature_width_is_measured_and_its_modes_kept(tmp_path):
    from harness.run.models import build_model

    get_registry((str(tiny_file(tmp_path)),))
    net = build_model("tiny-net", (6,), 2, 3)
    assert net.heads[0].in_features == 16 and net.training and all(m.training for m in net.modules())


def test_plugin_families_select_through_the_engines_regimes(tmp_path):
    from harness.run.models import build_model
    from harness.run.regimes import RegimeError, apply_regime, selected_parameters

    get_registry((str(tiny_file(tmp_path)),))
    net = build_model("tiny-net", (6,), 2, 3)
    assert selected_parameters(net, "weights-w8") == ["blocks.enc.1.weight", "blocks.mix.0.weight"]
    with pytest.raises(RegimeError, match="'weights-w17' selects no parameter"):  # the argument reaches selects
        selected_parameters(net, "weights-w17")
    apply_regime(net, "last-1:weights-w8")
    trainable = sorted(n for n, p in net.blocks.named_parameters(prefix="blocks") if p.requires_grad)
    assert trainable == ["blocks.mix.0.weight"]


def test_names_are_taken_once(tmp_path):
    clash = tmp_path / "clash.py"
    clash.write_text("from harness.api.plugins import Backbone\n"
                     "PLUGINS = (Backbone('mlp', lambda s: [], ('a',), (1,)),)\n")
    with pytest.raises(RegistryError, match=r"clash\.py: backbone name 'mlp' is already defined by built-in"):
        get_registry((str(clash),))
    first, second = tiny_file(tmp_path / "a"), tiny_file(tmp_path / "b")
    get_registry((str(first),))
    with pytest.raises(RegistryError, match=rf"{second}: backbone name 'tiny-net' is already defined by {first}"):
        get_registry((str(second),))


@pytest.mark.parametrize("declaration,message", [
    ("Backbone('b', lambda s: [], (), (1,))", "blocks must be a non-empty tuple"),
    ("Backbone('b', lambda s: [], ('a',), (1,), norm_blocks=('z',))", "norm_blocks must be a tuple of its blocks"),
    ("Backbone('b', lambda s: [], ('a',), [1])", "input_shape must be a tuple of positive ints"),
    ("DataSource('d', lambda d, x: None, n_classes=1)", "n_classes must be an int >= 2"),
    ("DataSource('d', lambda d, x: None, n_classes=3, default_model='nope')", "default_model 'nope' is not a backbone"),
    ("RegimeFamily('Bad-name', lambda m, p, a: True)", "a family name is lower-case letters"),
    ("RegimeFamily('full', lambda m, p, a: True)", "none of head, full, last, depth"),
    ("RegimeFamily('fam', lambda m, p, a: True, argument='rr')", "argument must be one lower-case letter"),
    ("'not a plug-in'", "PLUGINS must be a tuple of harness.api.plugins"),
])
def test_ill_formed_declarations_fail_with_file_and_reason(tmp_path, declaration, message):
    path = tmp_path / "bad.py"
    path.write_text(f"from harness.api.plugins import *\nPLUGINS = ({declaration},)\n")
    with pytest.raises(RegistryError) as info:
        get_registry((str(path),))
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value) and "\n" not in str(info.value)


def test_protocol_plugins_are_loaded_before_its_names_are_checked(tmp_path):
    tiny_file(tmp_path / "lib")
    without = protocol(tmp_path, TINY_GRID, "without.yaml")
    with pytest.raises(ProtocolError, match="unknown dataset 'tiny-data'"):
        load_protocol(str(without), get_registry())
    with_key = protocol(tmp_path, "plugins: [lib/tiny.py]\n" + TINY_GRID, "with.yaml")
    loaded = load_protocol(str(with_key), get_registry())
    assert loaded.plugin_files == (str((tmp_path / "lib" / "tiny.py").resolve()),)
    assert loaded.datasets[0].model == "tiny-net" and loaded.regimes == ("last-1:weights-w8", "head")


@pytest.mark.parametrize("entry,message", [
    ("[nope.py]", "p.yaml: plugins[0]: 'nope.py': no such Python file"),
    ("lib/tiny.py", "p.yaml: plugins: expected a list of .py paths"),
    ("[broken.py]", "p.yaml: plugins: {dir}/broken.py: import failed: ZeroDivisionError"),
])
def test_protocol_plugins_key_errors_name_the_file_and_key(tmp_path, entry, message):
    tiny_file(tmp_path / "lib")
    (tmp_path / "broken.py").write_text("1 / 0\n")
    path = protocol(tmp_path, f"plugins: {entry}\n" + TINY_GRID)
    with pytest.raises(ProtocolError) as info:
        load_protocol(str(path), get_registry())
    assert message.format(dir=tmp_path.resolve()) in str(info.value)


def test_a_method_restricted_to_depth_refuses_a_plugin_family(tmp_path):
    tiny_file(tmp_path / "lib")
    path = tmp_path / "p.yaml"
    path.write_text("name: plug\nversion: '1'\nmethods: [gpm]\nplugins: [lib/tiny.py]\n" + TINY_GRID)
    with pytest.raises(ProtocolError, match=r"gpm cannot run faithfully under regime 'last-1:weights-w8'"):
        load_protocol(str(path), get_registry())
    assert v.runs_under_family("weights", v.REGIME_FAMILIES) and not v.runs_under_family("weights", ("depth",))


def _planned(path: Path):
    from harness.execution.plan import expand

    return expand(load_protocol(str(path), get_registry()))


def test_the_plugin_files_content_enters_the_run_id(tmp_path):
    lib = tiny_file(tmp_path / "lib")
    path = protocol(tmp_path, "plugins: [lib/tiny.py]\n" + TINY_GRID)
    specs = _planned(path)
    digest = "sha256:" + hashlib.sha256(lib.read_bytes()).hexdigest()[:16]
    assert specs[0].plugins == {"backbone:tiny-net": digest, "dataset:tiny-data": digest, "regime:weights": digest}
    assert specs[1].regime == "head" and "regime:weights" not in specs[1].plugins
    assert specs[0].to_dict()["plugins"] == specs[0].plugins
    lib.write_text(lib.read_text() + "# edited\n")
    assert {s.run_id for s in _planned(path)}.isdisjoint(s.run_id for s in specs)


def test_a_run_of_built_ins_has_no_plugins_key_and_keeps_its_id(spec_factory):
    from harness.config.specs import RunSpec

    spec = spec_factory()
    assert "plugins" not in spec.to_dict() and RunSpec.from_dict(spec.to_dict()) == spec
    # the ids these specs have under schema 7, as under the code before plug-ins existed with its schema
    # (then "c2e2e24c304c", "2e5ac8ef9359" under schema 5; "94dd6ef3aa3f", "3a13a18c8045" under schema 6): a
    # run of built-ins hashes no plug-in field, and no continual-evaluation field either
    assert (spec.run_id, spec_factory(regime="full", method="lwf").run_id) == ("7a2fc2d9de5f", "1cd4e0f2ede3")


def test_the_engine_refuses_a_plugin_changed_since_planning(tmp_path):
    from harness.run.engine import run_one

    lib = tiny_file(tmp_path / "lib")
    spec = _planned(protocol(tmp_path, "plugins: [lib/tiny.py]\n" + TINY_GRID))[0]
    record = run_one(spec, method_files=(str(lib),), device="cpu")
    assert record.ok and record.provenance["plugins"]["backbone:tiny-net"]["source"] == str(lib.resolve())
    lib.write_text(lib.read_text() + "# edited\n")
    again = run_one(spec, method_files=(str(lib),), device="cpu")
    assert again.status == "failed" and "IdentityError: plug-in backbone:tiny-net (sha256:" in again.error


def test_a_plugin_dataset_must_have_the_classes_it_declares(tmp_path):
    from harness.run.datasets import DatasetError, load_dataset

    get_registry((str(tiny_file(tmp_path, n_classes=5)),))
    with pytest.raises(DatasetError, match=r"tiny\.py: dataset 'tiny-data': declares n_classes=5, but its labels run 0\.\.3"):
        load_dataset("tiny-data")


def test_entry_points_register_plugins_of_their_groups_kind(tmp_path, monkeypatch):
    module = tiny_file(tmp_path, "clb_tiny_plugins.py")
    module.write_text(module.read_text() + "BACKBONE = PLUGINS[0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [EntryPoint("tiny", "clb_tiny_plugins", v.PLUGIN_GROUPS["backbone"])]
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group=None, **kw: [e for e in eps if e.group == group])
    with pytest.raises(RegistryError, match=r"group cl_bench.backbones holds backbones only; tiny-data, weights"):
        get_registry()
    eps[:] = [EntryPoint("tiny", "clb_tiny_plugins:BACKBONE", v.PLUGIN_GROUPS["backbone"])]
    registry._CACHE.clear()
    get_registry()
    found = plugins.lookup("backbone", "tiny-net")
    digest = hashlib.sha256(module.read_bytes()).hexdigest()[:16]
    assert found.source == "entry point tiny (clb_tiny_plugins:BACKBONE)" and found.implementation == f"sha256:{digest}"
    assert "tiny-data" not in v.DATASETS


# -- cl-bench check ----------------------------------------------------------------------------------------
BROKEN = {
    "blocks": ("TINY.replace('nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU())', 'nn.ReLU()')"
               ".replace('norm_blocks=(\"mix\",), bias_blocks=(\"enc\", \"mix\")', 'bias_blocks=(\"enc\",)')",
               "backbone 'tiny-net': the blocks with parameters are enc; it declares enc, mix"),
    "norm": ("TINY.replace('norm_blocks=(\"mix\",)', 'norm_blocks=()')", "backbone 'tiny-net': norm_blocks declares (), "
             "the built blocks holding them are (mix)"),
    "build": ("TINY.replace('nn.Linear(n, width)', 'nn.Linear(n + 1, width)')",
              "backbone 'tiny-net': building it for input (6,) raised RuntimeError"),
    "forward": ("TINY.replace('nn.Linear(n, width)', 'nn.Linear(n + 1, width)').replace('bias_blocks=(\"enc\", "
                "\"mix\"))', 'bias_blocks=(\"enc\", \"mix\"), feature_dim=16)')",
                "backbone 'tiny-net': a forward/backward pass on 4 inputs of shape (6,) raised RuntimeError"),
    "classes": ("TINY.replace('{n_classes}', '3')", "dataset 'tiny-data': declares n_classes=3, but its labels run 0..3"),
    "selects": ("TINY.replace('isinstance(module, nn.Linear) and', 'False and')", "regime 'weights': weights-w2 selects "
                "no parameter of mlp-bn or small-cnn"),
}


@pytest.mark.parametrize("defect", sorted(BROKEN))
def test_check_reports_a_broken_plugin_in_one_line_naming_file_and_plugin(tmp_path, defect, cli):
    edit, message = BROKEN[defect]
    path = tmp_path / "broken.py"
    path.write_text(eval(edit).format(n_classes=4))  # noqa: S307  (the table's own literals)
    code, _, err = cli("check", str(path))
    assert code == 2
    first = next(line for line in err.splitlines() if line.startswith("✗"))
    assert f"{path}: " in first and message in first, err
    assert f"{path}: the plug-in contract is broken" in err


def test_list_shows_plugins_beside_the_built_ins(tmp_path, cli):
    code, out, err = cli("list", "--plugin", str(tiny_file(tmp_path)))
    assert code == 0, err
    source = str(tmp_path / "tiny.py")
    assert f"plug-in ({source})" in next(line for line in out.splitlines() if "tiny-data" in line)
    assert f"weights-wN plug-in family ({source}), also last-k:weights-wN: Linear weights" in out
    assert f"tiny-net (2 blocks, plug-in {source})" in out and "mlp (4 blocks)," in out and "digits" in out
    # without --plugin, `list` imports no torch (a fresh process: this one has registered tiny.py)
    code = "import sys; from harness.cli import main; main(['list']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "plug-in" not in out and out.splitlines()[-1] == "False"


def test_check_passes_a_good_plugin_file(tmp_path, cli):
    code, out, _ = cli("check", str(tiny_file(tmp_path)))
    assert code == 0
    assert "backbone 'tiny-net': builds for input (6,)" in out and "dataset 'tiny-data': 96 train / 24 test" in out
    assert "regime 'weights': weights-w2 on mlp-bn" in out and "the plug-in contract holds" in out


# -- the worked examples (submissions/README.md) --------------------------------------------------------------
def shapes_folder(root: Path, n_train: int = 10, n_test: int = 4) -> Path:
    """`<root>/shapes-png/{train,test}/<class>/*.png`: 8x8 greyscale shapes with noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:8, :8]
    masks = {"bar": abs(yy - 3.5) < 1.5, "circle": abs(np.hypot(yy - 3.5, xx - 3.5) - 2.5) < 0.9,
             "cross": (abs(yy - xx) < 1) | (abs(yy + xx - 7) < 1), "square": (abs(yy - 3.5) > 2) | (abs(xx - 3.5) > 2)}
    for split, n in (("train", n_train), ("test", n_test)):
        for name, mask in masks.items():
            folder = root / "shapes-png" / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(mask * 200 + rng.normal(30, 25, mask.shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels, "L").save(folder / f"{i}.png")
    return root


EXAMPLE_GRIDS = {  # example -> (protocol body, how the file is given)
    "residual_mlp.py": ("datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: residual-mlp}]\n"
                        "regimes: [last-1, norm]\n", "flag"),
    "image_folder.py": ("datasets: [{name: shapes-png, n_tasks: 2, classes_per_task: 2}]\nregimes: [last-1]\n",
                        "protocol"),
    "kernels.py": ("datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: small-cnn}]\n"
                   "regimes: [last-2:kernels]\n", "flag"),
}


@pytest.mark.parametrize("example", sorted(EXAMPLE_GRIDS))
def test_each_worked_example_checks_and_runs_a_small_grid(example, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("CL_BENCH_DATA", str(shapes_folder(tmp_path / "data")))
    file = EXAMPLES / example
    code, _, err = cli("check", str(file))
    assert code == 0, err
    body, how = EXAMPLE_GRIDS[example]
    if how == "protocol":  # relative to the protocol file
        body = f"plugins: [{os.path.relpath(file, tmp_path)}]\n" + body
    path = protocol(tmp_path, body + "training: {epochs: 1, batch_size: 16}\n")
    flags = ["--plugin", str(file)] if how == "flag" else []
    assert cli("run", "--protocol", str(path), "--results", str(tmp_path / "res"), "--jobs", "1", "--no-mlflow",
               "--no-leaderboard", "--no-progress", *flags)[0] == 0
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "res" / "plug" / "runs").glob("*.json"))]
    digest = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()[:16]
    assert records and all(r["status"] == "ok" for r in records)
    assert all(digest in r["spec"]["plugins"].values() for r in records)
    assert all({p["source"] for p in r["provenance"]["plugins"].values()} == {str(file)} for r in records)


def test_a_plugin_record_reproduces_bitwise(tmp_path, cli):
    path = protocol(tmp_path, EXAMPLE_GRIDS["kernels.py"][0] + "training: {epochs: 1, batch_size: 16}\n")
    results = str(tmp_path / "res")
    assert cli("run", "--protocol", str(path), "--results", results, "--jobs", "1", "--no-mlflow",
               "--no-leaderboard", "--no-progress", "--plugin", str(EXAMPLES / "kernels.py"))[0] == 0
    (run_id,) = [p.stem for p in (tmp_path / "res" / "plug" / "runs").glob("*.json")]
    registry._CACHE.clear()
    code, out, _ = cli("reproduce", run_id, "--results", results, "--plugin", str(EXAMPLES / "kernels.py"))
    assert code == 0 and "reproduced: bitwise equal" in out


ABSENT = '''
{imports}
from harness.api.plugins import DataSource

def load(data_dir, download):
    raise {raised}(f"dataset 'absent-data': no files under {{data_dir}}/absent; allowed: put them there")

PLUGINS = (DataSource("absent-data", load, n_classes=4, default_model="mlp"),)
'''


@pytest.mark.parametrize("imports, raised", [("from harness.api import DatasetMissing", "DatasetMissing"),
                                             ("import harness.api as api", "api.DatasetMissing"),
                                             ("from harness import api", "api.DatasetMissing")])
def test_a_plugin_data_set_that_is_not_there_is_planned_without_in_a_dry_run(tmp_path, cli, imports, raised):
    (tmp_path / "absent.py").write_text(ABSENT.format(imports=imports, raised=raised))
    proto = protocol(tmp_path, "plugins: [absent.py]\ndatasets: [{name: absent-data, n_tasks: 2, classes_per_task: 2}]\n"
                               "regimes: [head]\n")
    results = tmp_path / "results"
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--dry-run", "--data-dir", tmp_path)
    assert code == 0, err
    assert "not planned: 1 runs of absent-data, whose files are not there" in out, out
    code, _, err = cli("run", "--protocol", proto, "--results", results, "--no-progress", "--no-mlflow",
                       "--data-dir", tmp_path)
    assert code == 2 and err.strip().endswith("allowed: put them there") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("raised", ["FileNotFoundError", "ValueError", "RuntimeError"])
def test_a_plugin_data_set_that_fails_otherwise_is_one_line_even_in_a_dry_run(tmp_path, cli, raised):
    (tmp_path / "broken.py").write_text(ABSENT.format(imports="", raised=raised))
    proto = protocol(tmp_path, "plugins: [broken.py]\ndatasets: [{name: absent-data, n_tasks: 2, classes_per_task: 2}]\n"
                               "regimes: [head]\n")
    code, _, err = cli("run", "--protocol", proto, "--results", tmp_path / "results", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"broken.py: dataset 'absent-data': load failed: {raised}: dataset 'absent-data': no files" in err, err
