"""Results from many labs: `bundle`, `verify` (checks + sampled reruns) and the board merging bundles.

Two "labs" run a tiny protocol (digits, one regime, naive and a method file, two orders) into two results
folders; lab B edits one record consistently (an accuracy and the metrics, warnings and step forgetting that
follow from it), so every cheap check passes and only a rerun can tell. Then each way a bundle can be damaged
or unsafe is refused in one line with exit code 2.
"""
import contextlib
import io
import json
import shutil
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

from harness import service
from harness.cli import main
from harness.config.metrics import all_metrics, step_forgetting
from harness.execution import bundle as bundle_mod
from harness.execution.bundle import MANIFEST, BundleError, check_bundle, read_bundle, sha256_hex
from harness.execution.bundle_verify import SELF_REPORTED, read_verdict
from harness.execution.store import parse_record
from harness.outputs.formatting import slug
from harness.run.checks import run_warnings

PROTOCOL = """name: tiny-labs
version: "1"
description: two labs, one cell each
scenario: task-il
pretrain: first-task
datasets:
  - {name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}
regimes: [head]
methods: [naive, l2-anchor]
task_orders: {count: 2, seed: 0}
seeds: [0]
training: {optimizer: sgd, lr: 0.05, momentum: 0.9, epochs: 1, batch_size: 32}
evaluation: {batch_size: 512}
"""
DELTA = 0.0625  # what lab B adds to one final accuracy


def _run(root: Path, results: Path, method: str) -> None:
    service.run(service.SweepRequest(str(root / "tiny-labs.yaml"), results=str(results), methods=(method,),
                                     method_files=(str(root / "l2_anchor.py"),), mlflow=False,
                                     leaderboard=False, progress=False), log=lambda *_: None)


def _tamper(path: Path) -> float:
    """Raise task 0's final accuracy by DELTA and rewrite everything that follows from it; returns the change."""
    data = json.loads(path.read_text())
    R = data["acc_matrix"]
    new = min(1.0, R[-1][0] + DELTA) if R[-1][0] + DELTA <= 1.0 else R[-1][0] - DELTA
    change = abs(new - R[-1][0])
    R[-1][0] = new
    data["metrics"] = all_metrics(R, data["init_acc"])
    if "step_forgetting" in data["update_norms"]:
        data["update_norms"]["step_forgetting"] = step_forgetting(np.asarray(R, dtype=float))
    from harness.config.specs import RunSpec
    scenario = RunSpec.from_dict(data["spec"]).scenario
    data["warnings"] = [w.to_dict() if hasattr(w, "to_dict") else w
                        for w in run_warnings(R, data["checks"], scenario, None)]
    record, problem = parse_record(data, expected_run_id=path.stem, protocol="tiny-labs")
    assert problem is None, problem  # consistent: the store's checks cannot tell
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    return change


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    """Two labs' results, their bundles (B tampered) and both verdicts."""
    root = tmp_path_factory.mktemp("labs")
    (root / "tiny-labs.yaml").write_text(PROTOCOL)
    shutil.copy(ROOT / "submissions" / "l2_anchor.py", root / "l2_anchor.py")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with contextlib.chdir(root):  # no submissions/ folder here: the method comes from the named file only
        _run(root, root / "lab-a", "naive")
        _run(root, root / "lab-b", "l2-anchor")
        runs = sorted((root / "lab-b" / "tiny-labs" / "runs").glob("*.json"))
        tampered = runs[0].stem
        change = _tamper(runs[0])
        (root / "bundles").mkdir()
        a, b = root / "bundles" / "a.zip", root / "bundles" / "b.zip"
        assert main(["bundle", "--results", "lab-a", "--protocol", "tiny-labs.yaml", "-o", str(a),
                     "--contributor", "Lab <A> & Co"]) == 0
        assert main(["bundle", "--results", "lab-b", "--protocol", "tiny-labs.yaml", "-o", str(b),
                     "--contributor", "Lab B"]) == 0
        codes = (main(["verify", str(a), "--sample", "2"]), main(["verify", str(b), "--sample", "2"]))
    torch.set_num_threads(threads)
    verdicts = [json.loads(Path(str(p) + ".verification.json").read_text()) for p in (a, b)]
    return {"root": root, "a": a, "b": b, "tampered": tampered, "change": change, "codes": codes,
            "verdicts": verdicts}


def test_honest_bundle_is_verified(labs):
    va = labs["verdicts"][0]
    assert labs["codes"][0] == 0
    assert va["status"] == "verified" and va["format"] == 1 and va["contributor"] == "Lab <A> & Co"
    assert va["bundle_sha256"] == sha256_hex(labs["a"].read_bytes())
    assert [r["verdict"] for r in va["reruns"]] == ["bitwise", "bitwise"] and va["records"] == 2


def test_tampered_bundle_passes_checks_but_its_rerun_differs(labs):
    vb = labs["verdicts"][1]
    assert labs["codes"][1] == 1
    assert vb["status"] == "rerun differs" and vb["ran_bundled_code"] is True
    differs = [r for r in vb["reruns"] if r["verdict"] == "differs"]
    assert [r["run_id"] for r in differs] == [labs["tampered"]]
    # the largest difference is the edited accuracy itself (the metrics move by less)
    assert differs[0]["max_delta"] == pytest.approx(labs["change"], abs=1e-12)
    assert labs["tampered"] in vb["reason"] and "largest difference" in vb["reason"]
    assert [r["verdict"] for r in vb["reruns"] if r["run_id"] != labs["tampered"]] == ["bitwise"]


def _verify(bundle, tmp_path, *flags, code: int = 0) -> dict:
    """`cl-bench verify BUNDLE FLAGS -o tmp/v.json`: its exit code checked, its verdict read back."""
    out = tmp_path / "v.json"
    assert main(["verify", str(bundle), *flags, "-o", str(out)]) == code
    return json.loads(out.read_text())


