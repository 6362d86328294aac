"""The CLI's front door: help with examples, listings, one-line errors with exit code 2."""
import pytest

from harness.cli import build_parser, main


@pytest.mark.parametrize("command", ["run", "list", "leaderboard", "report", "figures"])
def test_every_command_has_help_with_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_top_level_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("run", "list", "leaderboard"):
        assert command in out


BAD_ARGS = [
    (["run"], "the following arguments are required: --protocol"),
    (["run", "--protocol", "smoke", "--jobs", "0"], "--jobs: expected a positive integer, got '0'"),
    (["run", "--protocol", "smoke", "--jobs", "two"], "expected a positive integer, got 'two'"),
    (["run", "--protocol", "smoke", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["run", "--protocol", "smoke", "--orders", "5"], "--orders: 5 is out of range; allowed: 1..2"),
    (["run", "--protocol", "smoke", "--methods", "naive,foo"], "--methods: 'foo' is not in protocol 'smoke'; allowed: naive, lwf"),
    (["run", "--protocol", "smoke", "--datasets", ","], "expected a comma-separated list"),
    (["run", "--protocol", "no-such-protocol"], "unknown protocol 'no-such-protocol'"),
    (["run", "--protocol", "missing.yaml"], "missing.yaml: no such protocol file"),
    (["run", "--protocol", "smoke", "--method", "nope.py"], "nope.py: no such method file"),
    (["list", "gizmos"], "invalid choice: 'gizmos'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["leaderboard", "--results", "/nonexistent/results"], "no records found under /nonexistent/results"),
    (["leaderboard", "--rope", "-0.5"], "--rope: expected a finite number > 0 of ACC points, got '-0.5'"),
    (["leaderboard", "--rope", "one"], "--rope: expected a finite number > 0 of ACC points, got 'one'"),
    (["run", "--protocol", "smoke", "--rope", "inf"], "--rope: expected a finite number > 0 of ACC points, got 'inf'"),
    (["report", "--results", "/nonexistent/results", "--format", "latex"],
     "--results: no records found under /nonexistent/results"),
    (["report", "--format", "latex", "--rope", "nan"], "--rope: expected a finite number > 0 of ACC points"),
    (["report", "--format", "pdf"], "--format: invalid choice: 'pdf'"),
    (["figures", "--results", "/nonexistent/results", "--out", "/nonexistent/figs"],
     "--results: no records found under /nonexistent/results"),
    (["figures", "--out", "figs", "--format", "svg"], "--format: expected a comma-separated list of pdf, png"),
]


@pytest.mark.parametrize("argv,expected", BAD_ARGS, ids=[" ".join(a[0]) for a in BAD_ARGS])
def test_bad_arguments_give_one_line_and_exit_2(argv, expected, capsys, monkeypatch):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert expected in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_bad_protocol_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: 1\ndatasets: [digits]\nregimes: [head]\nmethods: [naive]\nepochs: 3\n")
    assert main(["run", "--protocol", str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"cl-bench: error: {bad}: epochs: unknown key; allowed: " + ", ".join(
        ("name", "version", "description", "scenario", "pretrain", "plugins", "datasets", "regimes", "methods",
         "task_orders", "seeds", "training", "evaluation", "resources"))


def test_list_shows_registered_names(capsys, monkeypatch):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("depth-sweep-mini", "digits", "mnist1d", "cifar100", "ewc-online", "last-k"):
        assert name in out


def test_parser_is_importable_without_torch_or_the_service_wing():
    import subprocess
    import sys

    # `--help` needs the parser only: the service wing (dataclasses by the dozen) would slow it
    code = ("import sys, harness.cli; harness.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'harness.service', 'harness.service.requests') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _requests():
    from harness import service

    return [(["run", "--protocol", "p"], service.SweepRequest("p")),
            (["submit", "f.py", "--protocol", "p"], service.SubmitRequest("f.py", service.SweepRequest(
                "p", method_files=("f.py",)))),
            (["check", "f.py"], service.CheckRequest("f.py")),
            (["list"], service.ListRequest()),
            (["leaderboard"], service.LeaderboardRequest()),
            (["export"], service.ExportRequest()),
            (["report", "--format", "markdown"], service.ReportRequest(format="markdown")),
            (["figures", "--out", "figures"], service.FiguresRequest()),
            (["reproduce", "0123456789ab"], service.ReproduceRequest("0123456789ab"))]


def test_the_parser_and_the_requests_agree_on_every_default():
    from harness.cli.requests import request_from_args

    for argv, expected in _requests():
        assert request_from_args(build_parser().parse_args(argv)) == expected, argv


def test_every_flag_reaches_a_field_of_its_request():
    """A flag whose dest names no request field would be parsed and then dropped."""
    import argparse
    from dataclasses import fields

    from harness.cli.requests import REQUESTS
    from harness.service import SweepRequest

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(REQUESTS)
    for command, parser in sub.choices.items():
        names = {f.name for f in fields(REQUESTS[command])}
        if command == "submit":
            names |= {f.name for f in fields(SweepRequest)}
        dests = {a.dest for a in parser._actions if a.dest != "help"}
        assert dests <= names, (command, dests - names)


def test_the_library_api_plans_a_dry_run_without_printing(tmp_path, capsys, monkeypatch):
    from conftest import ROOT

    from harness import service

    monkeypatch.chdir(ROOT)
    lines = []
    outcome = service.run(service.SweepRequest("smoke", results=str(tmp_path), dry_run=True), log=lines.append)
    assert capsys.readouterr().out == ""
    assert outcome.exit_code == 0 and outcome.result is None and outcome.site is None
    assert outcome.plan.counts()["total"] == len(outcome.plan.todo) == 8
    assert "grid: 1 datasets x 2 regimes x 2 methods x 2 task orders x 1 seeds = 8 runs" in lines[0]
    sections = service.list(service.ListRequest("datasets"))
    assert [s.name for s in sections] == ["datasets"] and "digits" in next(iter(sections[0].lines))


@pytest.mark.parametrize("argv", [["leaderboard"], ["run", "--protocol", "smoke"], ["report", "--format", "latex"]])
def test_rope_flag_parses_in_acc_points(argv):
    from harness.cli.requests import request_from_args

    assert request_from_args(build_parser().parse_args(argv)).rope == 1.0
    assert request_from_args(build_parser().parse_args([*argv, "--rope", "0.25"])).rope == 0.25
    from harness.config.errors import UsageError

    with pytest.raises(UsageError, match="--rope: expected a finite number > 0"):
        build_parser().parse_args([*argv, "--rope", "0"])


def test_report_and_figures_requests():
    from harness.cli.requests import request_from_args
    from harness.service import FiguresRequest, ReportRequest

    req = request_from_args(build_parser().parse_args(
        ["report", "--results", "r", "--format", "latex", "--out", "t.tex", "--metric", "aia", "--include-flagged"]))
    assert req == ReportRequest(results="r", format="latex", out="t.tex", metric="aia", include_flagged=True)
    req = request_from_args(build_parser().parse_args(["figures", "--out", "f", "--format", "png,PDF,png"]))
    assert req == FiguresRequest(out="f", formats=("png", "pdf"))
    assert request_from_args(build_parser().parse_args(["figures", "--out", "f"])).formats == ("pdf", "png")


def test_leaderboard_passes_rope_to_the_site(monkeypatch, tmp_path):
    from harness import service
    from harness.execution import store, views
    from harness.outputs import site

    seen = {}
    monkeypatch.setattr(store, "load_records", lambda *a, **k: ["record"])
    monkeypatch.setattr(views, "view_records", lambda recs, *a, **k: recs)
    monkeypatch.setattr(site, "build_site", lambda recs, out, **kw: seen.update(kw) or out / "index.html")
    (tmp_path / "proto" / "runs").mkdir(parents=True)
    assert main(["leaderboard", "--results", str(tmp_path), "--rope", "0.5"]) == 0
    assert seen["rope"] == 0.5
    service.build_leaderboard(tmp_path, "proto", out=str(tmp_path / "proto" / "site"), rope=2.0)
    assert seen["rope"] == 2.0


def test_report_passes_rope_to_the_analysis(monkeypatch, tmp_path, capsys):
    from harness.analysis import tables
    from harness.service import records

    seen = {}

    class Stop(Exception):
        pass

    monkeypatch.setattr(records, "paper_records", lambda *a, **k: ["record"])
    monkeypatch.setattr(tables, "analyse", lambda recs, **kw: seen.update(kw) or (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        main(["report", "--results", str(tmp_path), "--format", "markdown", "--rope", "0.75", "--include-flagged"])
    assert seen == {"include_flagged": True, "rope": 0.75}
