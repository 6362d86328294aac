"""How numbers are printed on every output: the site's filters, the report's tables and the figures.

One spelling per quantity wherever it appears:
- a missing number is an em dash (LaTeX writes `---`, which typesets as one);
- a p-value in a cell is "< 0.001" below 0.001, else three decimals; after a "p" in running
  text (tooltips, figure cells) it reads "p < 0.001", "p = 0.123" or "p n/a";
- a trainable fraction is a percent with two significant digits (`fraction_text`);
- a metric is a percent with DIGITS decimals (`percent`), with its CI as "mean ± half-width";
  LaTeX writes the ± as `$\\pm$` (its text fonts have no ± glyph), everything else as ±.
- the Bayesian comparison's region of practical equivalence reads "ROPE 0.5 ACC points" (`rope_text`);
- "best per regime" is decided as printed (`best_as_printed`);
- compute: FLOPs in decimal units, "45.6 G" (`flops_text`), a ratio to the reference method "3.0×"
  (`times_text`), and "not measured" where a record carries no compute (never 0);
- a size in bytes is in binary units with three significant digits, "12.3 KiB" (`bytes_text`);
- a label in a file name, anchor or LaTeX label is its `slug` (readable prefix + hash).
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Hashable, Mapping

from ..config.numbers import is_number

MISSING = "—"
NOT_AVAILABLE = "n/a"  # a statistic that cannot be computed (one method, no pairs): not a missing value
TEX_MISSING = "---"  # LaTeX typesets it as an em dash; its text fonts may lack the glyph
DIGITS = 1  # one decimal of a percent: task orders rarely resolve finer differences
P_FLOOR = 0.001  # smaller p-values print as "< 0.001": their digits are noise at these sample sizes


def num(x, digits: int = 3, missing: str = MISSING) -> str:
    """Fixed-point text, or `missing` for a missing or non-finite value."""
    return f"{x:.{digits}f}" if is_number(x) else missing


def percent(x, scale: float = 100.0, digits: int = DIGITS) -> str:
    """A value on the accuracy scale (fraction, or percent when scale is 1) as percent text."""
    return num(x * scale if is_number(x) else x, digits)


def half_width(lo, hi, scale: float = 1.0) -> float | None:
    """Half the width of the CI [lo, hi] (times scale): the "± half" of a mean; None if a bound is missing."""
    return (hi - lo) / 2 * scale if is_number(lo) and is_number(hi) else None


def rope_text(points: float) -> str:
    """The region of practical equivalence as the outputs name it: "ROPE 1 ACC point", "ROPE 0.5 ACC points"."""
    return f"ROPE {points:g} ACC point{'' if points == 1 else 's'}"


def mean_ci(mean, half, digits: int = DIGITS, tex: bool = False) -> str:
    """A mean with its CI as "mean ± half" (half: half the CI's width), both on the printed scale."""
    pm, missing = (r"$\pm$", TEX_MISSING) if tex else ("±", MISSING)
    return f"{num(mean, digits, missing)} {pm} {num(half, digits, missing)}"


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def bytes_text(n) -> str:
    """A size in bytes in binary units: "512 B", "1.50 KiB", "12.3 MiB", "456 GiB"; MISSING if unknown."""
    if not is_number(n) or n < 0:
        return MISSING
    n, unit = float(n), 0
    while n >= 1024 and unit < len(BYTE_UNITS) - 1:
        n, unit = n / 1024, unit + 1
    if unit == 0:
        return f"{round(n)} B"
    digits = 2 if n < 10 else 1 if n < 100 else 0
    return f"{n:.{digits}f} {BYTE_UNITS[unit]}"


NOT_MEASURED = "not measured"  # compute of a record from before compute accounting: never 0
FLOP_UNITS = ("", "k", "M", "G", "T", "P", "E")


def flops_text(n) -> str:
    """A FLOP count in decimal units with three significant digits: "812", "1.23 M", "45.6 G"; NOT_MEASURED if
    unknown."""
    if not is_number(n) or n < 0:
        return NOT_MEASURED
    n, unit = float(n), 0
    while n >= 1000 and unit < len(FLOP_UNITS) - 1:
        n, unit = n / 1000, unit + 1
    digits = 0 if unit == 0 or n >= 100 else 1 if n >= 10 else 2
    return f"{n:.{digits}f} {FLOP_UNITS[unit]}".rstrip()


def times_text(r) -> str:
    """A ratio against a reference, "3.0×" (one decimal; two below 0.1); NOT_MEASURED if unknown."""
    if not is_number(r) or not math.isfinite(r):
        return NOT_MEASURED
    return f"{r:.{2 if abs(r) < 0.1 else 1}f}×"


def fraction_text(f) -> str:
    """A trainable fraction as a percent with two significant digits (100%, 5.0%, 0.12%); MISSING if unknown."""
    if not is_number(f):
        return MISSING
    p = f * 100
    digits = 0 if p <= 0 else max(0, 1 - math.floor(math.log10(p)))
    return f"{num(p, digits)}%"


def p_text(p) -> str:
    """A p-value in a cell: "< 0.001" below P_FLOOR, else three decimals, MISSING if there is none."""
    if not is_number(p):
        return MISSING
    return f"< {P_FLOOR}" if p < P_FLOOR else f"{p:.3f}"


def p_eq(p) -> str:
    """A p-value after a "p": "< 0.001", "= 0.123", or "n/a" when there is none."""
    if not is_number(p):
        return NOT_AVAILABLE
    return p_text(p) if p < P_FLOOR else f"= {p_text(p)}"


def best_as_printed(values: Mapping[Hashable, float], higher_is_better: bool,
                    digits: int = DIGITS) -> frozenset:
    """The keys whose value, printed with `digits` decimals, equals the best printed value (ties all).

    The one rule for "best per regime" on the site and in the report: a reader compares printed
    numbers, so two cells that print alike are both best, and a difference too small to print
    never decides. Values must be on the printed scale (percent); missing values are never best.
    """
    printed = {k: float(num(v, digits)) for k, v in values.items() if is_number(v)}
    if not printed:
        return frozenset()
    top = max(printed.values()) if higher_is_better else min(printed.values())
    return frozenset(k for k, v in printed.items() if v == top)


def slug(name: str) -> str:
    """File-name-safe, collision-free slug of any string (readable prefix + short hash)."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", str(name)).strip("-").lower()[:40] or "x"
    return f"{base}-{hashlib.sha1(str(name).encode()).hexdigest()[:6]}"
