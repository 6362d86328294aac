"""Misbehaving methods (raise, NaN, hang past --run-timeout), the socket guard, hostile strings on the board."""
from __future__ import annotations

import copy
import json
import socket
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.config.specs import RunRecord
from harness.execution.store import load_records
from harness.outputs.site import build_site

from .conftest import tiny_protocol

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "records.json"


@pytest.mark.slow
def test_raising_nan_and_hanging_methods_become_records_and_the_board_shows_them(
        tmp_path, cli, bad_method_files):
    proto = tiny_protocol(tmp_path, methods=("naive", "raises", "nan", "hangs"), regimes=("head",))
    results = tmp_path / "res"
    method_flags = [x for f in bad_method_files.values() for x in ("--method", f)]
    code, out, err = cli("run", "--protocol", proto, "--results", results, "--no-progress", "--no-mlflow",
                             "--run-timeout", "8", *method_flags)
    assert code == 0, err
    assert "4 runs finished" in out and "1 diverged, 1 failed, 1 ok, 1 timeout" in out, out
    by_method = {r.spec.method: r.to_dict() for r in load_records(results, "tiny")}
    assert {m: r["status"] for m, r in by_method.items()} == {
        "naive": "ok", "raises": "failed", "nan": "diverged", "hangs": "timeout"}
    assert "RuntimeError: <b>boom</b>" in by_method["raises"]["error"]
    assert "training loss became nan" in by_method["nan"]["error"]
    assert "timed out after 8 s (--run-timeout)" in by_method["hangs"]["error"]
    index = (results / "tiny" / "site" / "index.html").read_text()
    for status in ("failed", "diverged", "timeout"):
        assert f'class="l bad">{status}</td>' in index
    assert "&lt;b&gt;boom&lt;/b&gt;" in index and "<b>boom" not in index


def test_socket_guard_blocks_outside_connections_and_allows_loopback(no_network):
    with pytest.raises(OSError, match="test socket guard"):
        socket.create_connection(("203.0.113.7", 80), timeout=1)  # TEST-NET-3: never routable
    assert no_network == [("203.0.113.7", 80)]
    no_network.clear()  # the attempt was this test's own; do not fail it at teardown
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=1)
    client.close()
    server.close()
    assert no_network == []


HOSTILE = {
    "label": '<script>alert("label")</script>',
    "method": "<img src=x onerror=alert('method')>",
    "error": '"><svg onload=alert(1)>',
    "hparam_key": "<iframe src=javascript:alert(2)>",
    "hparam_value": "</code><script>alert(3)</script>",
    "dataset": "npz:/data/<img src=x onerror=alert('ds')>.npz",
    "submission": "subs/<script>alert('sub')</script>.py",
    "diagnostic": "<marquee onstart=alert(4)>",
}


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.bad = []

    def handle_starttag(self, tag, attrs):
        if tag in ("img", "iframe", "marquee"):  # (the charts are inline <svg>)
            self.bad.append(tag)
        for name, value in attrs:
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.bad.append(f"{tag} {name}={value}")


def _hostile_records():
    records = json.loads(FIXTURE.read_text())
    evil = copy.deepcopy([r for r in records if r["status"] != "ok"][0])
    evil.update(run_id="evil00000000", error=HOSTILE["error"])
    evil["spec"].update(label=HOSTILE["label"], method=HOSTILE["method"],
                        hparams={HOSTILE["hparam_key"]: HOSTILE["hparam_value"]})
    evil["provenance"]["submission"] = {"file": HOSTILE["submission"], "sha256": "0" * 64}
    evil["diagnostics"] = {HOSTILE["diagnostic"]: [1.0, 2.0]}
    ok = copy.deepcopy([r for r in records if r["status"] == "ok"][0])
    ok["run_id"] = "evilds000000"
    ok["spec"]["dataset"]["name"] = HOSTILE["dataset"]
    ok["spec"]["hparams"] = {HOSTILE["hparam_key"]: HOSTILE["hparam_value"]}
    return [RunRecord.from_dict(r) for r in records + [evil, ok]]


def test_leaderboard_escapes_hostile_strings_from_records_and_submissions(tmp_path):
    out = tmp_path / "site"
    build_site(_hostile_records(), out)
    pages = list(out.rglob("*.html"))
    shown = {k: 0 for k in HOSTILE}
    for page in pages:
        html = page.read_text(encoding="utf-8")
        parser = _Tags()
        parser.feed(html)
        assert not parser.bad, (page.name, parser.bad)
        assert html.count("<script") <= 1, page.name  # only the sort script
        for key, value in HOSTILE.items():
            assert value not in html, (page.name, key)
            shown[key] += value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html \
                or value.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").replace("'", "&#39;") in html
    # every hostile string is shown (escaped) somewhere, not silently dropped
    assert all(shown[k] for k in ("label", "error", "dataset", "submission")), shown
