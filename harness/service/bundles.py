"""The services of results from many labs: `bundle`, `verify`, and the board merging local records with
bundles (`leaderboard --bundles DIR`).

The board trusts no status a bundle claims: it reruns the cheap checks itself (manifest, schema, metrics,
fingerprints, grid) and takes a rerun verdict only from a verification file in the verdicts folder
(--verdicts; default the bundles folder) whose bundle sha256 is the bundle's. Records are keyed so that
another protocol version, data fingerprint, backbone weights, regime or scenario never shares a cell: a
bundle's protocol must be the board's canonical protocol of that name and version (parsed YAML equal), and
a record whose data fingerprint or backbone weights differ from the board's for its data set is left out,
saying so. A run id in two sources is kept once (the better-vouched), a conflict said; records of a bundle
whose rerun differs are marked and left out of rankings (include_flagged or not) unless include_unverified.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..config.errors import SweepError
from .requests import BundleRequest, LeaderboardRequest, VerifyRequest

LOCAL = "local"  # the verification status of the board's own records
DIFFERS = "rerun differs"  # bundle_verify.DIFFERS


@dataclass(frozen=True)
class Source:
    """Where a record on a merged board came from: contributor, verification status (and why), hardware."""

    contributor: str
    status: str
    reason: str
    hardware: str
    bundle: str  # the bundle's file name ("" for local records)


def bundle(req: BundleRequest, log=print):
    """Write the bundle file; returns bundle_write.Packed."""
    from ..execution.bundle_write import make_bundle

    return make_bundle(req.results, req.protocol, req.out, req.contributor, req.method_files, log=log)


def verify(req: VerifyRequest, log=print):
    """Check a bundle, rerun its sample, write the verdict JSON; returns bundle_verify.Verification."""
    from ..config.files import write_atomic
    from ..execution.bundle_verify import ALL, check_seed, verdict_path, verify as run_verify

    if req.sample < 0 and req.sample != ALL:
        raise SweepError(f"--sample: {req.sample}; allowed: an integer >= 0, or all")
    if req.seed is not None:
        check_seed(req.seed)
    _writable(verdict_path(req.file, req.out), "-o" if req.out else "the verdict file")
    if req.markdown:
        _writable(Path(req.markdown), "--markdown")
    if req.board and not Path(req.board).is_dir():
        raise SweepError(f"--board: {req.board} is not a folder; allowed: the folder of the board's bundles")
    result = run_verify(req.file, req.sample, req.data_dir, log=log, seed=req.seed, download=req.download)
    write_atomic(verdict_path(req.file, req.out), result.to_json())
    if req.markdown:
        write_atomic(Path(req.markdown), verify_comment(req, result))
    return result


def _writable(path: Path, flag: str) -> None:
    """Refuse, before any work, an output whose folder does not exist (or is no folder)."""
    from ..config.errors import OutputError

    if not path.parent.is_dir():
        raise OutputError(f"{flag}: {path}: its folder {path.parent} does not exist; allowed: a file in an existing "
                          "folder")


def verify_comment(req: VerifyRequest, result) -> str:
    """The Markdown comment of a verdict: the bundle's cells beside those of the bundles under req.board (each
    checked here; the bundle itself and refused ones left out)."""
    from ..config.errors import UserError
    from ..execution.bundle import check_bundle, read_bundle
    from ..outputs.bundle_comment import cell_means, comment

    mine = check_bundle(read_bundle(req.file)).records
    board, used, refused = [], 0, 0
    folder = Path(req.board) if req.board else None
    for path in sorted(folder.iterdir()) if folder and folder.is_dir() else []:
        if path.suffix != ".zip" or path.resolve() == Path(req.file).resolve():
            continue
        try:
            checked = check_bundle(read_bundle(path))
        except UserError:  # one bad bundle on the board leaves the comparison with the others
            refused += 1
            continue
        if (checked.bundle.protocol, checked.bundle.version) == (result.protocol, result.version):
            board += [r for r in checked.records if r.run_id not in {m.run_id for m in mine}]
            used += 1
    note = (f"Board: {used} bundle(s) of this protocol version under the repository's bundles folder"
            + (f"; {refused} refused by the checks" if refused else "") + ".") if folder else ""
    return comment(result, mine, cell_means(board), note)


def identity(record) -> tuple:
    """What must be equal for two records of one data set to share a board: data fingerprint, backbone weights."""
    s = record.spec
    pretrained = (record.provenance or {}).get("pretrained")
    # the weights' source, cache key and content hash; not the file's path, which differs from lab to lab
    weights = {k: pretrained.get(k) for k in ("source", "key", "sha256")} if isinstance(pretrained, dict) else None
    return (s.data_fingerprint, json.dumps(s.pretrain.as_json(), sort_keys=True),
            json.dumps(weights, sort_keys=True, default=str))


def local_source(record, contributor: str | None) -> Source:
    """The Source of a record of the board's own results folder."""
    from ..execution.bundle import hardware

    return Source(contributor or "local results", LOCAL, "this results folder", hardware({}, [record]), "")