def test_sample_zero_runs_no_bundled_code(labs, monkeypatch, tmp_path, capsys):
    import harness.api.registry as registry

    def refuse(*args, **kwargs):
        raise AssertionError("bundled code was loaded")
    monkeypatch.setattr(registry, "load_module_file", refuse)
    verdict = _verify(labs["b"], tmp_path, "--sample", "0")
    assert verdict["status"] == SELF_REPORTED and verdict["ran_bundled_code"] is False and verdict["reruns"] == []
    assert "no bundled code ran" in capsys.readouterr().out


def _board(labs, tmp_path, out: str, *extra) -> str:
    """Build the merged board in a fresh local results folder holding only the protocol's copy."""
    local = tmp_path / "local"
    copies = local / "tiny-labs" / "protocol-files"
    copies.mkdir(parents=True, exist_ok=True)
    text = PROTOCOL.encode()
    (copies / f"{sha256_hex(text)[:16]}.yaml").write_bytes(text)
    assert main(["leaderboard", "--results", str(local), "--bundles", str(labs["bundles_dir"] if "bundles_dir"
                 in labs else labs["a"].parent), "--out", str(tmp_path / out), *extra]) == 0
    return (tmp_path / out / "index.html").read_text()


def test_merged_board_shows_both_contributors_and_statuses(labs, tmp_path, capsys):
    index = _board(labs, tmp_path, "site")
    assert "Lab &lt;A&gt; &amp; Co" in index and "Lab <A>" not in index  # escaped
    assert "Lab B" in index and "rerun differs" in index and "verified" in index
    run_page = (tmp_path / "site" / "runs" / f"{slug(labs['tampered'])}.html").read_text()
    assert "Contributed by <b>Lab B</b>" in run_page and "rerun differs" in run_page and "cpu" in run_page
    dataset_page = (tmp_path / "site" / f"dataset-{slug('digits')}.html").read_text()
    # each grid cell names its contributor, coloured by its verification status; B's rerun differs: its
    # records enter no table (they are on their run pages and the contributors table) unless --include-unverified
    assert '<span class="ok" title="verified">Lab &lt;A&gt; &amp; Co</span>' in dataset_page
    assert "Lab B" not in dataset_page
    _board(labs, tmp_path, "site-u", "--include-unverified")
    dataset_page = (tmp_path / "site-u" / f"dataset-{slug('digits')}.html").read_text()
    assert '<span class="bad" title="rerun differs">Lab B</span>' in dataset_page
    assert '<span class="ok" title="verified">Lab &lt;A&gt; &amp; Co</span>' in dataset_page


def test_board_takes_no_verdict_made_for_another_bundle(labs, tmp_path):
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copy(labs["b"], bundles / "b.zip")
    forged = dict(labs["verdicts"][0], status="verified", bundle_sha256=labs["verdicts"][0]["bundle_sha256"])
    (bundles / "b.zip.verification.json").write_text(json.dumps(forged))  # A's verdict beside B
    assert read_verdict(bundles / "b.zip.verification.json", sha256_hex(labs["b"].read_bytes()))[0] == SELF_REPORTED
    index = _board(dict(labs, bundles_dir=bundles), tmp_path, "site2")
    assert '<b class="">self-reported</b>' in index and 'class="ok">verified<' not in index


# ---- refusals: one line, exit 2 --------------------------------------------------------------------

def _rezip(src: Path, dst: Path, edit=None, manifest: bool = True, link: str | None = None) -> Path:
    """A copy of bundle `src` with its members edited; the manifest recomputed unless manifest=False."""
    with zipfile.ZipFile(src) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    if edit:
        members = edit(members)
    if manifest:
        old = json.loads(members[MANIFEST])
        old["members"] = [{"name": n, "sha256": sha256_hex(b), "size": len(b)}
                          for n, b in sorted(members.items()) if n != MANIFEST]
        members[MANIFEST] = json.dumps(old).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, b in members.items():
            info = zipfile.ZipInfo(n)
            if n == link:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, b, compress_type=zipfile.ZIP_DEFLATED)
    dst.write_bytes(buf.getvalue())
    return dst


def _refused(path: Path, capsys, *words) -> str:
    assert main(["verify", str(path), "--sample", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not Path(str(path) + ".verification.json").exists()
    return err


def _renamed(old: str, new: str):
    return lambda m: {(new if n == old else n): b for n, b in m.items()}


def _first_record(path: Path) -> str:
    with zipfile.ZipFile(path) as zf:
        return next(n for n in zf.namelist() if n.startswith("records/"))


@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil.json", "records\\..\\x.json", "records/../x.json",
                                  "records/sub/aaaaaaaaaaaa.json", "protocol/x.yaml"])
def test_member_names_outside_the_layout_are_refused(labs, tmp_path, capsys, name):
    bad = _rezip(labs["a"], tmp_path / "bad.zip", _renamed(_first_record(labs["a"]), name))
    _refused(bad, capsys, "not an allowed name")


def test_a_link_member_is_refused(labs, tmp_path, capsys):
    bad = _rezip(labs["a"], tmp_path / "bad.zip", link=_first_record(labs["a"]))
    _refused(bad, capsys, "link")


def test_a_zip_bomb_is_refused(labs, tmp_path, capsys):
    name = "records/aaaaaaaaaaaa.json"
    bomb = _rezip(labs["a"], tmp_path / "bomb.zip", lambda m: {**m, name: b"0" * (17 * 2**20)})
    assert bomb.stat().st_size < 2**20  # small on disk, 17 MiB inflated
    _refused(bomb, capsys, "bytes", name)


def test_total_and_count_caps_count_inflated_bytes(labs, tmp_path, capsys, monkeypatch):
    a = Path(shutil.copy(labs["a"], tmp_path / "a.zip"))
    monkeypatch.setattr(bundle_mod, "MAX_TOTAL_BYTES", 8000)  # bundle A inflates to more than that
    _refused(a, capsys, "zip bomb")
    monkeypatch.setattr(bundle_mod, "MAX_TOTAL_BYTES", 2**30)
    monkeypatch.setattr(bundle_mod, "MAX_MEMBERS", 3)
    _refused(a, capsys, "at most 3")


