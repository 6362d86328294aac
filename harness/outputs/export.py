"""Records out of cl-bench: the tidy table as CSV/Parquet, and records read back from MLflow."""
from __future__ import annotations

import io
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

from ..config.errors import ExportError
from ..config.files import inside, safe_target, write_atomic
from ..config.specs import RunRecord
from .downloads import for_download, has_curves

FORMATS = ("csv", "parquet")


def export_table(records: list, fmt: str, out: str | Path, root: str | Path | None = None) -> Path:
    """Write one row per record (harness.analysis.frame.records_to_frame) to `out`, atomically.

    root: the folder the user named, `out` inside it (default: out's folder); no part of out below
    it may be a symbolic link (config/files.py). The any-time columns (has_curve and the ANYTIME
    metrics, config/metrics.py) are written when some record has a continual-evaluation curve; without
    one the table is what it was before they existed (downloads.py, as the site's downloads).
    """
    from ..analysis.frame import records_to_frame

    if fmt not in FORMATS:
        raise ExportError(f"--format: {fmt!r} is not supported; allowed: {', '.join(FORMATS)}")
    out = Path(out)
    root = Path(out.parent if root is None else root)
    target = safe_target(root, inside(root, out))
    frame = records_to_frame(records)
    frame = for_download(frame, has_curves(frame))
    if fmt == "csv":
        from ..config.text import spreadsheet_safe

        # Text cells a spreadsheet would run as formulas are neutralised; numbers stay numbers.
        text = frame.select_dtypes(include=["object", "string"]).columns
        data = frame.assign(**{c: frame[c].map(spreadsheet_safe) for c in text}).to_csv(index=False)
    else:
        buffer = io.BytesIO()
        try:
            frame.to_parquet(buffer, index=False)
        except ImportError as exc:
            raise ExportError(f"--format parquet needs pyarrow ({exc}); pip install pyarrow") from None
        data = buffer.getvalue()
    write_atomic(target, data)
    return out


def records_from_mlflow(uri: str, experiment: str, log=print) -> list[RunRecord]:
    """Valid records of an MLflow experiment's child runs, by run id (one per run id: ok runs preferred,
    then the newest, then a total order of their content; several different ones get a warning)."""
    from .. import compat  # noqa: F401  (telemetry off before mlflow is imported)
    from ..config.text import terminal_safe
    from ..execution.store import parse_record
    from .tracking import KIND_TAG, RECORD_ARTIFACT, quiet_mlflow_logs, search_all, store_problem

    say = log  # notes quote records' contents: no control or bidi characters reach the terminal
    log = lambda message: say(terminal_safe(message))  # noqa: E731
    problem = store_problem(uri)  # before MLflow opens it: opening a missing store creates one
    if problem:
        raise ExportError(f"--from-mlflow: {problem}")
    quiet_mlflow_logs()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        names = sorted(e.name for e in client.search_experiments()) if exp is None else []
    except MlflowException as exc:
        raise ExportError(f"--from-mlflow: {uri}: {str(exc).splitlines()[0][:300]}") from None
    if exp is None:
        raise ExportError(f"--experiment: no experiment {experiment!r} at {uri}; "
                          f"found: {', '.join(names) or 'none'}")
    found = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="cl-bench-mlflow-") as tmp:
        for run in search_all(client, exp.experiment_id, f"tags.`{KIND_TAG}` = 'run'"):
            try:
                path = client.download_artifacts(run.info.run_id, RECORD_ARTIFACT, tmp)
                data = json.loads(Path(path).read_text())
            except Exception as exc:  # one broken run must not hide the others
                log(f"note: MLflow run {run.info.run_id}: no readable {RECORD_ARTIFACT} ({exc}); skipped")
                continue
            record, problem = parse_record(data)
            if problem:
                log(f"note: MLflow run {run.info.run_id}: invalid record ({problem.reason}); skipped")
                continue
            found[record.run_id].append(((record.ok, run.info.end_time or 0, _canonical(record)), record))
    return _one_per_run_id(found, experiment, log)


def _canonical(record: RunRecord) -> str:
    return json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=True)


def _one_per_run_id(found: dict, experiment: str, log) -> list[RunRecord]:
    """The best record of each run id (the largest key), in run-id order; says where several differ."""
    clashes = sorted(rid for rid, entries in found.items() if len({key[2] for key, _ in entries}) > 1)
    if clashes:
        log(f"warning: {len(clashes)} run ids have several different records in MLflow experiment "
            f"{experiment!r} (e.g. {clashes[0]}); each shows its ok one, then the newest")
    return [max(found[rid], key=lambda entry: entry[0])[1] for rid in sorted(found)]