def merged_records(req: LeaderboardRequest, log=print) -> tuple[list, dict]:
    """(records, {run_id: Source}) of the local results folder and every bundle under req.bundles that passes."""
    from ..execution.store import load_records

    local = load_records(req.results, req.protocol, log=log) if Path(req.results).is_dir() else []
    records = list(local)
    sources = {r.run_id: local_source(r, req.contributor) for r in local}
    folder = Path(req.bundles)
    if not folder.is_dir():
        raise SweepError(f"--bundles: {req.bundles} is not a folder; allowed: a folder of bundle .zip files")
    if req.verdicts and not Path(req.verdicts).is_dir():
        raise SweepError(f"--verdicts: {req.verdicts} is not a folder; allowed: the folder of the board's verdicts")
    for path in sorted(p for p in folder.iterdir() if p.suffix == ".zip"):
        _add_bundle(req, path, records, sources, log)
    return _keyed(records, sources, log), sources


def _add_bundle(req: LeaderboardRequest, path: Path, records: list, sources: dict, log) -> None:
    """Check one bundle and add its records (duplicates of a run id already on the board are left out)."""
    from ..config.errors import UserError
    from ..config.text import terminal_safe
    from ..execution.bundle import check_bundle, hardware, read_bundle
    from ..execution.bundle_verify import VERDICT_SUFFIX, read_verdict

    try:
        checked = check_bundle(read_bundle(path))
        problem = protocol_mismatch(req.results, checked)
    except UserError as exc:  # one bad bundle is refused; the board is built from the others
        log(terminal_safe(f"leaderboard: bundle {path.name} refused: {exc}"))
        return
    if problem:
        log(terminal_safe(f"leaderboard: bundle {path.name} refused: {problem}"))
        return
    if req.protocol and checked.bundle.protocol != req.protocol:
        log(terminal_safe(f"leaderboard: bundle {path.name} is of protocol {checked.bundle.protocol}; left out "
                          f"(--protocol {req.protocol})"))
        return
    status, reason = read_verdict(Path(req.verdicts or path.parent) / (path.name + VERDICT_SUFFIX),
                                  checked.bundle.sha256)
    source = Source(checked.bundle.contributor, status, reason, hardware(checked.environment, checked.records),
                    path.name)
    dup = [r for r in checked.records if r.run_id in sources]
    for r in checked.records:
        if r.run_id not in sources:
            records.append(r)
            sources[r.run_id] = source
    for r in dup:
        _duplicate(r, source, records, sources, log)
    log(terminal_safe(f"leaderboard: bundle {path.name} ({checked.bundle.contributor}, {status}): "
                      f"{len(checked.records) - len(dup)} records added"
                      + (f", {len(dup)} whose run id is already on the board (see above)" if dup else "")))


# Which of two sources of one run id the board keeps: the board's own records, then verified, self-reported,
# rerun differs (a tie keeps the one already there).
RANK = {LOCAL: 0, "verified": 1, "self-reported": 2, "rerun differs": 3}
COMPARED = ("status", "acc_matrix", "metrics", "init_acc")  # a record's results, as a rerun compares them


