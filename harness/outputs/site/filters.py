"""Text the templates print: numbers, p-values, counts, slugs and flag hover texts (jinja2 filters).

Pure functions of one value each; `FILTERS` is what templates.environment() registers.
"""
from __future__ import annotations

import json

from ...config.numbers import is_number
from ...config.vocabulary import WARNINGS, Status
from ..formatting import MISSING, bytes_text, flops_text, fraction_text, num, p_eq, p_text, percent, slug, times_text


def value(x, digits: int = 4) -> str:
    """A diagnostic value: whole numbers as integers (memory dimensions, epochs), others fixed-point."""
    return str(int(x)) if is_number(x) and float(x).is_integer() and abs(x) < 1e15 else num(x, digits)


def listing(values) -> str:
    """Distinct values joined by " · " (one value: just it)."""
    return " · ".join(str(v) for v in values) if values else MISSING


def thousands(x) -> str:
    """A whole number with thousands separators (1,234), or an em dash for missing values."""
    return f"{round(x):,}" if is_number(x) else MISSING


def status_class(status) -> str:
    """The CSS class of a run status: "ok" for a run that finished, "bad" for any other."""
    return "ok" if status == Status.OK else "bad"


def flag_title(codes: str) -> str:
    """Hover text of a flag mark: each comma-joined warning code with its meaning."""
    items = [c for c in str(codes or "").split(",") if c]
    # Unknown codes (records from another harness version) are shown without a meaning.
    if not items:
        return ""
    return "learning-check warnings: " + "; ".join(f"{c} ({WARNINGS[c]})" if c in WARNINGS else c for c in items)


FILTERS = {"num": num, "pct": percent, "slug": slug,
           "tojson_compact": lambda v: json.dumps(v, default=str),
           "tojson_pretty": lambda v: json.dumps(v, indent=1, default=str),
           "thousands": thousands, "flag_title": flag_title, "status_class": status_class, "p": p_text, "p_eq": p_eq,
           "prob": lambda x: num(x, 3), "listing": listing, "val": value, "frac": fraction_text,
           "bytes": bytes_text, "flops": flops_text, "times": times_text}
