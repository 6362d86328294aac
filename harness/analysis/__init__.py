"""Analysis layer: pure functions from run records (dicts) to pandas frames. No torch, no I/O."""
from harness.analysis.frame import format_summary, records_to_frame, regime_order, summary_table

__all__ = ["records_to_frame", "summary_table", "format_summary", "regime_order"]
