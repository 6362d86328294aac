"""npz data sets are validated at load (one-line DatasetError per defect), and every data set
has a content fingerprint that is stable across processes."""
import os
import subprocess
import sys

import numpy as np
import pytest

from harness.run import datasets
from harness.run.datasets import DatasetError, dataset_fingerprint, fingerprint, load_dataset, validate_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def valid_arrays(n_classes=2, n=8, features=3, seed=0) -> dict:
    """A valid data set: n x features samples per split, every class in both splits."""
    rng = np.random.default_rng(seed)
    return {"x_train": rng.standard_normal((n, features)).astype(np.float32),
            "y_train": np.arange(n) % n_classes,
            "x_test": rng.standard_normal((n, features)).astype(np.float32),
            "y_test": np.arange(n) % n_classes}


def write(tmp_path, arrays: dict, filename="data.npz") -> str:
    """Save the arrays as an npz (np.savez pickles object arrays) and return its dataset name."""
    path = tmp_path / filename
    np.savez(path, **arrays)
    return f"npz:{path}"


def with_defect(**changes) -> dict:
    arrays = valid_arrays(n_classes=4)
    arrays.update(changes)
    return arrays


def nan_features():
    x = valid_arrays(n_classes=4)["x_test"]
    x[1, 2], x[3, 0], x[5, 1] = np.nan, np.inf, -np.inf
    return x


