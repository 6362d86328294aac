"""The one validator of cl-bench's input files (torch-free).

`Validator(source, error)` checks the values of one file; every failure raises `error` (a
UserError) with one line that reads `source: key: what is wrong; allowed: ...`. The protocol
loader (config/protocol.py) builds its section checks on it, and so does the `pretrain:` value
(config/pretrain.py): a new key of either is one more call of these checks.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .errors import UserError
from .vocabulary import NAME_RULE, is_valid_name

MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit seed
SHOWN = 60  # characters of a value an error message shows at most


def show(value) -> str:
    """A value as an error message shows it: its repr, cut to SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def is_finite(value) -> bool:
    """True for a number that is a finite float (an integer too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Range:
    """The values a hyperparameter may take beyond its type: numbers from `low` to `high` (None: no bound;
    `low_open`/`high_open`: the bound itself excluded) and, for one that takes a string, the strings
    among `choices` (empty: any string). Null and booleans are never range-checked."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()

    def admits(self, value) -> bool:
        """True when `value` is within the range (a number) or among the choices (a string)."""
        if isinstance(value, str):
            return not self.choices or value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True  # lists, mappings, null: their type is all that is checked
        if not is_finite(value):
            return False
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return low_ok and high_ok

    def describe(self, integer: bool = False) -> str:
        """The range in words: `an integer >= 1`, `a number in (0, 1]`, `'auto' or a number in [0, 1]`."""
        words = []
        if self.choices:
            listed = ", ".join(repr(c) for c in self.choices)
            words.append(f"one of {listed}" if len(self.choices) > 1 else listed)
        if self.low is not None or self.high is not None:
            words.append(f"{'an integer' if integer else 'a number'} {self._bounds()}")
        return " or ".join(words) or "any value of its type"

    def _bounds(self) -> str:
        fmt = lambda x: repr(x) if isinstance(x, float) and not float(x).is_integer() else str(int(x))  # noqa: E731
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{fmt(self.low)}, {fmt(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {fmt(self.low)}"
        return f"{'<' if self.high_open else '<='} {fmt(self.high)}"


def quoted_number(value) -> str:
    """` (a quoted string: write the number without quotes)` for a string that reads as a number, else ""."""
    if isinstance(value, str):
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return ""
        return " (a quoted string: write the number without quotes)" if math.isfinite(number) else ""
    return ""


class Validator:
    """Type and value checks whose errors all read `file: key: value ...; allowed: ...`."""

    def __init__(self, source: str, error: type[UserError] = UserError):
        self.source = source
        self.error = error

    def fail(self, key: str, message: str):
        """Raise the one-line error of `key`."""
        raise self.error(f"{self.source}: {key}: {message}")

    def mapping(self, value, key, allowed, required=()):
        """A mapping with keys among `allowed` and every `required` one."""
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping, got {show(value)}")
        for k in value:
            if k not in allowed:
                self.fail(f"{key}.{k}" if key != "(top level)" else str(k),
                          f"unknown key; allowed: {', '.join(allowed)}")
        for k in required:
            if k not in value:
                self.fail(f"{key}.{k}" if key != "(top level)" else k, "missing required key")

    def integer(self, value, key, minimum=None, maximum=None):
        """An integer (not a bool) within the given bounds, each bound named by its own message."""
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            self.fail(key, f"{show(value)} is too small; allowed: an integer >= {minimum}")
        if maximum is not None and value > maximum:
            self.fail(key, f"{show(value)} is too large; allowed: an integer <= {maximum}")
        return value

    def number(self, value, key, minimum=None, below=None):
        """A finite number (not a bool) >= minimum and < below, as a float."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {show(value)}{quoted_number(value)}")
        if not is_finite(value):
            self.fail(key, f"{show(value)} is not allowed; allowed: a finite number")
        if minimum is not None and value < minimum:
            self.fail(key, f"{show(value)} is out of range; allowed: >= {minimum}")
        if below is not None and value >= below:
            self.fail(key, f"{show(value)} is out of range; allowed: < {below}")
        return float(value)

    def in_range(self, value, key, allowed: Range, integer: bool = False, what: str = ""):
        """`value` if `allowed` admits it, else `value is out of range[ what]; allowed: <range>`."""
        if not allowed.admits(value):
            self.fail(key, f"{show(value)} is out of range{what}; allowed: {allowed.describe(integer)}"
                           f"{quoted_number(value)}")
        return value

    def within(self, value, key, kind: type, rule: str, ok):
        """An int (`kind` int) or a finite number (`kind` float, returned as a float) for which
        `ok(value)` holds; otherwise `value is out of range; allowed: <rule>`."""
        integer = kind is int
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            self.fail(key, f"expected {'an integer' if integer else 'a number'}, got {show(value)}")
        if not (integer or is_finite(value)) or not ok(value):
            self.fail(key, f"{show(value)} is out of range; allowed: {rule}")
        return value if integer else float(value)

    def string(self, value, key):
        """A string."""
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {show(value)}")
        return value

    def name(self, value, key):
        """A name usable in folders, file names, URLs and CLI filters (vocabulary.NAME_RULE)."""
        value = self.string(value, key)
        if not is_valid_name(value):
            self.fail(key, f"{show(value)} is not a valid name; allowed: {NAME_RULE}")
        return value

    def plain(self, value, key):
        """A JSON value (it is hashed into the run id): no dates, bytes, sets or NaN."""
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            self.fail(key, f"{show(value)} is not allowed; allowed: numbers, strings, booleans, "
                           "null and lists/mappings of them")
        return value

    def choice(self, value, key, allowed):
        """One of `allowed`."""
        if value not in allowed:
            self.fail(key, f"{show(value)} is not allowed; allowed: {', '.join(allowed)}")
        return value

    def nonempty_list(self, value, key):
        """A list with at least one item."""
        if not isinstance(value, list) or not value:
            self.fail(key, f"expected a non-empty list, got {show(value)}")
        return value
