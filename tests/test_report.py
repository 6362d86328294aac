"""Paper tables (`cl-bench report`): cells against numbers computed from the records, bold = column
best, LaTeX / Markdown escaping, credible marks exactly where the Bayesian table says, the CLI."""
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import fixture_records

from harness.analysis import stats
from harness.analysis.tables import analyse
from harness.outputs.report import md_escape, report_latex, report_markdown, tex_escape

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
REGIMES = ["head", "last-1", "full"]  # the fixture's depth order
CELL = re.compile(r"^(\*\*)?(-?\d+\.\d) ± (\d+\.\d)(\*\*)?(‡)?(?: ⚑(\d+))?$")
TEX_CELL = re.compile(r"^(\\textbf\{)?(-?\d+\.\d) \$\\pm\$ (\d+\.\d)\}?(?:\\textsuperscript\{(\\ddag)?(?:\\dag(\d+))?\})?$")


@pytest.fixture(scope="module")
def records():
    return fixture_records(FIXTURE)


@pytest.fixture(scope="module")
def base_tables(records):
    return analyse(records)


@pytest.fixture
def tables(base_tables):
    """The analysis result; a test edits it with dataclasses.replace (inject a bayes frame, flag a cell)."""
    return base_tables


def raw_cells(metric: str) -> dict:
    """(method label, regime) -> (mean, half-width) in percent, straight from the fixture's JSON."""
    values = {}
    for d in json.loads(FIXTURE.read_text()):
        if d["status"] == "ok":
            values.setdefault((d["spec"]["label"], d["spec"]["regime"]), []).append(d["metrics"][metric])
    out = {}
    for key, v in values.items():
        mean, lo, hi = stats.bootstrap_means(np.array(v, float)[:, None])
        out[key] = (100 * float(np.mean(v)), 100 * (hi[0] - lo[0]) / 2)
        assert abs(mean[0] - np.mean(v)) < 1e-12
    return out


def md_tables(text: str) -> list[dict]:
    """Every Markdown table of a report: {"header": [...], "rows": {label: [cell, ...]}}."""
    out, current = [], None
    for line in text.splitlines():
        if not line.startswith("| "):
            current = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if current is None:
            current = {"header": cells, "rows": {}}
            out.append(current)
        elif not set(cells[0]) <= set("-:"):
            current["rows"][cells[0]] = cells[1:]
    return out


def md_cell(text: str) -> dict:
    m = CELL.match(text)
    assert m, text
    return {"mean": float(m[2]), "half": float(m[3]), "bold": bool(m[1]) and bool(m[4]),
            "credible": bool(m[5]), "flagged": int(m[6] or 0)}


def tex_tables(text: str) -> list[dict]:
    """Every tabular of a LaTeX report: header and body rows split on unescaped '&'."""
    out = []
    for block in re.findall(r"\\toprule\n(.*?)\\bottomrule", text, re.S):
        head, body = block.split("\\midrule\n")
        split = lambda line: [c.strip() for c in re.split(r"(?<!\\)&", line.removesuffix(r" \\"))]  # noqa: E731
        rows = [split(line) for line in body.strip().splitlines()]
        out.append({"header": split(head.strip()), "rows": {r[0]: r[1:] for r in rows}})
    return out


def tex_cell(text: str) -> dict:
    m = TEX_CELL.match(text)
    assert m, text
    return {"mean": float(m[2]), "half": float(m[3]), "bold": bool(m[1]), "credible": bool(m[4]),
            "flagged": int(m[5] or 0)}


# ------------------------------------------------------------------ cells and bold


@pytest.mark.parametrize("fmt", ["markdown", "latex"])
def test_every_cell_is_the_mean_and_ci_half_width_of_the_records(tables, fmt):
    text = report_markdown(tables) if fmt == "markdown" else report_latex(tables)
    parsed = md_tables(text) if fmt == "markdown" else tex_tables(text)
    parse = md_cell if fmt == "markdown" else tex_cell
    assert len(parsed) == 2  # ACC, then forgetting
    for table, metric in zip(parsed, ("acc", "forgetting")):
        assert table["header"][1:] == REGIMES
        want = raw_cells(metric)
        assert sorted(table["rows"]) == ["A", "B", "C", "D"]
        for method, cells in table["rows"].items():
            for regime, text_cell in zip(REGIMES, cells):
                got, (mean, half) = parse(text_cell), want[(method, regime)]
                assert got["mean"] == pytest.approx(round(mean, 1)), (method, regime)
                assert got["half"] == pytest.approx(round(half, 1), abs=0.051), (method, regime)
    # one cell by hand: head / A, ACC orders 0.90 0.92 0.91 0.93
    assert parse(parsed[0]["rows"]["A"][0])["mean"] == 91.5


