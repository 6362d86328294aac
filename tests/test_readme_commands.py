"""The `cl-bench` commands of the READMEs' bash examples parse with the CLI as it is (flags and choices)."""
import re
import shlex
from pathlib import Path

import pytest
from conftest import ROOT

from harness.cli.parser import build_parser

PLACEHOLDERS = ("[", "|", "$", "<", ">", "...", "…")  # synopsis lines and shell redirections are not run as written


def bash_commands(path: Path) -> list[str]:
    """Each `cl-bench ...` line of the file's ```bash blocks (continuations joined, comments cut)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s|\s{2,}#", line)[0].strip()
            if line.startswith("cl-bench ") and not any(p in line for p in PLACEHOLDERS):
                out.append(line)
    return out


COMMANDS = [(name, c) for name in ("README.md", "submissions/README.md") for c in bash_commands(ROOT / name)]


def test_the_readmes_show_the_commands_this_issue_touched():
    shown = [c for _, c in COMMANDS]
    assert any(c.startswith("cl-bench report") and "--protocol" in c and "--out" in c for c in shown)
    assert any(c.startswith("cl-bench figures") and "--protocol" in c for c in shown)


@pytest.mark.parametrize("name,command", COMMANDS)
def test_a_readme_command_parses(name, command):
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:  # argparse's error exit: a flag or value the CLI does not take
        pytest.fail(f"{name}: {command!r} does not parse (exit {exc.code})")
