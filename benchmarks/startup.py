"""Start-up time of `cl-bench --help` and `cl-bench list` (target: at most 1 s each).

python benchmarks/startup.py [--repeats 5]

Each command runs as a fresh process, interleaved with a bare `python -c pass` (the
floor) and with the old way of listing methods (importing every adapter through the
registry, i.e. torch and Avalanche), so a busy machine slows all of them alike. Also says
whether the shipped built-in method index (harness/methods/_index.json) is fresh; when it
is not, the first `list` imports the methods once and caches their metadata per user.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "harness.cli"]
COMMANDS = {
    "python -c pass": [PY, "-c", "pass"],
    "cl-bench --help": [*CLI, "--help"],
    "cl-bench list": [*CLI, "list"],
    "cl-bench list methods": [*CLI, "list", "methods"],
    "old: import every adapter": [PY, "-c", "from harness.methods.registry import get_registry; get_registry()"],
}


def _runner(argv):
    def run():
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from harness.methods import index as method_index

    fresh = _index_is_fresh(method_index)
    print(f"built-in method index fresh: {fresh}; {C.load_avg()}")
    result = C.side_by_side({k: _runner(v) for k, v in COMMANDS.items()}, repeats=args.repeats)
    floor = result["python -c pass"][0]
    for name, (wall, _, spread) in result.items():
        print(f"{name:<28} {wall:6.2f} s wall (median of {args.repeats}, spread {spread:.0%})   "
              f"{wall / floor:6.1f}x bare python")
    print(f"done; {C.load_avg()}")


def _index_is_fresh(method_index) -> bool:
    import json

    try:
        return json.loads(method_index.INDEX_PATH.read_text())["fingerprint"] == method_index.builtin_fingerprint()
    except (OSError, ValueError, KeyError):
        return False


if __name__ == "__main__":
    main()
