"""Rerunning one record (`cl-bench reproduce`) and the command the site shows for it.

The rerun takes the record's own spec — method implementation and data fingerprint
included, so the engine refuses a changed method file or changed data — runs it in a
temporary folder, and compares the new record with the stored one.

A record is data from whoever made the results folder: its code comes only from what the user
names (`--method FILE`, `--plugin FILE`), an installed entry point or a built-in — not the
submissions folder of the current directory, which the user did not name for this record — and a
named file must hash to an implementation the record states (which its run id covers): the loader
checks the very bytes it is about to run (registry.code_scope). The paths a record writes in its
provenance are shown as hints, never imported.
"""
from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import SweepError
from ..config.specs import RunRecord
from ..config.vocabulary import Status
from .store import discover_protocol_dirs, read_record, write_record

# What a rerun must reproduce; timings and provenance (host, time) may differ.
COMPARED = ("status", "acc_matrix", "init_acc", "metrics", "acc_matrix_task_aware", "init_acc_task_aware",
            "metrics_task_aware", "update_norms", "diagnostics", "params", "regime_depth", "n_blocks", "budget")
EXACT = ("budget",)  # counts (steps, samples, passes, FLOPs): no tolerance makes a different count reproduced
METRIC_TOLERANCE = 1e-6
_RUN_ID = re.compile(r"^[0-9a-f]{12}$")


def reproduce_command(run_id: str, results: str | None = None, record: RunRecord | None = None) -> str:
    """The shell-quoted command that reruns one record in a temporary folder and compares it; for a
    record made with method or plug-in files, `--method`/`--plugin` name each file as the user would
    pass it: its base name, `submissions/NAME.py` for the submissions folder's (the user points them
    at their copy: a path written in a record is never a path to run). Built-ins and entry points
    need no flag."""
    cmd = ["cl-bench", "reproduce", run_id]
    if results:
        cmd += ["--results", str(results)]
    return shlex.join(cmd + list(_code_flags(record)))


def sweep_command(sweep, results: str, protocol_name: str, records=()) -> str | None:
    """The shell-quoted `cl-bench run`/`submit` command a record's `provenance["sweep"]` states: the protocol
    copy in the results folder (protocol_files.py), the filters given, `--method FILE` for each method file of
    `records` (the sweep's records), the submitted file by its base name. None for an entry that is not one
    cl-bench writes (a record is data: every value is checked before it is shown)."""
    from ..config.vocabulary import is_valid_name
    from .protocol_files import COPY_PATTERN

    if not isinstance(sweep, dict) or sweep.get("command") not in ("run", "submit") or not is_valid_name(protocol_name):
        return None
    copy = sweep.get("protocol_file")
    if not isinstance(copy, str) or not COPY_PATTERN.match(copy):
        return None
    cmd = ["cl-bench", sweep["command"]]
    if sweep["command"] == "submit":
        cmd.append(_file_name(sweep.get("method_file")))
    cmd += ["--protocol", str(Path(results) / protocol_name / copy), "--results", str(results)]
    for key in ("datasets", "regimes", "methods"):
        names = sweep.get(key)
        if names is None:
            continue
        if not (isinstance(names, list) and names and all(isinstance(n, str) and _filter_name(n) for n in names)):
            return None  # a command without this filter would run a larger grid than the one that ran
        cmd += [f"--{key}", ",".join(names)]
    orders = sweep.get("orders")
    if orders is not None:
        if not (isinstance(orders, int) and not isinstance(orders, bool) and orders > 0):
            return None  # as for a filter it cannot state: the command would run another grid
        cmd += ["--orders", str(orders)]
    only = sweep.get("only")
    if only is not None:
        if not (isinstance(only, list) and only and all(isinstance(i, str) and _RUN_ID.match(i) for i in only)):
            return None
        cmd += ["--only", ",".join(only)]
    if sweep.get("baselines") is False and sweep["command"] == "submit":
        cmd.append("--no-baselines")
    own = _file_name(sweep.get("method_file")) if sweep["command"] == "submit" else None
    flags = dict.fromkeys(pair for r in records for pair in zip(*[iter(_code_flags(r))] * 2) if pair[1] != own)
    return shlex.join(cmd + [x for pair in flags for x in pair])


