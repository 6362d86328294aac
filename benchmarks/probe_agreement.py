"""Two sweeps' probes and below-probe flags, task by task: what a change of the checks' probe changed.

python benchmarks/probe_agreement.py BEFORE AFTER

BEFORE and AFTER: results folders of the same protocol (e.g. the demo's depth-sweep-mini under checks
version 1 and version 2). Records are matched by (protocol, dataset, regime, method label, order,
seed); their accuracy matrices must be equal (the probe measures, it does not train), else the pair
is counted and left out. Prints the mean, mean absolute and largest absolute difference of the probe
accuracy per data set and overall, each warning that appears or disappears with the learned
accuracy and both probes, and the warnings per code before and after. Reads the records' JSON only.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path


def load(folder: Path) -> dict:
    """(protocol, dataset, regime, label, order, seed) -> record JSON, for every record under `folder`."""
    out = {}
    for path in sorted(folder.glob("**/runs/*.json")):
        r = json.loads(path.read_text())
        s = r["spec"]
        out[(s["protocol"], s["dataset"]["name"], s["regime"], s["label"] or s["method"], s["order"], s["seed"])] = r
    return out


def learned(r: dict, t: int) -> float:
    """What the checks judge task t by (checks.py _learned): the judged diagonal, or the better of it and
    the trained model's accuracy."""
    judged = r["acc_matrix_task_aware"] if r["spec"]["scenario"] == "class-il" else r["acc_matrix"]
    trained = (r["checks"].get("trained_acc") or [None] * (t + 1))[t]
    return judged[t][t] if trained is None else max(trained, judged[t][t])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    a, b = load(args.before), load(args.after)
    common = sorted(set(a) & set(b))
    diffs, changed, acc_differs = {}, [], 0
    codes = {"before": Counter(), "after": Counter()}
    versions = {"before": Counter(), "after": Counter()}
    for key in common:
        ra, rb = a[key], b[key]
        if ra["acc_matrix"] != rb["acc_matrix"] or ra.get("acc_matrix_task_aware") != rb.get("acc_matrix_task_aware"):
            acc_differs += 1
            continue
        for side, r in (("before", ra), ("after", rb)):
            codes[side].update(w["code"] for w in r["warnings"])
            versions[side][r["checks"].get("version", 1)] += 1
        for pa, pb in zip(ra["checks"]["probe_acc"], rb["checks"]["probe_acc"]):
            if pa is not None and pb is not None:
                diffs.setdefault(key[1], []).append(pb - pa)
        wa = {(w["code"], w["task"]) for w in ra["warnings"]}
        wb = {(w["code"], w["task"]) for w in rb["warnings"]}
        for code, t in sorted(wa ^ wb):
            what = "gained" if (code, t) in wb else "lost"
            changed.append(f"  {what:<6} {code} task {t + 1} {key[1:]}: learned {learned(ra, t):.4f}, probe "
                           f"{ra['checks']['probe_acc'][t]:.4f} -> {rb['checks']['probe_acc'][t]:.4f}")
    print(f"{len(common)} records in both ({len(a)} before, {len(b)} after); accuracy matrices differ in "
          f"{acc_differs}; checks versions before {dict(versions['before'])}, after {dict(versions['after'])}")
    everything = [d for ds in diffs.values() for d in ds]
    for name, ds in sorted(diffs.items()) + [("all", everything)]:
        if ds:
            print(f"  probe after - before, {name:<8} {len(ds):5d} tasks: mean {statistics.mean(ds):+.4f}, "
                  f"mean |d| {statistics.mean(abs(d) for d in ds):.4f}, max |d| {max(abs(d) for d in ds):.4f}, "
                  f"equal {sum(d == 0 for d in ds) / len(ds):.0%}")
    print(f"warnings before {dict(codes['before'])}, after {dict(codes['after'])}; {len(changed)} changed:")
    print("\n".join(changed))


if __name__ == "__main__":
    main()
