"""The records store: results layout, atomic JSON writes, records verified and parsed on read."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..config.files import TMP_MARK, NotRegularFile, ensure_dir, inside, open_regular, write_atomic
from ..config.metrics import all_metrics, step_forgetting
from ..config.paths import RUNS
from ..config.specs import (
    COMPUTE_COUNTS,
    COMPUTE_MERGE,
    COMPUTE_PER_TASK,
    COMPUTE_VERSION,
    MEMORY_PEAKS,
    SCHEMA_VERSION,
    DatasetSpec,
    RunRecord,
    RunSpec,
    TrainingSpec,
    check_spec_json,
    run_id_of,
)
from ..config.text import terminal_safe
from ..config.validate import show
from ..config.vocabulary import Scenario, Status
from ..run.checks import CHECKS_VERSION, head_outputs, run_warnings
from ..run.provenance import method_problem

RECORD_KEYS = frozenset(f.name for f in fields(RunRecord))
OPTIONAL_KEYS = frozenset({"curve"})  # absent from a record without continual evaluation


def protocol_dir(results: str | Path, protocol_name: str) -> Path:
    """`<results>/<protocol>/`: everything a protocol's sweep writes."""
    return Path(results) / protocol_name


def runs_dir(results: str | Path, protocol_name: str) -> Path:
    """`<results>/<protocol>/runs/`: one `<run_id>.json` per finished run."""
    return protocol_dir(results, protocol_name) / RUNS


def write_record(folder: str | Path, record: RunRecord, root: str | Path | None = None) -> Path:
    """Write a record atomically (temp file in the same folder, fsync, rename).

    `root`: the folder the user named (--results), `folder` inside it; no part of `folder` below
    root, nor the record file, may be a symbolic link (config/files.py). Default: `folder` itself.
    """
    data = record.to_dict()
    root = Path(folder if root is None else root)
    folder = ensure_dir(root, inside(root, folder))
    payload = json.dumps(data, indent=1, sort_keys=True, allow_nan=True)
    return write_atomic(folder / f"{data['run_id']}.json", payload, fsync=True)


# A record is tens of kilobytes; a file far larger is not one (and would make a huge page).
MAX_RECORD_BYTES = 16 * 2**20
METRIC_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Problem:
    """Why a record file is not counted: `corrupt` (damaged, edited) or `foreign` (another
    protocol's, or written by an older cl-bench whose run ids did not cover code and data)."""

    kind: str
    reason: str


def validate_record(data, expected_run_id: str | None = None, protocol: str | None = None) -> Problem | None:
    """None if the record's JSON form is valid (for `protocol`'s folder, when given), else why not."""
    if not isinstance(data, dict):
        return Problem("corrupt", "not a JSON object")
    if data.get("schema_version") != SCHEMA_VERSION:
        return Problem("foreign", f"schema_version {data.get('schema_version')!r}: written by another cl-bench "
                                  f"(this one reads {SCHEMA_VERSION}, whose run ids cover the method's code and the "
                                  "data); never counted, its run is redone under the new run id")
    newer = _newer_checks(data.get("checks"))
    if newer:
        return Problem("foreign", newer)
    keys = set(data)
    if not RECORD_KEYS - OPTIONAL_KEYS <= keys <= RECORD_KEYS:
        missing, extra = sorted(RECORD_KEYS - keys), sorted(keys - RECORD_KEYS)
        return Problem("corrupt", f"keys differ from the schema (missing {missing}, unexpected {extra})")
    if data["status"] not in tuple(Status):
        return Problem("corrupt", f"status {data['status']!r} is not one of {', '.join(Status)}")
    if not isinstance(data["spec"], dict) or run_id_of(data["spec"]) != data["run_id"]:
        return Problem("corrupt", "its spec does not hash to its run_id (edited or foreign record)")
    if expected_run_id is not None and data["run_id"] != expected_run_id:
        return Problem("corrupt", f"file name says {expected_run_id} but the record's run_id is {data['run_id']}")
    try:
        check_spec_json(data["spec"])
    except ValueError as exc:  # a field of another type or out of range: forged, or not a record of a protocol
        return Problem("corrupt", f"its {exc}")
    canonical = canonical_problem(data["spec"])
    if canonical:
        return Problem("corrupt", canonical)
    shape = _shape_problem(data)
    if shape:
        return Problem("corrupt", shape)
    if protocol is not None and data["spec"].get("protocol") != protocol:
        return Problem("foreign", f"a record of protocol {data['spec'].get('protocol')!r} in the folder of "
                                  f"protocol {protocol!r}")
    return None


