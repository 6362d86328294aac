"""`cl-bench submit` ranks a method file against the protocol's baselines; the commands pages show reproduce.

One tiny protocol (digits, 2 tasks, one regime, 2 task orders, naive + replay) in tmp_path; the method is
the DER++ example file, three forward/backward passes per step.
"""
import csv
import hashlib
import json
import re
import shlex
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT

from harness.config.errors import OutputError
from harness.config.files import file_sha256
from harness.execution.protocol_files import relative_references, save_protocol_file
from harness.execution.reproduce import sweep_command
from harness.outputs.site import slug

PROTOCOL = """\
    name: tinyrank
    version: "1"
    scenario: task-il
    pretrain: first-task
    datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}]
    regimes: [full]
    methods: [naive, replay]
    task_orders: {count: 2, seed: 0}
    seeds: [0]
    training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 3, batch_size: 16}
    evaluation: {batch_size: 512}
    """
FILE = "submissions/derpp.py"  # as a user in the repository names it
QUIET = ("--no-mlflow", "--no-progress", "--jobs", "1")


@pytest.fixture
def setup(tmp_path, monkeypatch):
    protocol = tmp_path / "tinyrank.yaml"
    protocol.write_text(textwrap.dedent(PROTOCOL))
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "no-submissions"))  # only the named file
    return SimpleNamespace(protocol=protocol, results=tmp_path / "results", tmp=tmp_path)


def _records(results) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(results) / "tinyrank" / "runs").glob("*.json"))]


def _methods(results) -> list[str]:
    return sorted(r["spec"]["method"] for r in _records(results))


def test_submit_ranks_the_file_among_the_baselines_already_there(setup, cli):
    code, _, err = cli("run", "--protocol", setup.protocol, "--results", setup.results, "--no-leaderboard", *QUIET)
    assert code == 0, err
    baselines = {r["run_id"] for r in _records(setup.results)}
    assert len(baselines) == 4  # naive, replay x 2 orders
    code, out, err = cli("submit", FILE, "--protocol", setup.protocol, "--results", setup.results, *QUIET)
    assert code == 0, err
    assert "baselines: 4 of 4 runs of the protocol's own methods are recorded" in out
    assert "2 runs (2 of 'derpp-plugin') finished" in out  # the baselines were not run again
    assert "not in the protocol's grid" not in out and "outside this grid" not in out and "no longer" not in out
    assert "protocol tinyrank version 1: 6 records" in out
    summary = out[out.index("dataset: digits"):]
    assert all(m in summary for m in ("derpp-plugin", "naive", "replay"))
    records = _records(setup.results)
    assert {r["run_id"] for r in records} >= baselines
    assert all((r["provenance"].get("submission") is not None) == (r["spec"]["method"] == "derpp-plugin")
               for r in records)
    site = setup.results / "tinyrank" / "site"
    index = (site / "index.html").read_text()
    assert "6 runs" in index and "3 methods" in index
    cells = (site / f"dataset-{slug('digits')}.html").read_text()
    assert all(f">{m}</a>" in cells for m in ("derpp-plugin", "naive", "replay"))
    with open(site / "data" / "global_ranks.csv") as fh:
        ranked = {row["method"]: float(row["mean_rank"]) for row in csv.DictReader(fh)}
    assert set(ranked) == {"derpp-plugin", "naive", "replay"}
    assert sum(ranked.values()) == pytest.approx(6.0)  # ranks 1..3 per block, averaged: they sum to 1+2+3
    _shows_derpp_compute_and_page(records, index, site)


