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


def test_parser_is_importable_without_torch():
    import subprocess
    import sys

    code = "import sys, harness.cli; harness.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("argv", [["leaderboard"], ["run", "--protocol", "smoke"], ["report", "--format", "latex"]])
def test_rope_flag_parses_in_acc_points(argv):
    from harness.cli.requests import request_from_args

    assert request_from_args(build_parser().parse_args(argv)).rope == 1.0
    assert request_from_args(build_parser().parse_args([*argv, "--rope", "0.25"])).rope == 0.25
    from harness.cli.parser import UsageError

    with pytest.raises(UsageError, match="--rope: expected a finite number > 0"):
        build_parser().parse_args([*argv, "--rope", "0"])


def test_report_and_figures_requests():
    from harness.cli.requests import FiguresRequest, ReportRequest, request_from_args

    req = request_from_args(build_parser().parse_args(
        ["report", "--results", "r", "--format", "latex", "--out", "t.tex", "--metric", "aia", "--include-flagged"]))
    assert req == ReportRequest(results="r", format="latex", out="t.tex", metric="aia", include_flagged=True)
    req = request_from_args(build_parser().parse_args(["figures", "--out", "f", "--format", "png,PDF,png"]))
    assert req == FiguresRequest(out="f", formats=("png", "pdf"))
    assert request_from_args(build_parser().parse_args(["figures", "--out", "f"])).formats == ("pdf", "png")


def test_leaderboard_passes_rope_to_the_site(monkeypatch, tmp_path):
    from harness.cli import commands
    from harness.execution import store, views
    from harness.outputs import site

    seen = {}
    monkeypatch.setattr(store, "load_records", lambda *a, **k: ["record"])
    monkeypatch.setattr(views, "view_records", lambda recs, *a, **k: recs)
    monkeypatch.setattr(site, "build_site", lambda recs, out, **kw: seen.update(kw) or out / "index.html")
    (tmp_path / "proto" / "runs").mkdir(parents=True)
    assert main(["leaderboard", "--results", str(tmp_path), "--rope", "0.5"]) == 0
    assert seen["rope"] == 0.5
    commands.build_leaderboard(tmp_path, "proto", out=str(tmp_path), rope=2.0)
    assert seen["rope"] == 2.0


def test_report_passes_rope_to_the_analysis(monkeypatch, tmp_path, capsys):
    from harness.analysis import tables
    from harness.cli import commands

    seen = {}

    class Stop(Exception):
        pass

    monkeypatch.setattr(commands, "paper_records", lambda *a, **k: ["record"])
    monkeypatch.setattr(tables, "analyse", lambda recs, **kw: seen.update(kw) or (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        main(["report", "--results", str(tmp_path), "--format", "markdown", "--rope", "0.75", "--include-flagged"])
    assert seen == {"include_flagged": True, "rope": 0.75}