def test_missing_extra_and_edited_members_are_refused(labs, tmp_path, capsys):
    first = _first_record(labs["a"])
    missing = _rezip(labs["a"], tmp_path / "m.zip", lambda m: {n: b for n, b in m.items() if n != first},
                     manifest=False)
    _refused(missing, capsys, "missing", first)
    extra = _rezip(labs["a"], tmp_path / "e.zip", lambda m: {**m, "records/000000000000.json": b"{}"},
                   manifest=False)
    _refused(extra, capsys, "extra", "000000000000")
    edited = _rezip(labs["a"], tmp_path / "h.zip", lambda m: {**m, first: m[first].replace(b'"seed"', b'"seed" ')},
                    manifest=False)
    _refused(edited, capsys, "sha256", first)


def test_a_record_edited_inconsistently_is_refused_even_with_a_fresh_manifest(labs, tmp_path, capsys):
    first = _first_record(labs["a"])

    def edit(m):
        data = json.loads(m[first])
        data["metrics"]["acc"] = min(1.0, data["metrics"]["acc"] + 0.1)
        return {**m, first: json.dumps(data).encode()}
    _refused(_rezip(labs["a"], tmp_path / "r.zip", edit), capsys, first, "do not follow from its accuracy matrix")


def test_untrusted_manifest_fields_are_refused(labs, tmp_path, capsys):
    def named(value):
        def edit(m):
            data = json.loads(m[MANIFEST])
            data["protocol"] = value
            return {**m, MANIFEST: json.dumps(data).encode()}
        return edit
    _refused(_rezip(labs["a"], tmp_path / "n.zip", named("../../etc"), manifest=False), capsys, "protocol name")
    _refused(_rezip(labs["a"], tmp_path / "n.zip", named("other"), manifest=False), capsys, "not protocol other")


def test_a_protocol_of_the_same_name_and_version_with_other_settings_is_refused_by_the_board(labs, tmp_path, capsys):
    def other_text(m):
        old = next(n for n in m if n.startswith("protocol/"))
        text = m[old].replace(b"two labs, one cell each", b"two labs, edited")
        return {**{n: b for n, b in m.items() if n != old}, f"protocol/{sha256_hex(text)[:16]}.yaml": text}
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    forged = _rezip(labs["a"], bundles / "a2.zip", other_text)
    check_bundle(read_bundle(forged))  # self-consistent: only the comparison with the local protocol tells
    capsys.readouterr()
    local = tmp_path / "local"
    (local / "tiny-labs" / "protocol-files").mkdir(parents=True)
    (local / "tiny-labs" / "protocol-files" / "x.yaml").write_text(PROTOCOL)
    assert main(["leaderboard", "--results", str(local), "--bundles", str(bundles), "--out",
                 str(tmp_path / "s")]) == 2  # nothing left to show
    out = capsys.readouterr()
    assert "a2.zip refused" in out.out and "differs from the board's" in out.out and "description" in out.out
    assert "x.yaml" in out.out  # which local copy it was compared with
    assert out.err.count("\n") == 1


def _respec(edit_spec):
    """A bundle edit that changes every record's spec and re-derives its run id (a consistent record)."""
    from harness.config.specs import run_id_of

    def edit(m):
        out = {}
        for n, b in m.items():
            if n.startswith("records/"):
                data = json.loads(b)
                edit_spec(data["spec"])
                data["run_id"] = run_id_of(data["spec"])
                n, b = f"records/{data['run_id']}.json", json.dumps(data).encode()
            out[n] = b
        return out
    return edit


def test_records_run_with_other_settings_under_the_protocols_name_and_version_are_refused(labs, tmp_path, capsys):
    def two_epochs(spec):
        spec["training"]["epochs"] = 2
    forged = _rezip(labs["a"], tmp_path / "e2.zip", _respec(two_epochs))
    err = _refused(forged, capsys, "not a cell of the bundled protocol's grid", "training.epochs")
    assert "Traceback" not in err


@pytest.mark.parametrize("section, value", [("regimes", [{"a": 1}]), ("regimes", 5), ("datasets", 7),
                                            ("methods", "naive"), ("datasets", [{"name": "nope"}])])
def test_a_malformed_bundled_protocol_is_refused_in_one_line(labs, tmp_path, capsys, section, value):
    import yaml

    def edit(m):
        old = next(n for n in m if n.startswith("protocol/"))
        doc = yaml.safe_load(m[old])
        doc[section] = value
        text = yaml.safe_dump(doc).encode()
        return {**{n: b for n, b in m.items() if n != old}, f"protocol/{sha256_hex(text)[:16]}.yaml": text}
    bad = _rezip(labs["a"], tmp_path / "p.zip", edit)
    _refused(bad, capsys, "p.zip", section)
    if value != [{"a": 1}]:
        return  # the board's handling, once (it is the same refusal)
    # on a board, the bad bundle is refused and the others still build
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copy(bad, bundles / "bad.zip")
    shutil.copy(labs["a"], bundles / "a.zip")
    index = _board(dict(labs, bundles_dir=bundles), tmp_path, "site-p")
    assert "bad.zip refused" in capsys.readouterr().out and "Lab &lt;A&gt; &amp; Co" in index


def test_a_bundled_protocol_with_a_huge_grid_is_refused_before_the_grid_is_expanded(labs, tmp_path, capsys,
                                                                                   monkeypatch):
    import yaml

    from harness.execution import plan

    limit = bundle_mod.MAX_GRID_CELLS
    seeds = limit // 2 + 1  # x 1 dataset x 1 regime x 2 task orders: just over the limit

    def edit(m):
        old = next(n for n in m if n.startswith("protocol/"))
        doc = yaml.safe_load(m[old])
        doc["seeds"] = list(range(seeds))
        text = yaml.safe_dump(doc).encode()
        return {**{n: b for n, b in m.items() if n != old}, f"protocol/{sha256_hex(text)[:16]}.yaml": text}
    big = _rezip(labs["a"], tmp_path / "huge.zip", edit)

    def never(*_a, **_k):
        raise AssertionError("the grid was expanded")
    monkeypatch.setattr(plan, "expand", never)
    _refused(big, capsys, "huge.zip", f"{2 * seeds} cells", f"at most {limit}")