def _newer_checks(checks) -> str | None:
    """Why a record's learning checks are a newer cl-bench's (an implementation this one does not know)."""
    version = checks.get("version") if isinstance(checks, dict) else None
    if _count(version) and version > CHECKS_VERSION:
        return (f"checks.version {version}: measured by a newer cl-bench's learning checks (this one knows versions "
                f"1 to {CHECKS_VERSION}); not counted")
    return None


def canonical_spec(spec: dict) -> dict:
    """The JSON form cl-bench writes for this spec: RunSpec.from_dict(spec).to_dict(), a float field a float."""
    canonical = RunSpec.from_dict(spec).to_dict()
    for key, kind in (("dataset", DatasetSpec), ("training", TrainingSpec)):
        for f in fields(kind):
            if f.name not in canonical[key]:  # a default left out of the JSON form (training.precision)
                continue
            value = canonical[key][f.name]
            if f.type in ("float", float) and isinstance(value, int) and not isinstance(value, bool):
                canonical[key][f.name] = float(value)
    return canonical


def canonical_problem(spec: dict) -> str | None:
    """Where a (type-checked) spec differs from its canonical form, or None. Another form of one spec (an
    empty `plugins`, 1 for 1.0) hashes to another run id, yet is the same RunSpec: the same cell of the
    grid as the real record, where the two would hide each other."""
    try:
        canonical = canonical_spec(spec)
    except (TypeError, ValueError, KeyError) as exc:
        return f"its spec does not have the schema's shape ({exc})"
    where = _first_difference(spec, canonical, "spec")
    return None if where is None else (f"its {where} is not in the form cl-bench writes "
                                       "(another spelling of a spec: edited or forged)")


