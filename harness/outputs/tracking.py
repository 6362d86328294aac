"""MLflow logging: one parent run per sweep, one child run per record.

The records on disk are the source of truth; MLflow is a mirror. Logging is best effort:
the first MLflow error is reported once and turns tracking off for the rest of the sweep
(the next `cl-bench run` logs whatever is missing). MLflow is imported only when used.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from ..config.files import check_links, check_tree
from ..config.numbers import is_number
from ..config.paths import MLFLOW_ARTIFACTS, MLFLOW_DB
from ..config.specs import RunRecord

KIND_TAG = "cl_bench.kind"          # "sweep" (parent) or "run" (child)
SWEEP_KEY_TAG = "cl_bench.sweep_key"
RECORD_ARTIFACT = "record.json"
_TAG_MAX = 5000
# How long a tracking server may take to answer before tracking is given up: MLflow's own client
# waits 120 s a request and retries 7 times (about 4 minutes for a server that is not there).
PROBE_TIMEOUT_S = 3.0
# Every later request (a server that stops answering mid-sweep): MLflow's client waits at most
# HTTP_TIMEOUT_S for a connection or the next bytes and tries once more; no Retry-After is obeyed.
# The user's own MLFLOW_HTTP_* settings win (setdefault).
HTTP_TIMEOUT_S = 10
HTTP_RETRIES = 1
REMOTE_SCHEMES = ("http", "https")
SQLITE_MAGIC = b"SQLite format 3\x00"


def resolve_tracking(results, uri: str | None = None) -> tuple[str, str | None]:
    """(tracking URI, artifact location for new experiments or None to let the server decide).

    The store MLflow keeps in the results folder is checked like every other output there: its
    database and artifact folder may not be links, nor hold one anywhere below (MLflow itself would
    write through them)."""
    given = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not given:
        check_links(results, MLFLOW_DB)
    uri = given or f"sqlite:///{(Path(results) / MLFLOW_DB).resolve()}"
    remote = uri.split(":", 1)[0] in ("http", "https", "databricks", "databricks-uc")
    if not remote:
        check_tree(results, MLFLOW_ARTIFACTS)
    artifacts = None if remote else (Path(results) / MLFLOW_ARTIFACTS).resolve().as_uri()
    return uri, artifacts


def flatten_spec(spec: dict, prefix: str = "") -> dict:
    """A spec as flat MLflow params: nested keys joined by '.', lists as compact JSON."""
    out = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_spec(value, name + "."))
        elif isinstance(value, (list, tuple, dict)):
            out[name] = json.dumps(value, separators=(",", ":"))
        else:
            out[name] = str(value)
    return out


def record_metrics(record: RunRecord) -> list[tuple[str, float, int]]:
    """(key, value, step) triples: summary metrics, accuracies and update norms per task."""
    out = [(k, float(v), 0) for k, v in (record.metrics or {}).items() if is_number(v)]
    for i, row in enumerate(record.acc_matrix or []):
        seen = [a for a in row[:i + 1] if is_number(a)]
        if seen:
            out.append(("acc_after_task", sum(seen) / len(seen), i))
        out += [(f"acc_task.{j}", float(a), i) for j, a in enumerate(row) if is_number(a)]
    norms = record.update_norms or {}
    series = {"update_norm": norms.get("shared"), "update_norm_relative": norms.get("relative"),
              "step_forgetting": norms.get("step_forgetting"),
              **{f"update_norm.{b}": v for b, v in (norms.get("per_block") or {}).items()}}
    for key, values in series.items():
        out += [(key, float(v), t) for t, v in enumerate(values or []) if is_number(v)]
    if is_number(norms.get("drift")):
        out.append(("drift", float(norms["drift"]), 0))
    extra = {"total_s": (record.timings or {}).get("total_s"),
             "trainable_params": (record.params or {}).get("trainable")}
    out += [(k, float(v), 0) for k, v in extra.items() if is_number(v)]
    return out


def record_tags(record: RunRecord) -> dict:
    """Tags that identify a child run: run id, status, dataset, regime, method (+ error)."""
    spec = record.spec
    tags = {KIND_TAG: "run", "run_id": record.run_id, "status": record.status,
            "dataset": record.dataset, "regime": spec.regime, "method": record.method,
            "protocol": spec.protocol, "protocol_version": spec.protocol_version}
    if record.error:
        tags["error"] = str(record.error)[:_TAG_MAX]
    return tags


def run_name(record: RunRecord) -> str:
    """A readable child-run name: dataset/regime/method/order/seed."""
    s = record.spec
    return f"{record.dataset}/{s.regime}/{record.method}/o{s.order}/s{s.seed}"


def sweep_key(protocol, plan) -> str:
    """Identity of a sweep (protocol, version, the grid's run ids): a resume reuses its parent."""
    ids = ",".join(sorted(s.run_id for s in plan.specs))
    return hashlib.sha256(f"{protocol.name}|{protocol.version}|{ids}".encode()).hexdigest()[:16]


def sweep_info(protocol, plan, command: str | None = None) -> dict:
    """What the parent run records: params (protocol, version, grid counts) and tags."""
    from ..run.provenance import git_sha

    counts = plan.counts()
    params = {"protocol": protocol.name, "protocol_version": str(protocol.version),
              **{f"grid.{k}": str(counts[k]) for k in
                 ("datasets", "regimes", "methods", "orders", "seeds", "total")}}
    tags = {KIND_TAG: "sweep", SWEEP_KEY_TAG: sweep_key(protocol, plan),
            "cl_bench.command": (command or _command_line())[:_TAG_MAX],
            "mlflow.source.name": "cl-bench", "protocol": protocol.name}
    sha = git_sha()
    if sha:
        tags["mlflow.source.git.commit"] = sha
    return {"name": f"sweep {protocol.name} v{protocol.version}", "params": params, "tags": tags}


def _command_line() -> str:
    import shlex

    return shlex.join(["cl-bench", *sys.argv[1:]]) if sys.argv else "cl-bench"


class SweepTracker:
    """Mirrors a sweep into MLflow; every public method is safe to call and never raises."""

    def __init__(self, uri: str, experiment: str, info: dict, artifact_location: str | None = None,
                 done: tuple = (), log=None):
        self.uri, self.experiment, self.info = uri, experiment, info
        self.artifact_location = artifact_location
        self.done = tuple(done)        # records already on disk (logged at the end if missing)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.enabled, self.client, self.parent, self.children = True, None, None, {}
        self.complete = set()         # run ids whose child run was fully logged
        self.logged = 0

    def log_record(self, record: RunRecord) -> None:
        """Log one record as a child run (replacing an older child of the same run id)."""
        self._safe(self._log_record, record)

    def finish(self, interrupted: bool = False) -> None:
        """Log on-disk records MLflow lacks, then close the parent run."""
        if not self._safe(self._open):
            return
        missing = [r for r in self.done if r.run_id not in self.complete]
        if missing:
            self.log(f"mlflow: logging {len(missing)} records that are on disk but not in MLflow")
        for record in missing:
            if not self._safe(self._log_record, record):
                return
        self._safe(self._close_parent, "KILLED" if interrupted else "FINISHED")

    def abort(self) -> None:
        """Mark the parent run failed (the sweep stopped on an error)."""
        if self.parent is not None:
            self._safe(self._close_parent, "FAILED")

    def _safe(self, fn, *args) -> bool:
        if not self.enabled:
            return False
        try:
            fn(*args)
            return True
        except Exception as exc:  # tracking must never stop a sweep
            self.enabled = False
            self.log(f"warning: MLflow logging failed ({type(exc).__name__}: {str(exc)[:300]}); "
                     f"tracking is off for the rest of this sweep. The records on disk are complete; "
                     f"the next `cl-bench run` logs the missing ones to {self.uri}")
            return False

    def _open(self) -> None:
        if self.client is not None:
            return
        check_reachable(self.uri)
        bound_mlflow_waits()
        from .. import compat  # noqa: F401  (telemetry off before mlflow is imported)

        quiet_mlflow_logs()
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        exp = client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            self.experiment, artifact_location=self.artifact_location)
        self.exp_id = exp_id
        for run in search_all(client, exp_id, f"tags.`{KIND_TAG}` = 'run'"):
            self.children[run.data.tags["run_id"]] = run.info.run_id
            if run.info.status != "RUNNING":  # RUNNING: logging was cut short; log it again
                self.complete.add(run.data.tags["run_id"])
        self.parent = self._find_or_create_parent(client, exp_id)
        self.client = client

    def _find_or_create_parent(self, client, exp_id) -> str:
        key = self.info["tags"][SWEEP_KEY_TAG]
        found = search_all(client, exp_id, f"tags.`{SWEEP_KEY_TAG}` = '{key}'")
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=_tags(self.info["tags"]))
            return run_id
        run = client.create_run(exp_id, tags=self.info["tags"], run_name=self.info["name"])
        client.log_batch(run.info.run_id, params=_params(self.info["params"]))
        return run.info.run_id

    def _log_record(self, record: RunRecord) -> None:
        self._open()
        client, run_id = self.client, record.run_id
        if run_id in self.children:      # rerun (--retry-failed): the new record replaces the old
            client.delete_run(self.children.pop(run_id))
            self.complete.discard(run_id)
        end = int(time.time() * 1000)
        total = (record.timings or {}).get("total_s")
        start = end - int(1000 * total) if is_number(total) else end
        tags = {**record_tags(record), "mlflow.parentRunId": self.parent}
        run = client.create_run(self.exp_id, start_time=start, tags=tags, run_name=run_name(record))
        child = run.info.run_id
        _log_batches(client, child, record, end)
        client.log_text(child, json.dumps(record.to_dict(), indent=1, sort_keys=True), RECORD_ARTIFACT)
        client.set_terminated(child, status="FINISHED" if record.ok else "FAILED",
                              end_time=end)
        self.children[run_id] = child
        self.complete.add(run_id)
        self.logged += 1

    def _close_parent(self, status: str) -> None:
        self._open()
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ok = sum(1 for r in self.done if r.ok)
        self.client.log_batch(self.parent, metrics=[
            Metric("runs_in_mlflow", float(len(self.children)), now, 0),
            Metric("runs_logged_this_session", float(self.logged), now, 0),
            Metric("runs_ok_before_this_session", float(ok), now, 0)])
        self.client.set_terminated(self.parent, status=status)


