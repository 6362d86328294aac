"""Files: the one content hash, the one atomic writer, and the one check that a write stays in its folder.

An atomic write goes to a temp file next to the target, then `os.replace` puts it in place:
a reader (or a process killed mid-write) sees the old file or the whole new one, never a part.
The temp file's name carries TMP_MARK, so a results folder can tell a leftover from a record.

Every writer names the folder it owns (`root`: the results folder, an --out folder, the cache)
and a path below it. `ensure_dir` and `safe_target` create or check each part of that path
without following links: cl-bench creates no symbolic links, so one found below a root was put
there by someone else (a received results folder, a shared site) and writing through it would
land outside the folder; it is refused with one line naming it (OutputError), as is a `..` or an
absolute path. The root itself is the user's choice and may be, or pass through, a link.
A write that fails (disk full) raises an OSError naming the target, and leaves no temp file.

A file cl-bench reads from a folder it writes (a lock, a record, a cache file) is read through
`open_regular`: a regular file only, never through a link, opened without blocking, so a FIFO,
device, socket or folder in its place is one line (NotRegularFile), never a hang.
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path, PurePath

from .errors import OutputError

TMP_MARK = ".tmp-"
CHUNK = 1 << 20  # checkpoints can be large: hash them in pieces
# A new temp file: never through a link (O_EXCL does not follow one, O_NOFOLLOW says so twice).
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def temp_path(path: Path) -> Path:
    """The temp file this process and thread write before renaming onto `path` (hidden, TMP_MARK)."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}.{threading.get_ident()}")


# -- staying inside a folder ----------------------------------------------------------------------
def link_error(path: str | Path) -> OutputError:
    """The one-line refusal to write through the symbolic link `path`."""
    return OutputError(f"{path}: is a symbolic link; cl-bench does not write through a link it did not "
                       "create (remove the link, or choose another folder)")


def refuse_link(path: str | Path) -> Path:
    """`path`, unless it is a symbolic link (OutputError naming it)."""
    if os.path.islink(path):
        raise link_error(path)
    return Path(path)


def relative_parts(root: str | Path, rel: str | PurePath) -> tuple[str, ...]:
    """The parts of `rel` below `root`; OutputError for an absolute path or a `..` (it would leave root)."""
    rel = PurePath(rel)
    if rel.is_absolute() or ".." in rel.parts:
        raise OutputError(f"{Path(root) / rel}: leaves the folder {root}; allowed: a path inside it")
    return rel.parts


def inside(root: str | Path, path: str | Path) -> PurePath:
    """`path` relative to `root` (both as written, not resolved); OutputError when it is not below root."""
    try:
        return PurePath(path).relative_to(PurePath(root))
    except ValueError:
        raise OutputError(f"{path}: outside the folder {root}; allowed: a path inside it") from None


def check_links(root: str | Path, rel: str | PurePath = ".") -> Path:
    """root/rel, after checking that no existing part of it below root is a link, and all but the last
    are folders (nothing is created)."""
    return _walk(Path(root), relative_parts(root, rel), create=False)


def check_tree(root: str | Path, rel: str | PurePath = ".") -> Path:
    """root/rel after `check_links`, with no link anywhere below it either (an lstat walk that follows
    nothing): for a folder another program writes into and would follow a link in (MLflow's artifacts)."""
    top = check_links(root, rel)
    for folder, dirs, names in os.walk(top):  # os.walk never descends into a link to a folder
        dirs.sort()
        for name in sorted((*dirs, *names)):
            if os.path.islink(os.path.join(folder, name)):
                raise link_error(Path(folder, name))
    return top


def ensure_dir(root: str | Path, rel: str | PurePath = ".") -> Path:
    """The folder root/rel, each missing part created without following a link, none of them a link."""
    root = Path(root)
    parts = relative_parts(root, rel)
    root.mkdir(parents=True, exist_ok=True)
    return _walk(root, parts, create=True)


def safe_target(root: str | Path, rel: str | PurePath) -> Path:
    """root/rel for a file to be written: its folders made by `ensure_dir`; the file, if any, not a link."""
    parts = relative_parts(root, rel)
    if not parts:
        raise OutputError(f"{root}: is the folder itself; allowed: a file inside it")
    return refuse_link(ensure_dir(root, PurePath(*parts[:-1]) if len(parts) > 1 else ".") / parts[-1])


def _walk(path: Path, parts: tuple[str, ...], create: bool) -> Path:
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if not create:  # nothing below a missing part can be a link
                return path.joinpath(*parts[i + 1:])
            try:
                os.mkdir(path)  # never follows a link: an existing one makes it fail
                continue
            except FileExistsError:  # made meanwhile: check what it is
                mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise link_error(path)
        if not stat.S_ISDIR(mode) and (create or i < len(parts) - 1):  # a checked path may end in a file
            raise OutputError(f"{path}: is a file, not a folder; allowed: a folder (or nothing) there")
    return path