def _shows_derpp_compute_and_page(records: list[dict], index: str, site: Path) -> None:
    """The must-show: equal optimizer steps, but DER++'s three passes per step cost ~3x naive's compute, and
    the budget line, the budget table and the method page say so."""
    def of(method):
        return sorted((r for r in records if r["spec"]["method"] == method), key=lambda r: r["spec"]["order"])

    for mine, naive in zip(of("derpp-plugin"), of("naive"), strict=True):
        assert mine["budget"]["optimizer_steps"] == naive["budget"]["optimizer_steps"]
        assert mine["budget"]["samples_seen"] == naive["budget"]["samples_seen"]  # plugins' passes: not in it
        # one current batch + two memory batches per step (a memory batch is smaller only at the very start)
        passes = mine["budget"]["compute"]["forward_samples"] / naive["budget"]["compute"]["forward_samples"]
        assert 2.8 < passes <= 3.0
        flops = mine["budget"]["compute"]["flops"] / naive["budget"]["compute"]["flops"]
        assert flops == pytest.approx(passes, rel=1e-9)  # same network, same trainable set: FLOPs follow passes
    line = index[index.index("Equal optimizer steps"):].split("</p>")[0]
    shown = re.search(r"derpp-plugin (\d\.\d)×", line)
    assert "compute differs" in line and shown and 2.8 <= float(shown.group(1)) <= 3.0, line
    page = (site / f"method-{slug('derpp-plugin')}.html").read_text()
    assert "Dark Experience for General Continual Learning" in page  # its REFERENCE
    assert "submitted file" in page and "derpp.py" in page


def test_missing_baselines_run_first_and_no_baselines_runs_none(setup, cli):
    args = ("--protocol", setup.protocol, "--results", setup.results, "--no-leaderboard", *QUIET)
    code, out, err = cli("submit", FILE, *args, "--no-baselines")
    assert code == 0, err
    assert _methods(setup.results) == ["derpp-plugin"] * 2
    assert "baselines: 0 of 4 runs" in out and "not run (--no-baselines)" in out
    assert "x 3 methods x" in out and "done: 0   to run: 2" in out  # the plan is the whole grid's
    code, out, err = cli("submit", FILE, *args)
    assert code == 0, err
    assert "the missing ones run first" in out and "4 runs (0 of 'derpp-plugin') finished" in out
    assert _methods(setup.results) == ["derpp-plugin"] * 2 + ["naive"] * 2 + ["replay"] * 2
    # a later submission of another file ranks against the baselines and the earlier submission alike
    code, out, err = cli("submit", "submissions/l2_anchor.py", *args, "--no-baselines")
    assert code == 0, err
    assert "baselines: 4 of 4 runs" in out and "2 records of other submitted files are ranked too" in out
    assert "protocol tinyrank version 1: 8 records" in out and "outside this grid" not in out
    summary = out[out.index("dataset: digits"):]
    assert all(m in summary for m in ("derpp-plugin", "l2-anchor", "naive", "replay"))


def test_a_setting_changed_without_a_new_version_is_named(setup, cli):
    args = ("--results", setup.results, "--no-leaderboard", *QUIET)
    assert cli("submit", FILE, "--protocol", setup.protocol, *args)[0] == 0
    setup.protocol.write_text(setup.protocol.read_text().replace("lr: 0.05", "lr: 0.1"))  # version stays "1"
    code, out, err = cli("submit", FILE, "--protocol", setup.protocol, "--no-baselines", *args)
    assert code == 0, err
    note = next(line for line in out.splitlines() if "no longer has" in line)
    assert note.startswith("note: 6 records of version 1 have settings the protocol's grid no longer has")
    assert "training.lr 0.05 vs 0.1" in note and "changed without a new version" in note
    assert "outside this grid" not in out


