"""The image data sets for pretrained models (ImageNet-R, CUB-200-2011, CIFAR-100 as pixels): their real
on-disk layouts (tiny files written here), the split and resize rules checked by hand, the cache, refusals
of damaged or hostile files, and a class-IL run on uint8 pixels equal to the same run on float / 255."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import pickle
import tarfile
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

import harness.config.vocabulary as vocab
import harness.run.image_sets as image_sets
from harness.config.errors import DatasetError, DatasetMissing
from harness.run.datasets import TORCHVISION, load_dataset

# (width, height, RGB) of each image of a tiny ImageNet-R: wide, tall, square, smaller than the crop.
IMAGE_SIZES = [(300, 200), (200, 300), (256, 256), (100, 60), (64, 90), (310, 257)]
WNIDS = ("n01443537", "n01484850", "n01494475")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own; ImageNet-R and CUB with as many classes as the fixtures have."""
    monkeypatch.setenv("CL_BENCH_CACHE", str(tmp_path / "cache"))
    for name in ("imagenet-r", "cub200"):
        monkeypatch.setitem(vocab.DATASETS, name, dataclasses.replace(vocab.DATASETS[name], n_classes=len(WNIDS)))
    load_dataset.cache_clear()
    yield
    load_dataset.cache_clear()


def noise_image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), "RGB")


def write_imagenet_r(root, solid=None):
    """root/imagenet-r/<wnid>/<i>.jpg (noise JPEGs); `solid` (RGB): the first class's first image a one-colour PNG."""
    for c, wnid in enumerate(WNIDS):
        folder = root / "imagenet-r" / wnid
        folder.mkdir(parents=True)
        for i, (w, h) in enumerate(IMAGE_SIZES):
            noise_image(w, h, 10 * c + i).save(folder / f"img_{i}.jpg", quality=90)
    if solid is not None:
        (root / "imagenet-r" / WNIDS[0] / "img_0.jpg").unlink()
        Image.new("RGB", (300, 200), solid).save(root / "imagenet-r" / WNIDS[0] / "img_0.png")
    (root / "imagenet-r" / "README.txt").write_text("not a class")  # a file beside the class folders is ignored
    return root / "imagenet-r"


# CUB: (image id, class 1..3, is_train, size); the index files list the ids out of order.
CUB_IMAGES = [(1, 1, 1, (120, 80)), (2, 1, 0, (80, 120)), (3, 2, 1, (90, 90)), (4, 2, 0, (300, 200)),
              (5, 3, 1, (64, 64)), (6, 3, 0, (70, 50)), (7, 1, 1, (100, 100)), (8, 3, 1, (50, 70))]


def write_cub(root):
    folder = root / "CUB_200_2011"
    names = {1: "001.Black_footed_Albatross", 2: "002.Laysan_Albatross", 3: "003.Sooty_Albatross"}
    lines = {"images.txt": [], "image_class_labels.txt": [], "train_test_split.txt": []}
    for image_id, cls, is_train, (w, h) in CUB_IMAGES:
        rel = f"{names[cls]}/{names[cls].split('.')[1]}_{image_id:04d}.jpg"
        (folder / "images" / names[cls]).mkdir(parents=True, exist_ok=True)
        noise_image(w, h, 100 + image_id).save(folder / "images" / rel, quality=90)
        lines["images.txt"].append(f"{image_id} {rel}")
        lines["image_class_labels.txt"].append(f"{image_id} {cls}")
        lines["train_test_split.txt"].append(f"{image_id} {is_train}")
    for name, rows in lines.items():
        (folder / name).write_text("\n".join(reversed(rows)) + "\n")
    return folder


def expected_pixels(path, size, box) -> np.ndarray:
    """The stored pixels of one image, by hand: the resized size and crop box are given, not computed."""
    with Image.open(path) as img:
        out = img.convert("RGB").resize(size, Image.Resampling.BILINEAR).crop(box)
    return np.asarray(out).transpose(2, 0, 1)