def _first_difference(a, b, name: str) -> str | None:
    """The dotted path of the first place where two JSON values differ in key, length, type or value."""
    if type(a) is not type(b):
        return name
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{name}.{key}"
            found = _first_difference(a[key], b[key], f"{name}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return name
        return next((found for i, (x, y) in enumerate(zip(a, b))
                     if (found := _first_difference(x, y, f"{name}[{i}]"))), None)
    return None if a == b or (a != a and b != b) else name  # NaN: the same spelling


# The JSON type of every field after `spec` (whose shape RunSpec.from_dict checks).
FIELD_TYPES = {"run_id": str, "error": (str, type(None)), "acc_matrix": list, "init_acc": list, "metrics": dict,
               "update_norms": dict, "diagnostics": dict, "params": dict, "regime_depth": (int, type(None)),
               "n_blocks": (int, type(None)), "timings": dict, "provenance": dict, "budget": dict,
               "checks": dict, "warnings": list, "acc_matrix_task_aware": (list, type(None)),
               "init_acc_task_aware": (list, type(None)), "metrics_task_aware": (dict, type(None))}
TASK_AWARE = ("acc_matrix_task_aware", "init_acc_task_aware", "metrics_task_aware")
SERIES = ("shared", "relative", "step_forgetting")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _series(v) -> bool:
    return isinstance(v, list) and all(x is None or _number(x) for x in v)


def _shape_problem(data: dict) -> str | None:
    """What is ill-typed in a record's fields (the analysis and the site read them), or None."""
    for key, kind in FIELD_TYPES.items():
        if not isinstance(data[key], kind) or (kind is not str and isinstance(data[key], bool)):
            return f"its {key} is {type(data[key]).__name__}, not what the schema says"
    norms = data["update_norms"]
    bad = [k for k in SERIES if k in norms and not _series(norms[k])]
    per_block = norms.get("per_block", {})
    blocks_ok = isinstance(per_block, dict) and all(_series(v) for v in per_block.values())
    if bad or not (norms.get("drift") is None or _number(norms["drift"])) or not blocks_ok:
        return "its update_norms are not lists of numbers (shared, relative, step_forgetting, per_block) and a drift"
    if not all(isinstance(data["provenance"].get(k, {}), (dict, type(None))) for k in ("method", "submission")):
        return "its provenance's method/submission are not mappings"
    method = method_problem(data["provenance"].get("method") or {})
    if method:
        return method
    if not all(isinstance(w, dict) and isinstance(w.get("code"), str) and isinstance(w.get("message"), str)
               and (w.get("task") is None or _number(w["task"])) for w in data["warnings"]):
        return "its warnings are not {code, task, message} entries"
    return _range_problem(data) or _curve_problem(data)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _size(x, finite: bool = True) -> bool:
    """A number >= 0; NaN and inf only where `finite` is False."""
    if not _number(x):
        return False
    return math.isfinite(x) and x >= 0 if finite else (math.isnan(x) or x >= 0)


def _leaves(name: str, value):
    """(name, item) for a value, or for each item of a list (nested lists too), named by index."""
    if isinstance(value, list):
        for i, x in enumerate(value):
            yield from _leaves(f"{name}[{i}]", x)
    else:
        yield name, value


COUNT = (_count, "a non-negative integer")
OPTIONAL_COUNT = (lambda x: x is None or _count(x), "a non-negative integer or null")
SECONDS = (_size, "a finite number >= 0")
ACCURACY = (lambda x: x is None or (_number(x) and 0.0 <= x <= 1.0), "an accuracy in [0, 1] or null")
FINITE = (lambda x: x is None or (_number(x) and math.isfinite(x)), "a finite number or null")
CHANCE = (lambda x: _number(x) and 0.0 < x <= 1.0, "a chance level in (0, 1]")
CHECKS_VERSIONS = (lambda x: _count(x) and 1 <= x <= CHECKS_VERSION, f"an integer from 1 to {CHECKS_VERSION}")
CHECKS = {"chance": CHANCE, "task_chance": CHANCE, "n_test": COUNT, "probe_acc": ACCURACY, "trained_acc": ACCURACY,
          "loss_first": FINITE, "loss_last": FINITE, "version": CHECKS_VERSIONS}
# What a method keeps between tasks (MemoryHook), one entry per trained task; null where nothing declared it.
MEMORY = ("memory_samples", "memory_bytes")


def _measured(data: dict):
    """(field, value, rule) for every number a run measures besides its metrics and accuracies."""
    # A run that diverged may have measured NaN or inf weights (its norms say so); a finished one never.
    finite = data["status"] == Status.OK
    norm = (lambda x: x is None or _size(x, finite),
            "a finite number >= 0 or null" if finite else "a number >= 0 (NaN or inf included) or null")
    yield "regime_depth", data["regime_depth"], OPTIONAL_COUNT
    yield "n_blocks", data["n_blocks"], OPTIONAL_COUNT
    for key, value in data["params"].items():
        yield f"params.{key}", value, (SECONDS if key == "fraction" else COUNT)
    for key, value in data["budget"].items():
        if key == "compute":  # checked as a whole by _compute_problem
            continue
        rule = OPTIONAL_COUNT if key in MEMORY else COUNT
        yield from ((name, x, rule) for name, x in _leaves(f"budget.{key}", value))
    for key, value in data["timings"].items():
        yield from ((name, x, SECONDS) for name, x in _leaves(f"timings.{key}", value))
    norms = data["update_norms"]
    series = {k: norms[k] for k in ("shared", "relative") if k in norms}
    series.update({f"per_block.{b}": v for b, v in norms.get("per_block", {}).items()})
    for key, value in series.items():
        yield from ((name, x, norm) for name, x in _leaves(f"update_norms.{key}", value))
    yield "update_norms.drift", norms.get("drift"), norm
    for key, rule in CHECKS.items():
        if key in data["checks"]:
            yield from ((name, x, rule) for name, x in _leaves(f"checks.{key}", data["checks"][key]))


def _memory_problem(data: dict) -> str | None:
    """The budget's memory entries: both or neither, flat lists of one entry per trained task."""
    budget, T = data["budget"], data["spec"]["dataset"]["n_tasks"]
    found = [k for k in MEMORY if k in budget]
    if not found:
        return None
    if len(found) != len(MEMORY):
        return f"its budget has {found[0]} without {[k for k in MEMORY if k not in found][0]}"
    lists = [budget[k] for k in MEMORY]
    if not all(isinstance(v, list) and not any(isinstance(x, list) for x in v) for v in lists):
        return f"its budget's {' and '.join(MEMORY)} are not lists of one entry per task"
    n = len(lists[0])
    if len(lists[1]) != n or n > T or (data["status"] == Status.OK and n != T):
        return f"its budget's {' and '.join(MEMORY)} do not have one entry per trained task (of {T})"
    return None


# Bounds of the compute entries: 2**62 is far above any run's FLOPs (1e18) and keeps them exact integers.
COMPUTE_LIMIT = 2**62
BOUNDED = (lambda x: _count(x) and x < COMPUTE_LIMIT, "an integer from 0 to 2**62")


def _compute_problem(data: dict) -> str | None:
    """budget.compute (optional): its keys, integer counts, per-task lists and sums that agree; and
    provenance.memory (optional): bounded byte counts."""
    memory = data["provenance"].get("memory")
    if memory is not None:
        if not isinstance(memory, dict) or set(memory) - set(MEMORY_PEAKS):
            return f"its provenance.memory is not a mapping of {', '.join(MEMORY_PEAKS)}"
        bad = next((k for k, v in memory.items() if not BOUNDED[0](v)), None)
        if bad:
            return f"its provenance.memory.{bad} is {show(memory[bad])}; allowed: {BOUNDED[1]}"
    c = data["budget"].get("compute")
    if c is None:
        return None
    if not isinstance(c, dict) or not (_count(c.get("version")) and 1 <= c["version"] <= COMPUTE_VERSION):
        return f"its budget.compute is not a mapping with a version from 1 to {COMPUTE_VERSION}"
    unknown = sorted(set(c) - {"version", *COMPUTE_COUNTS, *COMPUTE_PER_TASK, "merge", "executed_flops"}, key=str)
    missing = [k for k in (*COMPUTE_COUNTS, *COMPUTE_PER_TASK) if k not in c]
    if unknown or missing:
        return f"its budget.compute has {'unknown key ' + show(unknown[0]) if unknown else 'no ' + missing[0]}"
    T = data["spec"]["dataset"]["n_tasks"]
    if not all(isinstance(c[k], list) and len(c[k]) <= T and all(BOUNDED[0](x) for x in c[k])
               for k in COMPUTE_PER_TASK):  # flat lists of counts: the sums below must not meet a nested list
        return f"its budget.compute's {', '.join(COMPUTE_PER_TASK)} are not lists of at most {T} counts"
    merge = c.get("merge", {})
    if not isinstance(merge, dict) or set(merge) - set(COMPUTE_MERGE):
        return f"its budget.compute.merge is not a mapping of {', '.join(COMPUTE_MERGE)}"
    for name, value, (ok, allowed_values) in _compute_values(c, merge):
        if not ok(value):
            return f"its budget.compute.{name} is {show(value)}; allowed: {allowed_values}"
    if sum(c["forward_per_task"]) != c["forward_samples"] or sum(c["backward_per_task"]) != c["backward_samples"] \
            or c["forward_flops"] + c["backward_flops"] != c["flops"]:
        return "its budget.compute's totals do not add up (per-task passes, forward + backward FLOPs)"
    if "executed_flops" in c and not (BOUNDED[0](c["executed_flops"]) and c["executed_flops"] <= c["flops"]):
        return f"its budget.compute.executed_flops is {show(c['executed_flops'])}; allowed: a count up to flops"
    return None


def _compute_values(c: dict, merge: dict):
    """(name, value, rule) of every number in budget.compute."""
    for key in COMPUTE_COUNTS:
        yield key, c[key], BOUNDED
    for key in COMPUTE_PER_TASK:
        yield from ((name, x, BOUNDED) for name, x in _leaves(key, c[key]))
    for key, value in merge.items():
        yield f"merge.{key}", value, BOUNDED


def _range_problem(data: dict) -> str | None:
    """The first measured number (not a metric) out of its range, named by its field, or None."""
    memory = _memory_problem(data) or _compute_problem(data)
    if memory:
        return memory
    for name, value, (ok, allowed) in _measured(data):
        if not ok(value):
            return f"its {name} is {show(value)}; allowed: {allowed}"
    return None


def content_problem(record: RunRecord) -> Problem | None:
    """None when the record's numbers are consistent: its metrics follow from its accuracy matrix."""
    T = record.spec.dataset.n_tasks
    R, b = record.acc_matrix, record.init_acc
    if not record.ok:
        if record.metrics:
            return Problem("corrupt", f"a {record.status} record with metrics")
        if not _matrix_shape_ok(R, T, partial=True):
            return Problem("corrupt", "its accuracy matrix is malformed")
        return _task_aware_problem(record)
    if not (_matrix_shape_ok(R, T) and _accuracies(b, T)):
        return Problem("corrupt", f"its accuracy matrix is not {T}x{T} accuracies in [0, 1] with {T} initial ones")
    problem = _metrics_problem(record.metrics, all_metrics(R, b), "metrics", "accuracy matrix") \
        or _task_aware_problem(record)
    if problem:
        return problem
    steps = (record.update_norms or {}).get("step_forgetting")
    if steps is not None and not _same_series(steps, step_forgetting(np.asarray(R, dtype=float))):
        return Problem("corrupt", "its step forgetting does not follow from its accuracy matrix")
    return _warnings_problem(record)


def _metrics_problem(got: dict, expected: dict, name: str, source: str) -> Problem | None:
    """The recorded metric dict `got` must be `expected` (computed from its `source`) to METRIC_TOLERANCE."""
    if set(got) != set(expected):
        return Problem("corrupt", f"its {name} {sorted(got)} are not {sorted(expected)}")
    for metric, value in expected.items():
        v = got[metric]
        if not _number(v) or abs(v - value) > METRIC_TOLERANCE:
            return Problem("corrupt", f"its {name} do not follow from its {source} ({metric} {v!r} "
                                      f"recorded, {value:.6g} computed): edited or corrupt")
    return None


def _task_aware_problem(record: RunRecord) -> Problem | None:
    """Task-IL: no task-aware fields. Class-IL: a matrix shaped like acc_matrix, never below it, and its metrics."""
    values = [getattr(record, k) for k in TASK_AWARE]
    if record.spec.scenario == Scenario.TASK_IL:
        return None if all(v is None for v in values) else Problem(
            "corrupt", "a task-IL record with task-aware fields (its acc_matrix is the task-aware one)")
    R, b, metrics = values
    if any(v is None for v in values):
        return Problem("corrupt", f"a class-IL record without its task-aware fields ({', '.join(TASK_AWARE)})")
    T = record.spec.dataset.n_tasks
    if not record.ok:
        if metrics:
            return Problem("corrupt", f"a {record.status} record with task-aware metrics")
        # As for acc_matrix: a partial matrix, row for row with it (both come from one evaluation).
        if _matrix_shape_ok(R, T, partial=True) and len(R) == len(record.acc_matrix):
            return None
        return Problem("corrupt", "its task-aware accuracy matrix is malformed")
    if not (_matrix_shape_ok(R, T) and _accuracies(b, T)):
        return Problem("corrupt", f"its acc_matrix_task_aware is not {T}x{T} accuracies in [0, 1] with {T} "
                                  "initial ones (init_acc_task_aware)")
    # Masking to the task's classes keeps every correct full-argmax prediction correct (same logits).
    if any(m < c for rm, rc in zip([b, *R], [record.init_acc, *record.acc_matrix]) for m, c in zip(rm, rc)):
        return Problem("corrupt", "its task-aware accuracies are below its class-IL ones somewhere: edited or corrupt")
    return _metrics_problem(metrics, all_metrics(R, b), "task-aware metrics", "task-aware accuracy matrix")


def _chance_problem(record: RunRecord) -> Problem | None:
    """The chance levels a record's checks judge by must be its spec's (an edited one would drop warnings)."""
    spec, checks = record.spec, record.checks or {}
    if "chance" not in checks:
        return None
    cpt = spec.dataset.classes_per_task
    expected = {"chance": 1.0 / head_outputs(spec.scenario, spec.dataset.n_tasks, cpt)}
    if spec.scenario == Scenario.CLASS_IL:
        expected["task_chance"] = 1.0 / cpt
    for key, value in expected.items():
        if key in checks and (not _number(checks[key]) or abs(checks[key] - value) > 1e-12):
            return Problem("corrupt", f"its checks.{key} is {show(checks[key])}, not the spec's {value:.6g}: "
                                      "edited or corrupt")
    if spec.scenario == Scenario.TASK_IL and "task_chance" in checks:
        return Problem("corrupt", "a task-IL record with checks.task_chance (a class-IL check)")
    return None


def _warnings_problem(record: RunRecord) -> Problem | None:
    """A record's warnings must be exactly those its checks and accuracy matrices give (none removed)."""
    chance = _chance_problem(record)
    if chance:
        return chance
    try:
        expected = run_warnings(record.acc_matrix, record.checks, record.spec.scenario, record.acc_matrix_task_aware)
    except (TypeError, KeyError, ValueError, IndexError):
        return Problem("corrupt", "its learning checks are malformed")
    if record.warnings != expected:
        return Problem("corrupt", f"its warnings ({len(record.warnings)}) are not the {len(expected)} its learning "
                                  "checks give: edited or corrupt")
    return None


def _accuracies(row, n: int) -> bool:
    return isinstance(row, list) and len(row) == n and all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and 0.0 <= a <= 1.0 for a in row)


