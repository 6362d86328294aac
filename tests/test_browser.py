"""Real browser: headless Chromium renders every page type of the leaderboard at 1280 px.

Per page type (overview, a data-set page, BECAME's method page, a run page): no console
errors, no horizontal overflow of the page, no box that clips its content, no chart label
outside its SVG, no overlapping end labels, and every "SVG" button yields a parseable SVG file.
The measurements come from a script injected into a copy of the page, which writes them into
document.title; `--dump-dom` reads them back. A screenshot per page type is saved under the
test's folder (and copied to $CL_BENCH_SCREENSHOTS when set).
"""
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from test_site_pages import rich_records

from harness.outputs.site import build_site, slug

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)
WIDTH = 1280
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
# Runs on load: measures layout, then clicks every SVG button with the download stubbed out.
MEASURE = """<script>
window.addEventListener("load", function () {
  var de = document.documentElement, out = {sw: de.scrollWidth, iw: window.innerWidth, clipped: [],
    svg_text: [], overlaps: [], charts: document.querySelectorAll("figure.chart svg").length};
  var heads = document.querySelectorAll("h1, h2, h3, summary");
  function name(el) {  // tag.class under "the heading above it"
    var h = "";
    heads.forEach(function (x) { if (x.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) h = x.textContent.trim().slice(0, 40); });
    return el.tagName.toLowerCase() + (typeof el.className === "string" && el.className ? "." + el.className.trim().split(/\\s+/).join(".") : "") + ' under "' + h + '"';
  }
  document.querySelectorAll("body *").forEach(function (el) {
    if (el.closest("svg") || el.tagName === "PRE") return;  // a <pre> scrolls inside its own box by design
    var ox = getComputedStyle(el).overflowX;
    if ((ox === "auto" || ox === "scroll" || ox === "hidden") && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1)
      out.clipped.push(name(el) + " " + el.scrollWidth + ">" + el.clientWidth);
  });
  document.querySelectorAll("figure.chart svg").forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    svg.querySelectorAll("text").forEach(function (t) {
      var r = t.getBoundingClientRect();
      if (r.width && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1))
        out.svg_text.push(t.textContent.slice(0, 40));
    });
    var labels = Array.prototype.map.call(svg.querySelectorAll("text.end-label"), function (t) { return [t.textContent, t.getBoundingClientRect()]; });
    labels.forEach(function (a, i) { labels.slice(i + 1).forEach(function (b) {
      var x = Math.min(a[1].right, b[1].right) - Math.max(a[1].left, b[1].left), y = Math.min(a[1].bottom, b[1].bottom) - Math.max(a[1].top, b[1].top);
      if (x > 1 && y > 2) out.overlaps.push(a[0] + " / " + b[0]);
    }); });
  });
  var blobs = [], create = URL.createObjectURL, click = HTMLAnchorElement.prototype.click;
  URL.createObjectURL = function (b) { blobs.push(b); return "blob:stub"; };
  HTMLAnchorElement.prototype.click = function () {};
  var buttons = document.querySelectorAll("button.svg-dl");
  buttons.forEach(function (b) { b.click(); });
  URL.createObjectURL = create; HTMLAnchorElement.prototype.click = click;
  out.buttons = buttons.length;
  Promise.all(blobs.map(function (b) { return b.text(); })).then(function (texts) {
    out.downloads = texts.filter(function (t) {
      var d = new DOMParser().parseFromString(t, "image/svg+xml");
      return d.documentElement.nodeName === "svg" && !d.getElementsByTagName("parsererror").length;
    }).length;
    document.title = "CLB" + JSON.stringify(out);
  });
});
</script>"""


def _chromium(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def _console_errors(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if "Uncaught" in ln or "console" in ln.lower()]


def measure(page: Path, extra: str = "") -> tuple[dict, list[str]]:
    """Layout measurements of a page at 1280 px (and its console errors); extra: HTML injected too."""
    probe = page.with_name(f"__probe-{page.name}")
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", f"{extra}{MEASURE}</body>"), encoding="utf-8")
    try:
        proc = _chromium([f"--window-size={WIDTH},2000", "--virtual-time-budget=3000", "--dump-dom",
                          probe.resolve().as_uri()])
    finally:
        probe.unlink()
    found = re.search(r"<title>CLB(.*?)</title>", proc.stdout, re.S)
    assert found, (proc.stdout[-500:], proc.stderr[-2000:])
    return json.loads(html.unescape(found.group(1))), _console_errors(proc.stderr)


def screenshot(page: Path, png: Path, height: int = 2400) -> list[str]:
    """Save a screenshot of page at 1280 px wide; returns the console errors."""
    proc = _chromium([f"--window-size={WIDTH},{height}", f"--screenshot={png}", page.resolve().as_uri()])
    assert png.exists(), proc.stderr[-2000:]
    return _console_errors(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser-site")
    build_site(rich_records(), out)
    return out


def _pages(out: Path) -> dict[str, Path]:
    return {"overview": out / "index.html", "dataset": out / f"dataset-{slug('toy')}.html",
            "method-became": out / f"method-{slug('B')}.html",
            "run": out / "runs" / f"{slug('classil00000')}.html"}


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/ensure-chromium.sh installs it)")


@needs_chromium
@pytest.mark.parametrize("kind", ["overview", "dataset", "method-became", "run"])
def test_page_fits_1280px_without_console_errors(site, kind, tmp_path):
    from PIL import Image

    page = _pages(site)[kind]
    m, errors = measure(page)
    assert not errors, errors
    assert m["sw"] <= m["iw"] == WIDTH, m
    assert not m["clipped"], m["clipped"]
    assert not m["svg_text"], m["svg_text"]
    assert not m["overlaps"], m["overlaps"]
    assert m["charts"] and m["buttons"] == m["charts"] == m["downloads"], m
    png = tmp_path / f"{kind}.png"
    assert not screenshot(page, png)
    if os.environ.get("CL_BENCH_SCREENSHOTS"):
        Path(os.environ["CL_BENCH_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(os.environ["CL_BENCH_SCREENSHOTS"]) / png.name)
    img = Image.open(png).convert("L")
    non_white = sum(img.histogram()[:245])
    assert non_white > 0.02 * img.width * img.height  # text, tables and charts, not a blank page


@needs_chromium
def test_the_measurement_catches_an_element_wider_than_the_window(site):
    m, _ = measure(_pages(site)["overview"], '<div style="width:3000px;height:4px;background:#000"></div>')
    assert m["sw"] > m["iw"], m
    m, _ = measure(_pages(site)["overview"], '<div class="card" style="width:300px"><table><tr><td>'
                                             + "x" * 400 + "</td></tr></table></div>")
    assert any("card" in c for c in m["clipped"]), m