@pytest.mark.parametrize("fmt", ["markdown", "latex"])
def test_bold_cells_are_the_column_best(tables, fmt):
    text = report_markdown(tables) if fmt == "markdown" else report_latex(tables)
    parsed = md_tables(text) if fmt == "markdown" else tex_tables(text)
    parse = md_cell if fmt == "markdown" else tex_cell
    for table, best in zip(parsed, (max, min)):  # ACC: highest; forgetting: lowest
        for j in range(len(REGIMES)):
            col = {m: parse(cells[j]) for m, cells in table["rows"].items()}
            top = best(c["mean"] for c in col.values())
            assert {m for m, c in col.items() if c["bold"]} == {m for m, c in col.items() if c["mean"] == top}
    acc = {regime: {m: parse(cells[j]) for m, cells in parsed[0]["rows"].items()} for j, regime in enumerate(REGIMES)}
    assert [m for m, c in acc["head"].items() if c["bold"]] == ["A"]
    assert [m for m, c in acc["last-1"].items() if c["bold"]] == ["B"]
    assert [m for m, c in acc["full"].items() if c["bold"]] == ["C"]
    # forgetting that differs between methods: the lowest is bold (the fixture's forgetting ties everywhere)
    m = tables.methods
    tables = replace(tables, methods=m.assign(forgetting=m["acc"] / 10, forgetting_lo=m["acc"] / 10,
                                              forgetting_hi=m["acc"] / 10))
    text = report_markdown(tables) if fmt == "markdown" else report_latex(tables)
    forgetting = (md_tables(text) if fmt == "markdown" else tex_tables(text))[1]
    assert [m for m, cells in forgetting["rows"].items() if parse(cells[0])["bold"]] == ["D"]


def test_caption_says_orders_and_what_plus_minus_means(tables):
    md, tex = report_markdown(tables), report_latex(tables)
    assert "mean over 4 task orders" in md and "± is half the width of the 95% percentile bootstrap CI" in md
    assert r"\caption{Dataset toy: ACC (\%), mean over 4 task orders" in tex
    assert r"$\pm$ is half the width of the 95\% percentile bootstrap CI" in tex
    for cmd in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert tex.count(cmd) == 2


def test_missing_cells_stay_missing(tables):
    m = tables.methods
    tables = replace(tables, methods=m[~((m["method"] == "D") & (m["regime"] == "full"))])
    assert md_tables(report_markdown(tables))[0]["rows"]["D"][2] == "—"
    assert tex_tables(report_latex(tables))[0]["rows"]["D"][2] == "---"


def test_other_metric_comes_first_and_forgetting_only_once(tables):
    assert "**AIA (%)**" in report_markdown(tables, metric="aia")
    assert len(md_tables(report_markdown(tables, metric="forgetting"))) == 1
    with pytest.raises(ValueError, match="metric 'nope'"):
        report_markdown(tables, metric="nope")


# ------------------------------------------------------------------ escaping


def test_labels_are_escaped(records):
    nasty, ds = "a_b&c%", "t#y_{1}~^$x\\"
    recs = [replace(r, spec=replace(r.spec, label=nasty)) if r.spec.label == "A" else r for r in records]
    tables = analyse(recs)
    tables = replace(tables, methods=tables.methods.assign(dataset=ds), runs=tables.runs.assign(dataset=ds))
    tex = report_latex(tables)
    assert r"a\_b\&c\%" in tex and nasty not in tex
    assert r"t\#y\_\{1\}\textasciitilde{}\textasciicircum{}\$x\textbackslash{}" in tex
    for table in tex_tables(tex):
        assert table["rows"][r"a\_b\&c\%"] and all(len(r) == 3 for r in table["rows"].values())
    assert tex.count("{") == tex.count("}")
    md = report_markdown(tables)
    assert r"a\_b\&c%" in md and md_tables(md)[0]["rows"][r"a\_b\&c%"]
    assert tex_escape("x--y") == "x-{}-y" and tex_escape("p<q|r") == r"p\textless{}q\textbar{}r"
    assert md_escape("x|y*z\n") == r"x\|y\*z\\n"


