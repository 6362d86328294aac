"""cl-bench is a real package: a wheel holds the code, the built-in protocols, the leaderboard's
templates and the method index, and installed from that wheel into a fresh virtual environment it
runs a grid and builds its leaderboard from an unrelated folder. An editable install and the tree
on PYTHONPATH find the tree's own top-level folders.

The fresh environments see this interpreter's packages (torch, Avalanche) through a `.pth` line
written after the install, so pip never sees this environment's cl-bench and nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
SOURCES = ("pyproject.toml", "README.md", "harness", "protocols", "leaderboard")
PROBE = ("import harness, json; from harness.config import resources as r; "
         "print(json.dumps({'harness': harness.__file__, 'protocols': str(r.protocols_dir()), "
         "'templates': str(r.templates_dir()), 'tree': str(r.source_tree())}))")


def _files(folder: Path) -> list[Path]:
    """The files a build copies from `folder` (no caches, no hidden files)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".pyc"
                  and not any(part == "__pycache__" or part.startswith(".") for part in p.parts))


def _pip(*args: str, python: Path | None = None) -> None:
    target = ["--python", str(python)] if python else []
    subprocess.run([sys.executable, "-m", "pip", *target, *args, "--quiet", "--no-index", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check"], check=True, timeout=300)


def _venv(folder: Path) -> Path:
    """A fresh venv that also sees this interpreter's packages (a .pth line added after installing)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python"


def _see_project_packages(python: Path) -> None:
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(purelib, "cl-bench-test-project-env.pth").write_text("\n".join(sorted(ours)) + "\n")


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "CL_BENCH_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}


def _probe(python: Path, cwd: Path) -> dict:
    out = subprocess.run([str(python), "-c", PROBE], cwd=cwd, env=_env(cwd), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _copy_sources(dest: Path) -> Path:
    """A copy of the files a build reads (a build writes build/ and *.egg-info next to them)."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (the dev extra)")
    dest.mkdir(exist_ok=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
        else:
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source, dist = _copy_sources(tmp_path_factory.mktemp("source")), tmp_path_factory.mktemp("dist")
    _pip("wheel", "-w", str(dist), str(source))
    (built,) = dist.glob("cl_bench-*.whl")
    return built


def test_pyproject_lists_every_package_and_data_folder():
    """The explicit package list: every harness subpackage and every mapped folder holding files."""
    code = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "harness").rglob("__init__.py")}
    data = {".".join([package, *d.relative_to(ROOT / folder).parts])
            for package, folder in SETUPTOOLS["package-dir"].items()
            for d in [ROOT / folder, *(ROOT / folder).rglob("*")]
            if d.is_dir() and any(f.parent == d for f in _files(d))}
    missing = sorted((code | data) - set(SETUPTOOLS["packages"]))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(set(SETUPTOOLS["packages"]) - code - data), "packages listed that do not exist"


def test_wheel_holds_the_code_protocols_templates_and_method_index(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for p in _files(ROOT / "harness") if p.suffix == ".py"}
    expected.add("harness/api/_index.json")
    for package, folder in SETUPTOOLS["package-dir"].items():
        inside = package.replace(".", "/")
        expected |= {f"{inside}/{p.relative_to(ROOT / folder).as_posix()}" for p in _files(ROOT / folder)}
    assert "harness/builtin/protocols/smoke.yaml" in expected
    assert not sorted(expected - names), "missing from the wheel (pyproject's package-data?)"


def test_the_tree_on_pythonpath_uses_its_own_folders(tmp_path):
    env = {**_env(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found == {"harness": str(ROOT / "harness" / "__init__.py"), "protocols": str(ROOT / "protocols"),
                     "templates": str(ROOT / "leaderboard" / "templates"), "tree": str(ROOT)}


def test_an_editable_install_uses_the_tree(tmp_path):
    source = _copy_sources(tmp_path / "source")
    # built here (PEP 660), as `pip install -e` would: the fresh venv has no setuptools to build with
    build = "import sys; from setuptools.build_meta import build_editable; build_editable(sys.argv[1])"
    subprocess.run([sys.executable, "-c", build, str(tmp_path)], cwd=source, check=True, capture_output=True,
                   timeout=300)
    python = _venv(tmp_path / "venv")
    _pip("install", *map(str, tmp_path.glob("cl_bench-*.whl")), python=python)
    _see_project_packages(python)
    found = _probe(python, tmp_path)
    assert found == {"harness": str(source / "harness" / "__init__.py"), "protocols": str(source / "protocols"),
                     "templates": str(source / "leaderboard" / "templates"), "tree": str(source)}


@pytest.mark.slow
def test_an_installed_wheel_runs_a_grid_and_builds_its_leaderboard(wheel, tmp_path):
    if shutil.which("git"):  # a repository around the venv, whose commit a record must not claim
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "init", "-q"], cwd=tmp_path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                        "-m", "t"], cwd=tmp_path, check=True)
    python = _venv(tmp_path / "venv")
    _pip("install", "--ignore-installed", str(wheel), python=python)
    _see_project_packages(python)
    work = tmp_path / "elsewhere"
    work.mkdir()
    found = _probe(python, work)
    site_packages = Path(sysconfig.get_paths(vars={"base": str(tmp_path / "venv")})["purelib"])
    assert Path(found["harness"]).is_relative_to(site_packages), found
    assert Path(found["protocols"]) == site_packages / "harness" / "builtin" / "protocols"
    assert found["tree"] == "None"

    out = subprocess.run([str(python.parent / "cl-bench"), "run", "--protocol", "smoke", "--methods", "naive",
                          "--orders", "1", "--no-mlflow", "--no-progress", "--results", "res"],
                         cwd=work, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    records = [json.loads(p.read_text()) for p in (work / "res" / "smoke" / "runs").glob("*.json")]
    assert sorted(r["spec"]["regime"] for r in records) == ["full", "head"]
    assert {r["status"] for r in records} == {"ok"}
    assert all(r["provenance"]["git_sha"] is None for r in records)  # installed: no checkout
    assert (work / "res" / "smoke" / "site" / "index.html").stat().st_size > 1000