# -- reading regular files only -------------------------------------------------------------------
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # an open of a FIFO blocks until a writer comes; this one does not
_READ_FLAGS = _NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OutputError):
    """A path cl-bench reads that is not a regular file (a FIFO, device, socket, folder) or is a link."""

    def __init__(self, path: str | Path, kind: str):
        self.path, self.kind = Path(path), kind
        super().__init__(f"{path}: is {kind}; allowed: a regular file, not reached through a link (remove it)")


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, in words: 'a regular file', 'a FIFO', 'a symbolic link', ..."""
    return "a regular file" if stat.S_ISREG(mode) else next(
        (kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_regular(path: str | Path, info: os.stat_result) -> None:
    """NotRegularFile unless `info` (a stat of `path`) is a regular file's."""
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path, file_kind(info.st_mode))


def open_regular(path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o666, follow: bool = False) -> int:
    """A file descriptor of the regular file `path` (os.open `flags`, e.g. O_CREAT), opened without
    blocking and, unless `follow`, not through a link; NotRegularFile otherwise, before a byte is
    read. Other errors (missing, no permission) are open's OSError."""
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | _READ_FLAGS | nofollow, mode)
    except OSError:  # a link (ELOOP), a socket or a FIFO without a reader (ENXIO), a folder (EISDIR): say which
        try:
            info = os.stat(path) if follow else os.lstat(path)
        except OSError:
            info = None
        if info is not None:
            check_regular(path, info)
        raise
    try:
        check_regular(path, os.fstat(fd))  # the file opened, not the one a stat saw before
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | Path, limit: int = -1, follow: bool = False) -> bytes:
    """The bytes of the regular file `path` (at most `limit` of them when it is not -1), read through
    `open_regular`."""
    with os.fdopen(open_regular(path, follow=follow), "rb") as fh:
        return fh.read(limit)


# -- atomic writes --------------------------------------------------------------------------------
def write_atomic(path: str | Path, data: str | bytes, fsync: bool = False) -> Path:
    """Write text (UTF-8) or bytes to `path` atomically; returns the path.

    `fsync` makes the file durable before the rename (records: a crash must not leave a renamed
    but empty file). A link at `path` is refused (OutputError); an OSError names `path`.
    """
    path = refuse_link(path)
    tmp = temp_path(path)
    try:
        _write_new(tmp, data, fsync)
        os.replace(tmp, path)
    except OSError as exc:
        raise naming(exc, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


class AtomicWrites:
    """Files written under temp names, then renamed into place together: a batch that fails half-way
    (disk full) leaves every target as it was and no temp file. Use as a context manager: leaving the
    block cleanly commits, an error aborts. A later write of the same path replaces the earlier one.
    """

    def __init__(self):
        self.staged: dict[Path, Path] = {}  # target -> its temp file, in write order
        self.done: list[Path] = []  # targets renamed into place

    def __enter__(self) -> AtomicWrites:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False

    def write(self, path: str | Path, data: str | bytes) -> Path:
        """Stage text (UTF-8) or bytes for `path` (not a link); returns the path."""
        path = refuse_link(path)
        tmp = temp_path(path)
        try:
            _write_new(tmp, data, fsync=False)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise naming(exc, path) from None
        self.staged.pop(path, None)
        self.staged[path] = tmp
        return path

    def commit(self) -> list[Path]:
        """Rename every staged file onto its target (in write order); returns the targets."""
        try:
            for path, tmp in self.staged.items():
                try:
                    os.replace(refuse_link(tmp), refuse_link(path))
                except OSError as exc:
                    raise naming(exc, path) from None
                self.done.append(path)
        finally:
            self.abort()
        return list(self.done)

    def abort(self) -> None:
        """Remove the temp files not yet renamed."""
        done = set(self.done)
        for path, tmp in self.staged.items():
            if path not in done:
                tmp.unlink(missing_ok=True)
        self.staged = {}


def naming(exc: OSError, path: Path) -> OSError:
    """The OSError `exc` as one naming `path` (a write error on a file descriptor names no file)."""
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return OSError(exc.errno, reason, str(path))


def _write_new(tmp: Path, data: str | bytes, fsync: bool) -> None:
    """Create `tmp` afresh (a leftover or a planted link is removed first, never followed) holding `data`."""
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, _NEW_FILE, 0o666)
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            _write_all(fh, data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            if fsync:
                os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fh, data: bytes) -> None:
    """All of `data` to the open file (its own function: the fault tests make it fail half-way)."""
    fh.write(data)

