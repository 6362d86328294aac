"""Where method and plug-in code comes from: only from what the user names, never from a record.

A record (and the results folder it came in) is data. `reproduce` takes its method and plug-in
files from `--method`/`--plugin`, installed entry points and built-ins, checks a named file's hash
against the record's implementation before importing it, and never imports a path the record
writes. Every file is read by one loader that refuses what is not a regular `.py` file before
opening it; a method label `--methods` could not choose is refused at load.
"""
from __future__ import annotations

import ast
import hashlib
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import make_spec

from harness.config.errors import ProtocolError
from harness.config.specs import failed_record
from harness.execution.store import write_record

from .conftest import REPO, deadline, tiny_protocol

# Imported, it leaves a marker file; it is a valid method file, so a loader that imports it goes on to run it.
PAYLOAD = '''
    from pathlib import Path

    Path({marker!r}).write_text("imported")
    from harness.api.contract import MethodAdapter


    def build(ctx):
        from avalanche.training.supervised import Naive
        return Naive(**ctx.strategy_kwargs())


    ADAPTERS = (MethodAdapter({name!r}, {{}}, build, "a payload"),)
    '''


def _implementation(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _payload(folder: Path, marker: Path, name: str = "evil") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(PAYLOAD.format(marker=str(marker), name=name)))
    return path


def _forge(results: Path, *, method: str = "naive", version: str = "v1", source: str = "built-in",
           plugins: dict | None = None, plugin_sources: dict | None = None) -> str:
    """Write a valid (failed) record whose spec and provenance say what an adversary chose; its run id."""
    spec = make_spec(method=method, method_version=version, plugins=dict(plugins or {}))
    provenance = {"method": {"implementation": version, "source": source}, "device": "cpu",
                  "plugins": {k: {"source": s, "implementation": (plugins or {}).get(k)}
                              for k, s in (plugin_sources or {}).items()}}
    record = failed_record(spec, "forged", provenance=provenance)
    write_record(results / spec.protocol / "runs", record)
    return record.run_id


def _where(tmp_path: Path, results: Path, where: str) -> tuple[Path, str]:
    """(payload file, how the record writes its path) for each place an adversary may point at."""
    marker = tmp_path / "MARKER"
    if where == "inside results":
        path = _payload(results / "test", marker)
        return path, str(path)
    if where == "inside results, relative":  # relative to the cwd the CLI runs in (the repository root)
        path = _payload(results / "code", marker)
        return path, os.path.relpath(path, REPO)
    if where == "inside runs/":
        path = _payload(results / "test" / "runs", marker)
        return path, str(path)
    if where == "outside results":
        path = _payload(tmp_path / "elsewhere", marker)
        return path, str(path)
    if where == "dotted":  # a path that walks out of the results folder and back in
        path = _payload(results / "test", marker)
        return path, str(results / "test" / ".." / "test" / "evil.py")
    raise ValueError(where)


WHERE = ("inside results", "inside results, relative", "inside runs/", "outside results", "dotted")


def _refused(code: int, err: str, marker: Path, flag: str) -> None:
    assert code == 2, err
    assert not marker.exists(), "the record's file was imported"
    assert len(err.strip().splitlines()) == 1 and f"pass {flag} FILE" in err, err
    assert not any(m.startswith("cl_bench_submission_evil") for m in sys.modules)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("method", ["evil", "naive"])  # a new name, or a built-in's name with a file's hash
def test_reproduce_never_imports_the_method_file_a_record_names(tmp_path, cli, where, method):
    results = tmp_path / "received results"
    payload, written = _where(tmp_path, results, where)
    run_id = _forge(results, method=method, version=_implementation(payload), source=written)
    code, _, err = cli("reproduce", run_id, "--results", results)
    _refused(code, err, tmp_path / "MARKER", "--method")
    assert repr(written) in err  # shown, escaped, as a hint


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("key", ["backbone:mlp", "dataset:digits", "regime:evil"])
def test_reproduce_never_imports_a_plugin_file_a_record_names(tmp_path, cli, where, key):
    results = tmp_path / "received results"
    payload, written = _where(tmp_path, results, where)
    run_id = _forge(results, plugins={key: _implementation(payload)}, plugin_sources={key: written})
    code, _, err = cli("reproduce", run_id, "--results", results)
    _refused(code, err, tmp_path / "MARKER", "--plugin")