def _filter_name(name: str) -> bool:
    """A name a filter may hold: the name rule, or an npz data set's `npz:PATH` (quoted by shlex like the rest)."""
    from ..config.vocabulary import is_valid_name

    return is_valid_name(name) or (name.startswith("npz:") and "," not in name and name.isprintable())


def sweep_commands(records, results: str) -> list[str]:
    """The distinct `run`/`submit` commands that made `records` (each from its `provenance["sweep"]`, with the
    method files of the records it made): the `run`s first (submissions rank against what they made), each
    kind in the order of its first record; records without one are left out (the caller shows its fallback)."""
    groups: dict[str, list] = {}
    for r in records:
        entry = (r.provenance or {}).get("sweep")
        if isinstance(entry, dict):
            groups.setdefault(json.dumps([r.spec.protocol, entry], sort_keys=True, default=str), []).append(r)
    out = []
    for rs in sorted(groups.values(), key=lambda rs: rs[0].provenance["sweep"].get("command") != "run"):
        cmd = sweep_command(rs[0].provenance["sweep"], results, rs[0].spec.protocol, rs)
        if cmd and cmd not in out:
            out.append(cmd)
    return out


def _code_flags(record: RunRecord | None):
    """(`--method`, FILE) and (`--plugin`, FILE) for each file implementation the record needs, each file once."""
    if record is None:
        return
    spec = record.spec
    needed = [("--method", spec.method_version, _written(record.provenance, "method", "source"))]
    needed += [("--plugin", version, _written(record.provenance, "plugins", key, "source"))
               for key, version in spec.plugins.items()]
    given = set()
    for flag, version, source in needed:
        digest = _digest(version)
        if digest and _is_file_source(source) and digest not in given:  # one file may hold method and plug-ins
            given.add(digest)
            yield from (flag, _file_name(source))


def _is_file_source(source) -> bool:
    """Whether a record's source names a file (a path) rather than a built-in or an installed entry point."""
    return not (isinstance(source, str) and (source == "built-in" or source.startswith(ENTRY_POINT_SOURCE)))


ENTRY_POINT_SOURCE = "entry point "  # how the registry writes an entry point's source
SUBMISSIONS_FOLDER = "submissions"  # the default submissions folder, relative to where cl-bench runs


def _file_name(source) -> str:
    """The file as the user passes it: its base name, under `submissions/` for a submissions-folder file."""
    path = Path(source) if isinstance(source, str) else Path()
    name = path.name
    if not re.fullmatch(r"[\w.-]{1,80}\.py", name):
        return "FILE.py"
    return f"{SUBMISSIONS_FOLDER}/{name}" if path.parent.name == SUBMISSIONS_FOLDER else name


@dataclass(frozen=True)
class Reproduction:
    """A record, its rerun, and how they compare: `bitwise`, `metrics` (within tolerance) or `differs`."""

    record: RunRecord
    path: Path
    rerun: RunRecord
    rerun_path: Path | None
    verdict: str
    differences: tuple[str, ...]
    max_delta: float
    seconds: float

    @property
    def reproduced(self) -> bool:
        """Whether the rerun equals the record, bitwise or in its metrics within tolerance."""
        return self.verdict in ("bitwise", "metrics")


def find_record(run_id: str, results) -> tuple[RunRecord, Path]:
    """The valid record `run_id` under a results folder (any protocol); a SweepError otherwise."""
    if not _RUN_ID.match(run_id):
        raise SweepError(f"RUN_ID: {run_id!r} is not a run id; allowed: 12 hex digits (a record's file name)")
    folders = discover_protocol_dirs(results)
    for folder in folders:
        path = folder / "runs" / f"{run_id}.json"
        if path.exists() or path.is_symlink():
            record, problem = read_record(path, folder.name)
            if problem:
                raise SweepError(f"{path}: is {problem.kind} ({problem.reason}); it cannot be reproduced")
            return record, path
    where = ", ".join(str(f / "runs") for f in folders) or f"{results} (no <protocol>/runs/ folders)"
    raise SweepError(f"RUN_ID: no record {run_id} under {where}")