# -- ImageNet-R -------------------------------------------------------------------------------------------
def test_imagenet_r_reads_its_folder_layout_with_the_split_rule(tmp_path):
    write_imagenet_r(tmp_path)
    data = load_dataset("imagenet-r", str(tmp_path))
    # 6 images a class: floor(0.2 * 6 + 0.5) = 1 to test
    assert data.x_train.shape == (15, 3, 224, 224) and data.x_test.shape == (3, 3, 224, 224)
    assert data.x_train.dtype == torch.uint8 and data.x_test.dtype == torch.uint8
    assert data.y_train.dtype == torch.int64
    assert data.y_train.tolist() == [0] * 5 + [1] * 5 + [2] * 5 and data.y_test.tolist() == [0, 1, 2]
    for c, wnid in enumerate(WNIDS):  # the test image: the lowest blake2b('<wnid>/<file>')
        ranks = {f"img_{i}.jpg": hashlib.blake2b(f"{wnid}/img_{i}.jpg".encode(), digest_size=8).digest()
                 for i in range(len(IMAGE_SIZES))}
        chosen = min(ranks, key=ranks.get)
        i = int(chosen[4])
        w, h = IMAGE_SIZES[i]
        size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
        left, top = round((size[0] - 224) / 2), round((size[1] - 224) / 2)
        expected = expected_pixels(tmp_path / "imagenet-r" / wnid / chosen, size, (left, top, left + 224, top + 224))
        assert np.array_equal(data.x_test[c].numpy(), expected)


def test_the_resize_rule_by_hand(tmp_path):
    write_imagenet_r(tmp_path)
    path = tmp_path / "imagenet-r" / WNIDS[1] / "img_0.jpg"  # 300x200: shorter side 200 -> 256, 300 -> 384
    got = image_sets.load_image("imagenet-r", path)
    assert got.shape == (3, 224, 224) and got.dtype == np.uint8
    assert np.array_equal(got, expected_pixels(path, (384, 256), (80, 16, 304, 240)))
    tall = tmp_path / "imagenet-r" / WNIDS[1] / "img_5.jpg"  # 310x257: 257 -> 256, 310 -> int(308.8) = 308
    assert np.array_equal(image_sets.load_image("imagenet-r", tall), expected_pixels(tall, (308, 256),
                                                                                     (42, 16, 266, 240)))


def test_a_one_colour_png_keeps_its_colour(tmp_path):
    write_imagenet_r(tmp_path, solid=(10, 200, 30))
    got = image_sets.load_image("imagenet-r", tmp_path / "imagenet-r" / WNIDS[0] / "img_0.png")
    assert got[:, 0, 0].tolist() == [10, 200, 30] and (got == got[:, :1, :1]).all()


def test_the_split_counts_of_the_rule():
    files = [f"{i}.jpg" for i in range(10)]
    assert len(image_sets.split_test_files("n0", files)) == 2  # floor(2.5)
    assert len(image_sets.split_test_files("n0", files[:2])) == 1  # at least 1 to test, 1 to train
    assert len(image_sets.split_test_files("n0", files[:7])) == 1  # floor(1.9)
    assert len(image_sets.split_test_files("n0", files * 5)) == math.floor(0.2 * 50 + 0.5)


def test_the_cache_gives_the_same_arrays_without_decoding(tmp_path, monkeypatch):
    write_imagenet_r(tmp_path)
    first = load_dataset("imagenet-r", str(tmp_path))
    assert list((tmp_path / "cache" / "images").glob("imagenet-r-v1-*.npz"))
    load_dataset.cache_clear()

    def no_decoding(*_):
        raise AssertionError("decoded again")

    monkeypatch.setattr(image_sets, "load_image", no_decoding)
    second = load_dataset("imagenet-r", str(tmp_path))
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, key), getattr(second, key))
    # a changed source file is a new key: decoded again (here: refused by the patched decoder)
    noise_image(50, 50, 99).save(tmp_path / "imagenet-r" / WNIDS[2] / "img_1.jpg")
    load_dataset.cache_clear()
    with pytest.raises(DatasetError, match="decoded again"):
        load_dataset("imagenet-r", str(tmp_path))


def test_a_damaged_jpeg_is_one_line_naming_it(tmp_path):
    write_imagenet_r(tmp_path)
    bad = tmp_path / "imagenet-r" / WNIDS[1] / "img_2.jpg"
    bad.write_bytes(bad.read_bytes()[:300])
    with pytest.raises(DatasetError, match=rf"{bad} cannot be decoded as an image \(.*\); allowed: an image"):
        load_dataset("imagenet-r", str(tmp_path))