@pytest.mark.parametrize("source", [
    "entry point evil (evil_pkg.payload:ADAPTER)", "evil_pkg.payload:ADAPTER", "harness.methods.evil",
    "os:system", "evil.py\x1b[2J\u202e", "built-in"])
def test_reproduce_of_an_unknown_method_with_entry_point_looking_sources_is_refused(tmp_path, cli, source):
    results = tmp_path / "results"
    run_id = _forge(results, method="evil", version="sha256:" + "0" * 16, source=source)
    code, _, err = cli("reproduce", run_id, "--results", results)
    assert code == 2 and "pass --method FILE" in err and len(err.strip().splitlines()) == 1, err
    assert "\x1b" not in err and "\u202e" not in err


def test_a_named_file_is_verified_against_the_record_before_it_is_imported(tmp_path, cli):
    results = tmp_path / "results"
    marker = tmp_path / "MARKER"
    named = _payload(tmp_path / "mine", marker)  # the user's file, but not the code of this record
    for version in ("sha256:" + "1" * 16, "v1", "sha256:" + "2" * 16 + "+v3"):
        run_id = _forge(results, method="evil", version=version, source=str(named))
        for flag in ("--method", "--plugin"):
            code, _, err = cli("reproduce", run_id, "--results", results, flag, named)
            assert code == 2 and "is not code record" in err and not marker.exists(), err


def test_a_named_file_with_the_records_hash_is_the_code_that_reruns(tmp_path, cli):
    method = tmp_path / "mine.py"
    marker = tmp_path / "MARKER"
    method.write_text(textwrap.dedent(PAYLOAD.format(marker=str(marker), name="mine")))
    proto = tiny_protocol(tmp_path, methods=("mine",), regimes=("head",))
    results = tmp_path / "results"
    assert cli("run", "--protocol", proto, "--results", results, "--method", method, "--no-progress",
               "--no-mlflow", "--no-leaderboard")[0] == 0
    (path,) = (results / "tiny" / "runs").glob("*.json")
    code, out, err = cli("reproduce", path.stem, "--results", results, "--method", method)
    assert code == 0 and "reproduced: bitwise equal" in out, err
    # The command a run page shows names the file by its base name, for the user to point at their copy.
    assert cli("leaderboard", "--results", results)[0] == 0
    shown = next(results.glob(f"tiny/site/runs/{path.stem}*.html")).read_text()
    assert f"reproduce {path.stem} --results {results} --method mine.py" in shown



# --- reproduce imports no submissions folder: the user named none for the record

def _plugin_payload(folder: Path, marker: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(f"""\
        from pathlib import Path
        Path({str(marker)!r}).write_text("imported")
        from harness.api.plugins import RegimeFamily
        PLUGINS = (RegimeFamily({name!r}, lambda module, name, argument: True, description="a payload"),)
        """))
    return path


@pytest.mark.parametrize("what", ["method the record needs", "plug-in the record needs", "unrelated method"])
def test_reproduce_never_imports_the_submissions_folder(tmp_path, cli, monkeypatch, what):
    subs, marker, results = tmp_path / "subs", tmp_path / "MARKER", tmp_path / "results"
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(subs))
    if what == "plug-in the record needs":
        payload = _plugin_payload(subs, marker, "evilfam")
        run_id = _forge(results, plugins={"regime:evilfam": _implementation(payload)},
                        plugin_sources={"regime:evilfam": str(payload)})
    else:
        payload = _payload(subs, marker, name="evil" if what != "unrelated method" else "other")
        version = _implementation(payload) if what != "unrelated method" else "sha256:" + "3" * 16
        run_id = _forge(results, method="evil", version=version, source=str(payload))
    code, _, err = cli("reproduce", run_id, "--results", results)
    assert code == 2 and "FILE" in err and len(err.strip().splitlines()) == 1, err
    assert not marker.exists(), "the submissions folder was imported"


