"""One formatting module: p-values, percentages, CIs and the best-as-printed rule, as every output prints them."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from harness.config.numbers import is_number
from harness.outputs.formatting import (
    MISSING,
    best_as_printed,
    fraction_text,
    half_width,
    mean_ci,
    num,
    p_eq,
    p_text,
    percent,
    rope_text,
)


@pytest.mark.parametrize("p, text", [(0.0, "< 0.001"), (0.00049, "< 0.001"), (0.0009999, "< 0.001"),
                                     (0.001, "0.001"), (0.0625, "0.062"), (0.3333, "0.333"), (1.0, "1.000"),
                                     (float("nan"), "—"), (None, "—"), (True, "—")])
def test_p_values_in_a_cell(p, text):
    assert p_text(p) == text


@pytest.mark.parametrize("p, text", [(0.0002, "< 0.001"), (0.5, "= 0.500"), (float("nan"), "n/a"), (None, "n/a")])
def test_p_values_after_a_p(p, text):
    assert p_eq(p) == text


def test_numbers_percentages_and_cis():
    assert (num(0.12345), num(0.12345, 1), num(float("inf")), num("x")) == ("0.123", "0.1", MISSING, MISSING)
    assert (percent(0.9234), percent(92.34, scale=1.0), percent(None)) == ("92.3", "92.3", MISSING)
    assert mean_ci(92.34, 1.25) == "92.3 ± 1.2"  # 1.25 is 1.25 in binary: ties go to even
    assert mean_ci(92.34, 1.26, tex=True) == r"92.3 $\pm$ 1.3"
    assert mean_ci(92.34, float("nan"), tex=True) == r"92.3 $\pm$ ---"


def test_best_is_decided_as_printed():
    # 91.04 and 91.0 print alike: both best; 90.96 prints as 91.0 too; 90.94 does not.
    values = {"a": 91.04, "b": 91.0, "c": 90.96, "d": 90.94, "e": None, "f": float("nan")}
    assert best_as_printed(values, higher_is_better=True) == {"a", "b", "c"}
    assert best_as_printed(values, higher_is_better=False) == {"d"}
    assert best_as_printed({"a": 0.5004, "b": 0.5}, True, digits=3) == {"a", "b"}
    assert best_as_printed({"a": 0.5006, "b": 0.5}, True, digits=3) == {"a"}
    assert best_as_printed({"e": None}, True) == frozenset()


def test_outputs_print_p_values_through_the_one_module():
    # No output module restates the p-value rule (a literal "< 0.001" or "<0.001").
    outputs = Path(__file__).resolve().parent.parent / "harness" / "outputs"
    found = [p.name for p in outputs.glob("*.py") if p.name != "formatting.py"
             and re.search(r"<\s?0\.001", p.read_text(encoding="utf-8"))]
    assert not found, found


HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _sources(skip: set[str] = frozenset()) -> list[tuple[str, str]]:
    """(path under harness/, text) of every harness module but the ones named in skip."""
    return [(str(p.relative_to(HARNESS)), p.read_text(encoding="utf-8")) for p in sorted(HARNESS.rglob("*.py"))
            if str(p.relative_to(HARNESS)) not in skip]


@pytest.mark.parametrize("x, number", [(1, True), (0.5, True), (np.float64(2.0), True), (-3, True),
                                       (float("nan"), False), (float("inf"), False), (None, False), (True, False),
                                       ("1.0", False), ([1.0], False)])
def test_what_counts_as_a_number(x, number):
    assert is_number(x) is number


def test_the_finite_number_check_is_defined_once():
    # Written out again (a bool test next to isfinite), it could drift from config/numbers.py.
    check = re.compile(r"isinstance\(\w+, bool\)[^\n]*isfinite|isfinite[^\n]*isinstance\(\w+, bool\)")
    found = [path for path, text in _sources({"config/numbers.py"}) if check.search(text)]
    assert not found and check.search((HARNESS / "config" / "numbers.py").read_text()), found


def test_outputs_spell_missing_values_and_fixed_point_numbers_through_the_one_module():
    # An em dash or "n/a" literal, or a fixed-point format spec, outside formatting.py restates a spelling.
    spelled = re.compile(r"""["'](—|n/a)["']|:\.\d+f\}""")
    found = [path for path, text in _sources({"outputs/formatting.py"}) if path.startswith("outputs/")
             and spelled.search(text)]
    assert not found, found
    assert spelled.search('label = "n/a"') and spelled.search('f"{x:.2f}"') and spelled.search("else '—'")


@pytest.mark.parametrize("f, text", [(1.0, "100%"), (0.05, "5.0%"), (0.0012, "0.12%"), (0.000123, "0.012%"),
                                     (0.0, "0%"), (float("nan"), MISSING), (None, MISSING)])
def test_trainable_fractions_print_with_two_significant_digits(f, text):
    assert fraction_text(f) == text


def test_half_width_of_a_ci():
    assert half_width(0.90, 0.94) == pytest.approx(0.02) and half_width(0.90, 0.94, 100.0) == pytest.approx(2.0)
    assert half_width(None, 0.9) is None and half_width(0.9, float("nan")) is None
    assert mean_ci(92.0, half_width(0.90, 0.94, 100.0)) == "92.0 ± 2.0" and mean_ci(92.0, None) == "92.0 ± —"


def test_the_ci_half_width_is_computed_in_one_place():
    # A CI's upper bound minus something (r["acc_hi"] - ..., r[k ~ '_hi'] - ...) in a view-model or template.
    computed = re.compile(r"""_hi["'\])]*\s*-\s*[^,;\n]{0,30}_lo""")
    templates = HARNESS.parent / "leaderboard" / "templates"
    found = [path for path, text in _sources({"outputs/formatting.py"}) if computed.search(text)]
    found += [p.name for p in sorted(templates.glob("*.html")) if computed.search(p.read_text(encoding="utf-8"))]
    assert not found, found
    assert computed.search("""(r[k ~ '_hi'] - r[k ~ '_lo']) / 2""") and computed.search("""(r["acc_hi"] - r["acc_lo"])""")


@pytest.mark.parametrize("points, text", [(1.0, "ROPE 1 ACC point"), (1, "ROPE 1 ACC point"),
                                          (0.5, "ROPE 0.5 ACC points"), (0.25, "ROPE 0.25 ACC points")])
def test_the_rope_sentence(points, text):
    assert rope_text(points) == text


def test_the_rope_and_the_credible_level_are_written_once_in_the_outputs():
    # Templates receive rope_text and credible_level; the report calls rope_text.
    templates = HARNESS.parent / "leaderboard" / "templates"
    restated = re.compile(r"ROPE \{|ACC point\{|[≥=] 0\.95|reach 0\.95")
    found = [path for path, text in _sources({"outputs/formatting.py"}) if path.startswith("outputs/")
             and restated.search(text)]
    found += [p.name for p in sorted(templates.glob("*.html")) if restated.search(p.read_text(encoding="utf-8"))]
    assert not found, found
    assert all(restated.search(t) for t in ('f"ROPE {rope:g}', "ROPE {{ rp|num(1) }}", "P ≥ 0.95 in both", "reach 0.95)"))