def test_read_bundle_refuses_a_non_zip(tmp_path):
    p = tmp_path / "x.zip"
    p.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a readable zip"):
        read_bundle(p)


def test_pull_request_comment_escapes_and_compares_with_the_board(labs, tmp_path):
    out = tmp_path / "comment.md"
    assert main(["verify", str(labs["a"]), "--sample", "0", "-o", str(tmp_path / "v.json"), "--markdown", str(out),
                 "--board", str(labs["a"].parent)]) == 0
    text = out.read_text()
    assert "Lab \\<A\\> \\& Co" in text and "<A>" not in text
    # naive's cell: the mean over lab A's records of the last row's mean of each accuracy matrix (ACC)
    runs = [json.loads(p.read_text()) for p in (labs["root"] / "lab-a" / "tiny-labs" / "runs").glob("*.json")]
    acc = np.mean([np.mean(r["acc_matrix"][-1]) for r in runs])
    assert f"| digits | task-il | head | naive | 2 | {100 * acc:.2f} | — | 0 |" in text.replace("task\\-il", "task-il")
    assert "Board: 1 bundle(s)" in text  # b.zip (a.zip itself is left out)


WORKFLOWS = ROOT / "docs" / "results-repository"


@pytest.mark.parametrize("name", ["verify.yml", "comment.yml", "board.yml"])
def test_workflows_never_put_expressions_into_shell_lines(name):
    import yaml

    text = (WORKFLOWS / name).read_text()
    flow = yaml.safe_load(text)
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as true
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "pull_request_target" not in code and "pull_request_target" not in triggers
    steps = [step for job in flow["jobs"].values() for step in job["steps"]]
    code_lines = [step.get("run") or step.get("with", {}).get("script") for step in steps]  # shell or JavaScript
    assert any(code_lines) and not [c for c in code_lines if c and "${{" in c]


def test_the_workflow_that_runs_pull_request_code_has_a_read_only_token():
    import yaml

    flow = yaml.safe_load((WORKFLOWS / "verify.yml").read_text())
    triggers = flow.get("on", flow.get(True))
    assert list(triggers) == ["pull_request"] and flow["permissions"] == {"contents": "read"}
    assert "verdicts/**" in triggers["pull_request"]["paths"]  # a PR touching verdicts/ runs the check, which fails
    steps = flow["jobs"]["verify"]["steps"]
    assert steps[0]["with"]["persist-credentials"] is False
    assert any("cl-bench verify" in s.get("run", "") and "--markdown" in s.get("run", "") for s in steps)