def test_a_submissions_method_reproduces_with_the_file_its_page_names(tmp_path, cli):
    proto = tiny_protocol(tmp_path, methods=("l2-anchor",), regimes=("head",))
    results = tmp_path / "results"
    assert cli("run", "--protocol", proto, "--results", results, "--no-progress", "--no-mlflow")[0] == 0
    (path,) = (results / "tiny" / "runs").glob("*.json")
    code, _, err = cli("reproduce", path.stem, "--results", results)  # the folder is not imported unasked
    assert code == 2 and "pass --method FILE" in err, err
    shown = next(results.glob(f"tiny/site/runs/{path.stem}*.html")).read_text()
    assert f"reproduce {path.stem} --results {results} --method submissions/l2_anchor.py" in shown
    code, out, err = cli("reproduce", path.stem, "--results", results, "--method", "submissions/l2_anchor.py")
    assert code == 0 and "reproduced: bitwise equal" in out, err


# --- the bytes checked are the bytes that run, identified by the digest of that one read

GOOD = "PLUGINS = ()  # no method, no plug-in: good\n"
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('imported')\nVALUE = 'evil'\n"


def _swapping_reads(monkeypatch, path: Path, marker: Path) -> list:
    """Every reader of code sees the good bytes first and the evil ones from the second read on (a file
    swapped between a check and the run); returns the list of reads."""
    import harness.api.codefile as codefile
    import harness.api.registry as registry

    real, reads = codefile.code_bytes, []

    def reading(p):
        if Path(p) != path:
            return real(p)
        reads.append(p)
        return (GOOD if len(reads) == 1 else EVIL.format(marker=str(marker))).encode()

    monkeypatch.setattr(codefile, "code_bytes", reading)
    monkeypatch.setattr(registry, "code_bytes", reading)
    return reads


@pytest.mark.parametrize("flag", ["--method", "--plugin"])
@pytest.mark.parametrize("name", ["swapped", "swapped_too"])
def test_reproduce_checks_the_bytes_it_runs(tmp_path, monkeypatch, flag, name):
    from harness.config.errors import UserError
    from harness.execution.reproduce import code_files

    path, marker = tmp_path / f"{name}.py", tmp_path / "MARKER"
    path.write_text(GOOD)
    version = "sha256:" + hashlib.sha256(GOOD.encode()).hexdigest()[:16]
    record = failed_record(make_spec(method="evil", method_version=version), "forged",
                           provenance={"method": {"implementation": version, "source": str(path)}})
    reads = _swapping_reads(monkeypatch, path, marker)
    with pytest.raises(UserError, match="pass --method FILE"):  # the good file defines no method 'evil'
        code_files(record, **({"method_files": [path]} if flag == "--method" else {"plugin_files": [path]}))
    assert len(reads) == 1 and not marker.exists(), "checked one read, ran another"


@pytest.mark.parametrize("expect", ["0" * 16, "0" * 64, ("1" * 16, "2" * 64), "", ("",), ("abc",)])
def test_the_loader_refuses_unexpected_bytes_before_they_run(tmp_path, expect):
    from harness.api.registry import RegistryError, load_module_file

    marker = tmp_path / "MARKER"
    path = tmp_path / "unexpected.py"
    path.write_text(EVIL.format(marker=str(marker)))
    with pytest.raises(RegistryError, match="is not the expected code"):
        load_module_file(path, expect=expect)
    assert not marker.exists()


def test_a_files_identity_is_the_digest_of_the_bytes_that_ran(tmp_path):
    from harness.api.registry import CODE_DIGEST, implementation, load_module_file

    for i, version in enumerate(("1", "2")):
        path = tmp_path / f"ident{i}.py"
        path.write_text(f"VALUE = {i}\n")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        module = load_module_file(path, expect=digest[:16])
        assert getattr(module, CODE_DIGEST) == digest
        path.write_text(f"VALUE = {i} + 100  # edited after it ran\n")
        expected = f"sha256:{digest[:16]}" + ("" if version == "1" else f"+v{version}")
        assert implementation(module, str(path), "file", version) == expected


# --- the command a run page shows: a flag for a file implementation only, named as the user passes it

