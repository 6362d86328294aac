"""The CLI's front door: help with examples, listings, one-line errors with exit code 2."""
import pytest

from harness.cli import build_parser, main


@pytest.mark.parametrize("command", ["run", "list", "leaderboard"])
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
        ("name", "version", "description", "scenario", "pretrain", "datasets", "regimes", "methods",
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
