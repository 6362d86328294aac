"""Data and cache files are untrusted and may be damaged.

- a CIFAR-100 pickle runs no code (restricted unpickler), also under --dry-run; genuine files load;
- damaged data files and cache files: one line naming the file (exit 2), or a cache file rebuilt
  with one warning line;
- a replaced pretrained-cache file is caught by its stored sha256 on every read and rebuilt;
- an unwritable CL_BENCH_CACHE is one line naming the variable and the path;
- a sweep whose checkpoint cannot be loaded leaves no folder behind.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import struct
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.config.errors import CacheError, DatasetError
from harness.run import datasets as ds
from harness.run.datasets import load_dataset

from .conftest import tiny_protocol

N_TRAIN, N_TEST = 12, 6
QUIET = ("--no-progress", "--no-mlflow", "--no-leaderboard")


@pytest.fixture(autouse=True)
def fresh_loads(monkeypatch, tmp_path):
    """A private cache; no data set or fingerprint remembered from another test."""
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    load_dataset.cache_clear()
    ds._FINGERPRINTS.clear()
    yield
    load_dataset.cache_clear()
    ds._FINGERPRINTS.clear()


def one_line(text: str) -> str:
    """The single line the CLI printed for a user error (no traceback)."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- CIFAR-100 files --------------------------------------------------------------------------------
def _s(text: bytes) -> bytes:  # a Python 2 str: SHORT_BINSTRING or BINSTRING
    return (b"U" + bytes([len(text)]) if len(text) < 256 else b"T" + struct.pack("<i", len(text))) + text


def _int(v: int) -> bytes:
    return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)


def _py2_array(a: np.ndarray) -> bytes:
    """An ndarray as numpy 1 under Python 2 pickled it (protocol 2): the form of the published files."""
    header = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _int(0) + b"\x85" + _s(b"b") + b"\x87R"
    shape = b"(" + b"".join(_int(d) for d in a.shape) + b"t"
    order = b"|" if a.dtype.itemsize == 1 else b"<"
    dtype = (b"cnumpy\ndtype\n" + _s(a.dtype.str[1:].encode()) + _int(0) + _int(1) + b"\x87R"
             + b"(" + _int(3) + _s(order) + b"NNN" + b"J\xff\xff\xff\xff" * 2 + _int(0) + b"tb")
    return header + b"(" + _int(1) + shape + dtype + b"\x89" + _s(a.tobytes()) + b"tb"


def _py2_value(v) -> bytes:
    if isinstance(v, np.ndarray):
        return _py2_array(v)
    if isinstance(v, list):
        return b"](" + b"".join(_py2_value(x) for x in v) + b"e"
    if isinstance(v, int):
        return _int(v)
    return _s(v.encode("latin1"))


def py2_pickle(entry: dict) -> bytes:
    """A dict pickled as the CIFAR authors did (Python 2 cPickle, protocol 2, numpy 1)."""
    return b"\x80\x02}(" + b"".join(_s(k.encode()) + _py2_value(v) for k, v in entry.items()) + b"u."