def test_only_jpeg_and_png_are_decoded(tmp_path):
    """PIL would take this file for EPS, which it renders by running Ghostscript: never tried here."""
    write_imagenet_r(tmp_path)
    eps = tmp_path / "imagenet-r" / WNIDS[0] / "img_1.jpg"
    eps.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n")
    with Image.open(eps) as img:
        assert img.format == "EPS"
    with pytest.raises(DatasetError, match=rf"{eps} cannot be decoded as an image \(.*\); allowed: an image in "
                                           r"one of the formats JPEG, PNG"):
        image_sets.load_image("imagenet-r", eps)


def test_a_link_in_place_of_an_image_and_a_bomb_are_refused(tmp_path, monkeypatch):
    write_imagenet_r(tmp_path)
    link = tmp_path / "imagenet-r" / WNIDS[0] / "img_3.jpg"
    link.unlink()
    link.symlink_to(tmp_path / "imagenet-r" / WNIDS[0] / "img_2.jpg")
    with pytest.raises(DatasetError, match=rf"{link} cannot be read .*allowed: a regular image file"):
        image_sets.load_image("imagenet-r", link)
    monkeypatch.setattr(image_sets, "MAX_PIXELS", 300 * 200 - 1)
    with pytest.raises(DatasetError, match=r"claims 300x200 pixels; allowed: at most 59999"):
        image_sets.load_image("imagenet-r", tmp_path / "imagenet-r" / WNIDS[0] / "img_0.jpg")


def test_an_oversized_image_file_is_refused_unread(tmp_path, monkeypatch):
    write_imagenet_r(tmp_path)
    path = tmp_path / "imagenet-r" / WNIDS[0] / "img_0.jpg"
    monkeypatch.setattr(image_sets, "MAX_IMAGE_BYTES", path.stat().st_size - 1)
    with pytest.raises(DatasetError, match=rf"{path} is larger than 0 MiB; allowed: an image file"):
        image_sets.load_image("imagenet-r", path)
    monkeypatch.setattr(image_sets, "MAX_IMAGE_BYTES", path.stat().st_size)
    assert image_sets.load_image("imagenet-r", path).shape == (3, 224, 224)


def test_download_extracts_where_tarfile_has_no_data_filter(tmp_path, monkeypatch):
    """Python before 3.11.4 has no extraction filters: the harness's own member checks still run."""
    source = write_imagenet_r(tmp_path / "made")
    expected = load_dataset("imagenet-r", str(tmp_path / "made"))
    monkeypatch.delattr(tarfile, "data_filter")
    serve(monkeypatch, "imagenet-r", tar_of(source, "imagenet-r"))
    data = load_dataset("imagenet-r", str(tmp_path / "data"), True)
    assert torch.equal(data.x_train, expected.x_train) and torch.equal(data.y_test, expected.y_test)


def test_missing_and_incomplete_folders_say_what_is_expected(tmp_path):
    with pytest.raises(DatasetMissing, match=r"imagenet-r is missing \(layout: imagenet-r/<wnid>/<image>\.jpg.*"
                                             r"--data-dir DIR.*--download"):
        load_dataset("imagenet-r", str(tmp_path))
    with pytest.raises(DatasetMissing, match=r"CUB_200_2011 is missing \(layout: CUB_200_2011/\{images\.txt"):
        load_dataset("cub200", str(tmp_path))
    write_imagenet_r(tmp_path)
    (tmp_path / "imagenet-r" / "n09999999").mkdir()
    with pytest.raises(DatasetError, match=r"has 4 class folders; allowed: 3"):
        load_dataset("imagenet-r", str(tmp_path))


