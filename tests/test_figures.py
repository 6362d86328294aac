"""Paper figures (`cl-bench figures`): the files per dataset, byte-identical reruns, legends outside
the axes, regime names on the x axis, p-values as printed, the CLI."""
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import fixture_records

from harness.analysis.tables import analyse
from harness.outputs import figures
from harness.outputs.figures import write_figures
from harness.outputs.formatting import slug

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
KINDS = ("rank-shift", "tau", "norm-forgetting", "curves", "acc-forgetting")
REGIMES = ["head", "last-1", "full"]
MAGIC = {"pdf": b"%PDF-", "png": b"\x89PNG\r\n\x1a\n"}


@pytest.fixture(scope="module")
def records():
    return fixture_records(FIXTURE)


@pytest.fixture(scope="module")
def tables(records):
    return analyse(records)


@pytest.fixture(scope="module")
def written(tables, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    logged = []
    paths = write_figures(tables, out, log=logged.append)
    return out, paths, logged


def test_every_figure_is_written_in_both_formats(written):
    out, paths, logged = written
    want = {f"{slug('toy')}-{kind}.{fmt}" for kind in KINDS for fmt in ("pdf", "png")}
    assert {p.name for p in paths} == want == {p.name for p in out.iterdir()}
    assert logged == paths  # one line per file, as it is written
    for p in paths:
        data = p.read_bytes()
        assert len(data) > 1000 and data.startswith(MAGIC[p.suffix[1:]]), p.name


def test_the_same_tables_give_byte_identical_files(tables, written, tmp_path):
    """Also under other caller rcParams: the figures start from matplotlib's defaults plus RC."""
    import matplotlib

    out, paths, _ = written
    with matplotlib.rc_context({"font.size": 20, "lines.linewidth": 5, "axes.grid": False}):
        again = write_figures(tables, tmp_path)
        assert matplotlib.rcParams["font.size"] == 20  # the caller's settings are back afterwards
    assert [p.name for p in again] == [p.name for p in paths]
    different = [p.name for p in again if p.read_bytes() != (out / p.name).read_bytes()]
    assert not different  # PDF and PNG: no timestamp, no version, fixed rcParams
    for p in paths:  # what would differ between two runs a second apart, or two matplotlib versions
        data = p.read_bytes()
        assert (b"/CreationDate" not in data) if p.suffix == ".pdf" else (b"Software" not in data), p.name


def drawn_regime_names(ax) -> list[str]:
    """The regime names figures drew over ax (text tagged gid "regime-name"), left to right."""
    texts = [t for t in ax.texts if t.get_gid() == "regime-name"]
    return [t.get_text() for t in sorted(texts, key=lambda t: t.get_position()[0])]


def test_without_curves_the_curve_figure_is_skipped(tables, monkeypatch, tmp_path):
    partial = replace(tables, curves=tables.curves.iloc[:0])
    assert figures.curves(partial, "toy") is None
    monkeypatch.setattr(figures, "_save", lambda fig, stem, formats, log: [stem])  # drawing, not saving
    names = {p.name for p in write_figures(partial, tmp_path)}
    assert names == {f"{slug('toy')}-{kind}" for kind in KINDS if kind != "curves"}


def test_unknown_format_is_refused(tables, tmp_path):
    with pytest.raises(ValueError, match="'svg' is not one of pdf, png"):
        write_figures(tables, tmp_path, formats=("svg",))


def _legend_clear_of_axes(fig) -> bool:
    fig.canvas.draw()  # constrained layout places the legend on draw
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_label() != "<colorbar>"]
    return bool(fig.legends) and all(not leg.get_window_extent(renderer).overlaps(b)
                                     for leg in fig.legends for b in boxes)


@pytest.mark.parametrize("kind", ["rank-shift", "norm-forgetting", "curves", "acc-forgetting"])
def test_legends_sit_outside_every_panel(tables, kind):
    fig = figures.FIGURES[kind](tables, "toy")
    assert _legend_clear_of_axes(fig)
    assert all(ax.get_legend() is None for ax in fig.axes)


@pytest.mark.parametrize("kind", ["rank-shift", "acc-forgetting"])
def test_regime_axes_show_regime_names_in_depth_order(tables, kind):
    fig = figures.FIGURES[kind](tables, "toy")
    ax = fig.axes[-1]
    assert drawn_regime_names(fig.axes[0]) == REGIMES  # over the top panel, at their trainable fraction
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "trainable fraction (log scale)"
    assert all(a.get_ylabel() for a in fig.axes[:1])