def cifar_entry(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"batch_label": "training batch 1 of 1", "filenames": [f"img_{i}.png" for i in range(n)],
            "fine_labels": rng.integers(0, 100, size=n).tolist(), "coarse_labels": [0] * n,
            "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)}


def write_cifar(root: Path, train: bytes | None = None, test: bytes | None = None) -> Path:
    """cifar-100-python/{train,test} under `root`; genuine (Python 2 form) unless given."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train").write_bytes(py2_pickle(cifar_entry(N_TRAIN, 1)) if train is None else train)
    (folder / "test").write_bytes(py2_pickle(cifar_entry(N_TEST, 2)) if test is None else test)
    return folder


def cifar_protocol(folder: Path) -> Path:
    path = folder / "cifar.yaml"
    path.write_text(textwrap.dedent("""\
        name: cifar
        version: "1"
        datasets: [{name: cifar100, n_tasks: 2, classes_per_task: 2, model: small-cnn}]
        regimes: [head]
        methods: [naive]
        task_orders: {count: 1, seed: 0}
        seeds: [0]
        training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 64}
        """))
    return path


class Reduce:
    """An object that pickles as `func(*args)`: what a poisoned file calls when unpickled."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def payloads(marker: Path) -> dict:
    """name -> pickle bytes that would create `marker` (or allocate without bound) when unpickled."""
    from numpy.testing._private.utils import runstring

    touch = f"open({str(marker)!r}, 'w').close()"
    genuine = cifar_entry(N_TRAIN, 1)
    data = genuine["data"]
    return {
        "os.system": pickle.dumps({"data": Reduce(os.system, f"touch {marker}")}, protocol=2),
        "builtins.exec": pickle.dumps(Reduce(exec, touch), protocol=4),
        "subprocess.Popen": pickle.dumps({"data": Reduce(subprocess.Popen, ["touch", str(marker)])}, protocol=2),
        "numpy-runstring": pickle.dumps({"data": data, "fine_labels": Reduce(runstring, touch, {})}, protocol=2),
        "nested-in-labels": pickle.dumps({**genuine, "fine_labels": [1, 2, Reduce(exec, touch)]}, protocol=4),
        "nested-in-object-array": pickle.dumps({**genuine, "data": np.array([Reduce(exec, touch)], dtype=object)},
                                               protocol=2),
        "nested-reduce-argument": pickle.dumps({"data": Reduce(str, Reduce(exec, touch))}, protocol=5),
        "protocol-0-text": b"(dp0\nS'data'\np1\ncos\nsystem\np2\n(S'touch " + str(marker).encode() + b"'\ntRp3\ns.",
        "persistent-id": b"\x80\x02Ptouch " + str(marker).encode() + b"\n.",
        "codecs-other-encoding": b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00zlib\x86R.",
        "huge-reconstruct": (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                             b"\x8a\x06\x00\x00\x00\x00\x00\x01\x85U\x01b\x87R."),  # 2**40 elements
    }


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("variant", sorted(payloads(Path("/x"))))
def test_a_poisoned_cifar_pickle_runs_nothing_and_is_one_line(variant, split, dry_run, tmp_path, cli):
    marker = tmp_path / "MARKER"
    poison = payloads(marker)[variant]
    folder = write_cifar(tmp_path / "data", **{split: poison})
    cmd = ["run", "--protocol", cifar_protocol(tmp_path), "--data-dir", tmp_path / "data",
           "--results", tmp_path / "res", *QUIET] + (["--dry-run"] if dry_run else [])
    code, out, err = cli(*cmd)
    assert not marker.exists(), "the pickle ran code"
    line = one_line(err)
    assert code == 2, (out, err)
    assert f"{folder / split} refused: the pickle references" in line and "nothing from the file was run" in line
    assert not (tmp_path / "res").exists()


def test_the_refusal_names_the_forbidden_global(tmp_path):
    folder = write_cifar(tmp_path, train=payloads(tmp_path / "M")["builtins.exec"])
    with pytest.raises(DatasetError, match=r"references builtins\.exec, which no CIFAR-100 file does"):
        load_dataset("cifar100", str(tmp_path))
    assert (folder / "train").exists() and not (tmp_path / "M").exists()


def test_the_published_form_references_only_what_the_reader_admits():
    found = {arg for op, arg, _ in pickletools.genops(py2_pickle(cifar_entry(3, 0))) if op.name == "GLOBAL"}
    assert found == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    assert all(tuple(g.split(" ")) in ds._CifarUnpickler.ALLOWED for g in found)


@pytest.mark.parametrize("form", ["python2", "protocol-2", "protocol-4", "protocol-5", "int-array-labels"])
def test_genuine_cifar_pickles_still_load(form, tmp_path):
    train, test = cifar_entry(N_TRAIN, 1), cifar_entry(N_TEST, 2)
    if form == "int-array-labels":  # a re-packed copy: labels as a numpy array of int64
        train, test = ({**e, "fine_labels": np.asarray(e["fine_labels"])} for e in (train, test))
    dump = py2_pickle if form == "python2" else (
        lambda e: pickle.dumps(e, protocol=5 if form == "int-array-labels" else int(form[-1])))
    write_cifar(tmp_path, dump(train), dump(test))
    data = load_dataset("cifar100", str(tmp_path))
    assert data.x_train.shape == (N_TRAIN, 3, 32, 32) and data.x_test.shape == (N_TEST, 3, 32, 32)
    assert data.y_test.tolist() == list(test["fine_labels"])
    mean, std = ds.TORCHVISION["cifar100"][1:]
    expected = (test["data"][0, :1024].reshape(32, 32).astype(np.float32) / 255.0 - mean[0]) / std[0]
    np.testing.assert_allclose(data.x_test[0, 0].numpy(), expected, rtol=1e-6)


