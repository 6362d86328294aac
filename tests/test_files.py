"""config/files.py: the one file hash and the one atomic writer."""
from __future__ import annotations

import errno
import hashlib
import os

import pytest

from harness.config import files
from harness.config.files import TMP_MARK, file_sha256, write_atomic


def test_file_sha256_is_the_sha256_of_the_bytes_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CHUNK", 7)  # many chunks, the last one short
    data = bytes(range(256)) * 3
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(path)) == hashlib.sha256(data).hexdigest()


def test_write_atomic_writes_text_as_utf8_and_bytes_as_given(tmp_path):
    assert write_atomic(tmp_path / "t.txt", "α\n") == tmp_path / "t.txt"
    assert (tmp_path / "t.txt").read_bytes() == "α\n".encode()
    write_atomic(tmp_path / "b.bin", b"\x00\xff")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "t.txt"]  # no temp file left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path, seen = tmp_path / "r.json", []
    path.write_text("old")

    def half(fh, data):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        fh.write(data[:2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_write_all", half)
    with pytest.raises(OSError, match="r.json"):
        write_atomic(path, "new content")
    [[tmp, _]] = seen  # the temp file, beside the old one while it is written
    assert TMP_MARK in tmp and tmp.startswith(".")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_fsync_happens_on_the_temp_file_before_the_rename(tmp_path, monkeypatch):
    path, seen = tmp_path / "r.json", []
    real = os.fsync

    def spy(fd):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_atomic(path, "{}", fsync=True)
    [names] = seen
    assert len(names) == 1 and TMP_MARK in names[0]  # durable before it takes the record's name
    write_atomic(path, "{}")
    assert len(seen) == 1  # no fsync unless asked
