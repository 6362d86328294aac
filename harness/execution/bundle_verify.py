"""`cl-bench verify`: the cheap checks of a bundle (bundle.check_bundle, no bundled code runs), then reruns
of K records sampled with the verifier's seed (never the bundle's bytes, which its contributor controls) with
`reproduce` (which runs the bundled method files, and only those whose sha256 the
record's run id covers); the verdict: *verified*, *self-reported* or *rerun differs*, with the reason."""
from __future__ import annotations

import hashlib
import json
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config.errors import DatasetError, UserError
from .bundle import Checked, check_bundle, file_digest, hardware, read_bundle

VERDICT_FORMAT = 1
VERIFIED, SELF_REPORTED, DIFFERS = "verified", "self-reported", "rerun differs"
STATUSES = (VERIFIED, SELF_REPORTED, DIFFERS)
VERDICT_SUFFIX = ".verification.json"  # <bundle>.zip.verification.json, in the board's verdicts folder
ALL = -1  # --sample all: rerun every finished record
SEED_SHAPE = "1-200 printable ASCII characters"
CODE_NOTE = ("reruns execute the bundled method files (Python code from the contributor); the checks before "
             "them and --sample 0 run no bundled code")


@dataclass(frozen=True)
class Rerun:
    """One sampled record's rerun: the reproduce verdict (bitwise, metrics, differs), fields and largest delta."""

    run_id: str
    verdict: str
    max_delta: float
    differences: tuple[str, ...]


@dataclass(frozen=True)
class Verification:
    """A bundle's verdict, written as JSON for the board (`to_json`)."""

    bundle: str
    bundle_sha256: str
    status: str
    reason: str
    protocol: str
    version: str
    contributor: str
    records: int
    checks: tuple[str, ...]
    sample: int  # the reruns asked (ALL: every finished record)
    seed: str  # what drew the sample: the verifier's, never the bundle's (random unless --seed)
    finished: int  # the records that could be drawn (status ok)
    reruns: tuple[Rerun, ...]
    ran_bundled_code: bool
    hardware: str

    def to_json(self) -> str:
        """The verdict file's text (format VERDICT_FORMAT)."""
        data = {"format": VERDICT_FORMAT, **asdict(self)}
        return json.dumps(data, indent=1, sort_keys=True, allow_nan=False, default=str)

    @property
    def exit_code(self) -> int:
        """0 verified or self-reported, 1 when a rerun differs."""
        return 1 if self.status == DIFFERS else 0


def new_seed() -> str:
    """A sample seed the contributor cannot predict (the OS's randomness)."""
    return secrets.token_hex(16)


def check_seed(seed: str) -> str:
    """`seed` if it is 1-200 printable ASCII characters (a CI run id, a commit sha); UserError otherwise."""
    if not (isinstance(seed, str) and 0 < len(seed) <= 200 and seed.isascii() and seed.isprintable()):
        raise UserError(f"--seed: {str(seed)[:40]!r} is not a seed; allowed: {SEED_SHAPE}")
    return seed


def sample(checked: Checked, k: int, seed: str) -> list:
    """K ok records (ALL: every one), drawn by `seed`. The seed is the verifier's: a sample drawn from the
    bundle's own bytes could be steered by its contributor (re-bundling until the draw misses an edited record)."""
    ok = [r for r in checked.records if r.ok]
    key = lambda r: hashlib.sha256(f"{seed}:{r.run_id}".encode()).hexdigest()  # noqa: E731
    return sorted(ok, key=key)[:len(ok) if k == ALL else max(k, 0)]


def verify(path, k: int = 1, data_dir: str | None = None, log=print, seed: str | None = None,
           download: bool = False) -> Verification:
    """The verdict of bundle `path` (sample drawn by `seed`, else by a fresh random one); BundleError (one line)
    for a damaged or inconsistent bundle."""
    seed = new_seed() if seed is None else check_seed(seed)
    checked = check_bundle(read_bundle(path))
    chosen = sample(checked, k, seed)
    if k == 0:
        return _verdict(checked, SELF_REPORTED, "no reruns asked (--sample 0); no bundled code ran", k, (), seed)
    if not chosen:
        return _verdict(checked, SELF_REPORTED, "no finished (ok) record to rerun", k, (), seed)
    log(f"verify: sample of {len(chosen)} drawn with seed {seed} (pass --seed {seed} to draw it again)")
    reruns = []
    for record in chosen:
        log(f"verify: rerunning {record.run_id} ({record.method} on {record.dataset} / {record.spec.regime}, "
            f"order {record.spec.order}); {CODE_NOTE}")
        try:
            reruns.append(_rerun(checked, record, data_dir, download))
        except DatasetError as exc:
            return _verdict(checked, SELF_REPORTED, f"data not available here for {record.run_id}: {exc}", k,
                            tuple(reruns), seed, ran=True)
        except UserError as exc:
            return _verdict(checked, SELF_REPORTED, f"record {record.run_id} cannot be rerun here: {exc}", k,
                            tuple(reruns), seed, ran=True)
    return _judge(checked, k, tuple(reruns), seed)