# -- CUB-200-2011 -----------------------------------------------------------------------------------------
def test_cub_reads_its_own_index_files_and_split(tmp_path):
    folder = write_cub(tmp_path)
    data = load_dataset("cub200", str(tmp_path))
    train = [r for r in CUB_IMAGES if r[2] == 1]
    test = [r for r in CUB_IMAGES if r[2] == 0]
    assert data.y_train.tolist() == [r[1] - 1 for r in train]  # image-id order, classes 1..3 -> 0..2
    assert data.y_test.tolist() == [r[1] - 1 for r in test]
    assert data.x_train.shape == (5, 3, 224, 224) and data.x_train.dtype == torch.uint8
    # image 4 (300x200) is test row 1: 200 -> 256, 300 -> 384, crop at (80, 16)
    path = folder / "images" / "002.Laysan_Albatross" / "Laysan_Albatross_0004.jpg"
    assert np.array_equal(data.x_test[1].numpy(), expected_pixels(path, (384, 256), (80, 16, 304, 240)))


def test_cub_missing_listed_file_and_escaping_path_are_one_line(tmp_path):
    folder = write_cub(tmp_path)
    gone = folder / "images" / "003.Sooty_Albatross" / "Sooty_Albatross_0006.jpg"
    gone.unlink()
    with pytest.raises(DatasetError, match=rf"{gone} listed in images\.txt cannot be read"):
        load_dataset("cub200", str(tmp_path))
    text = (folder / "images.txt").read_text().replace("003.Sooty_Albatross/Sooty_Albatross_0006.jpg",
                                                       "../../secret.jpg")
    (folder / "images.txt").write_text(text)
    with pytest.raises(DatasetError, match=r"images\.txt names '\.\./\.\./secret\.jpg'; allowed: a relative path"):
        load_dataset("cub200", str(tmp_path))
    (folder / "image_class_labels.txt").write_text("".join(f"{r[0]} {r[1]}\n" for r in CUB_IMAGES[:-1]) + "8 ²\n")
    with pytest.raises(DatasetError, match=r"image_class_labels\.txt: value '²'; allowed: 1\.\.3"):
        load_dataset("cub200", str(tmp_path))
    (folder / "train_test_split.txt").write_text("1 1\n")
    with pytest.raises(DatasetError, match=r"train_test_split\.txt does not list the image ids of images\.txt"):
        load_dataset("cub200", str(tmp_path))


# -- CIFAR-100 pixels -------------------------------------------------------------------------------------
def write_cifar100(root, n_train=48, n_test=16, classes=8):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    entries = {}
    for split, n in (("train", n_train), ("test", n_test)):
        entries[split] = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                          "fine_labels": [i % classes for i in range(n)], "coarse_labels": [0] * n}
        with open(folder / split, "wb") as fh:
            pickle.dump(entries[split], fh, protocol=2)
    return entries


def test_cifar100_pixels_are_the_cifar100_files_as_uint8(tmp_path):
    entries = write_cifar100(tmp_path)
    pixels = load_dataset("cifar100-pixels", str(tmp_path))
    assert pixels.x_train.dtype == torch.uint8 and pixels.x_train.shape == (48, 3, 32, 32)
    assert np.array_equal(pixels.x_test.numpy().reshape(16, -1), entries["test"]["data"])
    assert pixels.y_test.tolist() == entries["test"]["fine_labels"]
    floats = load_dataset("cifar100", str(tmp_path))
    assert floats.x_train.dtype == torch.float32
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in TORCHVISION["cifar100"][1:])
    # cifar100 is what it always was: (pixels / 255 - mean) / std of the same bytes, bitwise
    assert torch.equal(floats.x_train, (pixels.x_train.float() / 255.0 - mean) / std)
    assert torch.equal(floats.y_train, pixels.y_train)


# -- --download: a local archive, never the network -------------------------------------------------------
def serve(monkeypatch, name: str, archive_bytes: bytes):
    """`fetch` copies `archive_bytes`; the source's md5 is theirs."""
    def fetch(url, path):
        assert url == image_sets.SOURCES[name].url
        path.write_bytes(archive_bytes)

    monkeypatch.setattr(image_sets, "fetch", fetch)
    source = dataclasses.replace(image_sets.SOURCES[name], md5=hashlib.md5(archive_bytes).hexdigest())
    monkeypatch.setitem(image_sets.SOURCES, name, source)