@pytest.mark.parametrize("kind, method_source, plugin_source, flags", [
    ("built-in", "built-in", None, ""),
    ("entry point", "entry point mine (mine_pkg.adapter:ADAPTER)", None, ""),
    ("entry-point plug-in", "built-in", "entry point fam (fam_pkg:PLUGIN)", ""),
    ("submissions folder", "/home/u/project/submissions/mas_wrapped.py", None,
     " --method submissions/mas_wrapped.py"),
    ("named file", "/home/u/code/mine.py", None, " --method mine.py"),
    ("relative named file", "code/mine.py", None, " --method mine.py"),
    ("named plug-in", "built-in", "/tmp/x/fam.py", " --plugin fam.py"),
    ("one file for both", "/tmp/x/both.py", "/tmp/x/both.py", " --method both.py"),
    ("unnamed file", "/tmp/x/$(touch PWN).py", None, " --method FILE.py"),
])
def test_the_reproduce_command_flags_file_implementations_only(kind, method_source, plugin_source, flags):
    from harness.execution.reproduce import reproduce_command

    digest = "sha256:" + "a" * 16
    method_version = "v1" if method_source == "built-in" else digest
    plugins, provenance = {}, {"method": {"implementation": method_version, "source": method_source}}
    if plugin_source:
        plugins = {"regime:fam": digest if plugin_source == method_source else "sha256:" + "b" * 16}
        provenance["plugins"] = {"regime:fam": {"source": plugin_source, "implementation": plugins["regime:fam"]}}
    record = failed_record(make_spec(method="m", method_version=method_version, plugins=plugins), "x",
                           provenance=provenance)
    assert reproduce_command("0123456789ab", "res", record) == f"cl-bench reproduce 0123456789ab --results res{flags}"


# --- one loader for every file: what is not a regular .py file is refused before it is opened

def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = "NAME = 'x'\nDEFAULTS = {}\ndef build(ctx):\n    pass\n"
    tmp_path.mkdir(parents=True)
    (tmp_path / "noext").write_text(good)
    (tmp_path / "method.txt").write_text(good)
    (tmp_path / "folder.py").mkdir()
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "link-to-fifo.py").symlink_to(tmp_path / "fifo.py")
    return {"no suffix": tmp_path / "noext", "dot-slash no suffix": Path("./noext"), ".txt": tmp_path / "method.txt",
            "folder": tmp_path / "folder.py", "FIFO": tmp_path / "fifo.py", "link to a FIFO": tmp_path / "link-to-fifo.py",
            "device": Path("/dev/null"), "missing": tmp_path / "missing.py"}


BAD = ("no suffix", "dot-slash no suffix", ".txt", "folder", "FIFO", "link to a FIFO", "device", "missing")


@pytest.fixture
def bad_files(tmp_path):
    """{kind: path} of method/plug-in paths that are not regular .py files."""
    return _bad_files(tmp_path / "bad")


def _args(command: str, bad: Path, proto: Path, results: Path, run_id: str) -> list:
    quiet = ("--no-progress", "--no-mlflow", "--no-leaderboard", "--dry-run")
    return {"run --method": ["run", "--protocol", proto, "--results", results, "--method", bad, *quiet],
            "run --plugin": ["run", "--protocol", proto, "--results", results, "--plugin", bad, *quiet],
            "submit": ["submit", bad, "--protocol", proto, "--results", results, *quiet],
            "list --method": ["list", "methods", "--method", bad],
            "list --plugin": ["list", "--plugin", bad],
            "reproduce --method": ["reproduce", run_id, "--results", results, "--method", bad],
            "reproduce --plugin": ["reproduce", run_id, "--results", results, "--plugin", bad]}[command]


COMMANDS = ("run --method", "run --plugin", "submit", "list --method", "list --plugin", "reproduce --method",
            "reproduce --plugin")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_method_or_plugin_path_that_is_not_a_regular_py_file_is_one_line_exit_2(tmp_path, cli, bad_files,
                                                                                   command):
    proto = tiny_protocol(tmp_path, regimes=("head",))
    results = tmp_path / "results"
    run_id = _forge(results, method="evil", version="sha256:" + "0" * 16, source="x.py")
    for kind in BAD:
        bad = bad_files[kind]
        with deadline():
            code, out, err = cli(*_args(command, bad.resolve() if kind != "dot-slash no suffix" else bad,
                                        proto, results, run_id))
        if kind == "dot-slash no suffix":  # relative to the cwd: the same check, whatever the file
            assert code == 2, (kind, err)
            continue
        assert code == 2, (kind, out, err)
        where = "" if command == "submit" else err  # submit reports through the contract check
        assert command == "submit" or len(where.strip().splitlines()) == 1, (kind, err)
        assert any(s in out + err for s in ("not a Python file", "allowed: a regular .py", "no such method file",
                                             "no such Python file")), (kind, out, err)


