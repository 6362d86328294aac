"""The records store: results layout, atomic JSON writes, records verified and parsed on read."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..config.specs import SCHEMA_VERSION, RunRecord, spec_hash
from ..config.vocabulary import STATUSES

RECORD_KEYS = frozenset(f.name for f in fields(RunRecord))
TMP_MARK = ".tmp-"


def protocol_dir(results: str | Path, protocol_name: str) -> Path:
    """`<results>/<protocol>/`: everything a protocol's sweep writes."""
    return Path(results) / protocol_name


def runs_dir(results: str | Path, protocol_name: str) -> Path:
    """`<results>/<protocol>/runs/`: one `<run_id>.json` per finished run."""
    return protocol_dir(results, protocol_name) / "runs"


def write_record(folder: str | Path, record: RunRecord) -> Path:
    """Write a record atomically (temp file in the same folder, fsync, rename)."""
    data = record.to_dict()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{data['run_id']}.json"
    tmp = folder / f".{data['run_id']}.json{TMP_MARK}{os.getpid()}"
    payload = json.dumps(data, indent=1, sort_keys=True, allow_nan=True)
    try:
        with open(tmp, "w") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return final


def validate_record(data, expected_run_id: str | None = None) -> str | None:
    """None if the record is valid, else the reason it is not."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version {data.get('schema_version')!r}, this harness reads {SCHEMA_VERSION}"
    keys = set(data)
    if keys != RECORD_KEYS:
        missing, extra = sorted(RECORD_KEYS - keys), sorted(keys - RECORD_KEYS)
        return f"keys differ from the schema (missing {missing}, unexpected {extra})"
    if data["status"] not in STATUSES:
        return f"status {data['status']!r} is not one of {', '.join(STATUSES)}"
    if not isinstance(data["spec"], dict) or spec_hash(data["spec"]) != data["run_id"]:
        return "its spec does not hash to its run_id (edited or foreign record)"
    if expected_run_id is not None and data["run_id"] != expected_run_id:
        return f"file name says {expected_run_id} but the record's run_id is {data['run_id']}"
    return None


def parse_record(data, expected_run_id: str | None = None) -> tuple[RunRecord | None, str | None]:
    """(record, None) for a valid record's JSON form, (None, reason) otherwise."""
    problem = validate_record(data, expected_run_id)
    if problem:
        return None, problem
    try:
        return RunRecord.from_dict(data), None
    except (TypeError, ValueError, KeyError) as exc:
        return None, f"its spec does not have the schema's shape ({exc})"


def read_record(path: str | Path) -> tuple[RunRecord | None, str | None]:
    """(record, None) for a valid record file, (None, reason) otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable: {exc}"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON (truncated?): {exc.msg} at line {exc.lineno}"
    return parse_record(data, expected_run_id=path.stem)


@dataclass
class Scan:
    """What a runs folder holds: valid records, invalid files with reasons, stray temp files."""

    valid: dict = field(default_factory=dict)
    invalid: list = field(default_factory=list)
    stray: list = field(default_factory=list)


def scan_runs(folder: str | Path) -> Scan:
    """Read every record file of a runs folder; nothing is skipped silently."""
    scan = Scan()
    folder = Path(folder)
    if not folder.is_dir():
        return scan
    for path in sorted(folder.iterdir()):
        if TMP_MARK in path.name:
            scan.stray.append(path)
        elif path.suffix == ".json":
            record, problem = read_record(path)
            if problem:
                scan.invalid.append((path, problem))
            else:
                scan.valid[record.run_id] = record
    return scan


def discover_protocol_dirs(results: str | Path) -> list[Path]:
    """Protocol folders under a results folder (those with a runs/ subfolder)."""
    results = Path(results)
    if (results / "runs").is_dir():
        return [results]
    return sorted(p for p in results.iterdir() if (p / "runs").is_dir()) if results.is_dir() else []


def load_records(results: str | Path, protocol_name: str | None = None) -> list[RunRecord]:
    """Valid records under `<results>/<protocol>/runs` (all protocols if none is named)."""
    folders = [runs_dir(results, protocol_name)] if protocol_name else \
        [p / "runs" for p in discover_protocol_dirs(results)]
    records = []
    for folder in folders:
        records.extend(scan_runs(folder).valid.values())
    return records


def _version_key(version: str):
    parts = str(version).replace("-", ".").split(".")
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts]


def current_records(records: list, version: str | None = None, log=print) -> list:
    """The records of one protocol version (given, else the newest present).

    Records of other versions are left out with a note, and cells that hold two records
    with different hyperparameters under the same method name (a protocol edited without a
    version bump) are reported, so nothing is mixed silently.
    """
    versions = sorted({r.spec.protocol_version for r in records}, key=_version_key)
    if not versions:
        return []
    keep = version if version is not None else versions[-1]
    chosen = [r for r in records if r.spec.protocol_version == keep]
    if len(chosen) < len(records):
        log(f"note: showing protocol version {keep}; {len(records) - len(chosen)} records of "
            f"version(s) {', '.join(v for v in versions if v != keep)} are left out")
    _report_conflicting_cells(chosen, log)
    return chosen


def _report_conflicting_cells(records: list, log) -> None:
    cells: dict = {}
    for r in records:
        key = (r.dataset, r.spec.regime, r.method, r.spec.order, r.spec.seed)
        cells.setdefault(key, set()).add(r.run_id)
    clashes = [k for k, ids in cells.items() if len(ids) > 1]
    if clashes:
        d, reg, m, o, seed = clashes[0]
        log(f"warning: {len(clashes)} cells hold several records with different settings under one "
            f"method name (e.g. {m} on {d}/{reg}, order {o}, seed {seed}); the protocol was edited "
            "without a new version — bump `version:` or give entries distinct labels")
