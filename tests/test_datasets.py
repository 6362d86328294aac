"""Dataset registry: embedded data, the torchvision on-disk formats (small files written
here in the real formats), npz files, and clear errors."""
import pickle
import struct

import numpy as np
import pytest

from harness.run.datasets import DatasetError, load_dataset

N_TRAIN, N_TEST = 40, 20


def write_idx(path, array: np.ndarray):
    """Write an array in the IDX (SN3 pascalvincent) format torchvision reads."""
    code = {np.dtype("uint8"): 0x08, np.dtype(">i4"): 0x0C}[array.dtype]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(struct.pack(">BBBB", 0, 0, code, array.ndim))
        fh.write(struct.pack(f">{array.ndim}i", *array.shape))
        fh.write(array.tobytes())


def fake_images(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n).astype(np.uint8)


def write_mnist_like(root, folder):
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        x, y = fake_images(n, hash(prefix) % 100)
        write_idx(root / folder / "raw" / f"{prefix}-images-idx3-ubyte", x)
        write_idx(root / folder / "raw" / f"{prefix}-labels-idx1-ubyte", y)
    return x, y


def write_qmnist(root):
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        x, y = fake_images(n, 7)
        labels = np.zeros((n, 8), dtype=">i4")
        labels[:, 0] = y
        write_idx(root / "QMNIST" / "raw" / f"qmnist-{split}-images-idx3-ubyte", x)
        write_idx(root / "QMNIST" / "raw" / f"qmnist-{split}-labels-idx2-int", labels)
    return x, y


def write_cifar100(root):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        entry = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 "fine_labels": rng.integers(0, 100, size=n).tolist(), "coarse_labels": [0] * n}
        with open(folder / split, "wb") as fh:
            pickle.dump(entry, fh)
    return entry


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST"),
                                         ("kmnist", "KMNIST")])
def test_mnist_family_reads_the_real_idx_format(tmp_path, name, folder):
    x_test, y_test = write_mnist_like(tmp_path, folder)
    data = load_dataset(name, str(tmp_path))
    assert data.x_train.shape == (N_TRAIN, 1, 28, 28) and data.x_test.shape == (N_TEST, 1, 28, 28)
    assert data.y_test.tolist() == y_test.tolist()
    from harness.run.datasets import TORCHVISION
    _, mean, std = TORCHVISION[name]
    expected = (x_test[0].astype(np.float32) / 255.0 - mean[0]) / std[0]
    np.testing.assert_allclose(data.x_test[0, 0].numpy(), expected, rtol=1e-6)


def test_qmnist_uses_the_first_label_column(tmp_path):
    _, y = write_qmnist(tmp_path)
    data = load_dataset("qmnist", str(tmp_path))
    assert data.y_test.tolist() == y.tolist()
    assert data.x_train.shape == (N_TRAIN, 1, 28, 28)


def test_cifar100_reads_the_python_pickles(tmp_path):
    test_entry = write_cifar100(tmp_path)
    data = load_dataset("cifar100", str(tmp_path))
    assert data.x_test.shape == (N_TEST, 3, 32, 32)
    assert data.y_test.tolist() == test_entry["fine_labels"]
    # channel 0 of image 0 is the first 1024 bytes, row-major
    raw = test_entry["data"][0][:1024].reshape(32, 32).astype(np.float32) / 255.0
    np.testing.assert_allclose(data.x_test[0, 0].numpy(), (raw - 0.5071) / 0.2673, rtol=1e-5)


@pytest.mark.parametrize("name", ["mnist", "cifar100", "qmnist"])
def test_missing_torchvision_data_says_how_to_get_it(tmp_path, name):
    with pytest.raises(DatasetError, match=r"not found.*--data-dir DIR.*--download"):
        load_dataset(name, str(tmp_path / "empty"))


def test_embedded_datasets():
    digits = load_dataset("digits")
    assert digits.n_classes == 10 and digits.input_shape == (1, 8, 8)
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert abs(float(digits.x_train.mean())) < 1e-4  # standardised with training statistics
    m1d = load_dataset("mnist1d")
    assert m1d.input_shape == (40,) and len(m1d.y_train) == 4000 and len(m1d.y_test) == 1000


def test_mnist1d_is_generated_offline_and_reproducibly(tmp_path, monkeypatch):
    import harness.run.datasets as ds

    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path))
    fresh = ds._mnist1d()
    cached = ds._mnist1d()
    assert (tmp_path / "mnist1d-default.npz").exists()
    assert bool((fresh.x_train == cached.x_train).all())
    assert fresh.x_train.shape == load_dataset("mnist1d").x_train.shape


def test_npz_dataset(tmp_path):
    path = tmp_path / "mine.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((30, 5)), y_train=np.arange(30) % 3,
             x_test=rng.random((9, 5)), y_test=np.arange(9) % 3)
    data = load_dataset(f"npz:{path}")
    assert data.n_classes == 3 and data.input_shape == (5,)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((2, 2)))
    with pytest.raises(DatasetError, match=r"missing arrays \['y_train', 'x_test', 'y_test'\]"):
        load_dataset(f"npz:{bad}")


def test_unknown_dataset():
    with pytest.raises(DatasetError, match="unknown dataset 'svhn'; allowed: digits, mnist1d"):
        load_dataset("svhn")