@pytest.mark.parametrize("kind", BAD)
def test_check_refuses_a_path_that_is_not_a_regular_py_file(cli, bad_files, kind):
    with deadline():
        code, out, err = cli("check", bad_files[kind] if kind != "dot-slash no suffix" else "./noext")
    assert code == 2 and "✗ load" in out + err, (kind, out, err)
    assert "Traceback" not in out + err


@pytest.mark.parametrize("kind", ["no suffix", ".txt", "folder", "FIFO", "link to a FIFO", "device"])
def test_the_protocol_plugins_key_refuses_a_path_that_is_not_a_regular_py_file(tmp_path, cli, bad_files, kind):
    proto = tiny_protocol(tmp_path, regimes=("head",), extra=f"plugins: [{str(bad_files[kind])!r}]\n")
    with deadline():
        code, _, err = cli("run", "--protocol", proto, "--results", tmp_path / "r", "--dry-run", "--no-mlflow")
    assert code == 2 and "plugins[0]" in err and len(err.strip().splitlines()) == 1, err


def test_the_loader_refuses_before_opening(tmp_path, bad_files):
    from harness.api.registry import RegistryError, load_module_file

    for kind in BAD:
        with deadline(), pytest.raises(RegistryError):
            load_module_file(bad_files[kind] if kind != "dot-slash no suffix" else tmp_path / "bad" / "noext")


def test_the_loader_runs_the_bytes_it_read_and_writes_no_bytecode(tmp_path):
    from harness.api.registry import load_module_file

    path = tmp_path / "m.py"
    path.write_text("VALUE = 41 + 1\n")
    assert load_module_file(path).VALUE == 42
    assert not (tmp_path / "__pycache__").exists()


# Calls that run code from a file or a module name; each may appear only where it is listed.
BUILTIN_CALLS = {"exec", "eval", "__import__"}  # called by name (`model.eval()` is not one)
LOADING_CALLS = {"spec_from_file_location", "exec_module", "run_path", "run_module", "import_module", "load_source",
                 "SourceFileLoader", "load_module"}
ALLOWED = {("harness/api/registry.py", "load_module_file"),  # the one loader of files the user named
           ("harness/api/registry.py", "builtin_modules"),  # harness.methods.* by a constant package name
           ("harness/compat.py", "_load"),  # the real loader of a deferred installed library
           ("harness/compat.py", "_run_installed")}  # the two parts of a split installed package's __init__


def test_one_function_imports_code_from_files():
    found = set()
    for path in sorted((REPO / "harness").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]:
            body = func.body if func is not tree else [n for n in tree.body if not isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            for node in (n for stmt in body for n in ast.walk(stmt)):
                if isinstance(node, ast.Call):
                    f = node.func
                    by_name = isinstance(f, ast.Name) and f.id in BUILTIN_CALLS | LOADING_CALLS
                    if by_name or (isinstance(f, ast.Attribute) and f.attr in LOADING_CALLS):
                        where = func.name if func is not tree else "(module)"
                        found.add((path.relative_to(REPO).as_posix(), where))
    assert found - ALLOWED == set(), found - ALLOWED


# --- a method label `--methods` cannot choose is refused at load

@pytest.mark.parametrize("label", ["a,b", "naive, tuned", ",", " lead", "trail ", "  ", "x,"])
def test_a_method_label_that_methods_could_not_choose_is_refused_at_load(tmp_path, label):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol

    proto = tiny_protocol(tmp_path, methods=(f"{{name: naive, label: {label!r}}}",), regimes=("head",))
    with pytest.raises(ProtocolError, match=r"methods\[0\]\.label: .* allowed: a label without ','") as info:
        load_protocol(str(proto), get_registry())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("label", ["naive-tuned", "EWC (λ=10)", "a b", "x.y"])
def test_a_label_without_comma_or_edge_spaces_loads_and_is_chosen(tmp_path, label):
    from harness.api.registry import get_registry
    from harness.cli.parser import build_parser
    from harness.config.protocol import load_protocol, select

    proto = tiny_protocol(tmp_path, methods=("naive", f"{{name: naive, label: {label!r}}}"), regimes=("head",))
    protocol = load_protocol(str(proto), get_registry())
    wanted = build_parser().parse_args(["run", "--protocol", "p", "--methods", label]).methods
    assert [m.display for m in select(protocol, methods=wanted).methods] == [label]
