"""User text on its way out: escaped for the terminal, defused for spreadsheets, and a rebuilt
site that drops the pages of records that are gone without touching the user's own files."""
import csv
import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
from conftest import fixture_records

from harness.analysis.frame import format_summary, records_to_frame
from harness.cli import one_line
from harness.config.specs import RunRecord
from harness.config.text import spreadsheet_safe, terminal_safe
from harness.outputs import site
from harness.outputs.export import export_table
from harness.outputs.site import build_site, slug

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
FORMULAS = {"A": '=HYPERLINK("http://x")', "B": "+1", "C": "-cmd", "D": "@SUM(A1)"}


def _raw():
    return json.loads(FIXTURE.read_text())


def _records(raw):
    return [RunRecord.from_dict(r) for r in raw]


# ------------------------------------------------------------------ terminal

@pytest.mark.parametrize("ch, escaped", [
    ("\x1b", "\\x1b"), ("\n", "\\n"), ("\r", "\\r"), ("\x7f", "\\x7f"), ("\u202e", "\\u202e"),
    ("\u2066", "\\u2066"), ("\u2069", "\\u2069"), ("\u200e", "\\u200e"), ("\u200f", "\\u200f"),
    ("\u200d", "\\u200d"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")])
def test_terminal_safe_escapes_control_format_and_separator_characters(ch, escaped):
    assert terminal_safe(f"a{ch}b") == f"a{escaped}b"


def test_terminal_safe_keeps_printable_text():
    text = "café 中文 α-β naïve ±1 [x] \\x1b"
    assert terminal_safe(text) == text
    assert terminal_safe(3.5) == "3.5"


def test_one_line_is_unchanged_for_controls_and_now_escapes_bidi():
    def old(text):  # one_line before format characters were added
        return "".join(ch.encode("unicode_escape").decode() if unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                       else ch for ch in text)

    controls = "".join(map(chr, [*range(32), *range(127, 160), 0x2028, 0x2029])) + "plain é"
    assert one_line(controls) == old(controls)
    assert one_line("evil\u202etxt.exe") == "evil\\u202etxt.exe"


def test_summary_escapes_labels_and_stays_aligned():
    raw = _raw()
    for r in raw:
        if r["spec"]["label"] == "A":
            r["spec"]["label"] = "\x1b[2J\x1b[31mRED\u202eA"
        if r["spec"]["regime"] == "full":
            r["spec"]["regime"] = "full\u2066x"
        r["spec"]["dataset"]["name"] = "toy\nline"
    text = format_summary(records_to_frame(_records(raw)))
    assert not [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")]
    assert "dataset: toy\\nline" in text
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("method"))
    assert "full\\u2066x" in header
    rows = lines[lines.index(header) + 1:]
    assert any(ln.startswith("\\x1b[2J\\x1b[31mRED\\u202eA ") for ln in rows)
    for col in ("head", "last-1", "full\\u2066x"):  # every cell starts under its column's name
        at = header.index(col)
        assert all(ln[at - 2:at] == "  " and ln[at] in "0123456789-" for ln in rows), col


# ------------------------------------------------------------------ spreadsheets

@pytest.mark.parametrize("value, expected", [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-cmd", "'-cmd"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\tx", "'\tx"), ("\rx", "'\rx"), ("plain", "plain"), ("", ""), ("a=b", "a=b"),
    (-0.5, -0.5), (-3, -3), (None, None), (True, True)])
def test_spreadsheet_safe(value, expected):
    assert spreadsheet_safe(value) == expected and type(spreadsheet_safe(value)) is type(expected)


def _formula_records():
    raw = _raw()
    for r in raw:
        r["spec"]["label"] = FORMULAS[r["spec"]["label"]]
    raw[0]["metrics"]["forgetting"] = -0.25
    return _records(raw)


def _column(path: Path, name: str) -> list[str]:
    rows = list(csv.reader(path.open(newline="")))
    return [row[rows[0].index(name)] for row in rows[1:]]


def test_export_csv_defuses_formulas_and_keeps_numbers(tmp_path):
    out = export_table(_formula_records(), "csv", tmp_path / "runs.csv")
    assert set(_column(out, "method")) == {"'" + v for v in FORMULAS.values()}
    assert "-0.25" in _column(out, "forgetting")
    assert _column(out, "bwt")[0].startswith("-0.01")  # a negative number is not a formula


def test_export_parquet_keeps_raw_labels(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = export_table(_formula_records(), "parquet", tmp_path / "runs.parquet")
    assert set(pd.read_parquet(out)["method"]) == set(FORMULAS.values())


def test_site_csv_defuses_formulas_and_json_keeps_raw(tmp_path):
    build_site(_formula_records(), tmp_path)
    runs = tmp_path / "data" / "runs.csv"
    assert set(_column(runs, "method")) == {"'" + v for v in FORMULAS.values()}
    assert "-0.25" in _column(runs, "forgetting")
    data = json.loads(runs.with_suffix(".json").read_text())
    assert {r["method"] for r in data} == set(FORMULAS.values())
    for f in (tmp_path / "data").glob("*.csv"):  # no table of the site starts a cell with a formula
        for row in csv.reader(f.open(newline="")):
            assert not [c for c in row if c and c[0] in "=+-@\t\r" and not _number(c)], f.name


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ site rebuilds

def _split():
    records = fixture_records(FIXTURE)
    keep = [r for r in records if r.method != "D"]
    gone = [r for r in records if r.method == "D"]
    return records, keep, gone


def _run_page(out: Path, rec) -> Path:
    return out / "runs" / f"{slug(rec.run_id)}.html"


def test_rebuild_removes_what_the_last_build_wrote_and_nothing_else(tmp_path):
    records, keep, gone = _split()
    build_site(records, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "runs" / "mine.html").write_text("<p>mine</p>")
    (tmp_path / "data" / "mine.csv").write_text("a,b\n")
    assert all(_run_page(tmp_path, r).exists() for r in gone)

    build_site(keep, tmp_path)
    assert not any(_run_page(tmp_path, r).exists() for r in gone)
    assert all(_run_page(tmp_path, r).exists() for r in keep)
    assert not (tmp_path / f"method-{slug('D')}.html").exists()
    assert not (tmp_path / "data" / f"method-{slug('D')}.csv").exists()
    assert (tmp_path / "index.html").exists() and (tmp_path / f"method-{slug('A')}.html").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "runs" / "mine.html").exists() and (tmp_path / "data" / "mine.csv").exists()
    listed = set(json.loads((tmp_path / ".cl-bench-site.json").read_text())["files"])
    on_disk = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert listed == on_disk - {".cl-bench-site.json", "notes.txt", "runs/mine.html", "data/mine.csv"}


def test_rebuild_keeps_a_site_file_the_user_changed(tmp_path):
    records, keep, gone = _split()
    build_site(records, tmp_path)
    edited = _run_page(tmp_path, gone[0])
    edited.write_text("<p>my annotated copy</p>")
    build_site(keep, tmp_path)
    assert edited.read_text() == "<p>my annotated copy</p>"
    assert not _run_page(tmp_path, gone[1]).exists()


def test_a_tampered_manifest_cannot_delete_outside_the_folder(tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    files = {"../victim.txt": digest, str(victim): digest, "runs/../../victim.txt": digest}
    (out / ".cl-bench-site.json").write_text(json.dumps({"files": files}))
    build_site(fixture_records(FIXTURE), out)
    assert victim.read_text() == "keep me"


def test_a_damaged_manifest_is_ignored(tmp_path):
    (tmp_path / ".cl-bench-site.json").write_text("{not json")
    assert build_site(fixture_records(FIXTURE), tmp_path).exists()
    assert json.loads((tmp_path / ".cl-bench-site.json").read_text())["files"]


def test_a_failed_build_deletes_nothing_and_the_next_one_prunes(tmp_path, monkeypatch):
    records, keep, gone = _split()
    build_site(records, tmp_path)

    def boom(*args, **kwargs):
        raise RuntimeError("template broke")

    with monkeypatch.context() as m:
        m.setattr(site.run, "page", boom)
        with pytest.raises(RuntimeError):
            build_site(keep, tmp_path)
    assert all(_run_page(tmp_path, r).exists() for r in gone)
    build_site(keep, tmp_path)
    assert not any(_run_page(tmp_path, r).exists() for r in gone)
