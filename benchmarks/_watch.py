"""Timing a `cl-bench run` process from outside (shared by startup.py and small_grid.py; imports no torch)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path


def first_and_total(proc: subprocess.Popen, runs: Path, t0: float) -> tuple[float | None, float]:
    """Seconds from `t0` to the first record file in `runs` (None if none appeared) and to the process's exit."""
    first = None
    while proc.poll() is None:
        if first is None and runs.is_dir() and any(p.suffix == ".json" for p in runs.iterdir()):
            first = time.perf_counter() - t0
        time.sleep(0.02)
    return first, time.perf_counter() - t0