def same_results(a, b) -> bool:
    """Whether two records of one run id report the same results (status, accuracy matrix, metrics)."""
    return all(json.dumps(getattr(a, k, None), sort_keys=True, default=str) ==
               json.dumps(getattr(b, k, None), sort_keys=True, default=str) for k in COMPARED)


def _where(src: Source) -> str:
    return f"bundle {src.bundle}" if src.bundle else "the local results"


def _duplicate(new, source: Source, records: list, sources: dict, log) -> None:
    """A record whose run id is on the board already: keep the better-vouched one (RANK); when their results
    differ, both sources are named in the log and the kept record's status reason says so (never silent)."""
    from dataclasses import replace

    from ..config.text import terminal_safe

    at = next(i for i, r in enumerate(records) if r.run_id == new.run_id)
    old, old_src = records[at], sources[new.run_id]
    take = RANK.get(source.status, 9) < RANK.get(old_src.status, 9)
    kept_src, other = (source, old_src) if take else (old_src, source)
    if same_results(old, new):
        log(terminal_safe(f"leaderboard: run {new.run_id} is in {_where(old_src)} and {_where(source)} with the same "
                          f"results; kept once, from {_where(kept_src)} ({kept_src.status})"))
    else:
        log(terminal_safe(f"leaderboard: CONFLICT: run {new.run_id} is in {_where(old_src)} and {_where(source)} with "
                          f"different results; the board shows {_where(kept_src)}'s ({kept_src.status}; ranked as "
                          f"that status allows) and names the conflict on its run page and contributors row"))
        kept_src = replace(kept_src, reason=f"{kept_src.reason}; run {new.run_id} conflicts with {_where(other)} "
                                            f"({other.contributor}), whose results for it differ")
    if take:
        records[at] = new
    sources[new.run_id] = kept_src


def protocol_mismatch(results, checked) -> str | None:
    """Why a bundle's protocol is not the board's canonical protocol of its name and version (parsed YAML), or
    None. The canonical one is the newest copy of that version in the results folder (the one its records
    were last run with), else the protocol `run --protocol NAME` loads; an older local copy never matches."""
    name, version = checked.bundle.protocol, checked.bundle.version
    found = canonical_protocol(results, name, version)
    if found is None:
        return (f"no local protocol {name} version {version} to compare it with (expected "
                f"{Path(results) / name / 'protocol-files'}/*.yaml or a protocol of that name here); it is not merged")
    path, doc = found
    if doc == checked.protocol_doc:
        return None
    keys = sorted(str(k) for k in set(doc) | set(checked.protocol_doc) if doc.get(k) != checked.protocol_doc.get(k))
    return (f"its protocol {name} version {version} differs from the board's ({path}, the newest local copy of "
            f"that version) in {', '.join(keys)}: the same name and version with other settings; it is not merged")


def canonical_protocol(results, name: str, version: str) -> tuple[str, dict] | None:
    """(path, parsed YAML) of the board's protocol `name` at `version`: the newest copy of that version under
    `<results>/<name>/protocol-files/` (by modification time, then name), else the named protocol file."""
    found = [(p, doc) for p, doc in local_protocols(results, name).items() if str(doc.get("version")) == version]
    copies = [(p, doc) for p, doc in found if Path(p).parent.name == "protocol-files"]
    if copies:
        return max(copies, key=lambda c: (Path(c[0]).stat().st_mtime, c[0]))
    return found[0] if found else None


