"""Static site build on the fixture records: pages parse, links resolve, strings are escaped."""
import copy
import csv
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest

from harness.config.specs import RunRecord
from harness.outputs import charts
from harness.outputs.site import build_site, slug

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
XSS = "<script>alert(1)</script>"


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.scripts = [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for k in ("href", "src"):
            if a.get(k):
                self.links.append(a[k])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    raw = json.loads(FIXTURE.read_text())
    for r in raw:  # B and C are BECAME and MagMax runs: their adapters caption the diagnostics
        r["spec"]["method"] = {"b": "became", "c": "magmax"}.get(r["spec"]["method"], r["spec"]["method"])
    evil = copy.deepcopy(raw[0])
    evil["run_id"] = "evil00000000"
    evil["spec"]["label"] = XSS
    evil["provenance"]["hostname"] = XSS
    records = [RunRecord.from_dict(r) for r in raw + [evil]]
    out = tmp_path_factory.mktemp("site")
    index = build_site(records, out, results_dir="results")
    return out, index


def test_index_returned(site):
    out, index = site
    assert index == out / "index.html" and index.exists()


def test_expected_pages_exist(site):
    out, _ = site
    assert (out / f"dataset-{slug('toy')}.html").exists()
    for m in ("A", "B", "C", "D", XSS):
        assert (out / f"method-{slug(m)}.html").exists()
    assert len(list((out / "runs").glob("*.html"))) == 49


def test_every_page_parses_and_links_resolve(site):
    out, _ = site
    pages = list(out.rglob("*.html"))
    assert len(pages) > 50
    for page in pages:
        p = _Links()
        p.feed(page.read_text(encoding="utf-8"))
        p.close()
        assert p.scripts <= 1, page  # only the sort script
        for link in p.links:
            u = urlparse(link)
            assert not u.scheme and not u.netloc, f"{page}: external link {link}"
            target = (page.parent / u.path).resolve()
            assert target.exists(), f"{page}: broken link {link}"


def test_strings_from_records_are_escaped(site):
    out, _ = site
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    seen = 0
    for page in out.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert XSS not in html, page
        seen += escaped in html
    assert seen >= 3  # overview, dataset, method and the run page all show it


def test_downloads_are_valid_csv_and_json(site):
    out, _ = site
    files = list((out / "data").glob("*.csv"))
    assert files
    for f in files:
        rows = list(csv.reader(f.open()))
        data = json.loads(f.with_suffix(".json").read_text())
        assert len(rows) - 1 == len(data)


def test_run_page_shows_reproduce_command_and_failure(site):
    out, _ = site
    html = (out / "runs" / f"{slug('fuD200000000')}.html").read_text()
    assert "cl-bench reproduce fuD200000000 --results results" in html
    assert "RuntimeError: boom" in html and "failed" in html


def test_method_page_shows_diagnostics(site):
    out, _ = site
    b = (out / f"method-{slug('B')}.html").read_text()
    assert "BECAME merge coefficient" in b
    c = (out / f"method-{slug('C')}.html").read_text()
    assert "sign conflicts among the task vectors" in c and "task_vector_norms" in c


def test_dataset_page_reports_exclusion(site):
    out, _ = site
    html = (out / f"dataset-{slug('toy')}.html").read_text()
    assert "excluded" in html and "Kendall" in html and "CD =" in html


def test_empty_records_still_build(tmp_path):
    index = build_site([], tmp_path)
    assert index.exists()


def test_pages_inline_the_static_files_and_colour_tags_by_class(site):
    out, _ = site
    static = Path(__file__).parent.parent / "leaderboard" / "static"
    css, js = (static / "site.css").read_text(), (static / "site.js").read_text()
    pages = [out / "index.html", out / f"dataset-{slug('toy')}.html", out / f"method-{slug('B')}.html",
             out / "runs" / f"{slug('fuD200000000')}.html"]
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert css in html and js in html, page.name  # one self-contained file: opens alone from file://
        assert ' style="' not in html, page.name  # classes, not inline styles
    html = pages[1].read_text(encoding="utf-8")
    rules = dict(re.findall(r"\.(rg-[a-z0-9-]+) \{ background:(#[0-9a-f]+); \}", html))
    tags = re.findall(r'<span class="tag (rg-[a-z0-9-]+)"[^>]*>([^<]+)</span>', html)
    colours = charts.regime_colours(["head", "last-1", "full"])  # the fixture's regimes, smallest first
    assert len(tags) > 3 and all(rules[cls] == colours[regime] for cls, regime in tags)


def test_regime_colour_rules_take_hex_colours_only():
    from harness.outputs.site.templates import regime_css

    assert regime_css({"head": "#f4a259"}) == f".rg-{slug('head')} {{ background:#f4a259; }}\n"
    with pytest.raises(ValueError, match="not a hex colour"):
        regime_css({"head": "red; } body { display:none"})  # the value lands in a <style> block
