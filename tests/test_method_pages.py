"""Method pages of files equal built-ins': what a method file declares is recorded in every record at
run time (provenance["method"]) and shown from there, escaped, without importing the file; a dict
diagnostic is one table, per-task series under t1..tT aligned with scalars."""
from __future__ import annotations

import hashlib
import json
import textwrap
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import ROOT, record_from

from harness.analysis.diagnostics import diagnostic_tables
from harness.cli import main
from harness.execution.store import load_records, read_record
from harness.outputs.site import build_site, slug

METHOD = '''\
    """Docstring that DESCRIPTION overrides."""
    from avalanche.core import SupervisedPlugin

    NAME = "mine"
    DEFAULTS = {"strength": 0.5, "mode": "a"}
    HPARAM_TYPES = {"strength": (int, float)}
    DESCRIPTION = "Penalty <script>alert('x')</script> & replay."
    REFERENCE = "Doe & Roe, <i>Forgetting</i> (2024)"
    CAPTIONS = {"stats": "tracked per task", "gap": "one number per run"}


    class Diag(SupervisedPlugin):
        def harness_diagnostics(self):
            return {"stats": {"a": [1.0, 2.0, 3.0], "b": 0.5, "c": [4.0, 5.0, 6.0], "d": 7.0, "e": [0.125, 0.25, 0.375]},
                    "gap": 0.25}


    def build(ctx, strength, mode):
        from avalanche.training.supervised import Naive
        return Naive(**ctx.strategy_kwargs(Diag()))
    '''
PROTOCOL = """\
    name: tiny
    version: "1"
    datasets: [{name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}]
    regimes: [head]
    methods: [mine, naive]
    task_orders: {count: 1, seed: 0}
    seeds: [0]
    training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 64}
    """


class _Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (header row first), and each table's preceding <h3>."""

    def __init__(self):
        super().__init__()
        self.tables, self.heads, self._h3, self._cell, self._last_h3 = [], [], None, None, ""

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
            self.heads.append(self._last_h3)
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell = []
        elif tag == "h3":
            self._h3 = []
        elif tag == "h2":  # a new section: its tables belong to no diagnostic heading
            self._last_h3 = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "h3" and self._h3 is not None:
            self._last_h3, self._h3 = "".join(self._h3).strip(), None

    def handle_data(self, data):
        for part in (self._cell, self._h3):
            if part is not None:
                part.append(data)


def _tables(html: str) -> list[tuple[str, list[list[str]]]]:
    parser = _Tables()
    parser.feed(html)
    return list(zip(parser.heads, parser.tables))