def tar_of(folder, arcname: str, mode="w", extra=()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        tar.add(folder, arcname=arcname)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def test_download_extracts_the_tar_and_loads_it(tmp_path, monkeypatch):
    source = write_imagenet_r(tmp_path / "made")
    expected = load_dataset("imagenet-r", str(tmp_path / "made"))
    serve(monkeypatch, "imagenet-r", tar_of(source, "imagenet-r"))
    data = load_dataset("imagenet-r", str(tmp_path / "data"), True)
    assert (tmp_path / "data" / "imagenet-r.tar").is_file()
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(data, key), getattr(expected, key))


def test_download_of_the_cub_tgz(tmp_path, monkeypatch):
    folder = write_cub(tmp_path / "made")
    serve(monkeypatch, "cub200", tar_of(folder, "CUB_200_2011", mode="w:gz"))
    data = load_dataset("cub200", str(tmp_path / "data"), True)
    assert data.y_train.tolist() == [r[1] - 1 for r in CUB_IMAGES if r[2] == 1]


def member(name: str, kind=tarfile.REGTYPE, linkname="", data: bytes | None = b"x"):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = len(data) if kind == tarfile.REGTYPE and data is not None else 0
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("hostile,why", [
    (member("imagenet-r/../../escaped.txt"), "its path leaves the folder"),
    (member("/tmp/absolute-escape.txt"), "its path leaves the folder"),
    (member("imagenet-r/link", tarfile.SYMTYPE, "/etc/passwd"), "it is a link"),
    (member("imagenet-r/hard", tarfile.LNKTYPE, "/etc/passwd"), "it is a link"),
    (member("imagenet-r/dev", tarfile.CHRTYPE), "it is not a regular file or folder"),
    (member("imagenet-r/fifo", tarfile.FIFOTYPE), "it is not a regular file or folder"),
], ids=["dotdot", "absolute", "symlink", "hardlink", "device", "fifo"])
def test_a_hostile_archive_member_is_refused_and_nothing_extracted(hostile, why, tmp_path, monkeypatch):
    source = write_imagenet_r(tmp_path / "made")
    serve(monkeypatch, "imagenet-r", tar_of(source, "imagenet-r", extra=[hostile]))
    data = tmp_path / "deep" / "data"
    with pytest.raises(DatasetError, match=rf"imagenet-r\.tar member '{hostile[0].name}' refused: {why}"):
        load_dataset("imagenet-r", str(data), True)
    assert not (data / "imagenet-r").exists() and not (tmp_path / "escaped.txt").exists()


def test_a_wrong_md5_is_refused(tmp_path, monkeypatch):
    source = write_imagenet_r(tmp_path / "made")
    serve(monkeypatch, "imagenet-r", tar_of(source, "imagenet-r"))
    monkeypatch.setitem(image_sets.SOURCES, "imagenet-r",
                        dataclasses.replace(image_sets.SOURCES["imagenet-r"], md5="0" * 32))
    with pytest.raises(DatasetError, match=r"has md5 [0-9a-f]{32}; allowed: 0{32}"):
        load_dataset("imagenet-r", str(tmp_path / "data"), True)
    assert not list((tmp_path / "data").iterdir())