def _matrix_shape_ok(R, T: int, partial: bool = False) -> bool:
    if not isinstance(R, list) or len(R) > T or (not partial and len(R) != T):
        return False
    return all(_accuracies(row, T) for row in R) if not partial else all(isinstance(r, list) for r in R)


def _same_series(a, b) -> bool:
    return len(a) == len(b) and all((x is None and y is None) or (
        x is not None and y is not None and abs(x - y) <= METRIC_TOLERANCE) for x, y in zip(a, b))


def parse_record(data, expected_run_id: str | None = None,
                 protocol: str | None = None) -> tuple[RunRecord | None, Problem | None]:
    """(record, None) for a valid, consistent record's JSON form, (None, problem) otherwise."""
    problem = validate_record(data, expected_run_id, protocol)
    if problem:
        return None, problem
    try:
        record = RunRecord.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        return None, Problem("corrupt", f"its spec does not have the schema's shape ({exc})")
    problem = content_problem(record)
    return (None, problem) if problem else (record, None)


def read_bounded(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_RECORD_BYTES; OSError(reason) otherwise.

    Read through config.files.open_regular (no link, no blocking), so a FIFO or a link to a
    device named *.json cannot hang or exhaust a command that reads the folder.
    """
    try:
        fd = open_regular(path)
    except NotRegularFile as exc:
        raise OSError(f"{exc.kind}, not a regular file; records are regular files") from None
    except OSError as exc:
        raise OSError(exc.strerror or str(exc)) from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_RECORD_BYTES:
            raise OSError(f"{size / 2**20:.0f} MiB; a record is at most {MAX_RECORD_BYTES // 2**20} MiB")
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise OSError(f"over {MAX_RECORD_BYTES // 2**20} MiB; a record is at most {MAX_RECORD_BYTES // 2**20} MiB")
    return data


def read_record(path: str | Path, protocol: str | None = None) -> tuple[RunRecord | None, Problem | None]:
    """(record, None) for a valid record file, (None, problem) otherwise."""
    path = Path(path)
    try:
        data = json.loads(read_bounded(path).decode("utf-8"))
    except OSError as exc:
        return None, Problem("corrupt", f"unreadable: {exc}")
    except UnicodeDecodeError as exc:
        return None, Problem("corrupt", f"not UTF-8 text: {exc}")
    except json.JSONDecodeError as exc:
        return None, Problem("corrupt", f"not valid JSON (truncated?): {exc.msg} at line {exc.lineno}")
    except RecursionError:
        return None, Problem("corrupt", "nested too deeply to be a record")
    return parse_record(data, expected_run_id=path.stem, protocol=protocol)


@dataclass
class Scan:
    """What a runs folder holds: valid records, corrupt and foreign files with reasons, stray temp files."""

    valid: dict = field(default_factory=dict)
    invalid: list = field(default_factory=list)   # (path, reason): damaged or edited; its run is redone
    foreign: list = field(default_factory=list)   # (path, reason): another protocol's or an older harness's
    stray: list = field(default_factory=list)

    def report(self, log=print) -> None:
        """One line per file that is not counted (each scan reports each file once)."""
        for path, reason in self.invalid:
            log(terminal_safe(f"note: {path} is invalid ({reason}); it is not counted and its run will be redone"))
        for path, reason in self.foreign:
            log(terminal_safe(f"note: {path} is foreign ({reason}); it is not counted"))


def scan_runs(folder: str | Path) -> Scan:
    """Read every record file of `<results>/<protocol>/runs`; nothing is skipped silently."""
    scan = Scan()
    folder = Path(folder)
    if not folder.is_dir():
        return scan
    protocol = folder.parent.name
    for path in sorted(folder.iterdir()):
        if TMP_MARK in path.name:
            scan.stray.append(path)
        elif path.suffix == ".json":
            record, problem = read_record(path, protocol)
            if problem is None:
                scan.valid[record.run_id] = record
            else:
                (scan.foreign if problem.kind == "foreign" else scan.invalid).append((path, problem.reason))
    return scan


def discover_protocol_dirs(results: str | Path) -> list[Path]:
    """Protocol folders under a results folder (those with a runs/ subfolder)."""
    results = Path(results)
    if (results / RUNS).is_dir():
        return [results]
    return sorted(p for p in results.iterdir() if (p / RUNS).is_dir()) if results.is_dir() else []


def load_records(results: str | Path, protocol_name: str | None = None, log=None) -> list[RunRecord]:
    """Valid records under `<results>/<protocol>/runs` (all protocols if none is named).

    With `log`, every file that is not counted (corrupt or foreign) is reported once.
    """
    folders = [runs_dir(results, protocol_name)] if protocol_name else \
        [p / RUNS for p in discover_protocol_dirs(results)]
    records = []
    for folder in folders:
        scan = scan_runs(folder)
        if log is not None:
            scan.report(log)
        records.extend(scan.valid.values())
    return records


# The continual-evaluation curve (RunRecord.curve; harness/run/evaluation.py ContinualEvaluator).
CURVE_KEYS = ("every", "subsample", "n_rows", "steps", "task", "end", "acc")
CURVE_SERIES = ("steps", "task", "end", "acc")


def _curve_problem(data: dict) -> str | None:
    """What is wrong with a record's curve, or None: shapes and ranges, its points (exactly those its budget's
    steps per task give; a prefix of them for a run that did not finish) and, on the tasks whose subsample is
    the whole test set, its initial and end points against init_acc and the accuracy matrix."""
    curve, setting, T = data.get("curve"), data["spec"].get("continual"), data["spec"]["dataset"]["n_tasks"]
    if "curve" not in data:
        ok = setting is None or data["status"] != Status.OK
        return None if ok else "it has no curve, though its spec asks for continual evaluation (spec.continual)"
    if setting is None:
        return "it has a curve, but its spec asks for no continual evaluation (spec.continual)"
    class_il = data["spec"]["scenario"] == Scenario.CLASS_IL
    keys = set(CURVE_KEYS) | ({"acc_task_aware"} if class_il else set())
    if not isinstance(curve, dict) or set(curve) != keys:
        return f"its curve is not a mapping of exactly {', '.join(sorted(keys))}"
    if curve["every"] != setting["every"] or curve["subsample"] != setting["subsample"]:
        return "its curve's every/subsample are not its spec's (spec.continual)"
    n_test = data["checks"].get("n_test")
    rows = [min(setting["subsample"], n) for n in n_test] if isinstance(n_test, list) else None
    if not (isinstance(curve["n_rows"], list) and len(curve["n_rows"]) == T and all(map(_count, curve["n_rows"]))
            and (rows is None or len(rows) != T or curve["n_rows"] == rows)):
        return f"its curve's n_rows are not {T} counts, each min(subsample, the task's test rows)"
    return (_curve_points_problem(curve, T, class_il)
            or _curve_sequence_problem(curve, T, data["budget"].get("steps_per_task"), data["status"] == Status.OK)
            or _curve_matrix_problem(data, curve, class_il))


def _curve_points_problem(curve: dict, T: int, class_il: bool) -> str | None:
    """Each point: a step count, its task, an end flag, and accuracies on tasks 0..task (null after it)."""
    series = [curve[k] for k in (*CURVE_SERIES, *(("acc_task_aware",) if class_il else ()))]
    if not all(isinstance(v, list) and len(v) == len(series[0]) for v in series):
        return "its curve's steps, task, end and acc are not lists of one entry per point"
    steps, tasks, ends, acc = series[:4]
    if not (all(map(_count, steps)) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < T
                                            for t in tasks) and all(isinstance(e, bool) for e in ends)):
        return f"its curve's steps are not counts, its tasks not in 0..{T - 1} or its end flags not booleans"
    if any(b < a for a, b in zip(steps, steps[1:])) or any(b < a for a, b in zip(tasks, tasks[1:])):
        return "its curve's steps or tasks decrease"
    for name in ("acc", "acc_task_aware") if class_il else ("acc",):
        bad = next((i for i, (row, t) in enumerate(zip(curve[name], tasks))
                    if not _curve_row(row, t, T, curve["n_rows"])), None)
        if bad is not None:
            return (f"its curve's {name}[{bad}] is not {T} entries: accuracies on tasks 0..{tasks[bad]} (a count "
                    "of its task's subsample rows each), null after")
    if class_il and any(m is not None and m < c for rm, rc in zip(curve["acc_task_aware"], acc)
                        for m, c in zip(rm, rc)):
        return "its curve's task-aware accuracies are below its class-IL ones somewhere: edited or corrupt"
    return None


def _curve_row(row, task: int, T: int, n_rows: list) -> bool:
    """Accuracies on tasks 0..task, each k/n of its n subsample rows; null for the tasks after it."""
    if not isinstance(row, list) or len(row) != T:
        return False
    seen = all(_number(a) and 0.0 <= a <= 1.0 and abs(a * n - round(a * n)) <= 1e-6
               for a, n in zip(row[:task + 1], n_rows))
    return seen and all(a is None for a in row[task + 1:])


def curve_points(every: int, steps_per_task: list) -> list:
    """The (step, task, end) of every point the engine gives a run whose tasks took `steps_per_task` optimizer
    steps: the initial model's (0, 0, False); then per task t, one after every `every`-th step of the task,
    (steps before t + k*every, t, False) for k = 1..floor(L_t/every), and the task's end point (steps up to
    and including t, t, True). When every divides L_t the last mid-task point and the end point share a step
    (HarnessPlugin.after_update's point, then the engine's end point of the evaluated model)."""
    points, done = [(0, 0, False)], 0
    for t, n in enumerate(steps_per_task):
        points += [(done + k, t, False) for k in range(every, n + 1, every)]
        done += n
        points.append((done, t, True))
    return points


def _curve_sequence_problem(curve: dict, T: int, steps_per_task, finished: bool) -> str | None:
    """A finished run's points are exactly `curve_points(every, budget.steps_per_task)`; a failed or diverged
    run's are a prefix of them (none included), its last task's steps counting as its length (the points
    stop where the run did: a task's end point is missing where it failed in or after training)."""
    if not (isinstance(steps_per_task, list) and all(map(_count, steps_per_task))
            and (len(steps_per_task) == T if finished else len(steps_per_task) <= T)):
        return (f"its budget.steps_per_task is not {T if finished else f'at most {T}'} step counts, from which "
                "its curve's points follow")
    expected = curve_points(curve["every"], steps_per_task)
    got = list(zip(curve["steps"], curve["task"], curve["end"]))
    bad = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), None)
    if bad is not None:
        return (f"its curve's point {bad} (step, task, end) is {_point(got[bad])}, not {_point(expected[bad])}: "
                f"points come at step 0, every {curve['every']} steps into each task and at its end "
                "(budget.steps_per_task)")
    if len(got) > len(expected) or (finished and len(got) < len(expected)):
        return (f"its curve has {len(got)} points, not the {len(expected)} that every {curve['every']} and "
                "budget.steps_per_task give (step 0, every k-th step of each task, each task's end)")
    return None


