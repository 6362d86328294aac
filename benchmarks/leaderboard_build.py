"""Time the leaderboard build from N seeded synthetic records (default 10,000).

python benchmarks/leaderboard_build.py [--n 10000] [--out DIR]
Prints the time for the analysis alone and for the whole site (analysis + every page).
"""
import argparse
import tempfile
import time
from pathlib import Path

from _synthetic import synthetic_records
from harness.analysis.tables import analyse
from harness.outputs.site import build_site


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000, help="number of synthetic records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="site folder (default: a temporary folder)")
    args = ap.parse_args()
    records = synthetic_records(args.n, seed=args.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    analyse(records)
    t1, c1 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        t2, c2 = time.perf_counter(), time.process_time()
        index = build_site(records, out)
        t3, c3 = time.perf_counter(), time.process_time()
        pages = sum(1 for _ in out.rglob("*.html"))
    # CPU seconds too: on a shared machine wall time says more about the neighbours than the code
    print(f"records: {args.n}  analysis: {t1 - t0:.1f} s wall / {c1 - c0:.1f} s CPU  "
          f"full site build: {t3 - t2:.1f} s wall / {c3 - c2:.1f} s CPU  pages: {pages}  ({index.name})")


if __name__ == "__main__":
    main()