def test_a_genuine_cifar_folder_plans_under_dry_run(tmp_path, cli):
    write_cifar(tmp_path / "data")
    code, out, err = cli("run", "--protocol", cifar_protocol(tmp_path), "--data-dir", tmp_path / "data",
                         "--results", tmp_path / "res", "--dry-run", *QUIET)
    assert code == 0, err
    assert "to run: 1" in out and "not planned" not in out


def damaged_cifar() -> dict:
    """name -> (bytes of the train file, part of the one line)."""
    genuine = cifar_entry(N_TRAIN, 1)
    whole = py2_pickle(genuine)
    rng = np.random.default_rng(0)

    def with_(**changes) -> bytes:
        return pickle.dumps({**genuine, **changes}, protocol=2)

    return {
        "random-bytes": (rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), "is damaged"),
        "random-bytes-after-proto": (b"\x80\x02" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), ""),
        "truncated": (whole[: len(whole) // 2], "is damaged"),
        "truncated-at-end": (whole[:-1], "is damaged"),
        "empty": (b"", "is damaged (EOFError"),
        "not-a-dict": (pickle.dumps([1, 2, 3], protocol=2), "holds a list"),
        "no-labels": (pickle.dumps({"data": genuine["data"]}, protocol=2), "missing keys ['fine_labels']"),
        "data-a-string": (with_(data="pixels"), "'data' holds <U6 values"),
        "data-floats": (with_(data=genuine["data"] / 255.0), "'data' holds float64 values"),
        "data-a-dict": (with_(data={"a": 1}), "'data' holds object values"),
        "data-ragged": (with_(data=[[1, 2], [3]]), "'data' is not an array"),
        "data-short": (with_(data=genuine["data"][:, :100]), "'data' has shape (12, 100) for 12 labels"),
        "data-out-of-range": (with_(data=genuine["data"].astype(np.int64) * 4), "outside 0..255"),
        "labels-strings": (with_(fine_labels=["cat"] * N_TRAIN), "'fine_labels' holds <U3 values"),
        "labels-too-large": (with_(fine_labels=[100] * N_TRAIN), "'fine_labels' runs 100..100"),
        "labels-negative": (with_(fine_labels=[-1] * N_TRAIN), "allowed: class indices 0..99"),
        "labels-2d": (with_(fine_labels=[[1]] * N_TRAIN), "'fine_labels' has shape (12, 1)"),
        "labels-empty": (with_(fine_labels=[]), "'fine_labels' holds float64"),
    }


@pytest.mark.parametrize("variant", sorted(damaged_cifar()))
def test_a_damaged_cifar_file_is_one_line_naming_it(variant, tmp_path):
    content, part = damaged_cifar()[variant]
    folder = write_cifar(tmp_path, train=content)
    with pytest.raises(DatasetError) as info:
        load_dataset("cifar100", str(tmp_path))
    text = str(info.value)
    assert "\n" not in text and str(folder / "train") in text and part in text, text


def test_a_folder_in_place_of_a_cifar_file_and_a_damaged_file_in_a_dry_run(tmp_path, cli):
    folder = write_cifar(tmp_path / "data", train=b"\x80\x02junk")
    code, _, err = cli("run", "--protocol", cifar_protocol(tmp_path), "--data-dir", tmp_path / "data",
                       "--results", tmp_path / "res", "--dry-run", *QUIET)
    assert code == 2 and f"{folder / 'train'} is damaged" in one_line(err)  # not "not there": it is
    (folder / "test").unlink()
    (folder / "test").mkdir()
    (folder / "train").write_bytes(py2_pickle(cifar_entry(N_TRAIN, 1)))
    with pytest.raises(DatasetError, match="cifar100"):
        load_dataset("cifar100", str(tmp_path / "data"))


# -- the MNIST family's files -----------------------------------------------------------------------
def write_mnist(root: Path) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        for kind, array in (("images-idx3", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)),
                            ("labels-idx1", np.arange(n, dtype=np.uint8) % 10)):
            header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}i", *array.shape)
            (raw / f"{prefix}-{kind}-ubyte").write_bytes(header + array.tobytes())
    return raw


