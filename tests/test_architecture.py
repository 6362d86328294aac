"""The layout as a contract: wings import only downwards, no module imports in a cycle, nobody
imports another module's private names, and the vocabulary and the CLI front stay torch-free.

Every import counts, also those inside functions: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent.parent / "harness"
# Bottom to top: a wing may import itself and the wings before it, never one after it.
WINGS = ("config", "api", "methods", "run", "execution", "analysis", "outputs", "service", "cli")
SHARED = {"harness", "harness.compat"}  # the package itself and the stack's quirks: anyone may import


def module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, known: dict) -> list[tuple[str, str, int]]:
    """(imported harness module, imported name or '', line) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "harness"]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            if target.split(".")[0] != "harness":
                continue
            for a in node.names:  # `from pkg import mod` imports a module, `from mod import name` a name
                sub = f"{target}.{a.name}"
                out.append((sub, "", node.lineno) if sub in known else (target, a.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {t for t, _, _ in imports(m, p, known) if t in known and t != m} for m, p in known.items()}


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def test_there_is_a_wing_for_every_module():
    loose = [m for m in modules() if wing(m) is None and m not in SHARED]
    assert not loose, f"modules outside the wings {WINGS}: {loose}"


def test_wings_import_only_downwards():
    g = graph()
    bad = []
    for m, targets in g.items():
        for t in targets:
            if t in SHARED or wing(m) is None:
                continue
            if WINGS.index(wing(t)) > WINGS.index(wing(m)):
                bad.append(f"{m} -> {t}")
    assert not bad, "imports against the layering " + " < ".join(WINGS) + ":\n" + "\n".join(sorted(bad))


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph (a list of nodes, first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for t in sorted(g.get(n, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_imports_another_modules_private_names():
    known = modules()
    bad = []
    for m, path in known.items():
        package = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for target, name, line in imports(m, path, known):
            leaf = target.rsplit(".", 1)[-1]
            # a private module may be imported within its own package (methods/_gpm_math.py)
            if _private(leaf) and target.rsplit(".", 1)[0] != package:
                bad.append(f"{path.name}:{line} imports private module {target}")
            if name and _private(name) and target != m:
                bad.append(f"{path.name}:{line} imports {target}.{name}")
        bad += _private_attribute_uses(m, path, known)
    assert not bad, "\n".join(bad)


def _private_attribute_uses(m: str, path: Path, known: dict) -> list[str]:
    """`mod._name` where `mod` is a name bound to another harness module by an import."""
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(m, path.name == "__init__.py", node)
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    aliases[a.asname] = a.name
    return [f"{path.name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and aliases[node.value.id] != m and _private(node.attr)]


def test_the_private_name_check_catches_both_forms(tmp_path, monkeypatch):
    fake = tmp_path / "harness"
    (fake / "run").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "run" / "__init__.py").write_text("")
    (fake / "run" / "a.py").write_text("def _hidden():\n    pass\n")
    (fake / "run" / "b.py").write_text("from . import a\nfrom .a import _hidden\na._hidden()\n")
    monkeypatch.setattr(sys.modules[__name__], "HARNESS", fake)
    with pytest.raises(AssertionError) as info:
        test_no_module_imports_another_modules_private_names()
    assert "imports harness.run.a._hidden" in str(info.value) and "uses harness.run.a._hidden" in str(info.value)


TORCH_FREE = ("harness.cli", "harness.cli.parser", "harness.cli.requests", "harness.cli.commands", "harness.service",
              "harness.config.vocabulary",
              "harness.config.protocol", "harness.config.specs", "harness.config.paths", "harness.api.index",
              "harness.api.plugins",
              "harness.analysis.tables", "harness.execution.store", "harness.execution.plan")


def test_vocabulary_cli_front_and_analysis_import_no_torch():
    code = ("import importlib, sys\n"
            f"for m in {TORCH_FREE!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'avalanche', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


TAMED = ("avalanche", "mlflow", "ray")  # what harness.compat must precede (HOME, warnings, telemetry)


def _compat_and_tamed_lines(m: str, path: Path) -> tuple[list[int], list[int]]:
    """Lines of the module-level imports of harness.compat and of the libraries it tames."""
    compat, tamed = [], []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(m, path.name == "__init__.py", node)
            names = [target, *(f"{target}.{a.name}" for a in node.names)]
        else:
            continue
        compat += [node.lineno] if "harness.compat" in names else []
        tamed += [node.lineno] if any(n.split(".")[0] in TAMED for n in names) else []
    return compat, tamed


def test_compat_is_imported_before_the_libraries_it_tames():
    """A module importing harness.compat does so above avalanche/mlflow/ray (an import sorter may not
    move it down: pyproject's isort section `quirks` keeps `import harness.compat` first)."""
    bad = []
    for m, path in modules().items():
        compat, tamed = _compat_and_tamed_lines(m, path)
        if compat and tamed and min(tamed) < min(compat):
            bad.append(f"{path.relative_to(HARNESS.parent)}:{min(tamed)} imports {TAMED} before harness.compat")
    assert not bad, "\n".join(bad)