def _point(point: tuple) -> str:
    step, task, end = point
    return f"({step}, {task}, {str(end).lower()})"


def _curve_matrix_problem(data: dict, curve: dict, class_il: bool) -> str | None:
    """Where a task's subsample is its whole test set (n_rows = checks.n_test), the engine evaluates the same
    model on the same rows, batches and classes for the curve as for the matrix: the initial point's entry is
    init_acc's and task t's end point's entries (tasks <= t) are the matrix row t's, exactly (both are
    correct/n with the same n, so equal floats are equal counts). Class-IL: acc against acc_matrix and
    acc_task_aware against acc_matrix_task_aware. A failed run is compared on the rows it has."""
    n_test = data["checks"].get("n_test")
    if not isinstance(n_test, list):
        return None
    whole = [j for j, (n, m) in enumerate(zip(curve["n_rows"], n_test)) if n == m and _count(m) and m > 0]
    if not whole or not curve["steps"]:
        return None
    ends = [i for i, e in enumerate(curve["end"]) if e]  # task t's end point is ends[t] (checked before)
    # On CPU the two evaluations are the same computation. An accelerator may pick other kernels for the
    # two calls (cuDNN autotuning), so a prediction on a tie could flip: there, one example of slack.
    device = str((data.get("provenance") or {}).get("device") or "cpu")
    slack = 0.0 if device.startswith("cpu") else 1.0

    def differs(a, b, j) -> bool:
        return abs(a - b) > slack / n_test[j] + 1e-12 if slack else a != b
    names = [("acc", "acc_matrix", "init_acc")]
    if class_il:
        names.append(("acc_task_aware", "acc_matrix_task_aware", "init_acc_task_aware"))
    for name, matrix_key, init_key in names:
        points, matrix, init = curve[name], data[matrix_key], data[init_key]
        if whole[0] == 0 and isinstance(init, list) and init and differs(points[0][0], init[0], 0):
            return (f"its curve's {name}[0][0] is not {init_key}[0] though task 0's subsample is its whole test "
                    "set (the same evaluation): edited or corrupt")
        for t, i in enumerate(ends):
            row = matrix[t] if isinstance(matrix, list) and t < len(matrix) and isinstance(matrix[t], list) else []
            j = next((j for j in whole if j <= t and j < len(row) and differs(points[i][j], row[j], j)), None)
            if j is not None:
                return (f"its curve's {name}[{i}][{j}] (task {t}'s end point) is not {matrix_key}[{t}][{j}] though "
                        f"task {j}'s subsample is its whole test set (the same evaluation): edited or corrupt")
    return None