@pytest.mark.parametrize("variant", ["random", "truncated", "empty", "short-labels", "huge-header"])
def test_damaged_mnist_files_are_one_line_not_a_traceback_nor_not_found(variant, tmp_path):
    raw = write_mnist(tmp_path)
    images, labels = raw / "train-images-idx3-ubyte", raw / "train-labels-idx1-ubyte"
    content = images.read_bytes()
    if variant == "random":
        images.write_bytes(np.random.default_rng(1).integers(0, 256, len(content), dtype=np.uint8).tobytes())
    elif variant == "truncated":
        images.write_bytes(content[: len(content) // 2])
    elif variant == "empty":
        images.write_bytes(b"")
    elif variant == "short-labels":
        labels.write_bytes(labels.read_bytes()[:-3])
    else:
        images.write_bytes(content[:4] + struct.pack(">3i", 2**30, 28, 28) + content[16:])
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", str(tmp_path))
    text = str(info.value)
    assert "\n" not in text and f"{tmp_path / 'MNIST'} cannot be read, damaged?" in text, text


# -- the mnist1d cache ------------------------------------------------------------------------------
@pytest.fixture
def fast_mnist1d(monkeypatch):
    """mnist1d's generator replaced by a small deterministic one (the cache's rule is under test)."""
    import mnist1d.data

    calls = []

    def make_dataset(_args):
        calls.append(1)
        rng = np.random.default_rng(5)
        return {"x": rng.normal(size=(40, 40)), "y": np.arange(40) % 10,
                "x_test": rng.normal(size=(20, 40)), "y_test": np.arange(20) % 10}

    monkeypatch.setattr(mnist1d.data, "make_dataset", make_dataset)
    return calls


def mnist1d_cache(tmp_path) -> Path:
    return tmp_path / "cache" / "mnist1d-default.npz"


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def damage_variants(original: bytes) -> dict:
    rng = np.random.default_rng(2)
    return {
        "random-bytes": rng.integers(0, 256, len(original), dtype=np.uint8).tobytes(),
        "truncated": original[: len(original) // 2],
        "empty": b"",
        "flipped-byte": original[:-40] + bytes([original[-40] ^ 1]) + original[-39:],
        "other-arrays": _npz(x=np.zeros((4, 40)), y=np.arange(4), x_test=np.zeros((2, 40)), y_test=np.arange(2)),
        "object-array": pickle.dumps(np.array([object()], dtype=object)),
    }


@pytest.mark.parametrize("variant", sorted(damage_variants(b"0" * 100)))
@pytest.mark.parametrize("sidecar", ["kept", "removed"])
def test_a_damaged_mnist1d_cache_is_rebuilt_with_one_warning(variant, sidecar, tmp_path, fast_mnist1d, capsys):
    fresh = ds._mnist1d()
    path = mnist1d_cache(tmp_path)
    original = path.read_bytes()
    path.write_bytes(damage_variants(original)[variant])
    if sidecar == "removed":  # also what a cache written by an older cl-bench looks like
        path.with_name(path.name + ".sha256").unlink()
    capsys.readouterr()
    again = ds._mnist1d()
    err = capsys.readouterr().err
    assert len(fast_mnist1d) == 2 and torch.equal(again.x_train, fresh.x_train)
    assert torch.equal(again.y_test, fresh.y_test)
    assert one_line(err).startswith(f"warning: cache file {path} ") and "discarded and rebuilt" in err
    ds._mnist1d()  # rebuilt and recorded: read back without a warning or a rebuild
    assert len(fast_mnist1d) == 2 and capsys.readouterr().err == ""


def test_a_folder_in_place_of_the_mnist1d_cache_is_one_line_naming_it(tmp_path, fast_mnist1d):
    from harness.config.errors import OutputError

    mnist1d_cache(tmp_path).mkdir(parents=True)
    (mnist1d_cache(tmp_path) / "f").write_text("x")
    with pytest.raises(OutputError, match="mnist1d-default.npz: is a folder") as info:  # never deleted
        ds._mnist1d()
    assert "\n" not in str(info.value) and (mnist1d_cache(tmp_path) / "f").exists()


# -- the pretrained-backbone cache ------------------------------------------------------------------
def digits_pretrain_spec(make_spec, seed: int = 0):
    from harness.config.pretrain import parse_pretrain
    from harness.config.specs import DatasetSpec

    pretrain = parse_pretrain({"dataset": "same", "epochs": 1, "batch_size": 64, "seed": seed}, "p.yaml", Path("."))
    return make_spec(pretrain=pretrain.for_dataset("digits"), dataset=DatasetSpec("digits", 5, 2, "mlp"))


def backbone(spec, log=None):
    from harness.run.pretrain import pretrained_backbone

    return pretrained_backbone(spec, (1, 8, 8), log=log)


def replacements(path: Path, other: Path) -> dict:
    """name -> a function that replaces or damages the cached backbone at `path`."""
    sidecar = path.with_name(path.name + ".sha256")
    other_sidecar = other.with_name(other.name + ".sha256")

    def write(data: bytes):
        return lambda: path.write_bytes(data)

    def both():  # another backbone's file AND its hash line: the line names the other file
        path.write_bytes(other.read_bytes())
        sidecar.write_text(other_sidecar.read_text())

    def rewrite(change):
        return lambda: path.write_bytes(change(path.read_bytes()))

    return {
        "another-backbone": lambda: path.write_bytes(other.read_bytes()),
        "another-backbone-and-its-hash": both,
        "random-bytes": rewrite(lambda b: np.random.default_rng(3).integers(0, 256, len(b), dtype=np.uint8).tobytes()),
        "truncated": rewrite(lambda b: b[: len(b) // 2]),
        "flipped-byte": rewrite(lambda b: b[:-100] + bytes([b[-100] ^ 1]) + b[-99:]),
        "empty": write(b""),
        "a-pickle-payload": write(pickle.dumps(Reduce(os.system, "true"))),
        "hash-removed": lambda: sidecar.unlink(),
        "hash-garbled": lambda: sidecar.write_text("not a hash\n"),
    }


VARIANTS = sorted(replacements(Path("a.pt"), Path("b.pt")))


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_replaced_or_damaged_pretrained_cache_file_is_caught_on_every_read(variant, tmp_path, monkeypatch,
                                                                               spec_factory):
    from harness.run import pretrain as pt

    _, other = backbone(digits_pretrain_spec(spec_factory, seed=1))
    state, weights = backbone(digits_pretrain_spec(spec_factory))
    path = Path(weights.path)
    assert path.with_name(path.name + ".sha256").read_text() == f"{weights.sha256}  {path.name}\n"
    replacements(path, Path(other.path))[variant]()
    lines, trained = [], []
    real = pt.train_backbone
    monkeypatch.setattr(pt, "train_backbone", lambda *a, **k: trained.append(1) or real(*a, **k))
    again, weights_again = backbone(digits_pretrain_spec(spec_factory), log=lines.append)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert trained == [1] and len(warnings) == 1, lines
    assert f"cache file {path} " in warnings[0] and "discarded and rebuilt" in warnings[0]
    # the rebuild is the same backbone, byte for byte: records (and their provenance) do not change
    assert all(torch.equal(again[k], state[k]) for k in state) and weights_again == weights
    backbone(digits_pretrain_spec(spec_factory), log=lines.append)
    assert trained == [1], "rebuilt twice"


# -- an unwritable CL_BENCH_CACHE ---------------------------------------------------------------------
def unwritable_caches(tmp_path: Path) -> dict:
    """name -> (a CL_BENCH_CACHE value that cannot be written, the path the message names)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    blocked = tmp_path / "blocked"  # the pretrained/ sub-folder is a file
    blocked.mkdir()
    (blocked / "pretrained").write_text("x")
    return {"a-file": (a_file, a_file), "under-a-file": (a_file / "sub", a_file / "sub"),
            "name-too-long": (tmp_path / ("n" * 300), tmp_path / ("n" * 300)),
            "pretrained-is-a-file": (blocked, blocked / "pretrained")}


@pytest.mark.parametrize("variant", ["a-file", "under-a-file", "name-too-long", "pretrained-is-a-file"])
def test_an_unwritable_cache_is_one_line_naming_cl_bench_cache(variant, tmp_path, cli, monkeypatch):
    value, named = unwritable_caches(tmp_path)[variant]
    monkeypatch.setenv("CL_BENCH_CACHE", str(value))
    proto = tiny_protocol(tmp_path, regimes=("head",), extra="pretrain: {dataset: same, epochs: 1}\n")
    code, out, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", *QUIET)
    line = one_line(err)
    assert code == 2, (out, err)
    assert f"CL_BENCH_CACHE={value}" in line and str(named) in line, line
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("variant", ["a-file", "under-a-file", "name-too-long"])
def test_an_unwritable_cache_for_mnist1d_is_one_line(variant, tmp_path, monkeypatch):
    value, _ = unwritable_caches(tmp_path)[variant]
    monkeypatch.setenv("CL_BENCH_CACHE", str(value))
    with pytest.raises(CacheError) as info:
        load_dataset("mnist1d")
    assert f"CL_BENCH_CACHE={value}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("variant", ["a-file", "under-a-file", "name-too-long"])
def test_an_unwritable_cache_leaves_digits_as_it_was_built_before_the_cache(variant, tmp_path, monkeypatch):
    from harness.run.datasets import fingerprint

    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "good"))
    cached = fingerprint(ds._digits())
    assert list((tmp_path / "good").glob("digits-*.npz"))
    value, _ = unwritable_caches(tmp_path)[variant]
    monkeypatch.setenv("CL_BENCH_CACHE", str(value))
    assert fingerprint(ds._digits()) == cached  # the embedded data set needs no cache


def test_unset_cache_variable_is_named_too(tmp_path, monkeypatch):
    from harness.config.paths import cache_dir

    monkeypatch.delenv("CL_BENCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CacheError, match=r"the default cache .* \(CL_BENCH_CACHE is not set\)"):
        cache_dir(create=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_cache_serves_what_it_holds_and_names_itself_when_it_must_write(tmp_path, fast_mnist1d,
                                                                                    spec_factory):
    ds._mnist1d()
    (tmp_path / "cache").chmod(0o500)
    try:
        ds._mnist1d()  # a valid entry is read without writing
        with pytest.raises(CacheError, match="CL_BENCH_CACHE="):
            backbone(digits_pretrain_spec(spec_factory))
    finally:
        (tmp_path / "cache").chmod(0o700)


# -- a checkpoint that cannot be loaded ---------------------------------------------------------------
def bad_checkpoints(marker: Path) -> dict:
    from harness.run.models import build_model

    other = build_model("mlp", (1, 4, 4), n_heads=1, head_classes=2).state_dict()
    buffer = io.BytesIO()
    torch.save(other, buffer)
    tensor = io.BytesIO()
    torch.save(torch.zeros(3), tensor)
    return {"random-bytes": np.random.default_rng(4).integers(0, 256, 800, dtype=np.uint8).tobytes(),
            "empty": b"", "a-pickle-payload": pickle.dumps(Reduce(os.system, f"touch {marker}")),
            "another-model": buffer.getvalue(), "a-tensor": tensor.getvalue(),
            "truncated": buffer.getvalue()[:200]}


@pytest.mark.parametrize("nested", [False, True], ids=["results", "nested-results"])
@pytest.mark.parametrize("variant", sorted(bad_checkpoints(Path("/x"))))
def test_a_checkpoint_that_cannot_load_leaves_no_folder(variant, nested, tmp_path, cli):
    marker = tmp_path / "MARKER"
    (tmp_path / "w.pt").write_bytes(bad_checkpoints(marker)[variant])
    proto = tiny_protocol(tmp_path, regimes=("head",), extra="pretrain: {checkpoint: w.pt}\n")
    results = tmp_path / "res" / "deeper" if nested else tmp_path / "res"
    code, out, err = cli("run", "--protocol", proto, "--results", results, *QUIET)
    assert code == 2 and "pretrain" in one_line(err), (out, err)
    assert not marker.exists() and not (tmp_path / "res").exists()


def test_a_results_folder_that_existed_is_kept(tmp_path, cli):
    (tmp_path / "w.pt").write_bytes(b"junk")
    (tmp_path / "res" / "tiny").mkdir(parents=True)
    proto = tiny_protocol(tmp_path, regimes=("head",), extra="pretrain: {checkpoint: w.pt}\n")
    code, _, err = cli("run", "--protocol", proto, "--results", tmp_path / "res", *QUIET)
    assert code == 2 and (tmp_path / "res" / "tiny").is_dir() and not list((tmp_path / "res" / "tiny").iterdir())