def test_regime_axis_falls_back_to_names_without_fractions(tables):
    runs = tables.runs.assign(trainable_fraction=float("nan"))
    bare = replace(tables, runs=runs, regimes=tables.regimes.assign(fraction=float("nan")))
    ax = figures.rank_shift(bare, "toy").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == REGIMES and ax.get_xscale() == "linear"


def test_rank_shift_plots_each_methods_mean_rank(tables):
    fig = figures.rank_shift(tables, "toy")
    ax = fig.axes[0]
    lines = {c.get_label(): c.lines[0] for c in ax.containers}  # one errorbar per method
    m = tables.methods
    want = m[m["method"] == "B"].set_index("regime")["mean_rank"]
    assert sorted(lines) == ["A", "B", "C", "D"]
    assert list(lines["B"].get_ydata()) == [want[r] for r in REGIMES]
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # rank 1 on top


def test_tau_cells_print_tau_p_and_small_p_as_below_a_thousandth(tables):
    tau = tables.tau.copy()
    tau.loc[(tau["regime_a"] == "head") & (tau["regime_b"] == "last-1"), "p"] = 0.0002
    texts = [t.get_text() for t in figures.tau_heatmap(replace(tables, tau=tau), "toy").axes[0].texts]
    assert "τ=0.67\np < 0.001\nn=4" in texts  # head / last-1
    assert "τ=0.67\np = 0.333\nn=4" in texts   # last-1 / head keeps its own p
    assert "τ=-1.00\np = 0.333\nn=3" in texts and "τ=1.00\nn=4" in texts  # the diagonal has no p


def test_scatter_has_one_point_per_ok_run(tables):
    fig = figures.norm_forgetting(tables, "toy")
    counts = [sum(len(c.get_offsets()) for c in ax.collections) for ax in fig.axes]
    assert counts == [16, 16, 15]  # D's run in (full, order 2) failed
    assert [ax.get_title().split(" ")[0] for ax in fig.axes] == REGIMES


def test_dollar_signs_in_labels_are_text_not_mathtext(records):
    label = r"a$\alpha_{$b"  # as mathtext: a syntax error when drawn
    recs = [replace(r, spec=replace(r.spec, label=label)) if r.spec.label == "A" else r for r in records]
    tables = analyse(recs)
    for draw in figures.FIGURES.values():
        draw(tables, "toy").canvas.draw()
    legend = figures.rank_shift(tables, "toy").legends[0]
    assert label in [t.get_text().replace("\\$", "$") for t in legend.get_texts()]


# ------------------------------------------------------------------ CLI


@pytest.fixture(scope="module")
def results(records, tmp_path_factory):
    from test_report import write_results

    return write_results(tmp_path_factory.mktemp("results"), records)


def test_figures_command_prints_one_line_per_file(results, tmp_path, capsys):
    from harness.cli import main

    out = tmp_path / "figs"
    assert main(["figures", "--results", str(results), "--out", str(out), "--format", "png"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("figures: ")]
    files = [out / f"{slug('toy')}-{kind}.png" for kind in KINDS]
    assert lines == [f"figures: {f}" for f in files]
    assert all(f.read_bytes().startswith(MAGIC["png"]) for f in files)


@pytest.mark.parametrize("argv,expected", [
    (["--results", "{missing}", "--out", "{out}"], "cl-bench: error: --results: no records found under"),
    (["--results", "{results}", "--out", "{out}", "--format", "pdf,svg"],
     "argument --format: expected a comma-separated list of pdf, png, got 'pdf,svg'"),
    (["--results", "{results}", "--out", "{out}", "--format", ","], "argument --format: expected"),
    (["--results", "{results}"], "the following arguments are required: --out"),
], ids=["bad-folder", "format", "empty-format", "no-out"])
def test_figures_command_bad_input_is_one_line_and_exit_2(results, tmp_path, capsys, argv, expected):
    from harness.cli import main

    argv = [a.format(results=results, missing=tmp_path / "nope", out=tmp_path / "o") for a in argv]
    assert main(["figures", *argv]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert expected in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "o").exists()