def bound_mlflow_waits() -> None:
    """Bound every MLflow HTTP request (HTTP_TIMEOUT_S, HTTP_RETRIES, no Retry-After sleeps) unless the user set
    MLflow's own variables; MLflow reads them on each request."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
    os.environ.setdefault("MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER", "false")


def check_reachable(uri: str, timeout: float | None = None) -> None:
    """Raise ConnectionError unless the tracking server of an http(s) URI answers (any HTTP status)
    within `timeout` seconds (PROBE_TIMEOUT_S); other URIs have no server to wait for."""
    if uri.partition(":")[0].lower() not in REMOTE_SCHEMES:
        return
    import warnings

    import requests  # MLflow's own HTTP client: proxies and certificates as MLflow uses them

    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    where = urlsplit(uri).netloc.rpartition("@")[2] or uri  # never the credentials of user:password@host
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verify=False: the probe asks whether it answers, not who
        try:
            requests.get(uri, timeout=timeout, verify=False, allow_redirects=False, stream=True).close()
        except requests.RequestException as exc:
            raise ConnectionError(f"the tracking server {where} did not answer within {timeout:g} s "
                                  f"({type(exc).__name__})") from None


def store_problem(uri: str) -> str | None:
    """Why `uri` names no existing MLflow store to read from (one line naming the path), or None.

    Opening a missing sqlite database or file store creates one: a reader checks first, and creates nothing.
    """
    scheme, _, rest = uri.partition(":")
    scheme = scheme.lower() if "/" not in scheme and len(scheme) > 1 else ""  # C:\... is a path
    if scheme in REMOTE_SCHEMES:
        try:
            check_reachable(uri)
        except ConnectionError as exc:
            return str(exc)
        bound_mlflow_waits()  # the reader opens MLflow next: a server that stops answering costs seconds
        return None
    if scheme == "sqlite":
        path = rest[len("///"):].partition("?")[0] if rest.startswith("///") else ""
        return _sqlite_problem(Path(path)) if path else f"{uri} is not the URI of a database file " \
            "(allowed: sqlite:///relative/path.db or sqlite:////absolute/path.db)"
    if scheme in ("", "file"):
        path = Path(urlsplit(uri).path if scheme == "file" else uri)
        return _file_store_problem(path)
    return None  # another database server (postgresql, mysql, ...): MLflow says what is wrong


def _sqlite_problem(path: Path) -> str | None:
    if not path.exists():
        return f"no MLflow database at {path} (missing); allowed: an existing MLflow sqlite database"
    if not path.is_file():
        return f"{path} is not an MLflow database (a folder or another kind of file)"
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if head != SQLITE_MAGIC:
        return f"{path} is not an SQLite database, so not an MLflow one"
    import sqlite3
    from contextlib import closing
    from urllib.parse import quote

    try:  # read-only: a database that is not MLflow's is never migrated into one
        with closing(sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        return f"{path} cannot be read as an SQLite database ({exc})"
    if not {"experiments", "runs"} <= tables:
        return f"{path} is an SQLite database without MLflow's tables (experiments, runs)"
    return None


def _file_store_problem(path: Path) -> str | None:
    if not path.exists():
        return f"no MLflow store at {path} (missing); allowed: a tracking server URL, sqlite:///PATH of an " \
               "existing MLflow database, or an MLflow file store folder"
    if path.is_file():
        hint = f"; write sqlite:///{path}" if _sqlite_problem(path) is None else ""
        return f"{path} is a file, not an MLflow file store folder{hint}"
    if not any(path.glob("*/meta.yaml")):
        return f"{path} is not an MLflow file store (no experiment folders with a meta.yaml)"
    return None


def quiet_mlflow_logs() -> None:
    import logging

    # Creating the sqlite store prints alembic migration chatter at INFO.
    for name in ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _params(mapping: dict):
    from mlflow.entities import Param

    return [Param(k, str(v)[:6000]) for k, v in mapping.items()]


def _tags(mapping: dict):
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in mapping.items()]


def _log_batches(client, run_id: str, record: RunRecord, timestamp: int) -> None:
    from mlflow.entities import Metric

    params = _params(flatten_spec(record.spec.to_dict()))
    metrics = [Metric(k, v, timestamp, step) for k, v, step in record_metrics(record)]
    for i in range(0, len(params), 100):   # MLflow's per-batch limits
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])


def search_all(client, exp_id: str, filter_string: str) -> list:
    """Every active run of an experiment matching a filter (all result pages)."""
    runs, token = [], None
    while True:
        page = client.search_runs([exp_id], filter_string=filter_string, max_results=1000,
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def make_tracker(results, protocol, plan, uri: str | None = None,
                 experiment: str | None = None) -> SweepTracker:
    """The tracker of a sweep into MLflow; contacts nothing until used."""
    uri, artifacts = resolve_tracking(results, uri)
    return SweepTracker(uri, experiment or protocol.name, sweep_info(protocol, plan),
                        artifact_location=artifacts, done=tuple(plan.done.values()))