def test_a_pipe_in_a_label_does_not_add_a_column(records):
    recs = [replace(r, spec=replace(r.spec, label="x|y")) if r.spec.label == "B" else r for r in records]
    rows = md_tables(report_markdown(analyse(recs)))[0]["rows"]
    assert len(rows[r"x\|y"]) == 3


# ------------------------------------------------------------------ marks


def bayes(*rows) -> pd.DataFrame:
    """A hand-made tables.bayes: (regime, method_1, method_2, decision) per row, dataset toy."""
    return pd.DataFrame([{"dataset": "toy", "regime": rg, "method_1": a, "method_2": b, "n_blocks": 4,
                          "diff": 0.0, "p_1": 0.0, "p_rope": 0.0, "p_2": 0.0, "rope": 0.01, "decision": d}
                         for rg, a, b, d in rows])


def marks(tables) -> tuple[set, set]:
    """(cells with the credible mark in Markdown, the same in LaTeX) of the ACC table."""
    md = md_tables(report_markdown(tables))[0]
    tex = tex_tables(report_latex(tables))[0]
    got = [{(m, REGIMES[j]) for m, cells in t["rows"].items() for j, c in enumerate(cells) if parse(c)["credible"]}
           for t, parse in ((md, md_cell), (tex, tex_cell))]
    return got[0], got[1]


def test_credible_mark_exactly_where_the_decision_names_the_best(tables):
    tables = replace(tables, bayes=bayes(
        ("head", "B", "A", "method_2"),     # A best, B runner-up: decided for A -> mark
        ("last-1", "A", "B", "equal"),      # B best, A runner-up: practically equal -> no mark
        ("full", "B", "C", "method_1"),     # C best, B runner-up: decided for B (not the best) -> no mark
        ("full", "A", "C", "method_2"),     # C over A, but A is not the runner-up -> no mark
    ))
    assert marks(tables) == ({("A", "head")}, {("A", "head")})
    md, tex = report_markdown(tables), report_latex(tables)
    assert "‡: credibly better than the regime's runner-up" in md and "ROPE 1 ACC point" in md
    assert r"\textsuperscript{\ddag}: credibly better" in tex
    assert md.count("‡") == 2  # the cell and the legend; the forgetting table has no marks


def test_credible_mark_needs_a_decision(tables):
    assert marks(replace(tables, bayes=bayes(("head", "B", "A", "undecided"), ("full", "B", "C", "method_2")))) \
        == ({("C", "full")}, {("C", "full")})
    assert marks(replace(tables, bayes=bayes(("head", "A", "B", "undecided")))) == (set(), set())
    assert marks(replace(tables, bayes=tables.bayes.iloc[:0])) == (set(), set())


def test_the_legend_quotes_the_analysis_settings(records):
    md = report_markdown(analyse(records, rope=2.5))
    assert "(Bayesian signed-rank test over paired task orders, ROPE 2.5 ACC points, P ≥ 0.95)." in md


def test_the_analysis_bayes_table_marks_clear_winners(tables):
    # the fixture's head and full columns are won by 5 points in every order; last-1 by 1 point in 3 of 4
    assert marks(tables) == ({("A", "head"), ("C", "full")},) * 2


def test_flagged_cells_are_marked_with_their_count(tables):
    m = tables.methods
    tables = replace(tables, methods=m.assign(n_flagged=np.where((m["method"] == "B") & (m["regime"] == "full"), 2, 0)))
    md, tex = report_markdown(tables), report_latex(tables)
    assert md_cell(md_tables(md)[0]["rows"]["B"][2])["flagged"] == 2
    assert tex_cell(tex_tables(tex)[0]["rows"]["B"][2])["flagged"] == 2
    assert sum(md_cell(c)["flagged"] for cells in md_tables(md)[0]["rows"].values() for c in cells) == 2
    assert "⚑N: N runs of the cell have learning-check warnings" in md
    assert r"\textsuperscript{\dag{}N}: N runs" in tex


# ------------------------------------------------------------------ CLI


