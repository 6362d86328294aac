"""The writer of a site folder: renders pages, writes their downloadable tables, prunes stale files.

It owns only what it wrote: a manifest (.cl-bench-site.json) lists each file with the sha256 of
its bytes, and a later build deletes a listed file only while it still holds those bytes. A
non-empty folder without a manifest is someone else's: refused unless `force`. Every file goes
through config/files.py (no symbolic link followed, nothing outside the folder) and is staged
under a temp name: a build that fails (disk full) changes no file of the previous one.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import jinja2
import pandas as pd

from ...config.errors import OutputError
from ...config.files import AtomicWrites, check_links, ensure_dir, inside, safe_target, write_atomic
from ...config.text import spreadsheet_safe
from ..charts import records_of
from ..downloads import for_download


class SiteWriter:
    """Writes pages and their downloadable tables, remembers what it wrote, and prunes stale files.

    The folder may be the user's own (`--out`): only a file the previous build listed in its
    manifest, still holding the bytes that build wrote, is ever deleted. Use it as a context
    manager; leaving the block renames the staged files into place, prunes and writes the new
    manifest; an error leaves the folder as the previous build left it.

    `root`: the folder the user named (--out, or --results for the default site) with `out`
    inside it; no part of out below root may be a link. `force`: write into a non-empty folder
    that holds no site (its index.html, data/ and runs/ files are overwritten).

    The attribute `curves`: whether some run of the site has a continual-evaluation curve; without one the
    downloads leave out the any-time columns (outputs/downloads.py), as `cl-bench export` does.
    """

    MANIFEST = ".cl-bench-site.json"
    FOLDERS = ("data", "runs")

    def __init__(self, out: Path, env: jinja2.Environment, base: dict, root: Path | None = None,
                 force: bool = False):
        self.out, self.env, self.base = Path(out), env, base
        self.root = Path(self.out if root is None else root)
        self.rel = inside(self.root, self.out)
        check_links(self.root, self.rel)
        fresh = self._claim(force)
        for folder in self.FOLDERS:
            ensure_dir(self.root, self.rel / folder)
        self.pages: list[Path] = []
        self.tables: list[Path] = []
        self.written: dict[str, str] = {}  # relative POSIX path -> sha256 of the bytes written
        self.staged = AtomicWrites()
        self.previous = {} if fresh else self._read_manifest()
        self.curves = True  # build_site sets it from the analysed runs (downloads.has_curves)

    def __enter__(self) -> SiteWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:  # a failed build changes, deletes and forgets nothing: the next build prunes
            self.staged.abort()
            return False
        try:
            self.staged.commit()
        except BaseException:
            done = {self._rel_of(p) for p in self.staged.done}
            self._try_save_manifest({**self.previous, **{k: v for k, v in self.written.items() if k in done}})
            raise
        self._save_manifest({**self._prune(), **self.written})
        return False

    def _claim(self, force: bool) -> bool:
        """Make the folder a site's (True when it held none): a non-empty one without a manifest is
        refused unless `force`. The manifest is written first, so a build that fails leaves a site."""
        manifest = self.out / self.MANIFEST
        try:
            mode = os.lstat(manifest).st_mode
        except FileNotFoundError:
            mode = None
        except NotADirectoryError:
            raise OutputError(f"{self.out}: is a file, not a folder; allowed: a folder for the site") from None
        if mode is not None and stat.S_ISLNK(mode):
            raise OutputError(f"{manifest}: is a symbolic link; cl-bench does not read or write through a link "
                              "it did not create (remove it, or choose another folder)")
        if mode is not None and stat.S_ISREG(mode):
            return False
        if not force and self.out.is_dir() and any(self.out.iterdir()):
            raise OutputError(f"{self.out}: is not empty and holds no cl-bench site (no {self.MANIFEST}); its "
                              "index.html and data/ files would be overwritten; choose an empty or new folder, "
                              "or add --force")
        self._save_manifest({})
        return True

    def table(self, df: pd.DataFrame, stem: str) -> dict:
        """Write df as data/<stem>.csv and .json (without the any-time columns unless `curves`);
        return the relative links."""
        df = for_download(df, self.curves)
        links = {"csv": f"data/{stem}.csv", "json": f"data/{stem}.json"}
        self.tables.append(self._write(links["csv"], self._spreadsheet_safe(df).to_csv(index=False)))
        # The JSON keeps the raw values: it is data for programs, not a spreadsheet.
        self.tables.append(self._write(links["json"], json.dumps(records_of(df), default=str)))
        return links

    def page(self, template: str, rel: str, **ctx) -> Path:
        """Render template to out/rel (links relative to it); return its path."""
        root = "../" * rel.count("/")
        html = self.env.get_template(template).render(**self.base, root=root, **ctx)
        path = self._write(rel, html)
        self.pages.append(path)
        return path

    @staticmethod
    def _spreadsheet_safe(df: pd.DataFrame) -> pd.DataFrame:
        """A copy whose text cells cannot start a spreadsheet formula; numbers stay numbers."""
        text = df.select_dtypes(include=["object", "string"]).columns
        return df.assign(**{c: df[c].map(spreadsheet_safe) for c in text})

    def _write(self, rel: str, text: str) -> Path:
        """Stage `text` for out/rel (renamed into place when the build ends cleanly)."""
        data = text.encode("utf-8")
        self.staged.write(safe_target(self.root, self.rel / rel), data)
        self.written[rel] = hashlib.sha256(data).hexdigest()
        return self.out / rel

    def _rel_of(self, path: Path) -> str:
        return Path(path).relative_to(self.root / self.rel).as_posix()

    def _read_manifest(self) -> dict[str, str]:
        """{relative path: sha256} from the previous build; empty when missing or unreadable."""
        try:
            files = json.loads((self.out / self.MANIFEST).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        if not isinstance(files, dict):
            return {}
        return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}

    def _save_manifest(self, files: dict[str, str]) -> None:
        doc = {"about": "files written by the last cl-bench site build", "files": dict(sorted(files.items()))}
        write_atomic(safe_target(self.root, self.rel / self.MANIFEST), json.dumps(doc, indent=1) + "\n")

    def _try_save_manifest(self, files: dict[str, str]) -> None:
        try:
            self._save_manifest(files)
        except (OSError, OutputError):
            pass  # the build's own error is the one to report

    def _prune(self) -> dict[str, str]:
        """Delete the previous build's files this build did not write; return those that could not be."""
        kept = {}
        for rel, digest in self.previous.items():
            path = None if rel in self.written else self._site_file(rel, digest)
            if path is None:
                continue
            try:
                path.unlink()
            except OSError:
                kept[rel] = digest  # still ours: try again next build
        return kept

    def _site_file(self, rel: str, digest: str) -> Path | None:
        """out/rel if it is a plain file inside out that still holds what the site wrote, else None."""
        path = self.out / rel
        try:
            inside = path.resolve().is_relative_to(self.out.resolve())
            if rel == self.MANIFEST or not inside or path.is_symlink() or not path.is_file():
                return None  # a manifest can be edited by hand: never trust it to point elsewhere
            return path if hashlib.sha256(path.read_bytes()).hexdigest() == digest else None
        except (OSError, ValueError):
            return None