# -- through the CLI: exit 2, one line --------------------------------------------------------------------
def protocol(folder, dataset: str, model: str = "small-cnn"):
    path = folder / "p.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: pix
        version: "1"
        datasets: [{{name: {dataset}, n_tasks: 1, classes_per_task: 2, model: {model}}}]
        regimes: [head]
        methods: [naive]
        scenario: class-il
        task_orders: {{count: 1, seed: 0}}
        seeds: [0]
        training: {{optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 8}}
        """))
    return path


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("case", ["damaged-jpeg", "missing-listed", "escaping-member"])
def test_refusals_through_the_cli_exit_2_with_one_line(case, tmp_path, monkeypatch, cli):
    data = tmp_path / "data"
    if case == "damaged-jpeg":
        write_imagenet_r(data)
        bad = data / "imagenet-r" / WNIDS[0] / "img_4.jpg"
        bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
        name, expected, extra = "imagenet-r", f"{bad} cannot be decoded as an image", []
    elif case == "missing-listed":
        folder = write_cub(data)
        bad = folder / "images" / "001.Black_footed_Albatross" / "Black_footed_Albatross_0007.jpg"
        bad.unlink()
        name, expected, extra = "cub200", f"{bad} listed in images.txt cannot be read", []
    else:
        source = write_imagenet_r(tmp_path / "made")
        serve(monkeypatch, "imagenet-r", tar_of(source, "imagenet-r", extra=[member("imagenet-r/../../x")]))
        name, expected, extra = "imagenet-r", "member 'imagenet-r/../../x' refused", ["--download"]
    dry = [] if extra else ["--dry-run"]  # a dry run downloads nothing
    code, out, err = cli("run", "--protocol", protocol(tmp_path, name), "--data-dir", data, "--results",
                         tmp_path / "res", "--no-progress", "--no-mlflow", "--no-leaderboard", *dry, *extra)
    assert code == 2, (out, err)
    assert expected in one_line(err)
    assert not (tmp_path / "res").exists()


# -- a run on uint8 pixels equals the run on float / 255 --------------------------------------------------
def float_copy(data):
    """The data set as float32 / 255: what CLNet computes from the uint8 pixels on the device."""
    return dataclasses.replace(data, x_train=data.x_train.float() / 255.0, x_test=data.x_test.float() / 255.0)


def comparable(record) -> dict:
    out = json.loads(json.dumps(record.to_dict()))
    for key in ("run_id", "timings", "provenance"):
        out.pop(key, None)
    compute = out["budget"].get("compute") or {}
    for key in [k for k in compute if "memory" in k or k.endswith("_s")]:  # measured peak memory, seconds
        compute.pop(key)
    return out


def differences(a, b, at="") -> list[str]:
    """The paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    return [] if a == b else [f"{at}: {str(a)[:200]} != {str(b)[:200]}"]


@pytest.mark.parametrize("method,regime,extra", [
    ("naive", "last-1", {}),  # the frozen-prefix cache (training and evaluation) on uint8 input
    ("replay", "full", {"hparams": {"mem_size": 20}}),
    ("derpp", "full", {}),
    ("naive", "full", {"pretrain": {"dataset": "same", "holdout": 0.25, "epochs": 1}}),
    ("naive", "full", {"continual": (2, 8)}),
], ids=["prefix-cache", "replay", "derpp", "pretrain-holdout", "continual"])
def test_a_class_il_run_on_pixels_equals_the_run_on_float(method, regime, extra, tmp_path, monkeypatch):
    from conftest import make_spec

    import harness.run.engine as engine
    import harness.run.pretrain as pretrain
    from harness.config.pretrain import parse_pretrain
    from harness.config.specs import ContinualSpec, DatasetSpec

    write_cifar100(tmp_path, n_train=96, n_test=32, classes=4)
    pixels = load_dataset("cifar100-pixels", str(tmp_path))
    kw = dict(extra)
    if "pretrain" in kw:
        kw["pretrain"] = parse_pretrain(kw["pretrain"], "p.yaml", tmp_path).for_dataset("cifar100-pixels")
    else:
        kw["pretrain"] = "none"
    if "continual" in kw:
        kw["continual"] = ContinualSpec(*kw["continual"])
    spec = make_spec(dataset=DatasetSpec("cifar100-pixels", 2, 2, "small-cnn"), scenario="class-il", method=method,
                     regime=regime, class_order=(2, 0, 3, 1), training=dataclasses.replace(
                         make_spec().training, epochs=1, batch_size=16), **kw)
    records = []
    for data in (pixels, float_copy(pixels)):
        monkeypatch.setattr(engine, "load_dataset", lambda *_a, _d=data, **_k: _d)
        monkeypatch.setattr(pretrain, "load_dataset", lambda *_a, _d=data, **_k: _d)
        # each its own pretrained backbone (the cache is keyed by the data's fingerprint)
        monkeypatch.setattr(pretrain, "dataset_fingerprint", lambda *_a, _d=data, **_k: f"sha256:{_d.x_train.dtype}")
        record = engine.run_one(spec, data_dir=str(tmp_path), device="cpu")
        assert record.status == vocab.Status.OK, record.error
        records.append(comparable(record))
    pixel_bytes, float_bytes = (r["budget"].pop("memory_bytes", None) for r in records)
    if pixel_bytes is not None:  # a stored row of pixels takes 3 * 32 * 32 bytes, of floats 4 times as many
        samples = records[0]["budget"]["memory_samples"]
        assert [f - p for f, p in zip(float_bytes, pixel_bytes)] == [3 * 3 * 32 * 32 * n for n in samples]
        assert samples[-1] > 0
    assert differences(records[0], records[1]) == []
    assert records[0]["acc_matrix"][1][0] is not None
    if regime == "last-1":  # the frozen-prefix cache served the pixel run's training (its passes are counted)
        assert records[0]["budget"]["compute"]["prefix_samples"] > 0