def local_protocols(results, name: str) -> dict:
    """{path: parsed YAML} of the local protocol files of `name`: the results folder's copies, then the named one."""
    from ..config.errors import UserError
    from ..config.files import read_regular
    from ..config.protocol import resolve_protocol_path
    from ..config.yamlfile import read_yaml
    from ..execution.bundle_write import PROTOCOL_FILES

    paths = sorted((Path(results) / name / PROTOCOL_FILES).glob("*.yaml"))
    try:
        paths.append(resolve_protocol_path(name))
    except UserError:
        pass
    out = {}
    for p in paths:
        try:
            doc = read_yaml(read_regular(p, 2**20).decode("utf-8"), str(p))
        except (UserError, OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(doc, dict):
            out[str(p)] = doc
    return out


def _keyed(records: list, sources: dict, log) -> list:
    """The records whose data fingerprint and backbone weights are the board's for their data set (the local
    records' where there are any, else the best-vouched bundle's: verified, then self-reported, then by file
    name, said in the log); the others are left out, saying which."""
    from ..config.text import terminal_safe

    first, chosen = {}, {}
    for r in sorted(records, key=lambda r: (RANK.get(sources[r.run_id].status, 9), sources[r.run_id].bundle)):
        key = (r.spec.protocol, r.spec.protocol_version, r.dataset, str(r.spec.scenario))
        if key not in first:
            first[key], chosen[key] = identity(r), sources[r.run_id]
    for key, src in chosen.items():
        others = {identity(r) for r in records if (r.spec.protocol, r.spec.protocol_version, r.dataset,
                                                   str(r.spec.scenario)) == key} - {first[key]}
        if src.status != LOCAL and others:
            log(terminal_safe(f"leaderboard: data set {key[2]} ({key[1]}, {key[3]}): no local records; the board "
                              f"takes the data fingerprint and backbone weights of bundle {src.bundle} "
                              f"({src.contributor}, {src.status}: the best-vouched, then the first by file name)"))
    kept = []
    for r in records:
        key = (r.spec.protocol, r.spec.protocol_version, r.dataset, str(r.spec.scenario))
        if identity(r) == first[key]:
            kept.append(r)
            continue
        what = "data fingerprint" if identity(r)[0] != first[key][0] else "backbone weights (pretrained source)"
        log(terminal_safe(f"leaderboard: record {r.run_id} of {sources[r.run_id].contributor} left out: its {what} "
                          f"differs from the board's for data set {r.dataset} (cells never mix them)"))
    return kept


def merged_leaderboard(req: LeaderboardRequest, log=print) -> tuple:
    """One site per protocol of the merged records; index.html paths."""
    from ..config.errors import OutputError
    from ..config.paths import SITE, record_area_problem
    from ..execution.store import protocol_dir
    from ..execution.views import view_records
    from ..outputs.site import build_site

    problem = record_area_problem(req.results, req.out, site=True) if req.out else None
    if problem:  # as records.refuse_record_area says it (that module calls this one: no import back)
        raise OutputError(f"--out: {req.out} {problem}, which every later command reads its records from; "
                          f"allowed: a path outside {req.results}, or the default")
    records, sources = merged_records(req, log)
    names = sorted({r.spec.protocol for r in records})
    if not names:
        raise SweepError(f"--bundles: no records on the board (none under {req.results}, no bundle merged)")
    if req.out and len(names) > 1:
        raise SweepError(f"--out: {len(names)} protocols found ({', '.join(names)}); add --protocol NAME")
    if not req.include_unverified:
        records = [_held(r, sources[r.run_id]) for r in records]
    sites = []
    for name in names:
        shown = view_records([r for r in records if r.spec.protocol == name], req.protocol_version, log=log)
        target = Path(req.out) if req.out else protocol_dir(req.results, name) / SITE
        index = build_site(shown, target, results_dir=str(Path(req.results).resolve()),
                           include_flagged=req.include_flagged,
                           rope=req.rope, root=_root(req.results, target), force=req.force or not req.out,
                           sources={r.run_id: sources[r.run_id] for r in shown})
        print(f"leaderboard: {Path(index).resolve()}")
        sites.append(Path(index))
    return tuple(sites)


def _held(record, source: Source):
    """`record` marked with the warning contributors.HELD when its bundle's rerun differs (shown, marked, left
    out of every ranking even under --include-flagged; --include-unverified does not mark it); else `record`."""
    from dataclasses import replace

    from ..outputs.site.contributors import HELD

    if source.status != DIFFERS:
        return record
    note = {"code": HELD, "task": None, "message": f"bundle {source.bundle}: {source.reason}"[:300]}
    return replace(record, warnings=[*record.warnings, note])


def _root(results, target) -> Path:
    """The folder the site writer owns: --results when the site lies inside it, else the site folder."""
    target = Path(target)
    return Path(results) if target.is_relative_to(Path(results)) and target != Path(results) else target
