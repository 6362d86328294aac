"""Which records a view shows: one protocol, one version of it, one record per cell.

Every view (the end-of-sweep summary, the site, exports, a site built from MLflow) goes
through `view_records`, so none of them mixes protocol versions, or two settings of one
cell, or two continual-evaluation settings, and each says what it left out.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import replace

from ..config.errors import SweepError
from ..config.text import terminal_safe


def version_key(version: str):
    """Total sort key of protocol versions: numeric parts numerically ("10" after "2"), then the
    string itself, so versions the parts call equal ("1" and "01", "1.0" and "1-0") still have
    one order (never the set's, which changes with PYTHONHASHSEED)."""
    parts = str(version).replace("-", ".").split(".")
    return [(0, int(p), "") if p.isascii() and p.isdigit() else (1, 0, p) for p in parts], str(version)


def view_records(records: list, version: str | None = None, grid=None, log=print) -> list:
    """The records of one protocol's view: one version (given, else the newest present), only
    run ids of `grid` when given (a set of run ids, or run id -> RunSpec: then the note on a record left out
    names the spec keys that differ), and no cell that holds several records; says what it left out."""
    say = log  # labels and names come from records: no control or bidi characters reach the terminal
    log = lambda message: say(terminal_safe(message))  # noqa: E731
    by_protocol = defaultdict(list)
    for r in records:
        by_protocol[r.spec.protocol].append(r)
    shown = []
    for name in sorted(by_protocol):
        shown += _one_protocol(name, by_protocol[name], version, grid, log)
    return shown


def _one_protocol(name: str, records: list, version, grid, log) -> list:
    versions = sorted({r.spec.protocol_version for r in records}, key=version_key)
    keep = version if version is not None else versions[-1]
    if keep not in versions:
        raise SweepError(f"--protocol-version: protocol {name!r} has no records of version {keep!r}; "
                         f"allowed: {', '.join(versions)}")
    chosen = [r for r in records if r.spec.protocol_version == keep]
    twins = [v for v in versions if v != keep and version_key(v)[0] == version_key(keep)[0]]
    if twins and version is None:
        log(f"warning: protocol {name!r} has records of versions {', '.join(sorted([keep, *twins]))}, which "
            f"number alike; version {keep} is shown (--protocol-version chooses)")
    log(f"protocol {name} version {keep}: {len(chosen)} records"
        + (f" (version(s) {', '.join(v for v in versions if v != keep)} left out: "
           f"{len(records) - len(chosen)} records; --protocol-version chooses)" if len(chosen) < len(records) else ""))
    if grid is not None:
        stale = [r for r in chosen if r.run_id not in grid]
        chosen = [r for r in chosen if r.run_id in grid]
        for line in stale_notes(stale, grid, keep):
            log(line)
    chosen = _one_curve_setting(_one_record_per_cell(chosen, keep, log), keep, log)
    _say_checks_versions(chosen, keep, log)
    return chosen


def stale_notes(stale: list, grid, version: str) -> list[str]:
    """Why records of the shown version are not in `grid` (run ids, or run id -> RunSpec): for a record whose
    cell the grid holds with another spec, the spec keys that differ (`training.lr 0.05 vs 0.1`); for the
    others, that their cells are outside the grid. Empty when nothing is left out."""
    if not stale:
        return []
    by_cell = {_spec_cell(s): s for s in grid.values()} if isinstance(grid, Mapping) else {}
    changed = [(r, by_cell[cell_of(r)]) for r in stale if cell_of(r) in by_cell]
    outside = [r for r in stale if cell_of(r) not in by_cell]
    lines = []
    if changed:
        diffs = Counter(d for r, spec in changed for d in spec_differences(r.spec.to_dict(), spec.to_dict()))
        keys = {d.split(" ", 1)[0] for d in diffs}
        shown = "; ".join(d for d, _ in diffs.most_common(4)) + ("; ..." if len(diffs) > 4 else "")
        lines.append(f"note: {len(changed)} records of version {version} have settings the protocol's grid no "
                     f"longer has (record vs grid: {shown}): {_why(keys)}; they are left out")
    if outside:
        cells = sorted({f"{r.method} on {r.dataset}/{r.spec.regime}" for r in outside})
        lines.append(f"note: {len(outside)} records of version {version} are of cells outside this grid "
                     f"({', '.join(cells[:3])}{', ...' if len(cells) > 3 else ''}: another selection of "
                     "datasets/regimes/methods/orders, or entries the protocol no longer has); they are left out")
    return lines


def _spec_cell(spec) -> tuple:
    return (spec.dataset.name, spec.regime, spec.display, spec.order, spec.seed)


def _why(keys: set) -> str:
    """What changed, from the differing spec keys: the protocol's settings, the method's code, the data."""
    reasons = []
    if keys - {"method_version", "data_fingerprint", "plugins", "protocol_version"}:
        reasons.append("the protocol's settings changed without a new version")
    if "method_version" in keys or "plugins" in keys:
        reasons.append("the method's or a plug-in's code changed")
    if "data_fingerprint" in keys:
        reasons.append("the data changed")
    return ", or ".join(reasons) or "the spec changed"


def spec_differences(record: dict, grid: dict, prefix: str = "") -> list[str]:
    """`key a vs b` for each (dotted) key whose value differs between two spec dicts, values in short JSON."""
    out = []
    for key in sorted(set(record) | set(grid), key=str):
        a, b = record.get(key, _ABSENT), grid.get(key, _ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            out += spec_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {_short(a)} vs {_short(b)}")
    return out


_ABSENT = object()


def _short(value) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _curve_setting(record) -> tuple:
    c = record.spec.continual
    return (c.every, c.subsample)


def _one_curve_setting(records: list, version: str, log) -> list:
    """One continual-evaluation setting per view: the curve is not in the run id, so records of one version
    can carry curves taken every 10 and every 20 steps only if the protocol or a record was edited. The
    setting most records carry is kept (ties: the smaller interval); the other records are shown without
    their curve (their accuracy matrix does not depend on it), and the view says so."""
    settings = Counter(_curve_setting(r) for r in records if r.curve is not None)
    if len(settings) <= 1:
        return records
    kept = min(settings, key=lambda s: (-settings[s], s))
    others = sum(n for s, n in settings.items() if s != kept)
    log(f"warning: records of version {version} carry continual-evaluation curves of {len(settings)} settings "
        f"(every, subsample: {', '.join(f'{e}, {n}' for e, n in sorted(settings))}): the protocol was edited without "
        f"a new version, or records were; the {others} curves not taken every {kept[0]} steps on {kept[1]} rows are "
        "left out (the records' other results are shown)")
    return [r if r.curve is None or _curve_setting(r) == kept else replace(r, curve=None) for r in records]


def checks_version(record) -> int:
    """The implementation of the learning checks that measured `record` (1 where the record does not say)."""
    return record.checks.get("version", 1)


def _say_checks_versions(records: list, version: str, log) -> None:
    """The learning checks are not in the run id: a view whose records were measured by two implementations
    (a probe that changed) shows both, and says so."""
    versions = Counter(checks_version(r) for r in records if r.checks)  # a lost run's record measured nothing
    if len(versions) > 1:
        log(f"note: records of version {version} were checked by {len(versions)} implementations of the learning "
            f"checks ({', '.join(f'version {v}: {n} runs' for v, n in sorted(versions.items()))}); their "
            "below-probe warnings come from different probes (harness/run/checks.py CHECKS_VERSION)")


def cell_of(record) -> tuple:
    """(dataset, regime, method, order, seed): where a record sits in the grid."""
    s = record.spec
    return (s.dataset.name, s.regime, record.method, s.order, s.seed)


def _one_record_per_cell(records: list, version: str, log) -> list:
    cells = defaultdict(list)
    for r in records:
        cells[cell_of(r)].append(r)
    clashes = [k for k, rs in cells.items() if len(rs) > 1]
    if not clashes:
        return records
    d, reg, m, o, seed = clashes[0]
    log(f"warning: {len(clashes)} cells hold several records with different settings under version {version} "
        f"(e.g. {m} on {d}/{reg}, order {o}, seed {seed}): the protocol was edited without a new version. "
        "These cells are left out rather than averaged; bump `version:` (or give entries distinct labels) and rerun")
    bad = set(clashes)
    return [r for r in records if cell_of(r) not in bad]