def _cli(*argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:
        return exc.code


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """A results folder with one run of a method file (`run --method FILE`) and one of naive; its site."""
    folder = tmp_path_factory.mktemp("method-pages")
    method, proto = folder / "mine.py", folder / "tiny.yaml"
    method.write_text(textwrap.dedent(METHOD))
    proto.write_text(textwrap.dedent(PROTOCOL))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        code = _cli("run", "--protocol", proto, "--results", folder / "r", "--method", method,
                    "--no-progress", "--no-mlflow")
    assert code == 0
    return {"folder": folder, "method": method, "sha256": hashlib.sha256(method.read_bytes()).hexdigest(),
            "results": folder / "r", "site": folder / "r" / "tiny" / "site",
            "records": {r.spec.method: r for r in load_records(folder / "r", "tiny")}}


def _method_page(site: Path, name: str) -> str:
    return (site / f"method-{slug(name)}.html").read_text(encoding="utf-8")


def test_records_carry_the_method_metadata_without_changing_their_run_id(board):
    mine, naive = board["records"]["mine"], board["records"]["naive"]
    entry = mine.provenance["method"]
    assert entry["kind"] == "file" and entry["name"] == "mine" and entry["sha256"] == board["sha256"]
    assert entry["implementation"] == f"sha256:{board['sha256'][:16]}"  # the run id's identity, a prefix of it
    assert entry["source"] == str(board["method"].resolve())  # reproduce's hint, as before
    assert entry["description"] == "Penalty <script>alert('x')</script> & replay."  # stored as written
    assert entry["captions"] == {"stats": "tracked per task", "gap": "one number per run"}
    assert entry["hparams"] == {"strength": {"value": 0.5, "type": ["int", "float"]},
                                "mode": {"value": "a", "type": ["str"]}}
    assert mine.run_id == mine.spec.run_id and naive.run_id == naive.spec.run_id
    from harness.api.registry import get_registry

    builtin = get_registry()["naive"]
    assert naive.provenance["method"]["kind"] == "built-in" and "sha256" not in naive.provenance["method"]
    assert naive.provenance["method"]["description"] == builtin.description


def test_a_file_method_page_shows_what_the_file_declares_escaped(board):
    html = _method_page(board["site"], "mine")
    assert "Built-in adapter" not in html and '<span class="kind kind-file">submitted file</span>' in html
    assert "Penalty &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; replay." in html
    assert "<script>alert" not in html and "<i>Forgetting" not in html
    assert "Reference: Doe &amp; Roe, &lt;i&gt;Forgetting&lt;/i&gt; (2024)" in html
    assert f'<code class="sha">{board["sha256"]}</code>' in html and "<code>mine.py</code>" in html
    hparams = next(rows for _, rows in _tables(html) if rows and rows[0] == ["name", "value", "type"])
    assert hparams[1:] == [["mode", '"a"', "str"], ["strength", "0.5", "int | float"]]
    naive = _method_page(board["site"], "naive")
    assert '<span class="kind kind-built-in">built-in</span>' in naive and "implementation <code>v1</code>" in naive


def test_a_dict_diagnostic_is_one_table_with_scalars_beside_t1_to_tT(board):
    html = _method_page(board["site"], "mine")
    stats = [rows for head, rows in _tables(html) if head.startswith("stats")]
    assert len(stats) == 1  # before: five one-row tables, stats.a ... stats.e
    (rows,) = stats
    assert rows[0] == ["entry", "dataset", "regime", "runs", "value", "t1", "t2", "t3", ""]
    assert all(len(r) == len(rows[0]) for r in rows)  # every row aligned with the header
    body = {r[0]: r[4:8] for r in rows[1:]}  # value, t1, t2, t3: the values the method file returns
    assert body == {"a": ["", "1", "2", "3"], "b": ["0.500", "", "", ""], "c": ["", "4", "5", "6"],
                    "d": ["7", "", "", ""], "e": ["", "0.125", "0.250", "0.375"]}
    assert "stats · tracked per task" in [h for h, _ in _tables(html)]
    gap = next(rows for head, rows in _tables(html) if head.startswith("gap"))
    assert gap == [["dataset", "regime", "runs", "value"], ["digits", "head", "1", "0.250"]]


def test_the_run_page_aligns_scalar_and_per_task_diagnostics(board):
    rec = board["records"]["mine"]
    html = (board["site"] / "runs" / f"{slug(rec.run_id)}.html").read_text(encoding="utf-8")
    rows = next(rows for _, rows in _tables(html) if rows and rows[0][:3] == ["", "value", "t1"])
    assert rows[0] == ["", "value", "t1", "t2", "t3", ""] and all(len(r) == 6 for r in rows)
    assert ["stats.b", "0.5000", "", "", "", ""] in rows and ["stats.a", "", "1", "2", "3", ""] in rows


def test_the_board_is_rebuilt_without_the_method_file(board, tmp_path):
    """Nothing is imported: the page of a file that is gone (another lab's) still says what it is."""
    moved = tmp_path / "elsewhere.py"
    board["method"].rename(moved)
    try:
        out = tmp_path / "site"
        build_site(list(board["records"].values()), out)
        html = _method_page(out, "mine")
    finally:
        moved.rename(board["method"])
    assert "Penalty &lt;script&gt;" in html and board["sha256"] in html and "int | float" in html


def test_older_records_fall_back_to_what_is_known(board, tmp_path):
    mine, naive = board["records"]["mine"], board["records"]["naive"]
    old_mine = replace(mine, provenance={**mine.provenance, "method": {
        "implementation": mine.spec.method_version, "source": "/lab/mine.py"},
        "submission": {"file": "subs/mine.py", "sha256": board["sha256"]}})
    old_naive = replace(naive, provenance={**naive.provenance, "method": {"implementation": "v1", "source": "built-in"}})
    build_site([old_mine, old_naive], tmp_path / "site")
    html = _method_page(tmp_path / "site", "mine")
    assert "submitted file" in html and board["sha256"] in html and "<code>mine.py</code>" in html
    assert "Penalty" not in html and "recorded before records carried" in html
    from harness.api.registry import get_registry

    shown = _method_page(tmp_path / "site", "naive")
    assert "built-in" in shown and get_registry()["naive"].description in shown


def test_a_page_believes_the_run_id_not_the_provenance(board, tmp_path):
    """Another lab's record calling its file a built-in, or naming another file's hash, is not shown so."""
    mine = board["records"]["mine"]
    liar = replace(mine, provenance={**mine.provenance, "method": {
        **mine.provenance["method"], "kind": "built-in", "sha256": "ab" * 32}})
    build_site([liar], tmp_path / "site")
    html = _method_page(tmp_path / "site", "mine")
    assert "submitted file" in html and '<span class="kind kind-built-in">' not in html and "ab" * 32 not in html
    assert f"implementation <code>{mine.spec.method_version}</code>" in html


def _rewrite(path: Path, **method) -> Path:
    data = json.loads(path.read_text())
    data["provenance"]["method"] = {**data["provenance"]["method"], **method}
    out = path.parent.parent.parent / "copy" / "tiny" / "runs" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("bad, says", [
    ({"description": "x" * 2001}, "provenance.method.description"),
    ({"kind": "trusted"}, "provenance.method.kind"),
    ({"captions": {"k": ["not", "text"]}}, "provenance.method.captions"),
    ({"hparams": {"lr": {"value": 1, "type": "float"}}}, "provenance.method.hparams"),
    ({"hparams": {"lr": {"value": "x" * 20_000, "type": ["str"]}}}, "provenance.method.hparams"),
    ({"hparams": {"lr": {"value": 1, "type": ["int"] * 9}}}, "provenance.method.hparams"),
    ({"kind": "built-in"}, "says built-in but names a source file or sha256"),
    ({"sha256": "0" * 64}, "sha256 is not the code its implementation names"),
    ({"sha256": "<b>" * 20}, "sha256 is not 64 lowercase hex digits"),
])
def test_the_store_refuses_unbounded_or_ill_typed_method_metadata(board, bad, says):
    path = board["results"] / "tiny" / "runs" / f"{board['records']['mine'].run_id}.json"
    record, problem = read_record(_rewrite(path, **bad), "tiny")
    assert record is None and problem.kind == "corrupt" and says in problem.reason


def test_the_store_reads_an_older_records_method_entry(board):
    path = board["results"] / "tiny" / "runs" / f"{board['records']['mine'].run_id}.json"
    data = json.loads(path.read_text())
    data["provenance"]["method"] = {"implementation": data["spec"]["method_version"], "source": "/x/mine.py"}
    out = _rewrite(path)
    out.write_text(json.dumps(data))
    record, problem = read_record(out, "tiny")
    assert problem is None and record.provenance["method"]["source"] == "/x/mine.py"


def test_diagnostic_tables_average_each_entry_over_ok_runs():
    runs = [record_from({"diagnostics": {"s": {"x": [1.0, 3.0], "y": 2.0}}}),
            record_from({"diagnostics": {"s": {"x": [3.0, 5.0], "y": 4.0}}}),
            record_from({"status": "failed", "diagnostics": {"s": {"x": [99.0, 99.0], "y": 99.0}}})]
    (table,) = diagnostic_tables(runs, ["last-1"])
    assert table.key == "s" and table.scalars == frozenset({"s.y"}) and table.width == 2
    means = {d.name: d.rows[0] for d in table.series}
    assert means["s.x"].values == [2.0, 4.0] and means["s.y"].values == [3.0] and means["s.x"].n == 2


def test_an_entry_points_metadata_names_the_file_defining_it():
    from harness.api.contract import MethodAdapter
    from harness.run.provenance import method_provenance

    def build(ctx, lr=0.1):
        return None

    adapter = MethodAdapter("ep", {"lr": 0.1}, build, "from a package", source="entry point ep (pkg:ADAPTER)",
                            implementation="sha256:0123456789abcdef")
    entry = method_provenance(adapter, {"lr": 0.2}, adapter.source)
    assert entry["kind"] == "entry point" and entry["hparams"] == {"lr": {"value": 0.2, "type": ["float"]}}
    assert entry["sha256"] == hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    assert entry["description"] == "from a package" and entry["captions"] == {}


def test_each_kind_has_its_label_and_a_list_of_lists_is_one_table():
    from harness.outputs.site.method import about, diagnostic_view

    assert about("ep", {"kind": "entry point", "implementation": "v2", "description": "d"}, None, {})["label"] == \
        "entry point"
    assert about("f", {"implementation": "sha256:" + "0" * 16, "source": "/x/f.py"}, None, {})["label"] == \
        "submitted file"
    runs = [record_from({"diagnostics": {"norms": [[1.0, 2.0], [3.0, 4.0]]}})]
    (table,) = diagnostic_tables(runs, ["last-1"])
    view = diagnostic_view(table, {}, n_tasks=2)
    assert view["labels"] == ["t1", "t2"] and not view["has_value"]
    assert [(r["label"], r["values"]) for r in view["rows"]] == [("[0]", [1.0, 2.0]), ("[1]", [3.0, 4.0])]


def test_a_record_cannot_rewrite_a_built_ins_description(board, tmp_path):
    """A built-in's description and reference are the harness's own: another lab's record saying otherwise is
    not shown."""
    from harness.api.registry import get_registry

    naive = board["records"]["naive"]
    forged = replace(naive, provenance={**naive.provenance, "method": {
        **naive.provenance["method"], "description": "DEPRECATED and known buggy", "reference": "Nobody (2099)"}})
    relabelled = replace(naive, provenance={**naive.provenance, "method": {
        **forged.provenance["method"], "kind": "file"}})  # a version, not a hash: still this harness's built-in
    for i, record in enumerate((forged, relabelled)):
        build_site([record], tmp_path / f"site{i}")
        html = _method_page(tmp_path / f"site{i}", "naive")
        assert "DEPRECATED" not in html and "Nobody (2099)" not in html and "submitted file" not in html
        assert get_registry()["naive"].description in html