def code_files(record: RunRecord, method_files=(), plugin_files=()) -> tuple[str, ...]:
    """The method and plug-in files the rerun registers: only those the user named (no submissions
    folder), each refused unless the bytes about to run hash to code the record was made with. A record
    is data: the paths it names are shown as a hint, never imported."""
    from ..api.plugins import implementations
    from ..api.registry import code_scope, get_registry

    spec = record.spec
    files = tuple(dict.fromkeys(map(str, (*method_files, *plugin_files))))
    with code_scope(rerun_scope(record)):
        adapter = get_registry(files).get(spec.method)
    if adapter is None or adapter.implementation != spec.method_version:
        raise SweepError(_method_missing(record, adapter))
    found = implementations(spec.dataset.model, spec.dataset.name, spec.regime)
    missing = {key: version for key, version in spec.plugins.items() if found.get(key) != version}
    if missing:
        raise SweepError(_plugins_missing(record, missing))
    return files


def needed_code(record: RunRecord) -> dict[str, str]:
    """{what: implementation} of the code a record was made with: its method and its plug-ins."""
    spec = record.spec
    return {f"method {spec.method!r}": spec.method_version,
            **{f"plug-in {key}": version for key, version in spec.plugins.items()}}


def rerun_scope(record: RunRecord):
    """The code a rerun of `record` may import beside built-ins and entry points: named files only, each
    of whose bytes must hash to one of the record's file implementations (checked by the loader)."""
    from ..api.registry import CodeScope

    needed = needed_code(record)
    made = "; ".join(f"{what} {version or '(none)'}" for what, version in needed.items())
    return CodeScope(submissions=False, expect=frozenset(filter(None, map(_digest, needed.values()))),
                     expected=f"code record {record.run_id} was made with ({made}); pass only the "
                              "--method/--plugin files it was made with")


def _digest(implementation) -> str | None:
    """The source hash of a file's (or entry point's) implementation; None for a declared version."""
    if not isinstance(implementation, str) or not implementation.startswith("sha256:"):
        return None
    return implementation[len("sha256:"):].split("+", 1)[0]


def _method_missing(record: RunRecord, adapter) -> str:
    spec = record.spec
    made = f"implementation {spec.method_version or '(none)'}"
    if adapter is None:
        what = f"record {record.run_id} was made with method {spec.method!r} ({made}), which is not built in here"
    else:
        what = (f"method {spec.method!r} changed since the record was made ({made}, now {adapter.implementation} "
                f"from {adapter.source})")
    source = _written(record.provenance, "method", "source")
    return f"{what}: pass --method FILE, the method file it was made with, or install that version{_hint(source)}"


def _plugins_missing(record: RunRecord, missing: dict) -> str:
    sources = (_written(record.provenance, "plugins", key, "source") for key in missing)
    hint = _hint(", ".join(s for s in sources if isinstance(s, str) and s))
    listed = ", ".join(f"{key} ({version})" for key, version in missing.items())
    return (f"record {record.run_id} was made with plug-in {listed}, not registered here in that version: pass "
            f"--plugin FILE, the plug-in file it was made with, or install that version{hint}")


HINT_CHARS = 160


