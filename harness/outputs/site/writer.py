"""The writer of a site folder: renders pages, writes their downloadable tables, prunes stale files.

It owns only what it wrote: a manifest (.cl-bench-site.json) lists each file with the sha256 of
its bytes, and a later build deletes a listed file only while it still holds those bytes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2
import pandas as pd

from ...config.text import spreadsheet_safe
from ..charts import records_of


class SiteWriter:
    """Writes pages and their downloadable tables, remembers what it wrote, and prunes stale files.

    The folder may be the user's own (`--out`): only a file the previous build listed in its
    manifest, still holding the bytes that build wrote, is ever deleted. Use it as a context
    manager; leaving the block prunes and writes the new manifest.
    """

    MANIFEST = ".cl-bench-site.json"

    def __init__(self, out: Path, env: jinja2.Environment, base: dict):
        self.out, self.env, self.base = out, env, base
        (out / "data").mkdir(parents=True, exist_ok=True)
        (out / "runs").mkdir(exist_ok=True)
        self.pages: list[Path] = []
        self.tables: list[Path] = []
        self.written: dict[str, str] = {}  # relative POSIX path -> sha256 of the bytes written
        self.previous = self._read_manifest()

    def __enter__(self) -> SiteWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._save_manifest({**self._prune(), **self.written})
            return False
        try:  # a failed build deletes nothing and forgets nothing: the next build prunes
            self._save_manifest({**self.previous, **self.written})
        except OSError:
            pass  # the build's own error is the one to report
        return False

    def table(self, df: pd.DataFrame, stem: str) -> dict:
        """Write df as data/<stem>.csv and .json; return the relative links."""
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
        path, data = self.out / rel, text.encode("utf-8")
        path.write_bytes(data)
        self.written[rel] = hashlib.sha256(data).hexdigest()
        return path

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
        (self.out / self.MANIFEST).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

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