def test_pretraining_on_float_features_for_a_pixel_stream_is_refused(tmp_path):
    from conftest import make_spec

    from harness.config.errors import PretrainError
    from harness.config.pretrain import parse_pretrain
    from harness.config.specs import DatasetSpec
    from harness.run.pretrain import pretrained_backbone

    write_cifar100(tmp_path)
    spec = make_spec(dataset=DatasetSpec("cifar100-pixels", 2, 2, "small-cnn"), scenario="class-il",
                     pretrain=parse_pretrain({"dataset": "cifar100", "epochs": 1}, "p.yaml", tmp_path))
    with pytest.raises(PretrainError, match=r"'cifar100' holds float32 features, but the stream 'cifar100-pixels' "
                                            r"holds uint8 pixels; allowed: a data set held the same way"):
        pretrained_backbone(spec, (3, 32, 32), data_dir=str(tmp_path))


@pytest.mark.parametrize("regime", ["full", "last-1"])
def test_vit_tiny_takes_the_pixels_itself(regime, tmp_path, monkeypatch):
    """A backbone whose first block `takes_pixels` (a ViT's input stage) gets the uint8 tensor as it is: the run
    equals the run on a float copy normalised as that stage does ((x / 255 - mean) / std), not on x / 255."""
    from conftest import make_spec

    import harness.run.engine as engine
    from harness.config.specs import DatasetSpec
    from harness.run.models import build_model

    write_cifar100(tmp_path, n_train=64, n_test=16, classes=4)
    pixels = load_dataset("cifar100-pixels", str(tmp_path))
    stage = build_model("vit-tiny", (3, 32, 32), 1, 4).blocks["embed"].input
    assert build_model("vit-tiny", (3, 32, 32), 1, 4).pixels(pixels.x_test).dtype == torch.uint8  # left to it
    normalised = dataclasses.replace(pixels, x_train=(pixels.x_train.float() / 255.0 - stage.mean) / stage.std,
                                     x_test=(pixels.x_test.float() / 255.0 - stage.mean) / stage.std)
    spec = make_spec(dataset=DatasetSpec("cifar100-pixels", 2, 2, "vit-tiny"), scenario="class-il", method="naive",
                     regime=regime, class_order=(2, 0, 3, 1), pretrain="first-task",
                     training=dataclasses.replace(make_spec().training, epochs=1, batch_size=16))
    records = []
    for data in (pixels, normalised):
        monkeypatch.setattr(engine, "load_dataset", lambda *_a, _d=data, **_k: _d)
        record = engine.run_one(spec, data_dir=str(tmp_path), device="cpu")
        assert record.status == vocab.Status.OK, record.error
        records.append(comparable(record))
    assert differences(records[0], records[1]) == []


def test_a_cli_run_on_imagenet_r_files_finishes_ok(tmp_path, cli):
    write_imagenet_r(tmp_path / "data")
    code, out, err = cli("run", "--protocol", protocol(tmp_path, "imagenet-r"), "--data-dir", tmp_path / "data",
                         "--results", tmp_path / "res", "--no-progress", "--no-mlflow", "--no-leaderboard",
                         "--device", "cpu")
    assert code == 0, (out, err)
    [path] = (tmp_path / "res" / "pix" / "runs").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["spec"]["dataset"]["name"] == "imagenet-r"
    # the data's fingerprint: sha256 over each tensor's dtype, shape and bytes (uint8 pixels)
    data = load_dataset("imagenet-r", str(tmp_path / "data"))
    h = hashlib.sha256()
    for key in ("x_train", "y_train", "x_test", "y_test"):
        tensor = getattr(data, key)
        h.update(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode() + tensor.numpy().tobytes())
    assert record["spec"]["data_fingerprint"] == "sha256:" + h.hexdigest()[:16]