def write_results(folder: Path, records) -> Path:
    """A results folder of valid records: the fixture's, with metrics, warnings and run ids recomputed."""
    from harness.config.metrics import all_metrics, step_forgetting
    from harness.config.specs import SCHEMA_VERSION, run_id_of
    from harness.execution.store import runs_dir, write_record
    from harness.run.checks import run_warnings

    for r in records:
        norms = dict(r.update_norms)
        if r.ok:
            norms["step_forgetting"] = step_forgetting(np.asarray(r.acc_matrix, float))
        r = replace(r, metrics=all_metrics(r.acc_matrix, r.init_acc) if r.ok else {}, update_norms=norms,
                    warnings=run_warnings(r.acc_matrix, r.checks, r.spec.scenario), schema_version=SCHEMA_VERSION)
        write_record(runs_dir(folder, r.spec.protocol), replace(r, run_id=run_id_of(r.spec.to_dict())))
    return folder


@pytest.fixture(scope="module")
def results(records, tmp_path_factory):
    return write_results(tmp_path_factory.mktemp("results"), records)


def test_report_command_prints_the_report_of_the_folder(results, capsys):
    from harness.cli import main
    from harness.execution.store import load_records

    assert main(["report", "--results", str(results), "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert captured.out == report_markdown(analyse(load_records(results)))
    assert "protocol toy-proto version 1: 48 records" in captured.err  # notes off stdout


def test_report_command_writes_latex_to_out(results, tmp_path, capsys):
    from harness.cli import main

    out = tmp_path / "paper" / "tables.tex"
    assert main(["report", "--results", str(results), "--format", "latex", "--out", str(out), "--rope", "0.5",
                 "--metric", "aia"]) == 0
    text = out.read_text()
    assert text.startswith("% cl-bench report") and r"\caption{Dataset toy: AIA (\%)" in text
    assert "ROPE 0.5 ACC points" not in text  # the credible mark is about ACC: no legend on an AIA table
    assert f"report: 48 records -> {out}" in capsys.readouterr().out
    assert main(["report", "--results", str(results), "--format", "markdown", "--out", str(out),
                 "--rope", "0.5"]) == 0
    assert "ROPE 0.5 ACC points" in out.read_text()  # --rope reached the analysis


@pytest.mark.parametrize("argv,expected", [
    (["--results", "{missing}", "--format", "latex"], "cl-bench: error: --results: no records found under"),
    (["--results", "{results}", "--format", "html"], "argument --format: invalid choice: 'html'"),
    (["--results", "{results}", "--format", "latex", "--rope", "-1"],
     "argument --rope: expected a finite number > 0 of ACC points, got '-1'"),
    (["--results", "{results}", "--format", "latex", "--rope", "nan"], "argument --rope: expected a finite number"),
    (["--results", "{results}", "--format", "latex", "--rope", "1e999"], "argument --rope: expected a finite number"),
    (["--results", "{results}", "--format", "latex", "--metric", "speed"], "argument --metric: invalid choice"),
    (["--results", "{results}"], "the following arguments are required: --format"),
    (["--results", "{results}", "--format", "latex", "--protocol", "other"],
     "--results: no records found under"),
], ids=["bad-folder", "format", "rope-negative", "rope-nan", "rope-inf", "metric", "no-format", "protocol"])
def test_report_command_bad_input_is_one_line_and_exit_2(results, tmp_path, capsys, argv, expected):
    from harness.cli import main

    argv = [a.format(results=results, missing=tmp_path / "nope") for a in argv]
    assert main(["report", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert expected in captured.err and "Traceback" not in captured.err


def test_report_command_refuses_two_protocols(results, records, tmp_path, capsys):
    import shutil

    from harness.cli import main

    two = tmp_path / "two"
    shutil.copytree(results, two)
    other = [replace(r, spec=replace(r.spec, protocol="other-proto")) for r in records[:4]]
    write_results(two, other)
    assert main(["report", "--results", str(two), "--format", "latex"]) == 2
    err = capsys.readouterr().err
    assert "--protocol: 2 protocols found" in err and "add --protocol NAME" in err
    assert main(["report", "--results", str(two), "--protocol", "other-proto", "--format", "latex"]) == 0


def test_the_report_and_the_figures_do_not_load_the_site():
    # They need only `slug` and the number formats (outputs/formatting.py), not jinja2 and the site's templates.
    import subprocess
    import sys

    code = ("import sys, harness.outputs.report, harness.outputs.figures\n"
            "print(sorted(m for m in ('jinja2', 'harness.outputs.site') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