def _judge(checked: Checked, k: int, reruns: tuple, seed: str) -> Verification:
    """The verdict of the reruns: how many of how many finished records were rerun, and how they compare."""
    bad = [r for r in reruns if r.verdict == "differs"]
    of = f"{len(reruns)} of {sum(r.ok for r in checked.records)} finished records rerun (seed {seed})"
    if bad:
        worst = max(bad, key=lambda r: r.max_delta)
        ids = ", ".join(r.run_id for r in bad)
        return _verdict(checked, DIFFERS, f"{of}: {len(bad)} differ ({ids}); largest "
                        f"difference {worst.max_delta:.6g} in {worst.run_id} "
                        f"({', '.join(worst.differences)})", k, reruns, seed, ran=True)
    how = "bitwise" if all(r.verdict == "bitwise" for r in reruns) else "within 1e-6"
    return _verdict(checked, VERIFIED, f"all checks pass; {of}, all agree {how}", k, reruns, seed, ran=True)


def _verdict(checked: Checked, status: str, reason: str, k: int, reruns: tuple, seed: str,
             ran: bool = False) -> Verification:
    b = checked.bundle
    return Verification(b.path.name, b.sha256, status, reason, b.protocol, b.version, b.contributor,
                        len(checked.records), checked.lines, k, seed, sum(r.ok for r in checked.records), reruns,
                        ran, hardware(checked.environment, checked.records))


def _rerun(checked: Checked, record, data_dir, download: bool = False) -> Rerun:
    """Rerun one record with `reproduce`, from a temporary results folder holding it and its method file;
    with `download`, its data set (and timm weights) are fetched first (reproduce itself never downloads)."""
    from ..run.datasets import dataset_fingerprint
    from ..run.pretrain import with_timm_weights
    from .reproduce import reproduce
    from .store import write_record

    if download:
        dataset_fingerprint(record.spec.dataset.name, data_dir, True)
        with_timm_weights(record.spec.pretrain, True)  # published weights the record names (others: nothing)
    with tempfile.TemporaryDirectory(prefix="cl-bench-verify-") as tmp:
        results = Path(tmp) / "results"
        write_record(results / record.spec.protocol / "runs", record, root=results)
        files = []
        digest = file_digest(record.spec.method_version)
        if digest in checked.method_files:
            code = Path(tmp) / f"bundled_{digest}.py"
            code.write_bytes(checked.bundle.members[checked.method_files[digest]])
            files.append(str(code))
        rep = reproduce(record.run_id, results=str(results), data_dir=data_dir, method_files=tuple(files))
    return Rerun(record.run_id, rep.verdict, float(rep.max_delta), tuple(rep.differences))


def verdict_path(bundle_path, out: str | None = None) -> Path:
    """Where the verdict goes: `out`, else `<bundle>.verification.json` next to the bundle."""
    return Path(out) if out else Path(str(bundle_path) + VERDICT_SUFFIX)


def read_verdict(path: Path, bundle_sha256: str) -> tuple[str, str]:
    """(status, reason) a verdict file gives a bundle: its rerun verdict only when the file is a valid verdict of
    this very bundle (sha256); otherwise self-reported, saying why. A bundle never vouches for itself."""
    from ..config.files import read_regular

    if not path.is_file():
        return SELF_REPORTED, "no verdict of the board for it (no verification file in the verdicts folder)"
    try:
        data = json.loads(read_regular(path, 2**20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return SELF_REPORTED, "its verification file is unreadable"
    if not isinstance(data, dict) or data.get("format") != VERDICT_FORMAT or data.get("status") not in STATUSES:
        return SELF_REPORTED, "its verification file is not a verdict"
    if data.get("bundle_sha256") != bundle_sha256:
        return SELF_REPORTED, "its verification file is of another bundle (sha256 differs)"
    reason = data.get("reason") if isinstance(data.get("reason"), str) else ""
    return data["status"], reason[:300]
