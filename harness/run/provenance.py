"""Where a record came from: package versions, git SHA, device, host."""
from __future__ import annotations

import platform
import socket
import subprocess
from functools import lru_cache

from ..config.resources import source_tree


@lru_cache(maxsize=1)
def package_versions() -> dict:
    """Versions of the packages that decide a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "torchvision", "avalanche-lib", "peft", "numpy", "cl-bench"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    """SHA of the checkout the harness runs from (with '+dirty' if modified), else None (installed)."""
    root = source_tree()
    if root is None:  # an installed package: git would report whatever repository holds site-packages
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("+dirty" if dirty else "")) or None


def provenance(device: str) -> dict:
    """Provenance block of a record."""
    return {"versions": package_versions(), "git_sha": git_sha(), "device": device,
            "hostname": socket.gethostname(), "platform": platform.platform()}
