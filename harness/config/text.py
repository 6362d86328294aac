"""User text made safe for where it is shown: a terminal line, a spreadsheet cell.

Bottom layer on purpose (stdlib only): the CLI, the analysis tables and the outputs all print or
write labels that come from user files (method labels, data set and protocol names, errors).
"""
from __future__ import annotations

import unicodedata

# Control characters (ESC starts terminal escape codes), format characters (bidi overrides and
# isolates such as U+202E / U+2066-U+2069, zero-width joiners: they reorder or hide text) and
# line / paragraph separators (they break one line into two).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# A cell starting with one of these is a formula to Excel, LibreOffice and Google Sheets (OWASP).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def terminal_safe(text) -> str:
    """str(text) with control, format and line-separator characters written as their escapes."""
    text = str(text)
    if text.isascii() and text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch
                   for ch in text)


def _escaped(ch: str) -> str:
    """The character's unicode_escape form, e.g. '\\x1b' or '\\u202e'."""
    return ch.encode("unicode_escape").decode("ascii")


def spreadsheet_safe(value):
    """A string a spreadsheet would run as a formula, prefixed with "'"; any other value unchanged."""
    # Only str: a negative number (-0.5) is data, and must stay a number in the file.
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception in one line for a one-line error: its type and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0][:limit]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