def test_the_commands_a_page_shows_work_from_another_directory(setup, cli, monkeypatch):
    assert cli("submit", FILE, "--protocol", setup.protocol, "--results", setup.results, "--no-baselines",
               *QUIET)[0] == 0
    site = setup.results / "tinyrank" / "site"
    (copy,) = (setup.results / "tinyrank" / "protocol-files").iterdir()
    assert copy.name == file_sha256(setup.protocol)[:16] + ".yaml" and copy.read_bytes() == setup.protocol.read_bytes()
    setup.protocol.unlink()  # the commands must not need the original
    elsewhere = setup.tmp / "elsewhere"
    (elsewhere / "submissions").mkdir(parents=True)
    (elsewhere / FILE).write_bytes((ROOT / FILE).read_bytes())  # the user's copy of the file, as the page says
    monkeypatch.chdir(elsewhere)
    index = (site / "index.html").read_text()
    shown = [line for line in index.split('<pre class="cmd">')[-1].split("</pre>")[0].splitlines() if "submit" in line]
    assert len(shown) == 1
    argv = shlex.split(shown[0].replace("&#39;", "'"))
    assert argv[:3] == ["cl-bench", "submit", FILE] and "--no-baselines" in argv
    assert Path(argv[argv.index("--protocol") + 1]) == copy.absolute()
    code, out, err = cli(*argv[1:], "--dry-run")
    assert code == 0, err
    assert "done: 2   to run: 0" in out  # the same run ids: the command names the same grid
    run_page = next((site / "runs").glob("*.html")).read_text()
    cmd = shlex.split(run_page.split('<pre class="cmd">')[1].split("</pre>")[0])
    assert cmd[1] == "reproduce" and cmd[cmd.index("--method") + 1] == FILE
    code, out, err = cli(*cmd[1:])
    assert code == 0 and "reproduced: bitwise equal" in out, err


def test_the_protocol_copy_stays_in_its_folder_and_is_written_once(tmp_path):
    source = tmp_path / "p.yaml"
    source.write_text("name: p\n")
    protocol = SimpleNamespace(name="p", source=str(source))
    first = save_protocol_file(tmp_path / "res", protocol)
    before = first.stat().st_mtime_ns
    assert save_protocol_file(tmp_path / "res", protocol) == first and first.stat().st_mtime_ns == before
    assert first.parent == tmp_path / "res" / "p" / "protocol-files"
    with pytest.raises(OutputError, match="cannot name a folder"):
        save_protocol_file(tmp_path / "res", SimpleNamespace(name="../../escape", source=str(source)))
    loaded = hashlib.sha256(source.read_bytes()).hexdigest()
    source.write_text("name: p\nversion: '2'\n")  # edited between loading and the sweep's first record
    with pytest.raises(OutputError, match="changed since the sweep loaded it"):
        save_protocol_file(tmp_path / "res", protocol, loaded)
    forged = {"command": "run", "protocol_file": "../../../etc/passwd"}
    assert sweep_command(forged, "res", "p") is None
    assert sweep_command({**forged, "protocol_file": "protocol-files/" + "a" * 16 + ".yaml"}, "res", "../x") is None
    good = {"command": "run", "protocol_file": "protocol-files/" + "a" * 16 + ".yaml", "regimes": ["full", "a;b"],
            "orders": 2}
    assert sweep_command(good, "res", "p") is None  # without the filter the command would run a larger grid
    only = {**good, "regimes": ["full"], "only": ["0644e905448c"]}
    assert sweep_command(only, "res", "p").endswith("--orders 2 --only 0644e905448c")  # one run, not the grid
    assert sweep_command({**only, "only": ["../x"]}, "res", "p") is None
    assert sweep_command({**only, "orders": "2"}, "res", "p") is None
    npz = {**good, "regimes": ["full"], "datasets": ["npz:my data;rm.npz"]}
    assert sweep_command(npz, "res", "p") == ("cl-bench run --protocol res/p/protocol-files/" + "a" * 16
                                              + ".yaml --results res --datasets 'npz:my data;rm.npz' "
                                              "--regimes full --orders 2")  # quoted, never dropped


def test_the_files_a_protocol_names_relative_to_its_folder_are_found():
    text = b"plugins: [x.py, /abs/y.py]\npretrain: {checkpoint: ck.pt}\ndatasets: [{name: 'npz:d.npz'}, digits]\n"
    assert relative_references(text) == ["x.py", "ck.pt", "d.npz"]
    assert relative_references(b"name: p\n") == [] and relative_references(b"[unclosed") == []
