"""The data files cl-bench ships: built-in protocols, the leaderboard's templates and static files.

An installed cl-bench (a wheel, `pip install .`) holds them inside the package, in harness/builtin/
(pyproject.toml maps the top-level protocols/ and leaderboard/ folders there), found through
importlib.resources. A source tree (an editable install, or the tree on PYTHONPATH) has no
harness/builtin/: there the files are the tree's own top-level folders, next to harness/. The
shipped folder is looked up in the package actually imported, never by importing the mapped names,
so a tree on PYTHONPATH never picks up another checkout's editable install.
"""
from __future__ import annotations

from pathlib import Path

# The folder above harness/: the source tree, or site-packages when cl-bench is installed.
_ABOVE = Path(__file__).resolve().parents[2]


def source_tree() -> Path | None:
    """The source checkout harness runs from (editable install, PYTHONPATH), None when installed."""
    return _ABOVE if (_ABOVE / "pyproject.toml").is_file() and (_ABOVE / "harness").is_dir() else None


def _data(*parts: str) -> Path:
    from importlib.resources import files  # here, not at the top: it costs `cl-bench --help` ~7 ms

    # files() gives a Path for a package on disk; pip always unpacks, and jinja2 and glob need one.
    shipped = files("harness").joinpath("builtin", *parts)
    return Path(str(shipped)) if shipped.is_dir() else _ABOVE.joinpath(*parts)


def protocols_dir() -> Path:
    """The built-in protocols (`<name>.yaml`)."""
    return _data("protocols")


def templates_dir() -> Path:
    """The leaderboard's jinja2 templates."""
    return _data("leaderboard", "templates")


def static_dir() -> Path:
    """The leaderboard's static files (CSS, JS) that the site build inlines."""
    return _data("leaderboard", "static")
