"""Records out of cl-bench: the tidy table as CSV/Parquet, and records read back from MLflow."""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

from ..config.errors import ExportError
from ..config.files import inside, safe_target, write_atomic
from ..config.specs import RunRecord

FORMATS = ("csv", "parquet")


def export_table(records: list, fmt: str, out: str | Path, root: str | Path | None = None) -> Path:
    """Write one row per record (harness.analysis.frame.records_to_frame) to `out`, atomically.

    root: the folder the user named, `out` inside it (default: out's folder); no part of out below
    it may be a symbolic link (config/files.py).
    """
    from ..analysis.frame import records_to_frame

    if fmt not in FORMATS:
        raise ExportError(f"--format: {fmt!r} is not supported; allowed: {', '.join(FORMATS)}")
    out = Path(out)
    root = Path(out.parent if root is None else root)
    target = safe_target(root, inside(root, out))
    frame = records_to_frame(records)
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
    """Valid records of an MLflow experiment's child runs (one per run id, ok runs preferred)."""
    from .. import compat  # noqa: F401  (telemetry off before mlflow is imported)
    from ..execution.store import parse_record
    from .tracking import KIND_TAG, RECORD_ARTIFACT, quiet_mlflow_logs, search_all

    quiet_mlflow_logs()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ExportError(f"--experiment: no experiment {experiment!r} at {uri}; "
                          f"found: {', '.join(names) or 'none'}")
    best = {}
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
                log(f"note: MLflow run {run.info.run_id}: invalid record ({problem}); skipped")
                continue
            key = (record.ok, run.info.end_time or 0)
            if record.run_id not in best or key > best[record.run_id][0]:
                best[record.run_id] = (key, record)
    return [record for _, record in best.values()]