DEFECTS = {
    "label_out_of_range": (with_defect(y_train=np.array([0, 1, 2, 3, 0, 1, 2, 50])),
                           "classes 4, 5, 6, 7, 8 and 41 more have no samples in y_train (labels run 0..50)"),
    "negative_label": (with_defect(y_train=np.array([-1, 0, 1, 2, -1, 0, 1, 2]),
                                   y_test=np.array([-1, 0, 1, 2, -1, 0, 1, 2])),
                       "y_train has negative label -1; allowed: labels 0..C-1"),
    "float_labels": (with_defect(y_train=np.arange(8.0) % 4),
                     "y_train labels must be integers; got dtype float64; allowed: an integer dtype"),
    "string_labels": (with_defect(y_test=np.array(list("abcdabcd"))),
                      "y_test labels must be integers; got dtype <U1"),
    "bool_labels": (with_defect(y_train=np.arange(8) % 2 == 0),
                    "y_train labels must be integers; got dtype bool"),
    "object_features": (with_defect(x_train=np.array([[1, 2, 3]] * 7 + [[1, "a", None]], dtype=object)),
                        "x_train is an object array (pickled Python objects); allowed: numeric arrays"),
    "object_labels": (with_defect(y_test=np.array([0, 1, 2, 3, 0, 1, 2, None], dtype=object)),
                      "y_test is an object array (pickled Python objects); allowed: numeric arrays"),
    "string_features": (with_defect(x_train=np.full((8, 3), "1.5")),
                        "x_train features must be numeric; got dtype <U3"),
    "two_d_labels": (with_defect(y_train=(np.arange(8) % 4).reshape(8, 1)),
                     "y_train must be 1-D (one label per sample); got shape (8, 1)"),
    "one_d_features": (with_defect(x_test=np.zeros(8, dtype=np.float32)),
                       "x_test must have shape (samples, features...) with at least one feature; got shape (8,)"),
    "empty_test": (with_defect(x_test=np.zeros((0, 3), np.float32), y_test=np.zeros(0, np.int64)),
                   "x_test has no samples; allowed: a non-empty test split"),
    "empty_train": (with_defect(x_train=np.zeros((0, 3), np.float32), y_train=np.zeros(0, np.int64)),
                    "x_train has no samples; allowed: a non-empty train split"),
    "length_mismatch": (with_defect(y_train=np.arange(7) % 4),
                        "x_train has 8 samples but y_train has 7 labels; allowed: one label per sample"),
    "single_class": (with_defect(y_train=np.zeros(8, np.int64), y_test=np.zeros(8, np.int64)),
                     "only one class (label 0) in y_train and y_test; allowed: at least 2 classes"),
    "non_finite_features": (with_defect(x_test=nan_features()),
                            "x_test has 3 non-finite values (NaN or inf) of 24; allowed: finite numbers"),
    "float32_overflow": (with_defect(x_train=np.full((8, 3), 1e39)),
                         "x_train has 24 values beyond the float32 range"),
    "class_missing_in_test": (with_defect(y_test=np.array([0, 1, 0, 1, 0, 1, 0, 3])),
                              "class 2 has no samples in y_test (labels run 0..3); "
                              "allowed: every class 0..3 present in both y_train and y_test"),
    "class_missing_in_train": (with_defect(y_train=np.array([0, 2, 0, 2, 0, 2, 0, 3])),
                               "class 1 has no samples in y_train"),
    "sample_shapes_differ": (with_defect(x_test=np.zeros((8, 4), np.float32)),
                             "x_train and x_test sample shapes differ ((3,) vs (4,))"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_defect_is_one_dataset_error_line(tmp_path, defect):
    arrays, fragment = DEFECTS[defect]
    name = write(tmp_path, arrays, f"{defect}.npz")  # a distinct path: load_dataset is lru-cached
    with pytest.raises(DatasetError) as info:
        load_dataset(name)
    message = str(info.value)
    assert message.startswith(f"dataset '{name}': ")
    assert fragment in message
    assert "\n" not in message and "\r" not in message


@pytest.mark.parametrize("n_classes", [2, 4])
def test_a_valid_file_loads(tmp_path, n_classes):
    arrays = valid_arrays(n_classes)
    data = load_dataset(write(tmp_path, arrays, f"ok{n_classes}.npz"))
    assert data.n_classes == n_classes and data.input_shape == (3,)
    assert data.y_test.tolist() == arrays["y_test"].tolist()
    np.testing.assert_array_equal(data.x_train.numpy(), arrays["x_train"])


def test_narrow_and_foreign_dtypes_load_as_float32_and_int64(tmp_path):
    arrays = valid_arrays(4)
    arrays.update(x_train=arrays["x_train"].astype(">f8"), y_train=arrays["y_train"].astype(">u2"),
                  x_test=(arrays["x_test"] > 0), y_test=arrays["y_test"].astype(np.int8))
    data = load_dataset(write(tmp_path, arrays, "dtypes.npz"))
    assert str(data.x_train.dtype) == "torch.float32" and str(data.y_train.dtype) == "torch.int64"
    assert data.y_train.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert data.x_test.sum().item() == float(arrays["x_test"].sum())


def test_validate_arrays_is_pure_and_accepts_a_valid_dict():
    arrays = valid_arrays(2)
    assert validate_arrays("npz:mem", arrays) is None
    arrays["y_test"] = np.array([0] * 8)
    with pytest.raises(DatasetError, match=r"^dataset 'npz:mem': class 1 has no samples in y_test"):
        validate_arrays("npz:mem", arrays)


def test_many_missing_classes_are_summarised_not_listed(tmp_path):
    huge = np.array([0, 1, 0, 1, 0, 1, 0, 10**12])
    name = write(tmp_path, with_defect(y_train=huge, y_test=huge), "huge.npz")
    with pytest.raises(DatasetError, match=r"classes 2, 3, 4, 5, 6 and 999999999993 more have no samples"):
        load_dataset(name)


def test_existing_file_errors_keep_their_messages(tmp_path):
    with pytest.raises(DatasetError, match=r"^dataset 'npz:.*nope\.npz': file not found$"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="not a readable .npz file"):
        load_dataset(f"npz:{junk}")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(DatasetError, match="not an .npz archive of named arrays"):
        load_dataset(f"npz:{tmp_path / 'one.npy'}")


PROTOCOL = """\
name: npzbad
version: "1"
datasets: [{{name: "npz:{path}", n_tasks: 2, classes_per_task: 2, model: mlp}}]
regimes: [head]
methods: [naive]
task_orders: {{count: 1, seed: 0}}
training: {{epochs: 1, batch_size: 8}}
"""


def test_cli_reports_bad_labels_as_one_line_exit_2(tmp_path, capsys):
    from harness.cli import main

    bad = tmp_path / "bad.npz"
    np.savez(bad, **with_defect(y_train=np.array(list("abcdabcd"))))
    protocol = tmp_path / "npzbad.yaml"
    protocol.write_text(PROTOCOL.format(path=bad.resolve()))
    code = main(["run", "--protocol", str(protocol), "--results", str(tmp_path / "r"),
                 "--no-mlflow", "--no-progress", "--no-leaderboard"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "y_train labels must be integers; got dtype <U1" in err
    assert f"npz:{bad.resolve()}" in err
    assert "Traceback" not in err


def test_fingerprint_format_and_sensitivity(tmp_path):
    arrays = valid_arrays(4)
    first = fingerprint(load_dataset(write(tmp_path, arrays, "a.npz")))
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 16
    int(first[len("sha256:"):], 16)
    # The same content at another path: the same fingerprint (the name is not hashed).
    (tmp_path / "elsewhere").mkdir()
    assert fingerprint(load_dataset(write(tmp_path / "elsewhere", arrays, "b.npz"))) == first
    changed = {k: v.copy() for k, v in arrays.items()}
    changed["x_test"][2, 1] += 1.0
    assert fingerprint(load_dataset(write(tmp_path, changed, "c.npz"))) != first
    relabelled = {k: v.copy() for k, v in arrays.items()}
    relabelled["y_train"][[0, 1]] = relabelled["y_train"][[1, 0]]
    assert fingerprint(load_dataset(write(tmp_path, relabelled, "d.npz"))) != first


def test_fingerprint_hashes_shape_not_only_bytes(tmp_path):
    arrays = valid_arrays(2, n=8, features=4)
    reshaped = dict(arrays, x_train=arrays["x_train"].reshape(8, 2, 2), x_test=arrays["x_test"].reshape(8, 2, 2))
    a = fingerprint(load_dataset(write(tmp_path, arrays, "flat.npz")))
    b = fingerprint(load_dataset(write(tmp_path, reshaped, "square.npz")))
    assert a != b


def test_dataset_fingerprint_is_memoised_per_name_and_dir(tmp_path, monkeypatch):
    name = write(tmp_path, valid_arrays(2), "memo.npz")
    calls = []
    real = datasets.fingerprint
    monkeypatch.setattr(datasets, "fingerprint", lambda data: calls.append(data.name) or real(data))
    monkeypatch.setattr(datasets, "_FINGERPRINTS", {})
    value = dataset_fingerprint(name)
    assert dataset_fingerprint(name) == value == real(load_dataset(name))
    assert calls == [name]
    assert datasets._FINGERPRINTS == {(name, None): value}


def test_digits_fingerprint_is_the_same_in_two_fresh_processes():
    code = "from harness.run.datasets import dataset_fingerprint; print(dataset_fingerprint('digits'))"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outputs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=True).stdout.strip() for _ in range(2)]
    assert outputs[0] == outputs[1]
    assert outputs[0].startswith("sha256:") and len(outputs[0]) == 23
    assert outputs[0] == dataset_fingerprint("digits")