def test_the_board_workflow_runs_bundle_code_only_in_a_read_only_job():
    import yaml

    flow = yaml.safe_load((WORKFLOWS / "board.yml").read_text())
    assert flow["permissions"] == {}
    for name, job in flow["jobs"].items():
        code = "\n".join(s.get("run", "") for s in job["steps"])
        writes = job["permissions"].get("contents") == "write"
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout"))
        if "cl-bench verify" in code:  # reruns execute bundled method files
            assert not writes and job["permissions"] == {"contents": "read"}, name
            assert checkout["with"]["persist-credentials"] is False, name
        if writes:
            assert "cl-bench verify" not in code and "git push" in code and "--verdicts verdicts" in code, name
    assert {n for n, j in flow["jobs"].items() if j["permissions"].get("contents") == "write"} == {"publish"}
    assert flow["jobs"]["publish"]["needs"] == ["pending", "verify"]
    # one verify job per pending bundle: its own runner, install and artifact, named after that bundle
    verify = flow["jobs"]["verify"]
    assert verify["needs"] == "pending" and "${{ fromJSON(needs.pending.outputs.bundles) }}" == \
        verify["strategy"]["matrix"]["bundle"]
    upload = next(s for s in verify["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "verdict-${{ matrix.bundle }}"
    assert "cl-bench" not in "\n".join(s.get("run", "") for s in flow["jobs"]["pending"]["steps"])


def _step(flow_file: str, words: str) -> str:
    import yaml

    flow = yaml.safe_load((WORKFLOWS / flow_file).read_text())
    return next(s["run"] for j in flow["jobs"].values() for s in j["steps"] if words in s.get("name", ""))


@pytest.mark.parametrize("change, ok", [
    (lambda r: (r / "bundles" / "new.zip").write_bytes(b"z"), True),
    (lambda r: (r / "bundles" / "new.zip.verification.json").write_text("{}"), False),
    (lambda r: ((r / "verdicts").mkdir(), (r / "verdicts" / "old.zip.verification.json").write_text("{}")), False),
    (lambda r: (r / "bundles" / "old.zip").write_bytes(b"changed"), False),
    (lambda r: (r / "bundles" / "old.zip").unlink(), False),
    (lambda r: (r / "bundles" / "a b.zip").write_bytes(b"z"), False),
    (lambda r: (r / "README.md").write_text("docs"), True),
])
def test_verify_workflow_refuses_pull_requests_touching_verdicts_or_existing_bundles(tmp_path, change, ok):
    import os
    import subprocess

    script = _step("verify.yml", "Refuse any change")
    repo = tmp_path / "repo"
    (repo / "bundles").mkdir(parents=True)
    (repo / "bundles" / "old.zip").write_bytes(b"old")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True,  # noqa: E731
                                    text=True).stdout
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD").strip()
    change(repo)
    git("add", "-A")
    git("commit", "-qm", "pr")
    run = subprocess.run(["bash", "-e", "-c", script], cwd=repo, env={**env, "BASE_SHA": base}, capture_output=True,
                         text=True)
    assert (run.returncode == 0) == ok, run.stdout + run.stderr


def test_the_board_takes_verdicts_only_from_its_verdicts_folder(labs, tmp_path):
    bundles, verdicts = tmp_path / "bundles", tmp_path / "verdicts"
    bundles.mkdir()
    verdicts.mkdir()
    shutil.copy(labs["b"], bundles / "b.zip")
    forged = dict(labs["verdicts"][1], status="verified")  # B's own sha256, status edited: a PR could add it
    (bundles / "b.zip.verification.json").write_text(json.dumps(forged))
    local = tmp_path / "local" / "tiny-labs" / "protocol-files"
    local.mkdir(parents=True)
    (local / "p.yaml").write_text(PROTOCOL)
    assert main(["leaderboard", "--results", str(tmp_path / "local"), "--bundles", str(bundles), "--verdicts",
                 str(verdicts), "--out", str(tmp_path / "s")]) == 0
    index = (tmp_path / "s" / "index.html").read_text()
    assert '<b class="">self-reported</b>' in index and 'class="ok">verified<' not in index
    assert main(["leaderboard", "--results", str(tmp_path / "local"), "--bundles", str(bundles), "--verdicts",
                 str(tmp_path / "nonexistent"), "--out", str(tmp_path / "s2")]) == 2


def test_records_of_another_data_fingerprint_never_share_a_cell(labs, tmp_path, capsys):
    from harness.config.specs import run_id_of

    def other_data(m):
        out = {}
        for n, b in m.items():
            if n.startswith("records/"):
                data = json.loads(b)
                data["spec"]["data_fingerprint"] = "sha256:00000000000000ff"
                data["run_id"] = run_id_of(data["spec"])
                n, b = f"records/{data['run_id']}.json", json.dumps(data).encode()
            out[n] = b
        return out
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copy(labs["a"], bundles / "a.zip")
    forged = _rezip(labs["b"], bundles / "b2.zip", other_data)
    moved = {r.run_id for r in check_bundle(read_bundle(forged)).records}  # consistent on its own
    capsys.readouterr()
    index = _board(dict(labs, bundles_dir=bundles), tmp_path, "site3")
    out = capsys.readouterr().out
    assert all(f"record {rid} of Lab B left out: its data fingerprint differs" in out for rid in moved)
    assert "no local records; the board takes the data fingerprint and backbone weights of bundle a.zip" in out
    assert "Lab B" not in index and "Lab &lt;A&gt; &amp; Co" in index


def test_bundling_by_name_takes_the_results_folders_protocol_copy_and_is_deterministic(labs, tmp_path):
    lab = tmp_path / "lab-a"
    shutil.copytree(labs["root"] / "lab-a", lab)
    text = PROTOCOL.encode()
    copy = lab / "tiny-labs" / "protocol-files" / f"{sha256_hex(text)[:16]}.yaml"
    assert copy.read_bytes() == text  # the sweep kept a byte copy of its protocol file, named by content
    out = tmp_path / "again.zip"
    assert main(["bundle", "--results", str(lab), "--protocol", "tiny-labs", "-o", str(out),
                 "--contributor", "Lab <A> & Co"]) == 0
    assert sha256_hex(out.read_bytes()) == sha256_hex(labs["a"].read_bytes())  # same members, same bytes


def test_data_not_available_makes_a_bundle_self_reported(labs, tmp_path, monkeypatch):
    import harness.execution.reproduce as reproduce
    from harness.config.errors import DatasetMissing

    def missing(*args, **kwargs):
        raise DatasetMissing("digits: not found under ./data")
    monkeypatch.setattr(reproduce, "reproduce", missing)
    verdict = _verify(labs["a"], tmp_path, "--sample", "1")
    assert verdict["status"] == SELF_REPORTED and verdict["reason"].startswith("data not available here")


def test_a_member_whose_header_understates_its_size_is_refused(labs, tmp_path, capsys):
    name = "records/aaaaaaaaaaaa.json"
    data = bytearray(_rezip(labs["a"], tmp_path / "lie.zip", lambda m: {**m, name: b"0" * (17 * 2**20)}).read_bytes())
    at = data.find(name.encode())  # the local header's name; its sizes sit 26..30 bytes before it
    data[at - 30 + 22: at - 30 + 26] = (100).to_bytes(4, "little")
    central = data.find(b"PK\x01\x02")
    while central != -1:  # each central directory entry: uncompressed size at offset 24
        if data[central + 46: central + 46 + len(name)] == name.encode():
            data[central + 24: central + 28] = (100).to_bytes(4, "little")
        central = data.find(b"PK\x01\x02", central + 4)
    lie = tmp_path / "lie.zip"
    lie.write_bytes(bytes(data))
    with zipfile.ZipFile(lie) as zf:
        assert zf.getinfo(name).file_size == 100  # the header says 100 bytes
    _refused(lie, capsys, "lie.zip", "not a readable zip")  # the read stops at the declared size: CRC fails


def test_cells_are_keyed_by_the_weights_content_not_their_cache_path(labs):
    from dataclasses import replace

    from harness.service.bundles import identity

    record = check_bundle(read_bundle(labs["a"])).records[0]
    prov = dict(record.provenance, pretrained={"source": "imagenet", "key": "k1", "path": "/lab-a/cache/w.pt",
                                               "sha256": "ab" * 32})
    here = replace(record, provenance=prov)
    elsewhere = replace(record, provenance=dict(prov, pretrained={**prov["pretrained"], "path": "/lab-b/w.pt"}))
    other = replace(record, provenance=dict(prov, pretrained={**prov["pretrained"], "sha256": "cd" * 32}))
    assert identity(here) == identity(elsewhere) and identity(here) != identity(other)


# ---- the sample is the verifier's, not the contributor's ------------------------------------------------

def _first_by(seed: str, run_ids) -> str:
    """The record a sample of one draws with `seed` (computed here, independently of bundle_verify)."""
    import hashlib

    return min(run_ids, key=lambda rid: hashlib.sha256(f"{seed}:{rid}".encode()).hexdigest())


def test_a_sample_the_contributor_could_steer_is_drawn_by_the_verifiers_seed(labs, tmp_path):
    import hashlib

    ids = sorted(r.run_id for r in check_bundle(read_bundle(labs["b"])).records)
    # re-bundle B under other contributor names until the old draw (seeded by the bundle's own sha256) misses
    # the edited record: what a contributor could do when the bundle's bytes decided the sample
    steered = None
    for i in range(40):
        def renamed(m, i=i):
            data = json.loads(m[MANIFEST])
            data["contributor"] = f"Lab B{i}"
            return {**m, MANIFEST: json.dumps(data).encode()}
        path = _rezip(labs["b"], tmp_path / f"b{i}.zip", renamed)
        sha = sha256_hex(path.read_bytes())
        old_pick = min(ids, key=lambda rid: hashlib.sha256(f"{sha}:{rid}".encode()).hexdigest())
        if old_pick != labs["tampered"]:
            steered = path
            break
    assert steered is not None
    hit = next(f"s{i}" for i in range(100) if _first_by(f"s{i}", ids) == labs["tampered"])
    miss = next(f"s{i}" for i in range(100) if _first_by(f"s{i}", ids) != labs["tampered"])
    verdict = _verify(steered, tmp_path, "--sample", "1", "--seed", hit, code=1)
    assert verdict["status"] == "rerun differs" and verdict["seed"] == hit
    assert [r["run_id"] for r in verdict["reruns"]] == [labs["tampered"]]
    assert f"1 of 2 finished records rerun (seed {hit})" in verdict["reason"]
    verdict = _verify(steered, tmp_path, "--sample", "1", "--seed", miss)
    assert verdict["status"] == "verified" and verdict["seed"] == miss and verdict["finished"] == 2
    assert "1 of 2 finished records rerun" in verdict["reason"]


def test_without_a_seed_each_verification_draws_its_own_and_records_it(labs, tmp_path):
    seeds = []
    for i in range(2):
        out = tmp_path / f"v{i}.json"
        assert main(["verify", str(labs["a"]), "--sample", "0", "-o", str(out)]) == 0
        seeds.append(json.loads(out.read_text())["seed"])
    assert len(seeds[0]) == 32 and seeds[0] != seeds[1]


def test_sample_all_reruns_every_finished_record(labs, tmp_path):
    verdict = _verify(labs["b"], tmp_path, "--sample", "all", "--seed", "x", code=1)
    assert verdict["sample"] == -1 and len(verdict["reruns"]) == 2 and "2 of 2 finished records" in verdict["reason"]


@pytest.mark.parametrize("argv, words", [
    (["-o", "/nonexistent-dir/v.json"], ["-o", "/nonexistent-dir"]),
    (["--markdown", "/nonexistent-dir/c.md"], ["--markdown"]),
    (["--board", "/nonexistent-dir"], ["--board", "not a folder"]),
    (["--seed", "a\tb"], ["--seed"]),
])
def test_bad_verify_outputs_are_refused_before_any_work(labs, capsys, monkeypatch, argv, words):
    import harness.execution.bundle_verify as bv

    monkeypatch.setattr(bv, "check_bundle", lambda *a: (_ for _ in ()).throw(AssertionError("work was done")))
    assert main(["verify", str(labs["a"]), "--sample", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and all(w in err for w in words), err


def test_a_bundle_matching_only_a_stale_local_copy_is_refused_naming_the_canonical_one(labs, tmp_path, capsys):
    import os

    copies = tmp_path / "local" / "tiny-labs" / "protocol-files"
    copies.mkdir(parents=True)
    (copies / "old.yaml").write_text(PROTOCOL)  # the bundle's protocol, but an older copy
    (copies / "new.yaml").write_text(PROTOCOL.replace("two labs, one cell each", "the board's current text"))
    os.utime(copies / "old.yaml", (1_000_000, 1_000_000))
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copy(labs["a"], bundles / "a.zip")
    assert main(["leaderboard", "--results", str(tmp_path / "local"), "--bundles", str(bundles), "--out",
                 str(tmp_path / "s")]) == 2
    out = capsys.readouterr().out
    assert "a.zip refused" in out and "new.yaml" in out and "description" in out


def test_a_duplicate_run_id_with_other_results_is_flagged_and_the_verified_one_kept(labs, tmp_path, capsys):
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copy(labs["a"], bundles / "a.zip")
    shutil.copy(Path(str(labs["a"]) + ".verification.json"), bundles / "a.zip.verification.json")  # verified
    first = _first_record(labs["a"])
    rid = Path(first).stem

    def tampered(m):
        path = tmp_path / f"{rid}.json"
        path.write_bytes(m[first])
        _tamper(path)
        return {**m, first: path.read_bytes()}
    _rezip(labs["a"], bundles / "0-early.zip", tampered)  # first by file name, self-reported, same run id
    _rezip(labs["a"], bundles / "1-copy.zip")  # the very same records again
    capsys.readouterr()
    _board(dict(labs, bundles_dir=bundles), tmp_path, "site-d")
    out = capsys.readouterr().out
    assert f"CONFLICT: run {rid} is in bundle 0-early.zip and bundle a.zip" in out
    assert "the board shows bundle a.zip's (verified; ranked as that status allows) and names the conflict" in out
    assert "flagged" not in out  # the kept record is not flagged by the conflict
    assert f"CONFLICT: run {rid} is in bundle 0-early.zip and bundle 1-copy.zip" in out  # both self-reported
    run_page = (tmp_path / "site-d" / "runs" / f"{slug(rid)}.html").read_text()
    assert "conflicts with bundle 0-early.zip" in run_page and "verified" in run_page
    from harness.service.bundles import merged_records
    from harness.service.requests import LeaderboardRequest

    records, sources = merged_records(LeaderboardRequest(results=str(tmp_path / "local"), bundles=str(bundles)),
                                      log=lambda *_: None)
    kept = [r for r in records if r.run_id == rid]
    original = json.loads(read_bundle(labs["a"]).members[first])
    assert len(kept) == 1 and kept[0].acc_matrix == original["acc_matrix"] and sources[rid].bundle == "a.zip"


def test_records_of_a_bundle_whose_rerun_differs_are_left_out_of_rankings_unless_asked(labs, tmp_path):
    from harness.analysis.frame import records_to_frame
    from harness.service.bundles import _held, merged_records
    from harness.service.requests import LeaderboardRequest

    index = _board(labs, tmp_path, "site-h")
    assert "Left out of the rankings" in index and "--include-unverified" in index
    run_page = (tmp_path / "site-h" / "runs" / f"{slug(labs['tampered'])}.html").read_text()
    assert "rerun-differs" in run_page
    records, sources = merged_records(LeaderboardRequest(results=str(tmp_path / "local"), bundles=str(labs["b"].parent)),
                                      log=lambda *_: None)
    from dataclasses import replace

    records = [replace(r, warnings=[]) for r in records]  # the tiny runs' own learning checks aside
    before = records_to_frame(records).set_index("run_id")["ranked"]
    after = records_to_frame([_held(r, sources[r.run_id]) for r in records]).set_index("run_id")["ranked"]
    b_ids = sorted(r.run_id for r in check_bundle(read_bundle(labs["b"])).records)
    assert before.all() and not after[b_ids].any()  # B's were ranked; held, none is
    assert after.drop(b_ids).equals(before.drop(b_ids))  # A's (verified) stand as they were
    index = _board(labs, tmp_path, "site-h2", "--include-unverified")
    assert "Left out of the rankings" not in index and "rerun differs" in index


@pytest.mark.parametrize("flags", [(), ("--include-flagged",), ("--include-unverified",),
                                   ("--include-flagged", "--include-unverified")])
def test_rerun_differs_records_are_ranked_only_under_include_unverified_whatever_include_flagged(labs, tmp_path,
                                                                                               flags):
    import csv

    index = _board(labs, tmp_path, "site-f", *flags)
    with open(tmp_path / "site-f" / "data" / "runs.csv", newline="") as f:
        ranked = {row["run_id"]: row["ranked"] == "True" for row in csv.DictReader(f)}
    a_ids = {r.run_id for r in check_bundle(read_bundle(labs["a"])).records}
    b_ids = {r.run_id for r in check_bundle(read_bundle(labs["b"])).records}
    # the tiny runs carry learning-check warnings (flagged): ranked only under --include-flagged
    assert all(ranked[i] == ("--include-flagged" in flags) for i in a_ids)
    unverified = "--include-unverified" in flags
    assert all(ranked.get(i, False) == (unverified and "--include-flagged" in flags) for i in b_ids)
    assert (b_ids <= set(ranked)) == unverified  # held: in no table, yet on its run page and contributors row
    assert ("Left out of the rankings" in index) != unverified
    run_page = (tmp_path / "site-f" / "runs" / f"{slug(labs['tampered'])}.html").read_text()
    assert "rerun differs" in run_page


def test_bundle_records_get_no_sweep_command_and_the_board_names_its_results_folder_absolutely(labs, tmp_path):
    copies = tmp_path / "local" / "tiny-labs" / "protocol-files"
    copies.mkdir(parents=True)
    (copies / f"{sha256_hex(PROTOCOL.encode())[:16]}.yaml").write_text(PROTOCOL)
    with contextlib.chdir(tmp_path):
        assert main(["leaderboard", "--results", "local", "--bundles", str(labs["a"].parent), "--out", "site"]) == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert f"--results {tmp_path / 'local'}" in index and "--results local " not in index
    assert "cl-bench verify BUNDLE.zip" in index and "protocol-files" not in index
    run_page = (tmp_path / "site" / "runs" / f"{slug(labs['tampered'])}.html").read_text()
    assert "Made by this sweep" not in run_page and "cl-bench run --protocol" not in run_page
    assert "cl-bench verify b.zip" in run_page


def test_a_record_member_over_8_mib_is_refused_before_it_is_parsed(labs, tmp_path, capsys):
    from harness.execution.bundle import RECORD_CAP

    assert RECORD_CAP == 8 * 2**20
    name = "records/bbbbbbbbbbbb.json"
    big = _rezip(labs["a"], tmp_path / "big.zip", lambda m: {**m, name: b" " * (RECORD_CAP + 1)})
    _refused(big, capsys, name, str(RECORD_CAP))


@pytest.mark.parametrize("name", ["smoke", "depth-sweep-mini", "classil-sweep-mini"])
def test_the_grid_planned_without_method_code_is_the_protocols_own(name):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol, resolve_protocol_path
    from harness.config.yamlfile import read_yaml
    from harness.execution.plan import expand

    path = resolve_protocol_path(name)
    protocol = load_protocol(name, get_registry())
    real = expand(protocol, {d.name: "" for d in protocol.datasets})  # with every method, loaded
    b = bundle_mod.Bundle(Path("x.zip"), "0" * 64, protocol.name, protocol.version, "t", {})
    cells, skip = bundle_mod._cells(b, read_yaml(path.read_text(), str(path)))
    assert skip == "" and len(cells) < len(real)
    assert {json.dumps(bundle_mod._setting(s.to_dict()), sort_keys=True) for s in real} == \
        {json.dumps(c, sort_keys=True) for c in cells}


def test_the_pull_request_comment_counts_a_malformed_board_bundle_as_refused(labs, tmp_path):
    import yaml

    def edit(m):
        old = next(n for n in m if n.startswith("protocol/"))
        doc = yaml.safe_load(m[old])
        doc["regimes"] = [{"a": 1}]
        text = yaml.safe_dump(doc).encode()
        return {**{n: b for n, b in m.items() if n != old}, f"protocol/{sha256_hex(text)[:16]}.yaml": text}
    board = tmp_path / "board"
    board.mkdir()
    _rezip(labs["a"], board / "bad.zip", edit)
    shutil.copy(labs["b"], board / "b.zip")
    out = tmp_path / "c.md"
    assert main(["verify", str(labs["a"]), "--sample", "0", "-o", str(tmp_path / "v.json"), "--markdown", str(out),
                 "--board", str(board)]) == 0
    assert "Board: 1 bundle(s)" in out.read_text() and "1 refused by the checks" in out.read_text()


def test_download_fetches_the_records_data_set_before_the_rerun(labs, tmp_path, monkeypatch):
    import harness.execution.reproduce as reproduce
    import harness.run.datasets as datasets

    calls = []
    monkeypatch.setattr(datasets, "dataset_fingerprint", lambda name, data_dir, download: calls.append(
        (name, data_dir, download)))

    class Rep:
        verdict, max_delta, differences = "bitwise", 0.0, ()
    monkeypatch.setattr(reproduce, "reproduce", lambda *a, **k: Rep())
    out = tmp_path / "v.json"
    assert main(["verify", str(labs["a"]), "--sample", "1", "--download", "--data-dir", str(tmp_path), "-o",
                 str(out)]) == 0
    assert calls == [("digits", str(tmp_path), True)]
    calls.clear()
    assert main(["verify", str(labs["a"]), "--sample", "1", "-o", str(out)]) == 0
    assert calls == []


def _fake_cl_bench(tmp_path: Path) -> tuple[dict, Path]:
    """An environment whose `cl-bench` only logs its arguments (one call a line) to the returned file."""
    import os

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "cl-bench").write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {log}\n')
    (bin_dir / "cl-bench").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def _board_repo(tmp_path: Path) -> Path:
    """A results repository: kept.zip has its verdict, edited.zip a verdict of other bytes, new.zip none."""
    repo = tmp_path / "repo"
    (repo / "bundles").mkdir(parents=True)
    (repo / "verdicts").mkdir()
    for name, body in (("kept.zip", b"kept"), ("edited.zip", b"edited"), ("new.zip", b"new")):
        (repo / "bundles" / name).write_bytes(body)
    (repo / "verdicts" / "kept.zip.verification.json").write_text(
        json.dumps({"bundle_sha256": sha256_hex(b"kept"), "status": "verified"}, indent=1, sort_keys=True))
    (repo / "verdicts" / "edited.zip.verification.json").write_text(
        json.dumps({"bundle_sha256": sha256_hex(b"before"), "status": "verified"}, indent=1, sort_keys=True))
    (repo / "bundles" / "new.zip.verification.json").write_text("{}")  # beside the bundle: never a board verdict
    return repo


def test_the_board_verifies_each_bundle_without_a_verdict_of_that_very_bundle_in_its_own_job(tmp_path):
    import subprocess

    repo = _board_repo(tmp_path)
    out = tmp_path / "github-output"
    run = subprocess.run(["bash", "-e", "-c", _step("board.yml", "List the bundles")], cwd=repo,
                         env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(out)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert out.read_text().startswith("bundles=")
    assert json.loads(out.read_text().removeprefix("bundles=")) == ["edited.zip", "new.zip"]
    env, log = _fake_cl_bench(tmp_path)
    for name in ("new.zip", "../kept.zip"):  # a name the list would never give is refused
        run = subprocess.run(["bash", "-e", "-c", _step("board.yml", "Verify this job's one bundle")], cwd=repo,
                             env={**env, "BUNDLE": name, "CL_BENCH_DATA": str(tmp_path / "data")},
                             capture_output=True, text=True)
        assert run.returncode == (0 if name == "new.zip" else 1), run.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[:2] for c in calls] == [["verify", "bundles/new.zip"]]
    assert "--seed" not in calls[0] and "-o new-verdicts/new.zip.verification.json" in calls[0]


def test_the_board_lists_no_bundle_as_an_empty_json_list(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "bundles").mkdir(parents=True)
    out = tmp_path / "github-output"
    run = subprocess.run(["bash", "-e", "-c", _step("board.yml", "List the bundles")], cwd=repo,
                         env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(out)}, capture_output=True, text=True)
    assert run.returncode == 0 and out.read_text() == "bundles=[]\n", run.stderr


def test_the_publish_job_takes_each_pending_bundles_verdict_only_from_its_own_job(tmp_path):
    import subprocess

    repo = _board_repo(tmp_path)
    for d in ("results/p-one/protocol-files", "results/p-two/protocol-files"):
        (repo / d).mkdir(parents=True)
    kept_before = (repo / "verdicts" / "kept.zip.verification.json").read_text()
    mine = repo / "new-verdicts" / "verdict-new.zip"
    mine.mkdir(parents=True)
    (mine / "new.zip.verification.json").write_text('{"own": 1}')
    # what new.zip's code could write beside its verdict: forged verdicts of other bundles, verified or pending
    (mine / "kept.zip.verification.json").write_text('{"forged": 1}')
    (mine / "edited.zip.verification.json").write_text('{"forged": 1}')
    (mine / "ghost.zip.verification.json").write_text('{"forged": 1}')
    (repo / "new-verdicts" / "verdict-kept.zip").mkdir()  # an artifact of a bundle that has its verdict
    (repo / "new-verdicts" / "verdict-kept.zip" / "kept.zip.verification.json").write_text('{"forged": 1}')
    env, log = _fake_cl_bench(tmp_path)
    run = subprocess.run(["bash", "-e", "-c", _step("board.yml", "Take each pending bundle's verdict")], cwd=repo,
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    verdicts = {p.name: p.read_text() for p in (repo / "verdicts").iterdir()}
    assert sorted(verdicts) == ["edited.zip.verification.json", "kept.zip.verification.json",
                                "new.zip.verification.json"]
    assert verdicts["new.zip.verification.json"] == '{"own": 1}'  # from its own job
    assert verdicts["kept.zip.verification.json"] == kept_before  # has its verdict: never overwritten
    assert "forged" not in verdicts["edited.zip.verification.json"]  # edited.zip's own job wrote none: stays stale
    calls = log.read_text().splitlines()
    assert [c.split("--protocol ")[1].split()[0] for c in calls] == ["p-one", "p-two"]
    assert all("--verdicts verdicts" in c and "verify" not in c.split()[0] for c in calls)
