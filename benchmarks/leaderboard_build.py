"""Time the leaderboard build from N seeded synthetic records (default 10,000).

python benchmarks/leaderboard_build.py [--n 10000] [--out DIR]
Prints the time for the analysis alone and for the whole site (analysis + every page).
"""
import argparse
import tempfile
import time
from pathlib import Path

from harness.analysis.synthetic import synthetic_records
from harness.analysis.tables import analyse
from harness.site import build_site


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000, help="number of synthetic records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="site folder (default: a temporary folder)")
    args = ap.parse_args()
    records = synthetic_records(args.n, seed=args.seed)
    t0 = time.perf_counter()
    analyse(records)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        t2 = time.perf_counter()
        index = build_site(records, out)
        t3 = time.perf_counter()
        pages = sum(1 for _ in out.rglob("*.html"))
    print(f"records: {args.n}  analysis: {t1 - t0:.1f} s  full site build: {t3 - t2:.1f} s  "
          f"pages: {pages}  ({index.name})")


if __name__ == "__main__":
    main()