def _written(data, *keys):
    """What a record wrote under nested keys; None where any level is missing or not a mapping."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _hint(source) -> str:
    """Where the record says its code came from: escaped and shortened, for the user to find the file."""
    if not isinstance(source, str) or not source or source == "built-in":
        return ""
    shown = source if len(source) <= HINT_CHARS else source[:HINT_CHARS] + "…"
    return f" (the record names {shown!r}; a path in a record is never imported)"


def reproduce(run_id: str, results="results", data_dir: str | None = None, device: str | None = None,
              out: str | None = None, method_files=(), plugin_files=()) -> Reproduction:
    """Rerun record `run_id` (inline, one torch thread, as workers run) with the method and plug-in files
    the user names (verified against the record), and compare."""
    from ..api.registry import code_scope

    record, path = find_record(run_id, results)
    with code_scope(rerun_scope(record)):  # the engine's registry too: named files only, checked as they load
        return _rerun(record, path, data_dir, device, out, method_files, plugin_files)


def _rerun(record: RunRecord, path: Path, data_dir, device, out, method_files, plugin_files) -> Reproduction:
    """The rerun of `record` and its comparison (in the record's code scope)."""
    from ..run.engine import resolve_device, run_one
    from .executors.base import init_worker
    from .interrupts import signals_interrupt

    files = code_files(record, method_files, plugin_files)
    device = device or (record.provenance or {}).get("device") or "auto"
    try:
        resolve_device(device)
    except ValueError as exc:
        raise SweepError(f"--device: {exc}") from None
    init_worker(1)
    started = time.perf_counter()
    with signals_interrupt():  # Ctrl-C stops the rerun, never turns into its failed record
        rerun = run_one(record.spec, data_dir=data_dir, device=device, method_files=files,
                        submission=record.submission)
    seconds = time.perf_counter() - started
    rerun_path = _keep(rerun, out)
    verdict, differences, delta = compare(record, rerun)
    return Reproduction(record, path, rerun, rerun_path, verdict, differences, delta, seconds)


def _keep(rerun: RunRecord, out: str | None) -> Path | None:
    """Write the rerun's record under `out` (or a temporary folder that is removed)."""
    if out is None:
        with tempfile.TemporaryDirectory(prefix="cl-bench-reproduce-") as tmp:
            write_record(Path(tmp) / rerun.spec.protocol / "runs", rerun, root=tmp)
        return None
    return write_record(Path(out) / rerun.spec.protocol / "runs", rerun, root=out)


def _comparable(record: RunRecord, measured: bool = True) -> dict:
    """The compared fields; without `measured` (a record from before compute accounting) its budget's compute
    is left out, so such a record still reproduces."""
    data = {k: getattr(record, k) for k in COMPARED}
    data["diagnostics"] = {k: v for k, v in (data["diagnostics"] or {}).items() if k != "traceback"}
    data["budget"] = {k: v for k, v in (data["budget"] or {}).items() if measured or k != "compute"}
    return data


def compare(record: RunRecord, rerun: RunRecord) -> tuple[str, tuple[str, ...], float]:
    """(verdict, fields that differ, largest difference of a metric or accuracy)."""
    measured = "compute" in (record.budget or {})
    a, b = _comparable(record, measured), _comparable(rerun, measured)
    differences = tuple(k for k in COMPARED if a[k] != b[k])
    if not differences:
        return "bitwise", (), 0.0
    delta = _max_delta(record, rerun)
    same_status = record.status == rerun.status
    exact = not any(k in EXACT for k in differences)
    return ("metrics" if same_status and exact and delta <= METRIC_TOLERANCE else "differs"), differences, delta


def _max_delta(a: RunRecord, b: RunRecord) -> float:
    """Largest |difference| over the metrics and the accuracy matrices, class-IL and task-aware
    (inf where shapes differ)."""
    views = [(a.metrics, b.metrics, a.acc_matrix, b.acc_matrix),
             (a.metrics_task_aware or {}, b.metrics_task_aware or {},
              a.acc_matrix_task_aware or [], b.acc_matrix_task_aware or [])]
    pairs = []
    for ma, mb, Ra, Rb in views:
        if set(ma) != set(mb) or len(Ra) != len(Rb):
            return float("inf")
        pairs += [(ma[k], mb[k]) for k in ma]
        for ra, rb in zip(Ra, Rb):
            if len(ra) != len(rb):
                return float("inf")
            pairs += list(zip(ra, rb))
    return max((abs(x - y) for x, y in pairs), default=0.0)


def describe(rep: Reproduction) -> list[str]:
    """The report lines of a reproduction."""
    s = rep.record.spec
    lines = [f"record {rep.record.run_id}: protocol {s.protocol} v{s.protocol_version}, {s.dataset.name} / "
             f"{s.regime} / {rep.record.method}, order {s.order}, seed {s.seed} ({rep.path})",
             f"rerun ({rep.rerun.status}, {rep.seconds:.1f} s)"
             + (f", kept in {rep.rerun_path}" if rep.rerun_path else "")]
    if rep.verdict == "bitwise":
        lines.append(f"reproduced: bitwise equal ({', '.join(COMPARED)})")
    elif rep.verdict == "metrics":
        lines.append(f"reproduced within {METRIC_TOLERANCE:g}: metrics and accuracies equal to "
                     f"{rep.max_delta:.2g}; not bitwise ({', '.join(rep.differences)} differ)")
    else:
        detail = ", ".join(f"{k} {rep.record.metrics.get(k)!r} -> {rep.rerun.metrics.get(k)!r}"
                           for k in ("acc", "forgetting") if rep.record.metrics.get(k) != rep.rerun.metrics.get(k))
        status = "" if rep.record.status == rep.rerun.status else f"status {rep.record.status} -> {rep.rerun.status}; "
        lines.append(f"NOT reproduced: {status}{detail or 'differences in ' + ', '.join(rep.differences)}"
                     + (f" (error: {rep.rerun.error})" if rep.rerun.error and rep.rerun.status != Status.OK else ""))
    return lines
